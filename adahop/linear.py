"""The quantized linear layer: one autograd Function, three GEMMs, a strategy per GEMM.

``QuantLinear`` (alias ``AdaHOPLinear``) replaces ``nn.Linear`` under any recipe of
:mod:`adahop.recipes`. Its three GEMMs (``fwd`` Y = X·Wᵀ, ``dgrad`` dX = dY·W, ``wgrad``
dW = dYᵀ·X) each run one :class:`~adahop.policy.Strategy` through :func:`strategy_mm`:

* ``bf16``: the unquantized product in the compute dtype. For ``wgrad`` that is dY in BF16
  against X dequantized from its saved MXFP4 copy (plain, no transform): X is never saved in BF16.
* ``mxfp4`` / ``iht``: both operands quantized along the inner dimension (after a block-Hadamard
  transform for ``iht``), product in fp32, output in the compute dtype.
* ``iht+oe-left`` / ``iht+oe-right``: ``iht``, then the ``k`` rows of A (left) or of Bᵀ (right)
  with the largest absmax are recomputed in BF16 and written over their rows/columns of the
  output. Rows are quantized independently along K, so computing the full IHT product and
  overwriting is exactly "quantize the remainder" without a gather. ``wgrad`` OE-left runs as IHT
  (X is only in MXFP4; :func:`adahop.policy.effective_strategy`).

Saved for backward (counted by :class:`SavedTensorMeter`): X quantized along tokens (Xᵀ, the
``wgrad`` operand) and W quantized along ``out`` (Wᵀ, the ``dgrad`` operand), codes + scales only,
4.25 bits per value; plus ``(k, ·)`` BF16 outlier slices for OE-right, W as the forward got it (the
parameter, or autocast's bf16 cast) when ``dgrad`` is ``bf16`` or OE-left, X as it came (in place
of its MXFP4 copy) when ``wgrad`` is ``bf16`` under ``recipe.bf16_wgrad_input = "bf16"``, and during ``measured``
calibration a BF16 sample of ``measure_tokens`` rows of X. With ``recipe.weight_for_backward =
"param"`` nothing of W is saved: the backward quantizes it again from the parameter (one more read
of W; the same values, since the draw's seed is the forward's). Sibling layers reading one input
(q/k/v, gate/up) whose specs for X give the same result share one quantization and one saved copy
of X (:class:`SharedInputQuantization`), as a fused projection would.

Rounding: forward operands RNE; grad_output by ``recipe.grad_rounding`` (SR by default); the saved
copies by ``recipe.saved_rounding``. Every SR draw and random-sign vector has its own seed derived
from (run seed, layer id, optimizer step, forward call within the step, GEMM, operand), so runs are
reproducible and no two draws share a seed.

Shapes: ``in_features`` and ``out_features`` must be multiples of ``max(32, hadamard_size)``
(the constructor raises ValueError; :func:`convert` keeps such layers as ``nn.Linear`` in BF16 and
warns). Inputs ``(..., in)`` are flattened to tokens; a token count that is not a multiple of it
is zero-padded inside the layer (zero rows change neither the output rows nor dW).

Autocast: under ``torch.autocast`` the layer casts X, W and bias to the autocast dtype (as
``F.linear`` would) and runs with autocast off; outside it, X and W must share a dtype.
"""

from __future__ import annotations

import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from adahop import ops
from adahop.formats import MXFP4Tensor
from adahop.hadamard import random_signs
from adahop.policy import (
    MEASURED_CANDIDATES,
    SLOTS,
    Calibration,
    Strategy,
    decide,
    effective_strategy,
    parse_strategy,
    pattern_pairs,
    strategies_from_dict,
    strategies_to_dict,
)
from adahop.recipes import Recipe, get_recipe, recipe_from_dict

EXTRA_STATE_VERSION = 1


# ---------------------------------------------------------------------------------------------
# Seams to adahop.ops


