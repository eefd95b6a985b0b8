"""The autograd Function of the quantized layer: Y = X·Wᵀ + b with three GEMMs under a plan.

Its arguments are tensors and one frozen :class:`LayerPlan` (strategies, quantization specs,
GEMM path and FP8 layouts; plain data), so Dynamo traces forward and backward into the model's
graph: no graph break, and a plan that does not change between steps adds no guard that fails.
The draw counter (:mod:`adahop.linear.seeds`) is a tensor argument, read, never written here.

Saved for backward (counted by :class:`adahop.linear.SavedTensorMeter`): X quantized along tokens
(Xᵀ, the ``wgrad`` operand) and W quantized along ``out`` (Wᵀ, the ``dgrad`` operand), packed
MXFP4, 4.25 bits per value (re-encoded to FP8 in the backward on Hopper, a pass over 0.53 B/value);
plus ``(k, ·)`` BF16 outlier slices for OE-right, W as the forward got it when ``dgrad`` is ``bf16``
or OE-left, and X as it came when ``wgrad`` is ``bf16`` under ``bf16_wgrad_input="bf16"``. With
``weight_for_backward="param"`` nothing of W is saved: the backward quantizes it again from the
parameter. HOT's strategies (:mod:`adahop.hot`) save instead, for ``hot-lowrank-int8``, X projected
along tokens in INT8 (1 byte per two tokens' values; ``hot-int8``: not projected, 1 byte a value)
and, for ``hot-int4``, W as the forward got it (the backward transforms and quantizes it, as HOT
does). Under ``torch.compile`` sibling layers reading one input (q/k/v, gate/up) quantize it
with identical calls (same input, specs and draws: their input salt is shared, fixed by
:func:`adahop.convert`), which the compiler computes once and saves once, as a fused projection
would.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from adahop import hot
from adahop.linear.gemm import GemmConfig, Operand, QuantSpec, Quantized, Want, quantize_pair, strategy_mm, top_rows
from adahop.policy import SLOTS, Strategy


@dataclass(frozen=True)
class SlotPlan:
    """One GEMM's strategy, the specs of its A and Bᵀ, and their FP8 layouts (None off the FP8 path)."""

    strategy: Strategy
    a: QuantSpec | None
    b: QuantSpec | None
    layout_a: str | None = None
    layout_b: str | None = None


@dataclass(frozen=True)
class LayerPlan:
    """Everything one forward call needs besides its tensors; static for a layer at a token count."""

    fwd: SlotPlan
    dgrad: SlotPlan
    wgrad: SlotPlan
    k: int
    need_backward: bool
    gemm: GemmConfig
    weight_from_param: bool = False
    weight_cached: bool = False

    def slot(self, name: str) -> SlotPlan:
        return getattr(self, name)

    @property
    def strategies(self) -> dict[str, Strategy]:
        return {s: self.slot(s).strategy for s in SLOTS}


CACHE_FIELDS = ("codes", "scales", "fp8", "fp8_scale", "amax")


def _q_fields(q: Quantized | None) -> tuple[torch.Tensor | None, ...]:
    """The tensors of ``q`` that a backward or a weight cache keeps (:data:`CACHE_FIELDS`)."""
    return (None,) * len(CACHE_FIELDS) if q is None else tuple(getattr(q, f) for f in CACHE_FIELDS)


def _q(codes: torch.Tensor | None, scales: torch.Tensor | None, fp8: torch.Tensor | None = None,
       fp8_scale: torch.Tensor | None = None, amax: torch.Tensor | None = None,
       layout: str | None = None) -> Quantized | None:
    if codes is None and fp8 is None:
        return None
    return Quantized(codes, scales, fp8, fp8_scale, layout if fp8 is not None else None, amax)


def weight_operands(w: torch.Tensor, plan: LayerPlan, counter: torch.Tensor) -> tuple[Quantized | None, Quantized | None]:
    """W ``(out, in)`` quantized as the forward of ``plan`` needs it: along ``in`` for the forward GEMM
    and along ``out`` (Wᵀ) for dgrad, from one read. Wᵀ is in the FP8 form dgrad reads where the
    plan caches W (:attr:`LayerPlan.weight_cached`), packed MXFP4 (4.25 bits) where the forward saves
    it for its own backward."""
    fwd, dgrad, g = plan.fwd, plan.dgrad, plan.gemm
    cached = plan.weight_cached
    keep_w = dgrad.b if (plan.need_backward or cached) and not plan.weight_from_param else None
    oe_w = dgrad.strategy is Strategy.IHT_OE_RIGHT and (plan.need_backward or cached)
    want_t = g.want(dgrad.layout_b, oe_w) if cached else Want(True, None, oe_w)
    if fwd.strategy.quantized:
        return quantize_pair(w, fwd.b, keep_w, g.want(fwd.layout_b, fwd.strategy is Strategy.IHT_OE_RIGHT),
                             want_t, counter, g.backend)
    return None, quantize_pair(w, None, keep_w, None, want_t, counter, g.backend)[1]


