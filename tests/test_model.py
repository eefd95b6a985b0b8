"""adahop.harness.model: HF Llama parity, export/load round trip, named sizes, FLOPs formula, input checks."""

import json
import re

from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import adahop.harness.model as model_mod
from adahop.harness.model import (
    MX_BLOCK,
    NOMINAL_PARAMS,
    PRESETS,
    REFERENCE_VOCAB,
    Llama,
    LlamaConfig,
    RMSNorm,
    config_from_hf,
    export_hf,
    load_hf,
    special_tokens,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny ops (tests/conftest.py)

VOCAB = 320


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory):
    """A byte-level BPE with one special end-of-text token, trained on a few sentences."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog", "to be or not to be"] * 20, trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def tiny(**overrides) -> Llama:
    torch.manual_seed(0)
    return Llama(LlamaConfig.from_name("tiny", vocab_size=VOCAB, **overrides))


@pytest.mark.parametrize("tie,kv_heads", [(False, 2), (True, 4)], ids=["untied-gqa", "tied-mha"])
def test_logits_match_hf_llama(tokenizer_json, tmp_path, tie, kv_heads):
    from transformers import LlamaForCausalLM

    model = tiny(tie_embeddings=tie, n_kv_heads=kv_heads, rope_theta=5000.0).eval()
    # Non-trivial norm weights, so a swapped or missing norm cannot hide behind ones.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    export_hf(model, tokenizer_json, tmp_path / "hf")
    hf = LlamaForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32, attn_implementation="sdpa").eval()
    ids = torch.randint(0, VOCAB, (2, 96), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(ids)[0], hf(ids).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert hf.config.tie_word_embeddings == tie and hf.config.num_key_value_heads == kv_heads


def test_load_hf_round_trip_is_exact(tokenizer_json, tmp_path):
    model = tiny(tie_embeddings=True).eval()
    loaded = load_hf(export_hf(model, tokenizer_json, tmp_path / "hf")).eval()
    assert loaded.config == model.config
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    ids = torch.randint(0, VOCAB, (2, 33))
    with torch.no_grad():
        assert torch.equal(loaded(ids)[0], model(ids)[0])


def test_exported_tokenizer_has_bos_eos(tokenizer_json, tmp_path):
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    out = export_hf(tiny(), tokenizer_json, tmp_path / "hf")
    tok = PreTrainedTokenizerFast.from_pretrained(out)
    config = json.loads((out / "config.json").read_text())
    eos_id = Tokenizer.from_file(str(tokenizer_json)).token_to_id("<|endoftext|>")
    assert tok.eos_token == tok.bos_token == "<|endoftext|>"
    assert config["eos_token_id"] == config["bos_token_id"] == tok.eos_token_id == eos_id
    text = "the lazy fox"
    assert tok(text).input_ids == Tokenizer.from_file(str(tokenizer_json)).encode(text).ids


def test_export_refuses_tokenizer_larger_than_vocab(tokenizer_json, tmp_path):
    small = Llama(LlamaConfig.from_name("tiny", vocab_size=128))
    with pytest.raises(ValueError, match="tokenizer has"):
        export_hf(small, tokenizer_json, tmp_path / "hf")


def test_special_tokens_without_eos_is_a_clear_error(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps({"added_tokens": [{"content": "<pad>", "special": True}]}))
    with pytest.raises(ValueError, match="no end-of-text token"):
        special_tokens(path)


def test_config_from_hf_rejects_rope_scaling():
    config = json.loads(json.dumps({"model_type": "llama", "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5}}))
    with pytest.raises(ValueError, match="RoPE scaling"):
        config_from_hf(config)


@pytest.mark.parametrize("name", sorted(NOMINAL_PARAMS))
def test_preset_parameter_count_matches_its_name(name):
    """Counted on the meta device (no memory): total parameters incl. embeddings at 32k vocab."""
    cfg = LlamaConfig.from_name(name, vocab_size=REFERENCE_VOCAB)
    with torch.device("meta"):
        model = Llama(cfg)
    assert model.num_params() == cfg.num_params()
    assert abs(cfg.num_params() / NOMINAL_PARAMS[name] - 1) <= 0.15, f"{name}: {cfg.num_params() / 1e6:.1f}M"


@pytest.mark.parametrize("name, shape, hf_params", [
    # Llama-3.2-1B/-3B (config.json of meta-llama/Llama-3.2-*B): hidden, layers, heads, kv heads, ffn;
    # their published totals at Llama 3's vocabulary of 128256 (tied embeddings counted once).
    ("1b", (2048, 16, 32, 8, 8192), 1_235_814_400),
    ("3b", (3072, 28, 24, 8, 8192), 3_212_749_824),
])
def test_llama_3_2_sizes_have_its_shapes_and_parameter_count(name, shape, hf_params):
    cfg = LlamaConfig.from_name(name, vocab_size=128256)
    assert (cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.ffn_dim) == shape
    assert cfg.tie_embeddings and cfg.rope_theta == 500000.0
    assert cfg.num_params() == hf_params
    # At the reference vocabulary the table shrinks by (128256 - 32768) rows of dim, once (tied).
    ref = LlamaConfig.from_name(name, vocab_size=REFERENCE_VOCAB)
    assert ref.num_params() == hf_params - (128256 - REFERENCE_VOCAB) * cfg.dim
    with torch.device("meta"):
        assert Llama(ref).num_params() == ref.num_params()


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_linear_dims_are_mx_blocks(name):
    with torch.device("meta"):
        model = Llama(LlamaConfig.from_name(name, vocab_size=REFERENCE_VOCAB))
    for mod_name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and mod_name != "lm_head":
            assert mod.in_features % MX_BLOCK == 0 and mod.out_features % MX_BLOCK == 0, mod_name


def test_flops_per_token_matches_flop_counter():
    """6N + 12·L·H·Q·T against torch's FLOP counter with the math SDPA (which computes the full T×T)."""
    model = tiny()
    B, T = 2, 64
    ids = torch.randint(0, VOCAB, (B, T))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(ids, ids)[1].backward()
    assert counter.get_total_flops() == model.config.flops_per_token(T) * B * T