def _mm(a: MXFP4Tensor, b: MXFP4Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """A·Bᵀ of two MXFP4 operands (fp32 accumulation), on the device's GEMM path."""
    return ops.mxfp4_mm(a, b, out_dtype)


def _emit_fp8(device: torch.device) -> bool:
    """Whether freshly quantized GEMM operands should carry the FP8 re-encoding (Hopper path)."""
    return ops.gemm_path(device) is ops.GemmPath.FP8_ROWWISE


def _signs(spec: QuantSpec, n: int, device: torch.device) -> torch.Tensor | None:
    """The spec's ±1 vector, computed on ``device`` (the same values on every device)."""
    if not (spec.hadamard and spec.signs_seed is not None):
        return None
    return random_signs(n, spec.signs_seed, device=device)


def _quantize_dual(
    t: torch.Tensor,
    along_last: QuantSpec | None,
    along_first: QuantSpec | None,
    emit_fp8: bool,
    emit_fp8_first: bool = False,
) -> tuple[MXFP4Tensor | None, MXFP4Tensor | None]:
    """``t (M, K)`` quantized along K and along M (returned ``(K, M)``); either spec may be None.

    ``emit_fp8`` / ``emit_fp8_first`` ask for the FP8 re-encoding of each copy: the forward asks it
    only for its GEMM operand, so the copy kept for backward stays at 4.25 bits. When both are
    wanted with one rounding, one :func:`ops.hadamard_quantize_dual` reads ``t`` once; its two
    orientations then draw SR from one seed (``along_last.seed``), as the fused kernel does.
    """
    if along_last is None or along_first is None or (along_last.rounding, along_last.hadamard_size) != (
        along_first.rounding, along_first.hadamard_size
    ):
        q_last = quantize(t, along_last, emit_fp8=emit_fp8) if along_last is not None else None
        q_first = quantize(t, along_first, True, emit_fp8_first) if along_first is not None else None
        return q_last, q_first
    return ops.hadamard_quantize_dual(
        t, hadamard=along_last.hadamard, hadamard_t=along_first.hadamard, hadamard_size=along_last.hadamard_size,
        signs=_signs(along_last, t.shape[1], t.device), signs_t=_signs(along_first, t.shape[0], t.device),
        rounding=along_last.rounding, seed=along_last.draw_seed,
        emit_fp8=emit_fp8, emit_fp8_t=emit_fp8_first,
    )


def _spec_key(spec: "QuantSpec | None") -> tuple | None:
    """What a quantization's result depends on: the SR seed only when it rounds stochastically."""
    if spec is None:
        return None
    return spec.hadamard, spec.rounding, spec.draw_seed, spec.signs_seed, spec.hadamard_size


class _LastInputCache:
    """What was computed from the last forward input, kept for the sibling layers that read the same
    tensor (the norm's output feeds q/k/v and gate/up): same storage, offset, shape, strides, dtype
    and in-place version, and the same ``extra`` key (what else the result depends on). The last
    input is held, so its memory cannot be reused under a matching key, until the next input
    replaces it or a backward starts (:meth:`clear`). ``enabled = False`` (per subclass) turns it off."""

    enabled = True

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.src: torch.Tensor | None = None
        self.out: Any = None

    def cached(self, x: torch.Tensor, extra: tuple, compute: Callable[[], Any]) -> Any:
        if not self.enabled:
            return compute()
        key = (x.untyped_storage().data_ptr(), x.storage_offset(), tuple(x.shape), x.stride(), x.dtype, x.device,
               x._version, *extra)
        if key != self.key:  # self.src holds the keyed storage, so a match is that very tensor
            self.clear()  # drop the old result before making the new one
            self.out = compute()
            self.key, self.src = key, x
        return self.out

    def clear(self) -> None:
        self.key = self.src = self.out = None


class SharedInputQuantization(_LastInputCache):
    """Quantize a forward input once for the sibling layers that read it (q/k/v, gate/up): with
    specs that give the same result (:func:`_spec_key`) the next layer gets the copies already made:
    the same values, one read of X instead of three, and one saved MXFP4 copy of X for backward
    instead of three, as a fused QKV projection would have."""

    def quantize(
        self, x: torch.Tensor, along_last: "QuantSpec | None", along_first: "QuantSpec | None", emit_fp8: bool
    ) -> tuple[MXFP4Tensor | None, MXFP4Tensor | None]:
        return self.cached(x, (_spec_key(along_last), _spec_key(along_first), emit_fp8),
                           lambda: _quantize_dual(x, along_last, along_first, emit_fp8))


shared_input = SharedInputQuantization()


class SharedInputLabel(_LastInputCache):
    """Label a forward input's outlier pattern once for the sibling layers that read it, while they
    calibrate: the same tensor and the same detector give the same label, so q/k/v and gate/up
    detect their input once instead of three and two times (the detector's medians dominate a
    calibrating step)."""

    def __call__(self, detector: Callable[[torch.Tensor], str], x: torch.Tensor) -> str:
        return self.cached(x, (detector,), lambda: detector(x))


shared_label = SharedInputLabel()


# ---------------------------------------------------------------------------------------------
# Seeds and quantization specs


_MASK64 = (1 << 64) - 1
SLOT_CODES = {"fwd": 1, "dgrad": 2, "wgrad": 3}
SIGNS, LEFT, RIGHT = 0, 1, 2


def _splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def derive_seed(*parts: int) -> int:
    """A 31-bit seed mixed from integers (splitmix64 chain): neighbours give unrelated seeds.

    31 bits fit every seed range the backends take (torch generators, the Triton kernels).
    """
    h = 0
    for p in parts:
        h = _splitmix64(h ^ (int(p) & _MASK64))
    return h & 0x7FFFFFFF


@dataclass(frozen=True)
class QuantSpec:
    """How one operand is quantized along its inner dimension.

    hadamard: block-Hadamard transform of ``hadamard_size`` first. rounding: ``"rne"``/``"sr"``.
    seed: the SR draw's seed. signs_seed: draw ±1 signs from it before the transform (both
    operands of a GEMM get the same one, so the product is unchanged).
    """

    hadamard: bool
    rounding: str = "rne"
    seed: int | None = None
    signs_seed: int | None = None
    hadamard_size: int = 32

    @property
    def draw_seed(self) -> int | None:
        """The seed the quantization draws from: ``seed`` under SR, None for RNE (it draws nothing)."""
        return self.seed if self.rounding == "sr" else None


def quantize(
    t: torch.Tensor, spec: QuantSpec, transpose: bool = False, emit_fp8: bool = False
) -> MXFP4Tensor:
    """``t`` (or ``t.T``) quantized along its last dimension per ``spec``, through :mod:`adahop.ops`.

    Equivalent to ``ops.hadamard_quantize(t, transpose=..., ...)`` with the spec's fields.
    """
    signs = _signs(spec, t.shape[0] if transpose else t.shape[1], t.device)
    return ops.hadamard_quantize(
        t, transpose=transpose, hadamard=spec.hadamard, hadamard_size=spec.hadamard_size, signs=signs,
        rounding=spec.rounding, seed=spec.draw_seed, emit_fp8=emit_fp8,
    )


def slot_specs(
    recipe: Recipe, slot: str, strategy: Strategy, call: tuple[int, ...]
) -> tuple[QuantSpec | None, QuantSpec | None]:
    """Quantization of A and Bᵀ for ``slot`` under ``strategy``; ``call`` seeds the draws.

    A ``bf16`` ``wgrad`` still quantizes X (plain MXFP4): that is the copy the forward saves, unless
    the recipe's ``bf16_wgrad_input`` is ``"bf16"`` (X saved as it is).
    """
    code = SLOT_CODES[slot]
    b_rounding = "rne" if slot == "fwd" else recipe.saved_rounding
    if not strategy.quantized:
        if slot != "wgrad" or recipe.bf16_wgrad_input == "bf16":
            return None, None
        return None, QuantSpec(False, b_rounding, derive_seed(*call, code, RIGHT), None, recipe.hadamard_size)
    a_rounding = "rne" if slot == "fwd" else recipe.grad_rounding
    signs = derive_seed(*call, code, SIGNS) if strategy.hadamard and slot in recipe.random_signs else None
    return (
        QuantSpec(strategy.hadamard, a_rounding, derive_seed(*call, code, LEFT), signs, recipe.hadamard_size),
        QuantSpec(strategy.hadamard, b_rounding, derive_seed(*call, code, RIGHT), signs, recipe.hadamard_size),
    )


# ---------------------------------------------------------------------------------------------
# One GEMM under a strategy


@dataclass
class Operand:
    """A GEMM operand ``(rows, K)``: ``src`` (or ``src.T`` when ``transpose``), what is kept of it.

    src: the high-precision tensor as stored, or None when only MXFP4 is kept.
    spec: how to quantize ``src`` when ``q`` is not given. q: already quantized along K.
    outliers: precomputed ``(indices (k,), rows (k, K))`` in high precision, for operands whose
        full copy is not kept (OE-right on ``dgrad``/``wgrad``).
    """

    src: torch.Tensor | None
    spec: QuantSpec | None = None
    transpose: bool = False
    q: MXFP4Tensor | None = None
    outliers: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def full(self) -> torch.Tensor:
        if self.src is None:
            raise RuntimeError("this operand is kept only in MXFP4; its strategy needs it in full precision")
        return self.src.t() if self.transpose else self.src

    def quantized(self, emit_fp8: bool = False) -> MXFP4Tensor:
        if self.q is None:
            if self.spec is None:
                raise RuntimeError("operand has neither a quantized copy nor a quantization spec")
            self.q = quantize(self.src, self.spec, self.transpose, emit_fp8)
        return self.q

    def outlier_rows(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.outliers is not None:
            return self.outliers
        return top_rows(self.full, k)


def top_rows(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices and BF16 copies of the ``min(k, rows)`` rows of ``x (rows, K)`` with the largest absmax.

    Equivalent to :func:`ops.extract_outliers` with ``k`` clamped to the row count.
    """
    return ops.extract_outliers(x, min(k, x.shape[0]))


def strategy_mm(
    strategy: Strategy,
    a: Operand,
    b: Operand,
    *,
    k: int = 64,
    out_dtype: torch.dtype | None = None,
    emit_fp8: bool = False,
) -> torch.Tensor:
    """``A · Bᵀ`` for A ``(M, K)`` and Bᵀ ``(N, K)`` under ``strategy``; returns ``(M, N)``.

    ``out_dtype`` defaults to the dtype of ``a``'s source. OE strategies recompute ``min(k, ·)``
    rows from BF16 copies of the outlier rows against the other operand in its own precision. Equivalent to ``a.full @ b.full.T`` up to the strategy's
    quantization error.
    """
    out_dtype = out_dtype or (a.src.dtype if a.src is not None else torch.float32)
    if not strategy.quantized:
        return (a.full @ b.full.t()).to(out_dtype)
    out = _mm(a.quantized(emit_fp8), b.quantized(emit_fp8), out_dtype)
    if strategy is Strategy.IHT_OE_LEFT:
        idx, rows = a.outlier_rows(k)
        other = b.full
        out.index_copy_(0, idx, (rows.to(other.dtype) @ other.t()).to(out_dtype))
    elif strategy is Strategy.IHT_OE_RIGHT:
        idx, rows = b.outlier_rows(k)
        other = a.full
        out.index_copy_(1, idx, (other @ rows.to(other.dtype).t()).to(out_dtype))
    return out


def _squared_errors(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    return (out.to(ref.dtype) - ref).square().sum().item(), ref.square().sum().item()


def score_strategies(
    recipe: Recipe, slot: str, a: Operand, b: Operand, call: tuple[int, ...]
) -> dict[Strategy, tuple[float, float]]:
    """``(squared error, squared reference)`` of every measured-policy candidate on one GEMM.

    ``a`` and ``b`` must hold full-precision sources; the reference is their product in fp64 on
    CPU (fp32 on GPU, far below MXFP4 error).
    """
    ref_dtype = torch.float64 if a.full.device.type == "cpu" else torch.float32
    ref = a.full.to(ref_dtype) @ b.full.to(ref_dtype).t()
    scores = {}
    for cand in MEASURED_CANDIDATES[slot]:
        spec_a, spec_b = slot_specs(recipe, slot, cand, call)
        ca = Operand(a.src, spec_a, a.transpose)
        cb = Operand(b.src, spec_b, b.transpose)
        scores[cand] = _squared_errors(strategy_mm(cand, ca, cb, k=recipe.outlier_k), ref)
    return scores


# ---------------------------------------------------------------------------------------------
# The autograd Function


@dataclass
class CallPlan:
    """Everything one forward call needs besides its tensors (built by :class:`QuantLinear`)."""

    strategies: dict[str, Strategy]
    specs: dict[str, tuple[QuantSpec | None, QuantSpec | None]]
    k: int
    need_backward: bool
    emit_fp8: bool
    layer: "QuantLinear | None" = None  # set while calibrating: receives grad_output observations
    sample_idx: torch.Tensor | None = None  # tokens of X kept in BF16 for measured calibration
    weight: nn.Parameter | None = None  # weight_for_backward="param": the backward re-reads W here
    call: tuple[int, ...] = field(default_factory=tuple)
    tokens: int = 0  # unpadded token count (what calibration labels)


def _mx_fields(t: MXFP4Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    return (None, None) if t is None else (t.codes, t.scales)


def _mx(codes: torch.Tensor | None, scales: torch.Tensor | None) -> MXFP4Tensor | None:
    return None if codes is None else MXFP4Tensor(codes, scales)


def _pair(idx: torch.Tensor | None, rows: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor] | None:
    return None if idx is None else (idx, rows)


class QuantLinearFunction(torch.autograd.Function):
    """Y = X·Wᵀ + b with the three GEMMs of ``plan``. X ``(T, in)``, T a multiple of 32."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, plan: CallPlan) -> torch.Tensor:
        s, k = plan.strategies, plan.k
        fwd_a, fwd_b = plan.specs["fwd"]
        keep_x = plan.specs["wgrad"][1] if plan.need_backward else None
        keep_w = plan.specs["dgrad"][1] if plan.need_backward and plan.weight is None else None
        xq, xq_t = shared_input.quantize(x, fwd_a, keep_x, plan.emit_fp8)
        wq, wq_t = _quantize_dual(w, fwd_b, keep_w, plan.emit_fp8)
        y = strategy_mm(s["fwd"], Operand(x, q=xq), Operand(w, q=wq), k=k, out_dtype=x.dtype, emit_fp8=plan.emit_fp8)
        if bias is not None:
            y += bias
        if not plan.need_backward:
            return y
        x_out = top_rows(x.t(), k) if s["wgrad"] is Strategy.IHT_OE_RIGHT else (None, None)
        w_out = top_rows(w.t(), k) if s["dgrad"] is Strategy.IHT_OE_RIGHT else (None, None)
        measuring = plan.layer is not None and plan.sample_idx is not None
        # W as given (the parameter, or autocast's cast of it), only where W is needed in full precision;
        # with weight_for_backward="param" the backward takes it from the parameter instead.
        needs_w = s["dgrad"] in (Strategy.BF16, Strategy.IHT_OE_LEFT) or measuring
        w_full = w if needs_w and plan.weight is None else None
        # A BF16 wgrad without a spec for X (bf16_wgrad_input="bf16") reads X as it is.
        x_full = x if s["wgrad"] is Strategy.BF16 and keep_x is None else None
        x_sample = x[plan.sample_idx] if measuring else None
        ctx.save_for_backward(
            *_mx_fields(xq_t), *_mx_fields(wq_t), w_full, x_full, *x_out, *w_out, plan.sample_idx, x_sample
        )
        ctx.plan, ctx.w_dtype, ctx.device_type = plan, w.dtype, x.device.type
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx, gy: torch.Tensor):
        plan = ctx.plan
        s, k = plan.strategies, plan.k
        shared_input.clear()  # the forward is over: its last input need not outlive it
        shared_label.clear()
        xc, xs, wc, ws, w_full, x_full, xo_idx, xo_rows, wo_idx, wo_rows, sample_idx, x_sample = ctx.saved_tensors
        g = gy.contiguous()
        if plan.weight is not None:  # weight_for_backward="param": W again, in the forward's dtype
            w_full = plan.weight.detach().to(ctx.w_dtype)
        dx = dw = db = None
        with torch.autocast(ctx.device_type, enabled=False):
            # dY along `out` (dgrad) and along tokens (wgrad), one read where both are quantized.
            spec_d = plan.specs["dgrad"][0] if ctx.needs_input_grad[0] else None
            spec_w = plan.specs["wgrad"][0] if ctx.needs_input_grad[1] else None
            gq, gq_t = _quantize_dual(g, spec_d, spec_w, plan.emit_fp8, plan.emit_fp8)
            if ctx.needs_input_grad[0]:
                a = Operand(g, q=gq)
                b = Operand(w_full, plan.specs["dgrad"][1], transpose=True, q=_mx(wc, ws),
                            outliers=_pair(wo_idx, wo_rows))
                dx = strategy_mm(s["dgrad"], a, b, k=k, out_dtype=g.dtype, emit_fp8=plan.emit_fp8)
            if ctx.needs_input_grad[1]:
                a = Operand(g, transpose=True, q=gq_t)
                if x_full is not None:  # (tokens, in), read along tokens
                    b = Operand(x_full, transpose=True)
                else:
                    xq_t = _mx(xc, xs)
                    x_src = ops.dequantize(xq_t, g.dtype) if s["wgrad"] is Strategy.BF16 else None
                    b = Operand(x_src, q=xq_t, outliers=_pair(xo_idx, xo_rows))
                dw = strategy_mm(s["wgrad"], a, b, k=k, out_dtype=ctx.w_dtype, emit_fp8=plan.emit_fp8)
            if ctx.has_bias and ctx.needs_input_grad[2]:
                db = g.sum(0, dtype=torch.float32).to(g.dtype)
            if plan.layer is not None:
                plan.layer._observe_backward(g, w_full, sample_idx, x_sample, plan)
        return dx, dw, db, None


# ---------------------------------------------------------------------------------------------
# The module


class QuantLinear(nn.Linear):
    """``nn.Linear`` whose fwd, dgrad and wgrad GEMMs run under a recipe (see the module docstring).

    in_features, out_features: multiples of ``max(32, recipe.hadamard_size)``.
    recipe: a registry name or :class:`~adahop.recipes.Recipe`; ``overrides`` replace its fields.
    layer_id: index of this layer in its model (part of every seed; :func:`convert` assigns it).

    State (kept in ``state_dict`` through ``get_extra_state``): optimizer ``step``, ``phase``
    (``calibrating`` or ``fixed``), the :class:`~adahop.policy.Calibration` votes/errors and the
    fixed strategies. Call :meth:`on_optimizer_step` after every optimizer step.
    Equivalent to ``nn.Linear`` up to the recipe's quantization error.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        recipe: str | Recipe = "adahop",
        layer_id: int = 0,
        device: Any = None,
        dtype: torch.dtype | None = None,
        **overrides: Any,
    ) -> None:
        recipe = get_recipe(recipe, **overrides)
        if not recipe.swaps_linear:
            raise ValueError(f"recipe {recipe.name!r} runs every GEMM in BF16: use nn.Linear")
        m = recipe.dim_multiple
        if in_features % m or out_features % m:
            raise ValueError(
                f"QuantLinear({in_features}, {out_features}): in and out features must be multiples of {m} "
                f"(MX blocks of 32 and Hadamard blocks of {recipe.hadamard_size}); keep this layer as nn.Linear"
            )
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.recipe = recipe
        self.layer_id = layer_id
        self.step = 0
        self.micro = 0
        self.calibration = Calibration()  # the votes (and errors) behind the current strategies
        self.recalibration: Calibration | None = None  # those being gathered while recalibrating
        self.fixed_at: list[dict[str, Any]] = []  # every (re)fix: step and strategies
        if recipe.policy is None:
            self.phase, self.strategies = "fixed", dict(recipe.fixed_strategies)
        else:
            self.phase, self.strategies = "calibrating", None
        self.register_load_state_dict_pre_hook(_warn_if_state_missing)

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe: str | Recipe, layer_id: int = 0, **overrides: Any) -> "QuantLinear":
        """A QuantLinear sharing ``linear``'s weight and bias parameters (no copy)."""
        new = cls(linear.in_features, linear.out_features, linear.bias is not None,
                  recipe=recipe, layer_id=layer_id, device="meta", **overrides)
        new.weight = linear.weight
        new.bias = linear.bias
        new.train(linear.training)
        return new

    # -- what runs now

    @property
    def active_strategies(self) -> dict[str, Strategy]:
        if self.phase == "calibrating":
            return {slot: effective_strategy(slot, self.recipe.calibration_strategy) for slot in SLOTS}
        return self.strategies

    def _plan(self, tokens: int, need_backward: bool, calibrating: bool, device: torch.device) -> CallPlan:
        call = (self.recipe.seed, self.layer_id, self.step, self.micro)
        strategies = self.active_strategies
        plan = CallPlan(
            strategies=strategies,
            specs={slot: slot_specs(self.recipe, slot, strategies[slot], call) for slot in SLOTS},
            k=self.recipe.outlier_k,
            need_backward=need_backward,
            emit_fp8=_emit_fp8(device),
            call=call,
            weight=self.weight if self.recipe.weight_for_backward == "param" else None,
        )
        if calibrating:
            plan.layer = self
            if self.recipe.policy == "measured":
                n = min(self.recipe.measure_tokens, tokens)
                gen = torch.Generator().manual_seed(derive_seed(*call, 0xCA11))
                plan.sample_idx = torch.randperm(tokens, generator=gen)[:n].sort().values.to(device)
        return plan

    # Dynamo would guard on the Python counters that seed every call (step, micro) and on the
    # calibration state, recompiling each step until it gives up; the layer's work is already in
    # fused kernels, so it runs eagerly while torch.compile handles the rest of the model.
    @torch.compiler.disable
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"QuantLinear takes a torch.Tensor, got {type(x).__name__}")
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"input of shape {tuple(x.shape)} does not end in in_features={self.in_features}")
        w, b = self.weight, self.bias
        device_type = x.device.type
        if torch.is_autocast_enabled(device_type):
            dt = torch.get_autocast_dtype(device_type)
            x, w = x.to(dt), w.to(dt)
            b = b.to(dt) if b is not None else None
        elif x.dtype != w.dtype:
            raise ValueError(f"input dtype {x.dtype} differs from weight dtype {w.dtype}; cast one or use torch.autocast")
        lead = x.shape[:-1]
        x2d = x.reshape(-1, self.in_features).contiguous()
        tokens = x2d.shape[0]
        need_backward = torch.is_grad_enabled() and (x2d.requires_grad or w.requires_grad)
        calibrating = self.phase in ("calibrating", "recalibrating") and self.training and need_backward
        pad = (-tokens) % self.recipe.dim_multiple
        xp = F.pad(x2d, (0, 0, 0, pad)) if pad else x2d
        plan = self._plan(xp.shape[0], need_backward, calibrating, x.device)
        if calibrating:
            self._observe_forward(x2d, w, xp, plan)
        if need_backward:
            self.micro += 1
        with torch.autocast(device_type, enabled=False):
            y = QuantLinearFunction.apply(xp, w, b, plan)
        # Slice only when padded: a no-op slice still costs a zero-filled gradient and a copy in backward.
        return (y[:tokens] if pad else y).reshape(*lead, self.out_features)

    # -- calibration

    @property
    def _collecting(self) -> Calibration:
        """The calibration this step's observations go to."""
        return self.recalibration if self.phase == "recalibrating" else self.calibration

    def _observe_forward(self, x: torch.Tensor, w: torch.Tensor, xp: torch.Tensor, plan: CallPlan) -> None:
        detect = self.recipe.detector
        with torch.no_grad():
            self._collecting.vote("x", shared_label(detect, x))
            self._collecting.vote("w", detect(w))
            if plan.sample_idx is not None:
                self._collecting.add_errors(
                    "fwd", score_strategies(self.recipe, "fwd", Operand(xp), Operand(w), plan.call))
        plan.tokens = x.shape[0]

    def _observe_backward(self, g, w_full, sample_idx, x_sample, plan: CallPlan) -> None:
        with torch.no_grad():
            self._collecting.vote("g", self.recipe.detector(g[: plan.tokens]))
            if sample_idx is not None:
                self._collecting.add_errors(
                    "dgrad", score_strategies(self.recipe, "dgrad", Operand(g), Operand(w_full, transpose=True), plan.call))
                self._collecting.add_errors(
                    "wgrad", score_strategies(self.recipe, "wgrad", Operand(g[sample_idx], transpose=True),
                                              Operand(x_sample, transpose=True), plan.call))

    def on_optimizer_step(self) -> None:
        """Advance the step counter (seeds); end calibration after ``calibration_steps`` steps; with
        ``recalibration_interval`` I, observe again from each step C + k·I (k ≥ 1) for C steps."""
        self.step += 1
        self.micro = 0
        c, interval = self.recipe.calibration_steps, self.recipe.recalibration_interval
        since = self.step - c
        if self.phase == "calibrating" and self.step >= c:
            self.finish_calibration()
        elif self.phase == "fixed" and interval and since > 0 and since % interval == 0:
            self.phase, self.recalibration = "recalibrating", Calibration()
        elif self.phase == "recalibrating" and since % interval >= c:
            self.calibration, self.recalibration = self.recalibration, None
            self.finish_calibration()

    def finish_calibration(self) -> None:
        """Fix the strategies from the votes/errors gathered so far (summed over DDP ranks)."""
        self.calibration.all_reduce()
        self.strategies = decide(self.recipe.policy, self.calibration, self.recipe.table,
                                 f"layer {self.layer_id}", self.recipe.measured_margin)
        self.phase = "fixed"
        self.fixed_at.append({"step": self.step, "strategies": strategies_to_dict(self.strategies)})

    def checked_map(self, strategies: Mapping[str, Strategy | str]) -> dict[str, Strategy]:
        """``strategies`` (slot → strategy) parsed, or a ValueError saying why this layer cannot take it."""
        if self.recipe.policy is None:
            raise ValueError(f"layer {self.layer_id}: recipe {self.recipe.name!r} has fixed strategies; "
                             "only a policy recipe (adahop, ...) takes a strategy map")
        if not isinstance(strategies, Mapping) or set(strategies) != set(SLOTS):
            got = sorted(strategies) if isinstance(strategies, Mapping) else type(strategies).__name__
            raise ValueError(f"layer {self.layer_id}: a strategy map names the slots {list(SLOTS)}, got {got}")
        return {slot: parse_strategy(strategies[slot]) for slot in SLOTS}

    def fix(self, strategies: Mapping[str, Strategy | str]) -> None:
        """Fix this layer's strategies to ``strategies`` (slot → strategy), ending or skipping its
        calibration: e.g. to reuse the map a calibrated run fixed (``export_strategies``) for a run,
        a measurement or a fine-tune. Only for policy recipes (a fixed recipe's strategies are the
        recipe); a recalibrating recipe still recalibrates on its schedule."""
        self.strategies = self.checked_map(strategies)
        self.phase, self.recalibration = "fixed", None
        self.fixed_at.append({"step": self.step, "strategies": strategies_to_dict(self.strategies), "from": "map"})

    # -- state

    def export(self) -> dict[str, Any]:
        """The layer's labels, pattern pairs and strategies as JSON-ready data."""
        out: dict[str, Any] = {
            "recipe": self.recipe.name,
            "layer_id": self.layer_id,
            "phase": self.phase,
            "step": self.step,
            "shape": [self.out_features, self.in_features],
            "strategies": strategies_to_dict(self.strategies) if self.strategies else None,
        }
        if self.recipe.policy is not None:
            labels = self.calibration.labels()
            # Labels and pairs are the calibration's: none while it runs, none for a map fixed from outside.
            labelled = self.phase != "calibrating" and not (self.fixed_at and self.fixed_at[-1].get("from") == "map")
            out.update(
                policy=self.recipe.policy,
                calibration_steps=self.recipe.calibration_steps,
                labels=labels if labelled else None,
                votes=self.calibration.to_dict()["votes"],
                pairs={s: "-".join(p) for s, p in pattern_pairs(labels).items()} if labelled else None,
                relative_errors=self.calibration.relative_errors() or None,
            )
            if self.recipe.recalibration_interval:
                out["fixed_at"] = list(self.fixed_at)
        return out

    def get_extra_state(self) -> dict[str, Any]:
        return {
            "version": EXTRA_STATE_VERSION,
            "recipe": self.recipe.to_dict(),
            "layer_id": self.layer_id,
            "step": self.step,
            "phase": self.phase,
            "strategies": strategies_to_dict(self.strategies) if self.strategies else None,
            "calibration": self.calibration.to_dict(),
            "recalibration": self.recalibration.to_dict() if self.recalibration is not None else None,
            "fixed_at": list(self.fixed_at),
        }

    def set_extra_state(self, state: Any) -> None:
        if not isinstance(state, dict) or state.get("version") != EXTRA_STATE_VERSION:
            raise ValueError(f"QuantLinear state has an unknown format (expected version {EXTRA_STATE_VERSION})")
        saved = recipe_from_dict(state["recipe"]).to_dict()
        mine = self.recipe.to_dict()
        diff = sorted(key for key in mine if mine[key] != saved.get(key))
        if diff:
            raise ValueError(
                f"checkpoint layer was trained with recipe {saved['name']!r} differing in {diff} from this "
                f"layer's {mine['name']!r}; convert the model with the same recipe and overrides"
            )
        if state["phase"] not in ("calibrating", "fixed", "recalibrating"):
            raise ValueError(f"unknown phase {state['phase']!r} in QuantLinear state")
        self.layer_id, self.step, self.micro, self.phase = int(state["layer_id"]), int(state["step"]), 0, state["phase"]
        self.strategies = strategies_from_dict(state["strategies"]) if state["strategies"] else None
        self.calibration = Calibration.from_dict(state["calibration"])
        # (states from before recalibration existed lack the last two keys)
        recal = state.get("recalibration")
        self.recalibration = Calibration.from_dict(recal) if recal is not None else None
        self.fixed_at = list(state.get("fixed_at", []))

    def extra_repr(self) -> str:
        strat = strategies_to_dict(self.strategies) if self.strategies else "calibrating"
        return f"{super().extra_repr()}, recipe={self.recipe.name}, strategies={strat}"


