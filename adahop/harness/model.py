"""A Llama-style decoder in one file, parameter-compatible with transformers' ``LlamaForCausalLM``.

RMSNorm → attention (RoPE, optional grouped-query heads, ``F.scaled_dot_product_attention``,
causal) → residual → RMSNorm → SwiGLU MLP → residual, ``n_layers`` times, then a final RMSNorm and
the LM head (untied, or tied to the embedding by a config flag). Module names follow
``LlamaForCausalLM`` (``model.layers.3.self_attn.q_proj`` …), so the state dict *is* the HF
checkpoint: :func:`export_hf` writes it with a ``config.json`` and the tokenizer, :func:`load_hf`
reads such a directory back, and ``tests/test_model.py`` checks that both give the same logits.

Every projection inside the blocks is a plain ``nn.Linear`` (no bias) so that
``adahop.convert(model, recipe)`` can swap them; the LM head is the one it skips by name.
All of their dimensions are multiples of 32 (the MXFP4 block); :class:`LlamaConfig` checks it.

Named sizes (:data:`PRESETS`). The name is the **total** parameter count, embeddings included
(the LM head counted separately when untied, once when tied), at the reference 32k vocabulary
(:data:`REFERENCE_VOCAB`); ``tests/test_model.py`` holds each within ±15% of its name:

==========  =====  ======  =====  ========  ======  =====  =================
name        dim    layers  heads  kv heads  ffn     tied   params at 32768
==========  =====  ======  =====  ========  ======  =====  =================
tiny        128    2       4      2         352     no     CPU smoke only
30m         320    8       5      5         864     no     30.9M
125m        768    12      12     12        2048    no     135.3M
350m        1024   24      16     16        2816    no     375.4M
1b          2048   16      32     8         8192    yes    1.04B
3b          3072   28      24     8         8192    yes    2.92B
==========  =====  ======  =====  ========  ======  =====  =================

``125m`` is the shape of the HF run in DESIGN.md §3 (134M at vocab 32000); ``1b`` and ``3b`` are
Llama-3.2-1B's and -3B's shapes (GQA 32/8 and 24/8, head dim 64 and 128, tied, RoPE θ = 500000)
without their long-context RoPE scaling, meant for throughput and memory, not full training (at
Llama 3's 128256-token vocabulary they hold its 1.24B and 3.21B parameters). Vocabulary size is
the tokenizer's and is not padded.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

REFERENCE_VOCAB = 32768
MX_BLOCK = 32

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(dim=128, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=352, max_seq_len=256),
    "30m": dict(dim=320, n_layers=8, n_heads=5, ffn_dim=864),
    "125m": dict(dim=768, n_layers=12, n_heads=12, ffn_dim=2048),
    "350m": dict(dim=1024, n_layers=24, n_heads=16, ffn_dim=2816),
    "1b": dict(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim=8192, tie_embeddings=True,
               rope_theta=500000.0),
    "3b": dict(dim=3072, n_layers=28, n_heads=24, n_kv_heads=8, ffn_dim=8192, tie_embeddings=True,
               rope_theta=500000.0),
}
# What each name promises (total parameters at REFERENCE_VOCAB); tiny promises nothing.
NOMINAL_PARAMS: dict[str, float] = {"30m": 30e6, "125m": 125e6, "350m": 350e6, "1b": 1.0e9, "3b": 3.0e9}


@dataclasses.dataclass
class LlamaConfig:
    """Shape of a :class:`Llama`. ``n_kv_heads=None`` means one kv head per query head (no GQA)."""

    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    ffn_dim: int
    n_kv_heads: int | None = None
    max_seq_len: int = 2048
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    init_std: float = 0.02

    def __post_init__(self) -> None:
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"LlamaConfig.{name} must be a positive int, got {value!r}")
        if self.dim % self.n_heads:
            raise ValueError(f"dim={self.dim} is not divisible by n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
        for name, value in (("dim", self.dim), ("ffn_dim", self.ffn_dim), ("kv dim", self.kv_dim)):
            if value % MX_BLOCK:
                raise ValueError(f"{name}={value} must be a multiple of {MX_BLOCK} (the MXFP4 block)")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @classmethod
    def from_name(cls, name: str, vocab_size: int, **overrides: Any) -> "LlamaConfig":
        """The preset ``name`` (see :data:`PRESETS`) with the tokenizer's ``vocab_size``."""
        if name not in PRESETS:
            raise ValueError(f"unknown model size {name!r}; choose one of {sorted(PRESETS)}")
        return cls(vocab_size=vocab_size, **{**PRESETS[name], **overrides})

    def block_params(self) -> int:
        """Parameters of one decoder block: q, k, v, o, gate, up, down and two norm weights."""
        attn = 2 * self.dim * self.dim + 2 * self.dim * self.kv_dim
        return attn + 3 * self.dim * self.ffn_dim + 2 * self.dim

    def num_params(self, embeddings: bool = True) -> int:
        """Total parameters (tied embedding counted once); ``embeddings=False`` leaves out the
        embedding table and the LM head."""
        body = self.n_layers * self.block_params() + self.dim
        table = self.vocab_size * self.dim * (1 if self.tie_embeddings else 2)
        return body + (table if embeddings else 0)

    def matmul_params(self) -> int:
        """Weights that take part in a matmul per token: every projection plus the LM head
        (the embedding lookup is a gather, not a matmul). The N of the 6N FLOPs rule."""
        return self.num_params(embeddings=False) - (2 * self.n_layers + 1) * self.dim + self.vocab_size * self.dim

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token, forward + backward: ``6 N + 12 L H Q T``.

        N = :meth:`matmul_params`; the attention term (PaLM, Chowdhery et al. 2022, app. B) counts
        QKᵀ and AV for all T keys of every query, i.e. without halving for the causal mask —
        the same convention as nanoGPT's and most published MFU figures.
        """
        return 6 * self.matmul_params() + 12 * self.n_layers * self.n_heads * self.head_dim * seq_len


class RMSNorm(nn.Module):
    """``x / rms(x) * weight`` over the last dim, computed in fp32 and cast back before the weight
    (as ``LlamaRMSNorm``, so bf16 runs round at the same place)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)
        if torch.is_autocast_enabled(y.device.type):
            # Every consumer is a linear layer that autocast casts its input for: casting here gives
            # the same values once, inside the norm's (compiled) kernel, instead of a separate pass
            # per consumer — three for q/k/v, two for gate/up — forward and backward, wherever a
            # converted layer is a graph break.
            y = y.to(torch.get_autocast_dtype(y.device.type))
        return y