def test_loss_is_next_token_cross_entropy():
    model = tiny()
    ids = torch.randint(0, VOCAB, (3, 20))
    logits, loss = model(ids, ids)
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids.reshape(-1))
    torch.testing.assert_close(loss, expected)
    assert model(ids)[1] is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_cross_entropy_is_f_cross_entropy(dtype, monkeypatch):
    # 8 rows a chunk over 21 rows: two whole chunks and a partial one; two targets ignored.
    monkeypatch.setattr(model_mod, "CHUNK_BYTES", 8 * 4 * 50)
    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(21, 50, generator=g)).to(dtype)
    targets = torch.randint(0, 50, (21,), generator=g)
    targets[[4, 17]] = model_mod.IGNORE_INDEX
    a, b = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    got, want = model_mod.cross_entropy_chunked(a, targets), F.cross_entropy(b.float(), targets)
    (2.5 * got).backward()
    (2.5 * want).backward()
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-6)
    assert a.grad.dtype == dtype and torch.allclose(a.grad.float(), b.grad.float(), rtol=1e-2 if dtype is torch.bfloat16 else 1e-5, atol=1e-7)
    assert (a.grad[[4, 17]] == 0).all()
    assert torch.equal(a.detach(), logits)  # the backward leaves the logits as they were
    every = torch.full((21,), model_mod.IGNORE_INDEX)  # nothing to average: NaN, as F.cross_entropy gives
    assert model_mod.cross_entropy_chunked(logits, every).isnan() and F.cross_entropy(logits.float(), every).isnan()


def test_chunked_cross_entropy_keeps_the_logits_and_a_float_a_row_for_the_backward():
    logits = torch.randn(64, 1000, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, 1000, (64,))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        model_mod.cross_entropy_chunked(logits, targets)
    extra = sum(t.numel() * t.element_size() for t in saved if t.data_ptr() != logits.data_ptr())
    assert extra <= 64 * (4 + 8 + 1) + 8, extra  # log-sum-exp, targets, mask, count
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        F.cross_entropy(logits.float(), targets)  # the whole-tensor form: an fp32 log-softmax
    assert sum(t.numel() * t.element_size() for t in saved) >= 64 * 1000 * 4