def _pair(idx: torch.Tensor | None, rows: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor] | None:
    return None if idx is None else (idx, rows)


def _amax(q: Quantized | None) -> torch.Tensor | None:
    return None if q is None else q.amax


class QuantLinearFunction(torch.autograd.Function):
    """Y = X·Wᵀ with the three GEMMs of ``plan``. X ``(T, in)``, T a multiple of 32.

    The forward reads X and W through operators only (``adahop::*``: quantize, the GEMMs, the
    outlier rows), writes nothing in place, and the bias is added outside by autograd: Dynamo in
    torch 2.11 mis-traces a Function whose forward applies an aten GEMM to its inputs or writes its
    output in place (the compiled model got zero gradients upstream of such a layer; 2.13 does not).

    ``w_param``: the weight parameter (W may be autocast's cast of it), read again by the backward
    under ``weight_from_param``. ``observer``: None, or (eager calibration only) the layer that
    receives the backward's ``grad_output`` observations. ``w_cache``: under ``plan.weight_cached``,
    the tensors of :func:`weight_operands` (W's and Wᵀ's :data:`CACHE_FIELDS`), which the forward
    reads instead of quantizing W.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, w_param: torch.Tensor | None, counter: torch.Tensor,
                plan: LayerPlan, observer: Any = None, *w_cache: torch.Tensor | None) -> torch.Tensor:
        fwd, dgrad, wgrad = plan.fwd, plan.dgrad, plan.wgrad
        g, k = plan.gemm, plan.k
        keep_x = wgrad.b if plan.need_backward else None
        oe_x = plan.need_backward and wgrad.strategy is Strategy.IHT_OE_RIGHT
        oe_w = plan.need_backward and dgrad.strategy is Strategy.IHT_OE_RIGHT
        # HOT's buffer compression: X kept in INT8, projected along tokens (not for the hot-int8 ablation).
        xc = (hot.compress_tokens(x, g.backend, wgrad.strategy.lowrank)
              if plan.need_backward and wgrad.strategy.hot else None)
        if fwd.strategy.quantized:
            xq, xq_t = quantize_pair(x, fwd.a, keep_x, g.want(fwd.layout_a, fwd.strategy is Strategy.IHT_OE_LEFT),
                                     Want(True, None, oe_x), counter, g.backend)
        else:
            xq = None
            xq_t = quantize_pair(x, None, keep_x, None, Want(True, None, oe_x), counter, g.backend)[1]
        if plan.weight_cached:
            n = len(CACHE_FIELDS)
            wq = _q(*w_cache[:n], layout=fwd.layout_b)
            wq_t = _q(*w_cache[n:], layout=dgrad.layout_b) if plan.need_backward else None
        else:
            wq, wq_t = weight_operands(w, plan, counter)
        a = Operand(x, q=xq)
        b = Operand(w, q=wq)
        if fwd.strategy is Strategy.IHT_OE_LEFT:
            a.outliers = top_rows(x, k, g.backend, _amax(xq))
        elif fwd.strategy is Strategy.IHT_OE_RIGHT:
            b.outliers = top_rows(w, k, g.backend, _amax(wq))
        y = strategy_mm(fwd.strategy, a, b, k=k, out_dtype=x.dtype, config=g, counter=counter)
        if not plan.need_backward:
            return y
        x_out = top_rows(x.t(), k, g.backend, _amax(xq_t)) if oe_x else (None, None)
        w_out = top_rows(w.t(), k, g.backend, _amax(wq_t)) if oe_w else (None, None)
        measuring = observer is not None and observer.sample_idx is not None
        # W as given (the parameter, or autocast's cast of it), only where W is needed in full precision.
        needs_w = dgrad.strategy in (Strategy.BF16, Strategy.IHT_OE_LEFT) or dgrad.strategy.hot or measuring
        w_full = w if needs_w and not plan.weight_from_param else None
        # A BF16 wgrad without a spec for X (bf16_wgrad_input="bf16") reads X as it is.
        x_full = x if wgrad.strategy is Strategy.BF16 and keep_x is None else None
        # The row maxima served the outlier selection above; the backward needs none.
        ctx.save_for_backward(*_q_fields(xq_t)[:-1], None, *_q_fields(wq_t)[:-1], None, w_full, x_full, *x_out, *w_out,
                              *((xc.values, xc.scale) if xc is not None else (None, None)), w_param, counter.clone())
        ctx.plan, ctx.w_dtype, ctx.device_type = plan, w.dtype, x.device.type
        ctx.n_cache = len(w_cache)
        ctx.observer = observer
        if measuring:
            ctx.x_sample = x[observer.sample_idx]
        return y

    @staticmethod
    def backward(ctx, gy: torch.Tensor):
        plan = ctx.plan
        dgrad, wgrad = plan.dgrad, plan.wgrad
        g_cfg, k = plan.gemm, plan.k
        n = len(CACHE_FIELDS)
        saved = ctx.saved_tensors
        xq_t, wq_t = _q(*saved[:n]), _q(*saved[n:2 * n], layout=dgrad.layout_b)
        (w_full, x_full, xo_idx, xo_rows, wo_idx, wo_rows, x_int, x_int_scale, w_param, counter) = saved[2 * n:]
        g = gy.contiguous()
        if plan.weight_from_param:  # W again, in the forward's dtype
            w_full = w_param.detach().to(ctx.w_dtype)
        dx = dw = None
        # The GEMMs take their operands' dtypes, whatever autocast state backward() is called in.
        # Under torch.compile the backward is traced where the forward ran, with autocast already
        # off (QuantLinear.forward), and an autocast context inside a traced backward breaks Dynamo.
        no_autocast = (contextlib.nullcontext() if torch.compiler.is_compiling()
                       else torch.autocast(ctx.device_type, enabled=False))
        with no_autocast:
            # dY along `out` (dgrad) and along tokens (wgrad), one read where both are quantized.
            spec_d = dgrad.a if ctx.needs_input_grad[0] and dgrad.strategy.mxfp4 else None
            spec_w = wgrad.a if ctx.needs_input_grad[1] and wgrad.strategy.mxfp4 else None
            gq, gq_t = quantize_pair(
                g, spec_d, spec_w, g_cfg.want(dgrad.layout_a, dgrad.strategy is Strategy.IHT_OE_LEFT),
                g_cfg.want(wgrad.layout_a, wgrad.strategy is Strategy.IHT_OE_LEFT), counter, g_cfg.backend)
            if ctx.needs_input_grad[0]:
                a = Operand(g, dgrad.a if dgrad.strategy.hot else None, q=gq)
                if dgrad.strategy is Strategy.IHT_OE_LEFT:
                    a.outliers = top_rows(g, k, g_cfg.backend, _amax(gq))
                b = Operand(w_full, dgrad.b, transpose=True, q=wq_t, outliers=_pair(wo_idx, wo_rows))
                dx = strategy_mm(dgrad.strategy, a, b, k=k, out_dtype=g.dtype, config=g_cfg, counter=counter)
            if ctx.needs_input_grad[1]:
                a = Operand(g, wgrad.a if wgrad.strategy.hot else None, transpose=True, q=gq_t)
                if x_full is not None:  # (tokens, in), read along tokens
                    b = Operand(x_full, transpose=True)
                elif x_int is not None:
                    b = Operand(None, q=hot.IntTensor(x_int, x_int_scale))
                else:
                    x_src = None
                    if wgrad.strategy is Strategy.BF16:
                        from adahop import library

                        x_src = library.dequantize(xq_t.codes, xq_t.scales, g.dtype, g_cfg.backend)
                    b = Operand(x_src, q=xq_t, outliers=_pair(xo_idx, xo_rows))
                dw = strategy_mm(wgrad.strategy, a, b, k=k, out_dtype=ctx.w_dtype, config=g_cfg, counter=counter)
            if ctx.observer is not None:
                ctx.observer.observe_backward(g, w_full, getattr(ctx, "x_sample", None), counter)
        return (dx, dw, None, None, None, None) + (None,) * ctx.n_cache