# Eager autograd keeps every elementwise op's inputs for the backward; a compiled graph keeps what
# Inductor's partition chooses and recomputes the rest. The Function below keeps, eagerly, what the
# compiled graph needs and recomputes the rest in the backward, with the same ops as autograd's, so
# eager and traced-unfused (aot_eager) training stay the same bits (tests/test_compile.py). Eager
# steps include every calibrating recipe's first steps, whose peak is a run's peak.


def _eager_with_grad() -> bool:
    return torch.is_grad_enabled() and not torch.compiler.is_compiling()


class _LeanSwiGLU(torch.autograd.Function):
    """``F.silu(gate) * up``, keeping ``gate`` and ``up`` where autograd would also keep
    ``silu(gate)``: one activation of the MLP's width a block."""

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate, up = ctx.saved_tensors
        return torch.ops.aten.silu_backward(grad * up, gate), grad * F.silu(gate)


def rope_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin ``(max_seq_len, head_dim)`` fp32 for the rotate-half RoPE layout of HF Llama."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    freqs = torch.outer(torch.arange(max_seq_len, dtype=torch.float), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x (B, heads, T, head_dim)`` by position. Equivalent to HF ``apply_rotary_pos_emb``."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.k_proj = nn.Linear(cfg.dim, cfg.kv_dim, bias=False)
        self.v_proj = nn.Linear(cfg.dim, cfg.kv_dim, bias=False)
        self.o_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        # The tables are cast to the activations' dtype first, as HF does under bf16.
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_kv_heads != self.n_heads)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.up_proj = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.down_proj = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(_LeanSwiGLU.apply(gate, up) if _eager_with_grad() else F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    """Decoder-only LM. ``forward(input_ids (B, T) int64, targets (B, T) int64 | None)`` returns
    ``(logits (B, T, vocab), loss)``; ``loss`` is the mean next-token cross-entropy (fp32) over
    all targets, or None without targets. ``T`` may not exceed ``max_seq_len``.

    Equivalent to ``LlamaForCausalLM`` with the same weights (no attention mask, positions 0..T-1).
    """

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.config = cfg
        self.model = nn.ModuleDict(dict(
            embed_tokens=nn.Embedding(cfg.vocab_size, cfg.dim),
            layers=nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers)),
            norm=RMSNorm(cfg.dim, cfg.norm_eps),
        ))
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        cos, sin = rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        # Not persistent: derived from the config, and kept out of checkpoints and HF exports.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Normal(0, init_std) weights; the two projections that write into the residual stream
        (o_proj, down_proj) scaled by 1/√(2·n_layers) as in GPT-2, so the residual's variance does
        not grow with depth. Norm weights 1."""
        cfg = self.config
        for name, p in self.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, 0.0, cfg.init_std / math.sqrt(2 * cfg.n_layers))
            elif p.dim() == 2:
                nn.init.normal_(p, 0.0, cfg.init_std)
            else:
                nn.init.ones_(p)

    def num_params(self) -> int:
        """Parameters actually held (a tied weight counted once)."""
        return sum(p.numel() for p in self.parameters())

    def forward(
        self, input_ids: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if input_ids.dim() != 2 or input_ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"input_ids must be (B, T) int64/int32, got {tuple(input_ids.shape)} {input_ids.dtype}")
        T = input_ids.shape[1]
        if T > self.config.max_seq_len:
            raise ValueError(f"sequence length {T} exceeds max_seq_len={self.config.max_seq_len}")
        if targets is not None and targets.shape != input_ids.shape:
            raise ValueError(f"targets {tuple(targets.shape)} must match input_ids {tuple(input_ids.shape)}")
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        x = self.model.embed_tokens(input_ids)
        for block in self.model.layers:
            x = block(x, cos, sin)
        logits = self.lm_head(self.model.norm(x))
        if targets is None:
            return logits, None
        loss = cross_entropy_chunked(logits.view(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss


def _row_chunks(n: int, rows: int | None) -> list[slice]:
    return [slice(None)] if rows is None else [slice(i, i + rows) for i in range(0, n, rows)]


IGNORE_INDEX = -100  # F.cross_entropy's default: such targets count neither in the loss nor the mean
CHUNK_BYTES = 1 << 28  # fp32 temporaries of this size at most in eager mode


class _ChunkedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, rows: int | None) -> torch.Tensor:
        valid = targets != IGNORE_INDEX
        targets = torch.where(valid, targets, 0)
        lse, picked = [], []
        for part in _row_chunks(logits.shape[0], rows):
            x = logits[part].float()
            lse.append(torch.logsumexp(x, dim=-1))
            picked.append(x.gather(1, targets[part, None]).squeeze(1))
        lse = torch.cat(lse)
        # One sum over every row, however many chunks: the same bits as a single chunk.
        count = valid.sum()
        ctx.save_for_backward(logits, targets, valid, lse, count)
        ctx.rows = rows
        return torch.where(valid, lse - torch.cat(picked), 0.0).sum() / count

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        logits, targets, valid, lse, count = ctx.saved_tensors
        # (softmax - one-hot) · a row's share of the mean (0 where ignored): F.cross_entropy's gradient.
        weight = torch.where(valid, grad / count, 0.0)[:, None]
        if ctx.rows is None:  # traced: elementwise throughout, for Inductor to fuse into one pass
            onehot = torch.arange(logits.shape[1], device=logits.device)[None, :] == targets[:, None]
            return ((torch.exp(logits.float() - lse[:, None]) - onehot.float()) * weight).to(logits.dtype), None, None
        out = torch.empty_like(logits)
        for part in _row_chunks(logits.shape[0], ctx.rows):
            # In place on a copy (fp32 logits' .float() is the logits themselves): one fp32
            # temporary a chunk, and the same bits as the traced form.
            p = logits[part].to(torch.float32, copy=True).sub_(lse[part, None]).exp_()
            p.scatter_add_(1, targets[part, None], torch.full((p.shape[0], 1), -1.0, device=p.device))
            out[part] = p.mul_(weight[part])
        return out, None, None


def cross_entropy_chunked(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``F.cross_entropy(logits.float(), targets)`` (mean, :data:`IGNORE_INDEX` ignored) for
    ``logits (N, V)`` of any float dtype, in fp32, keeping for the backward only ``logits``
    itself and one fp32 log-sum-exp a row. The whole-tensor form keeps an fp32 log-softmax
    (4·N·V bytes: 8.6 GB at 65k tokens of a 32k vocabulary) and, eagerly, makes fp32 copies of
    the logits and of their gradient. Eagerly (a calibrating recipe's first steps among others)
    this runs a few rows at a time; traced by torch.compile, in one piece for Inductor to fuse.
    Chunks split rows, never a row's reduction: untraced and traced without fusion
    (``aot_eager``), the loss and gradients are the same bits (tests/test_compile.py)."""
    rows = None if torch.compiler.is_compiling() else max(1, CHUNK_BYTES // (4 * logits.shape[-1]))
    return _ChunkedCrossEntropy.apply(logits, targets, rows)


# ---------------------------------------------------------------------------------------------
# Hugging Face interop
# ---------------------------------------------------------------------------------------------

_BOS_NAMES = ("<|begin_of_text|>", "<s>", "<|bos|>", "<bos>", "<|startoftext|>")
_EOS_NAMES = ("<|end_of_text|>", "</s>", "<|eos|>", "<eos>", "<|endoftext|>")


def special_tokens(tokenizer_json: str | Path) -> tuple[str, str]:
    """``(bos, eos)`` token strings of a ``tokenizers`` JSON, found among its special added tokens
    by the usual names; a tokenizer with an end token only (GPT-2 style) uses it for both."""
    added = json.loads(Path(tokenizer_json).read_text()).get("added_tokens", [])
    specials = [t["content"] for t in added if t.get("special")]
    eos = next((s for s in _EOS_NAMES if s in specials), None)
    if eos is None:
        raise ValueError(
            f"{tokenizer_json}: no end-of-text token among the special tokens {specials}; "
            f"expected one of {_EOS_NAMES} (or pass bos_token/eos_token)"
        )
    bos = next((s for s in _BOS_NAMES if s in specials), eos)
    return bos, eos


def hf_config(cfg: LlamaConfig, bos_token_id: int | None, eos_token_id: int | None) -> dict[str, Any]:
    """The ``config.json`` of ``LlamaForCausalLM`` for ``cfg``. RoPE θ is written both ways
    (``rope_parameters`` for transformers 5, top-level ``rope_theta`` for 4.x)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.dim,
        "intermediate_size": cfg.ffn_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": cfg.init_std,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "dtype": "float32",
        "torch_dtype": "float32",
        "use_cache": True,
    }


def hf_state_dict(model: Llama) -> dict[str, torch.Tensor]:
    """Weights under their ``LlamaForCausalLM`` names, contiguous fp32: the layers' extra state
    (calibrated strategies) is not part of a HF checkpoint, and a tied head is stored once."""
    out = {}
    for name, tensor in model.state_dict().items():
        if name.endswith("_extra_state") or (model.config.tie_embeddings and name == "lm_head.weight"):
            continue
        out[name] = tensor.detach().to("cpu", torch.float32).contiguous()
    return out


def export_hf(
    model: Llama,
    tokenizer_json: str | Path,
    out_dir: str | Path,
    bos_token: str | None = None,
    eos_token: str | None = None,
) -> Path:
    """Write ``out_dir`` as a HF ``LlamaForCausalLM`` directory: ``config.json``,
    ``model.safetensors`` (fp32) and the tokenizer (``PreTrainedTokenizerFast`` files with bos/eos
    set; found by :func:`special_tokens` unless given). A converted model exports its weights;
    strategies stay with adahop checkpoints. Returns ``out_dir``.

    Equivalent to ``LlamaForCausalLM(config).save_pretrained`` + ``tokenizer.save_pretrained``.
    """
    from safetensors.torch import save_file
    from transformers import PreTrainedTokenizerFast

    if not isinstance(model, Llama):
        raise TypeError(f"export_hf needs an adahop.harness.model.Llama (unwrap DDP/compile), got {type(model).__name__}")
    tokenizer_json = Path(tokenizer_json)
    if not tokenizer_json.is_file():
        raise ValueError(f"tokenizer file {tokenizer_json} does not exist")
    if bos_token is None or eos_token is None:
        found_bos, found_eos = special_tokens(tokenizer_json)
        bos_token, eos_token = bos_token or found_bos, eos_token or found_eos
    tok = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_json), bos_token=bos_token, eos_token=eos_token,
                                  model_max_length=model.config.max_seq_len)
    if len(tok) > model.config.vocab_size:
        raise ValueError(f"tokenizer has {len(tok)} tokens but the model's vocab_size is {model.config.vocab_size}")

    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    config = hf_config(model.config, tok.bos_token_id, tok.eos_token_id)
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(hf_state_dict(model), str(tmp / "model.safetensors"), metadata={"format": "pt"})
    tok.save_pretrained(str(tmp))
    # transformers 5 names its class TokenizersBackend; the alias loads under 4.x and 5.x alike.
    tok_config = json.loads((tmp / "tokenizer_config.json").read_text())
    tok_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    (tmp / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    # Swap in whole so a reader never sees half an export.
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir


def config_from_hf(config: dict[str, Any]) -> LlamaConfig:
    """Our :class:`LlamaConfig` from a ``LlamaForCausalLM`` ``config.json`` dict."""
    if config.get("model_type") != "llama":
        raise ValueError(f"not a Llama config (model_type={config.get('model_type')!r})")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError(f"RoPE scaling {rope} is not supported; only the default RoPE is")
    unsupported = {k: config.get(k) for k in ("attention_bias", "mlp_bias") if config.get(k)}
    if config.get("hidden_act", "silu") != "silu":
        unsupported["hidden_act"] = config["hidden_act"]
    if unsupported:
        raise ValueError(f"unsupported Llama options: {unsupported}")
    n_heads = config["num_attention_heads"]
    if config.get("head_dim", config["hidden_size"] // n_heads) * n_heads != config["hidden_size"]:
        raise ValueError("head_dim * num_attention_heads != hidden_size is not supported")
    return LlamaConfig(
        vocab_size=config["vocab_size"],
        dim=config["hidden_size"],
        n_layers=config["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=config.get("num_key_value_heads") or n_heads,
        ffn_dim=config["intermediate_size"],
        max_seq_len=config.get("max_position_embeddings", 2048),
        rope_theta=float(rope.get("rope_theta", config.get("rope_theta", 10000.0))),
        norm_eps=config.get("rms_norm_eps", 1e-6),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        init_std=config.get("initializer_range", 0.02),
    )


def load_hf(hf_dir: str | Path, device: torch.device | str = "cpu") -> Llama:
    """A :class:`Llama` (fp32) from a ``LlamaForCausalLM`` directory with one ``model.safetensors``."""
    from safetensors.torch import load_file

    hf_dir = Path(hf_dir)
    weights = hf_dir / "model.safetensors"
    if not (hf_dir / "config.json").is_file() or not weights.is_file():
        raise ValueError(f"{hf_dir} needs config.json and a single model.safetensors")
    cfg = config_from_hf(json.loads((hf_dir / "config.json").read_text()))
    with torch.device("meta"):
        model = Llama(cfg)
    state = load_file(str(weights), device=str(device))
    if cfg.tie_embeddings:
        state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True, assign=True)
    if cfg.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    cos, sin = rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
    model.rope_cos, model.rope_sin = cos.to(device), sin.to(device)
    return model