def test_eager_block_keeps_no_silu_output_and_computes_as_autograd():
    """An eager block under autocast keeps no silu(gate) for its backward, and computes the same
    bits as the plain ops it replaces."""
    cfg = LlamaConfig(vocab_size=64, dim=64, n_layers=1, n_heads=4, ffn_dim=160, max_seq_len=32)
    torch.manual_seed(0)
    block = model_mod.Block(cfg)
    cos, sin = model_mod.rope_tables(cfg.head_dim, 32, cfg.rope_theta)
    x = torch.randn(2, 32, 64)

    def run(lean: bool):
        saved, grads = [], {}
        inp = x.clone().requires_grad_()
        with mock.patch.object(model_mod, "_eager_with_grad", lambda: lean), torch.autocast("cpu", dtype=torch.bfloat16):
            with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
                out = block(inp, cos[:32], sin[:32])
        out.float().square().sum().backward()
        params = {p.data_ptr() for p in block.parameters()}
        kept = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in saved
                if t.untyped_storage().data_ptr() not in params}
        grads = {n: p.grad.clone() for n, p in block.named_parameters()}
        block.zero_grad(set_to_none=True)
        return out, inp.grad, grads, sum(kept.values())

    lean, plain = run(True), run(False)
    assert torch.equal(lean[0], plain[0]) and torch.equal(lean[1], plain[1])
    assert lean[2].keys() == plain[2].keys() and all(torch.equal(lean[2][n], plain[2][n]) for n in lean[2])
    tokens = 2 * 32
    assert plain[3] - lean[3] == tokens * cfg.ffn_dim * 2  # silu(gate), bf16


def test_compiled_loss_makes_no_fp32_copy_of_the_logits():
    # Inductor fuses the traced form: its buffers as large as the logits are the bf16 gradient only.
    from torch._inductor.utils import run_and_get_code

    logits = torch.randn(64, 1024, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, 1024, (64,))

    def step(x):
        loss = model_mod.cross_entropy_chunked(x, targets)
        loss.backward()
        return loss

    torch._dynamo.reset()
    _, codes = run_and_get_code(torch.compile(step), logits)
    big = [b for code in codes for b in re.findall(r"empty_strided_\w+\(\((\d+), (\d+)\), \([^)]*\), torch\.(\w+)\)", code)
           if b[:2] == ("64", "1024")]
    assert big == [("64", "1024", "bfloat16")], big


def test_eager_and_compiled_losses_agree():
    model = tiny()
    ids = torch.randint(0, VOCAB, (2, 16))
    eager = model(ids, ids)[1]
    compiled = torch.compile(model, backend="aot_eager")(ids, ids)[1]
    assert torch.allclose(eager, compiled, rtol=1e-6)


def test_bf16_autocast_forward_runs_and_is_close():
    model = tiny().eval()
    ids = torch.randint(0, VOCAB, (2, 32))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        low = model(ids)[0]
    with torch.no_grad():
        full = model(ids)[0]
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), full, rtol=0.05, atol=0.05)


@pytest.mark.parametrize(
    "overrides,match",
    [
        (dict(dim=130), "divisible by n_heads"),
        (dict(dim=144, n_heads=3, n_kv_heads=3), "multiple of 32"),
        (dict(ffn_dim=350), "multiple of 32"),
        (dict(n_kv_heads=3), "multiple of n_kv_heads"),
        (dict(n_layers=0), "positive int"),
    ],
    ids=["dim-heads", "dim-block", "ffn-block", "kv-heads", "layers"],
)
def test_config_rejects_bad_shapes(overrides, match):
    with pytest.raises(ValueError, match=match):
        LlamaConfig.from_name("tiny", vocab_size=VOCAB, **overrides)


def test_unknown_size_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown model size"):
        LlamaConfig.from_name("7b", vocab_size=VOCAB)


def test_forward_rejects_bad_inputs():
    model = tiny()
    with pytest.raises(ValueError, match="max_seq_len"):
        model(torch.zeros(1, model.config.max_seq_len + 1, dtype=torch.long))
    with pytest.raises(ValueError, match="int64"):
        model(torch.zeros(1, 8))
    with pytest.raises(ValueError, match="targets"):
        model(torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 7, dtype=torch.long))


def test_rmsnorm_under_autocast_gives_what_the_linear_would_cast_to():
    norm = RMSNorm(64, 1e-5)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(4, 64)
    plain = norm(x)
    assert plain.dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = norm(x)
    assert cast.dtype == torch.bfloat16
    assert torch.equal(cast, plain.to(torch.bfloat16))