AdaHOPLinear = QuantLinear


def _warn_if_state_missing(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
    # A checkpoint without this layer's state would restart calibration: never silently.
    if prefix + "weight" in state_dict and prefix + "_extra_state" not in state_dict:
        warnings.warn(
            f"{prefix or 'layer'}: loaded weights without their AdaHOP state (_extra_state); the layer keeps "
            f"its current phase {module.phase!r} at step {module.step} and will calibrate again if not fixed",
            stacklevel=2,
        )


# ---------------------------------------------------------------------------------------------
# Model-level API


def _skipped(name: str, skip: Iterable[str]) -> bool:
    return any(name == s or name.endswith("." + s) for s in skip)


def convert(model: nn.Module, recipe: str | Recipe, skip: Iterable[str] = ("lm_head",), **overrides: Any) -> nn.Module:
    """Swap every ``nn.Linear`` of ``model`` for a :class:`QuantLinear` under ``recipe``; return the model.

    skip: module names (full dotted names or their last components) to leave alone. Layers whose
    features are not multiples of ``max(32, hadamard_size)`` stay ``nn.Linear`` (BF16) with one
    warning listing them. A recipe that is BF16 everywhere (``bf16``) returns ``model`` unchanged.
    Parameters are shared, not copied; layer ids follow ``named_modules`` order.
    A bare ``nn.Linear`` is converted and returned.
    """
    recipe = get_recipe(recipe, **overrides)
    skip = tuple(skip)
    if not recipe.swaps_linear:
        return model
    m = recipe.dim_multiple

    def fits(lin: nn.Linear) -> bool:
        return lin.in_features % m == 0 and lin.out_features % m == 0

    if type(model) is nn.Linear:
        if not fits(model):
            raise ValueError(f"nn.Linear({model.in_features}, {model.out_features}): features must be multiples of {m}")
        return QuantLinear.from_linear(model, recipe)
    swapped: dict[int, QuantLinear] = {}
    kept: list[str] = []
    for parent_name, parent in list(model.named_modules()):
        # _modules, not named_children(): the latter yields a module registered twice only once.
        for child_name, child in list(parent._modules.items()):
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            if type(child) is not nn.Linear or _skipped(name, skip):
                continue
            if not fits(child):
                kept.append(f"{name} ({child.in_features}→{child.out_features})")
                continue
            if id(child) not in swapped:  # a Linear shared by two parents stays shared
                swapped[id(child)] = QuantLinear.from_linear(child, recipe, layer_id=len(swapped))
            setattr(parent, child_name, swapped[id(child)])
    if kept:
        warnings.warn(f"convert({recipe.name!r}): kept in BF16, features not multiples of {m}: {', '.join(kept)}",
                      stacklevel=2)
    return model


def quant_layers(model: nn.Module) -> Iterable[tuple[str, QuantLinear]]:
    return ((n, mod) for n, mod in model.named_modules() if isinstance(mod, QuantLinear))


def on_optimizer_step(model: nn.Module) -> None:
    """Call after every optimizer step: advances seeds and calibration of every QuantLinear."""
    for _, layer in quant_layers(model):
        layer.on_optimizer_step()


def export_strategies(model: nn.Module) -> dict[str, dict[str, Any]]:
    """``{module name: layer.export()}`` for every QuantLinear: labels, pairs, strategies (JSON-ready)."""
    return {name: layer.export() for name, layer in quant_layers(model)}


def fix_strategies(model: nn.Module, strategies: Mapping[str, Mapping[str, Strategy | str]]) -> nn.Module:
    """Fix every policy QuantLinear of ``model`` to a strategy map ``{module name: {slot: strategy}}``
    (the ``strategies`` of :func:`export_strategies`, or the records of ``experiments/strategies.py``
    grouped by layer). The map must name exactly the model's policy layers: a missing or unknown
    name is an error, not a layer left calibrating. Returns ``model``."""
    layers = {name: layer for name, layer in quant_layers(model) if layer.recipe.policy is not None}
    if not layers:
        raise ValueError("fix_strategies: the model has no QuantLinear of a policy recipe (convert it with adahop, ...)")
    missing, unknown = sorted(set(layers) - set(strategies)), sorted(set(strategies) - set(layers))
    if missing or unknown:
        raise ValueError(f"fix_strategies: the map does not match the model's policy layers: "
                         f"missing {missing[:5]}{' ...' if len(missing) > 5 else ''} ({len(missing)}), "
                         f"unknown {unknown[:5]}{' ...' if len(unknown) > 5 else ''} ({len(unknown)})")
    for name, layer in layers.items():  # every entry checked before any layer changes
        layer.checked_map(strategies[name])
    for name, layer in layers.items():
        layer.fix(strategies[name])
    return model


def strategy_fixes(model: nn.Module) -> list[dict[str, Any]]:
    """Per step at which calibrating layers fixed (or re-fixed) their strategies: how many GEMMs run
    each strategy from then on (``counts``, slot → strategy → n) and how many changed since the
    previous fix (``changed``; 0 at the first). Empty for a model without policy layers."""
    by_step: dict[int, dict[str, dict[str, str]]] = defaultdict(dict)
    for name, layer in quant_layers(model):
        for fix in layer.fixed_at:
            by_step[fix["step"]][name] = fix["strategies"]
    out, current = [], {}
    for step in sorted(by_step):
        fixed = by_step[step]
        changed = sum(current[n][slot] != s for n, strategies in fixed.items() if n in current
                      for slot, s in strategies.items())
        current.update(fixed)
        counts = {slot: dict(Counter(s[slot] for s in current.values())) for slot in SLOTS}
        out.append({"step": step, "layers": len(fixed), "counts": counts, "changed": changed})
    return out


# ---------------------------------------------------------------------------------------------
# Measuring what autograd keeps


class SavedTensorMeter:
    """Counts the bytes autograd saves for backward inside ``with SavedTensorMeter(model) as m:``.

    Unique storages are counted once (views share memory). ``param_bytes`` are saved tensors that
    are parameters of ``params_of`` (kept alive anyway); ``activation_bytes`` the rest.
    Equivalent to summing ``storage.nbytes()`` over ``torch.autograd.graph.saved_tensors_hooks``.
    """

    def __init__(self, params_of: nn.Module | None = None) -> None:
        self._params = {p.untyped_storage().data_ptr() for p in params_of.parameters()} if params_of else set()
        self.storages: dict[int, tuple[int, bool]] = {}
        self.tensors: list[tuple[tuple[int, ...], torch.dtype, bool]] = []  # (shape, dtype, is_param)
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        is_param = st.data_ptr() in self._params
        self.storages[st.data_ptr()] = (st.nbytes(), is_param)
        self.tensors.append((tuple(t.shape), t.dtype, is_param))
        return t

    def __enter__(self) -> "SavedTensorMeter":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)

    @property
    def total_bytes(self) -> int:
        return sum(n for n, _ in self.storages.values())

    @property
    def param_bytes(self) -> int:
        return sum(n for n, is_param in self.storages.values() if is_param)

    @property
    def activation_bytes(self) -> int:
        return self.total_bytes - self.param_bytes
