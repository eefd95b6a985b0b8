"""One GEMM under a strategy: how its operands are quantized, and how they are multiplied.

``strategy_mm(strategy, A, Bᵀ)`` computes ``A · Bᵀ`` for A ``(M, K)`` and Bᵀ ``(N, K)``:

* ``bf16``: the unquantized product in the compute dtype.
* ``mxfp4`` / ``iht``: both operands quantized along K (after a block-Hadamard transform for
  ``iht``), product with fp32 accumulation, output in the compute dtype.
* ``iht+oe-left`` / ``iht+oe-right``: ``iht``, then the ``k`` rows of A (left) or of Bᵀ (right)
  with the largest absmax are recomputed in BF16 and written over their rows/columns of the
  output. Rows are quantized independently along K, so computing the full IHT product and
  overwriting is exactly "quantize the remainder" without a gather.
* ``hot-int4`` / ``hot-int4-token`` (``dgrad``) and ``hot-lowrank-int8`` (``wgrad``): HOT's
  integer GEMMs (:mod:`adahop.hot`), on the paths :func:`adahop.hot.paths_for` gives the device.

How an operand is quantized is a :class:`QuantSpec` (static) plus the draw counter (a device
tensor, :mod:`adahop.linear.seeds`); what a quantization writes is a :class:`Want` (packed MXFP4
for a copy saved for backward, the exact FP8 operand for a GEMM on Hopper, the row absmax for
outlier selection). :class:`GemmConfig` says which GEMM path the device takes and which FP8
layouts its operands use. Everything here is plain tensors and frozen data, so it traces into one
graph under ``torch.compile``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from adahop import hot, library
from adahop.formats import BLOCKWISE_K, FP8_GROUP, MXFP4Tensor
from adahop.linear.seeds import LEFT, RIGHT, SIGNS, SLOT_CODES, derive_seed, draw_seed, new_counter, signs_from_seed
from adahop.backend import Backend
from adahop.ops import GemmPath, device_gemm_path, fp8_mm, gemm_path, rank_outliers
from adahop.policy import MEASURED_CANDIDATES, Strategy
from adahop.recipes import Recipe


@dataclass(frozen=True)
class QuantSpec:
    """How one operand is quantized along its inner dimension.

    hadamard: block-Hadamard transform of ``hadamard_size`` first. rounding: ``"rne"``/``"sr"``.
    salt: the SR draw's salt (its seed is ``draw_seed(counter, salt)``). signs_salt: draw ±1 signs
    from this salt before the transform (both operands of a GEMM get the same one, so the product
    is unchanged).
    """

    hadamard: bool
    rounding: str = "rne"
    salt: int | None = None
    signs_salt: int | None = None
    hadamard_size: int = 32

    @property
    def draws(self) -> bool:
        return self.rounding == "sr"


@dataclass(frozen=True)
class Want:
    """What a quantization of one operand writes: packed MXFP4, an FP8 layout, the row absmax."""

    packed: bool = True
    fp8: str | None = None
    amax: bool = False


SAVED = Want(packed=True)


@dataclass(frozen=True)
class Quantized:
    """An operand ``(rows, K)`` quantized along K: packed MXFP4 and/or its FP8 form (see :class:`Want`)."""

    codes: torch.Tensor | None = None
    scales: torch.Tensor | None = None
    fp8: torch.Tensor | None = None
    fp8_scale: torch.Tensor | None = None
    fp8_layout: str | None = None
    amax: torch.Tensor | None = None

    @property
    def mxfp4(self) -> MXFP4Tensor:
        if self.codes is None:
            raise RuntimeError("this operand was quantized to FP8 only; its packed MXFP4 form was not written")
        return MXFP4Tensor(self.codes, self.scales)


@dataclass(frozen=True)
class GemmConfig:
    """The device's GEMM path and the kernels' backend, fixed for a layer on one device.

    ``blockwise``: on the FP8 path, whether GEMMs whose K is a multiple of 512 and N of 128 use the
    blockwise-scaled FP8 GEMM (A per 1×128 segment, B per 128×128 tile; each element's scale comes
    from its own segment or tile, so the quantize kernel writes the FP8 operand in its single pass)
    rather than row scales (which need the whole row before any element: a second pass).
    """

    path: GemmPath
    backend: str
    blockwise: bool = False

    @classmethod
    def for_device(cls, device: torch.device, backend: str, blockwise: bool = False) -> "GemmConfig":
        """The config of ``device``; traceable (the path is logged once, outside ``torch.compile``)."""
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if not torch.compiler.is_compiling():
            gemm_path(device, backend)
        return cls(device_gemm_path(device, Backend(backend))[0], backend, blockwise)

    def layouts(self, m: int, n: int, k: int, out_dtype: torch.dtype) -> tuple[str | None, str | None]:
        """FP8 layouts of A ``(m, k)`` and Bᵀ ``(n, k)``; ``(None, None)`` off the FP8 path."""
        if self.path is not GemmPath.FP8_ROWWISE:
            return None, None
        if self.blockwise and k % BLOCKWISE_K == 0 and n % FP8_GROUP == 0 and out_dtype is torch.bfloat16:
            return "seg128", "tile128"
        return "row", "row"

    def want(self, layout: str | None, amax: bool = False) -> Want:
        """A GEMM operand's :class:`Want`: FP8 only on the FP8 path, packed MXFP4 elsewhere."""
        return Want(packed=layout is None, fp8=layout, amax=amax)


REFERENCE_GEMM = GemmConfig(GemmPath.REFERENCE, "reference")


def _signs(spec: QuantSpec | None, n: int, counter: torch.Tensor, dtype: torch.dtype,
           backend: str) -> torch.Tensor | None:
    if spec is None or not (spec.hadamard and spec.signs_salt is not None):
        return None
    return signs_from_seed(n, draw_seed(counter, spec.signs_salt), dtype, backend)


def _request(spec: QuantSpec | None, want: Want | None) -> str:
    if spec is None or want is None:
        return ""
    return library.request(spec.hadamard, want.packed, want.fp8, want.amax)


def _quantized(outs: tuple[torch.Tensor, ...], want: Want | None) -> Quantized | None:
    if want is None:
        return None
    codes, scales, fp8, fp8_scale, amax = outs
    return Quantized(codes if want.packed else None, scales if want.packed else None,
                     fp8 if want.fp8 else None, fp8_scale if want.fp8 else None, want.fp8,
                     amax if want.amax else None)


def quantize_pair(
    t: torch.Tensor,
    along_last: QuantSpec | None,
    along_first: QuantSpec | None,
    want_last: Want | None,
    want_first: Want | None,
    counter: torch.Tensor,
    backend: str,
) -> tuple[Quantized | None, Quantized | None]:
    """``t (M, K)`` quantized along K and along M (the latter returned ``(K, M)``); None where
    its spec or want is None. One read of ``t`` where both orientations round alike (one seed:
    ``along_last``'s); two operator calls otherwise.

    Equivalent to two :func:`quantize` calls.
    """
    if along_last is None or want_last is None:
        along_last = want_last = None
    if along_first is None or want_first is None:
        along_first = want_first = None
    if along_last is None and along_first is None:
        return None, None
    if along_last is not None and along_first is not None and (
        (along_last.rounding, along_last.hadamard_size) != (along_first.rounding, along_first.hadamard_size)
    ):
        return (quantize_pair(t, along_last, None, want_last, None, counter, backend)[0],
                quantize_pair(t, None, along_first, None, want_first, counter, backend)[1])
    lead = along_last if along_last is not None else along_first
    seed = draw_seed(counter, lead.salt if lead.salt is not None else 0) if lead.draws else None
    signs_k = _signs(along_last, t.shape[1], counter, t.dtype, backend)
    signs_m = _signs(along_first, t.shape[0], counter, t.dtype, backend)
    outs = library.quantize(
        t, signs_k, signs_m, seed,
        _request(along_last, want_last), _request(along_first, want_first),
        lead.hadamard_size, lead.rounding, "propagate", backend,
    )
    return _quantized(outs[:5], want_last), _quantized(outs[5:], want_first)


def quantize(t: torch.Tensor, spec: QuantSpec, transpose: bool = False, counter: torch.Tensor | None = None,
             backend: str = "reference") -> MXFP4Tensor:
    """``t`` (or ``t.T``) quantized along its last dimension per ``spec`` (packed MXFP4).

    ``counter``: the draw counter (default 0). Equivalent to ``ops.hadamard_quantize(t, transpose=...)``
    with the spec's transform, rounding, signs and seed.
    """
    counter = new_counter(t.device) if counter is None else counter
    pair = quantize_pair(t, None if transpose else spec, spec if transpose else None, SAVED, SAVED, counter, backend)
    return (pair[1] if transpose else pair[0]).mxfp4


def slot_specs(
    recipe: Recipe, slot: str, strategy: Strategy, layer_salt: int, input_salt: int | None = None
) -> tuple[QuantSpec | None, QuantSpec | None]:
    """Quantization of A and Bᵀ for ``slot`` under ``strategy``.

    ``layer_salt`` salts the layer's own draws (W, dY); ``input_salt`` (default: the layer's) those
    that touch X and the signs shared with it, so sibling layers reading one input (the same
    ``input_salt``) quantize it alike. A ``bf16`` ``wgrad`` still quantizes X (plain MXFP4): that is
    the copy the forward saves, unless the recipe's ``bf16_wgrad_input`` is ``"bf16"``. A HOT
    strategy quantizes to integers itself (:mod:`adahop.hot`): A's spec carries only dY's rounding
    and draw salt, and Bᵀ has none.
    """
    input_salt = layer_salt if input_salt is None else input_salt
    code = SLOT_CODES[slot]
    if strategy.hot:
        return QuantSpec(False, recipe.grad_rounding, derive_seed(layer_salt, code, LEFT)), None
    b_rounding = "rne" if slot == "fwd" else recipe.saved_rounding
    # X is A of fwd and B of wgrad; its draws and the signs it shares are the input group's.
    a_salt = input_salt if slot == "fwd" else layer_salt
    b_salt = input_salt if slot == "wgrad" else layer_salt
    if not strategy.quantized:
        if slot != "wgrad" or recipe.bf16_wgrad_input == "bf16":
            return None, None
        return None, QuantSpec(False, b_rounding, derive_seed(b_salt, code, RIGHT), None, recipe.hadamard_size)
    a_rounding = "rne" if slot == "fwd" else recipe.grad_rounding
    signs_salt = input_salt if slot in ("fwd", "wgrad") else layer_salt
    signs = derive_seed(signs_salt, code, SIGNS) if strategy.hadamard and slot in recipe.random_signs else None
    return (
        QuantSpec(strategy.hadamard, a_rounding, derive_seed(a_salt, code, LEFT), signs, recipe.hadamard_size),
        QuantSpec(strategy.hadamard, b_rounding, derive_seed(b_salt, code, RIGHT), signs, recipe.hadamard_size),
    )


# ---------------------------------------------------------------------------------------------
# Operands and the GEMM


@dataclass
class Operand:
    """A GEMM operand ``(rows, K)``: ``src`` (or ``src.T`` when ``transpose``), what is kept of it.

    src: the high-precision tensor as stored, or None when only a quantized copy is kept.
    spec: how to quantize ``src`` when ``q`` is not given. q: already quantized along K (for
        HOT's ``wgrad``, X's compressed copy, an :class:`adahop.hot.IntTensor` along tokens).
    outliers: precomputed ``(indices (k,), rows (k, K))`` in high precision, for operands whose
        full copy is not kept (OE-right on ``dgrad``/``wgrad``).
    """

    src: torch.Tensor | None
    spec: QuantSpec | None = None
    transpose: bool = False
    q: Quantized | MXFP4Tensor | hot.IntTensor | None = None
    outliers: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def full(self) -> torch.Tensor:
        if self.src is None:
            raise RuntimeError("this operand is kept only quantized; its strategy needs it in full precision")
        return self.src.t() if self.transpose else self.src

    def quantized(self, want: Want, counter: torch.Tensor, backend: str) -> Quantized:
        """The operand quantized, with what ``want`` asks (a saved packed copy gets its FP8 form here)."""
        q = self.q
        if isinstance(q, MXFP4Tensor):
            q = Quantized(q.codes, q.scales, q.fp8, q.fp8_scale, "row" if q.fp8 is not None else None)
        if q is None:
            if self.spec is None:
                raise RuntimeError("operand has neither a quantized copy nor a quantization spec")
            pair = quantize_pair(self.src, None if self.transpose else self.spec, self.spec if self.transpose else None,
                                 None if self.transpose else want, want if self.transpose else None, counter, backend)
            q = pair[1] if self.transpose else pair[0]
            self.q = q  # strategies sharing this operand (IHT and its OE variants) share its draws
        if want.fp8 and q.fp8_layout != want.fp8:
            fp8, scale = library.fp8_encode(q.codes, q.scales, want.fp8, backend)
            q = dataclasses.replace(q, fp8=fp8, fp8_scale=scale, fp8_layout=want.fp8)
        return q

    def outlier_rows(self, k: int, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
        if self.outliers is not None:
            return self.outliers
        return top_rows(self.full, k, backend)


def top_rows(x: torch.Tensor, k: int, backend: str = "reference", amax: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices (ascending) and BF16 copies of the ``min(k, rows)`` rows of ``x (rows, K)`` with the
    largest absmax (``amax``: those maxima, when the quantize pass already wrote them).

    Equivalent to :func:`adahop.ops.extract_outliers` with ``k`` clamped to the row count.
    """
    k = min(k, x.shape[0])
    amax = library.row_absmax(x, backend) if amax is None else amax
    idx = rank_outliers(amax, k)
    return idx, library.select_rows(x, idx)


def mm(a: Quantized, b: Quantized, out_dtype: torch.dtype, config: GemmConfig) -> torch.Tensor:
    """``A · Bᵀ`` of two quantized operands on ``config``'s path (fp32 accumulation)."""
    if config.path is GemmPath.FP8_ROWWISE:
        return fp8_mm(a.fp8, a.fp8_scale, a.fp8_layout, b.fp8, b.fp8_scale, b.fp8_layout, out_dtype)
    if config.path is GemmPath.REFERENCE:
        return library.mm_reference(a.codes, a.scales, b.codes, b.scales, out_dtype)
    if config.path is GemmPath.DOT_SCALED:
        return library.mm_dot_scaled(a.codes, a.scales, b.codes, b.scales, out_dtype)
    dtype = torch.bfloat16 if out_dtype is torch.bfloat16 else torch.float32
    da = library.dequantize(a.codes, a.scales, dtype, config.backend)
    db = library.dequantize(b.codes, b.scales, dtype, config.backend)
    return (da @ db.t()).to(out_dtype)


def strategy_mm(
    strategy: Strategy,
    a: Operand,
    b: Operand,
    *,
    k: int = 64,
    out_dtype: torch.dtype | None = None,
    config: GemmConfig = REFERENCE_GEMM,
    counter: torch.Tensor | None = None,
) -> torch.Tensor:
    """``A · Bᵀ`` for A ``(M, K)`` and Bᵀ ``(N, K)`` under ``strategy``; returns ``(M, N)``.

    ``out_dtype`` defaults to the dtype of ``a``'s source. OE strategies recompute ``min(k, ·)``
    rows from BF16 copies of the outlier rows against the other operand in its own precision.
    Equivalent to ``a.full @ b.full.T`` up to the strategy's quantization error.
    """
    out_dtype = out_dtype or (a.src.dtype if a.src is not None else torch.float32)
    if not strategy.quantized:
        return library.dense_mm(a.full, b.full, out_dtype)
    if strategy.hot:
        return _hot_mm(strategy, a, b, out_dtype, config, counter)
    device = (a.src if a.src is not None else a.q.codes if a.q.codes is not None else a.q.fp8).device
    counter = new_counter(device) if counter is None else counter
    m = a.full.shape[0] if a.src is not None else _rows(a.q)
    n = b.full.shape[0] if b.src is not None else _rows(b.q)
    kk = a.full.shape[1] if a.src is not None else _cols(a.q)
    la, lb = config.layouts(m, n, kk, out_dtype)
    qa = a.quantized(config.want(la), counter, config.backend)
    qb = b.quantized(config.want(lb), counter, config.backend)
    out = mm(qa, qb, out_dtype, config)
    if strategy is Strategy.IHT_OE_LEFT:
        idx, rows = a.outlier_rows(k, config.backend)
        other = b.full
        out = out.index_copy(0, idx, library.dense_mm(rows.to(other.dtype), other, out_dtype))
    elif strategy is Strategy.IHT_OE_RIGHT:
        idx, rows = b.outlier_rows(k, config.backend)
        other = a.full
        out = out.index_copy(1, idx, library.dense_mm(other, rows.to(other.dtype), out_dtype))
    return out


def _hot_mm(strategy: Strategy, a: Operand, b: Operand, out_dtype: torch.dtype, config: GemmConfig,
            counter: torch.Tensor | None) -> torch.Tensor:
    """HOT's GEMM ``A · Bᵀ``: dY's draws from A's spec (salt 0 without one); for ``wgrad`` (K =
    tokens) Bᵀ is X's compressed copy (``b.q``, an :class:`adahop.hot.IntTensor`) or X, compressed here."""
    spec = a.spec or QuantSpec(False, "sr", 0)
    device = a.src.device
    counter = new_counter(device) if counter is None else counter
    seed = draw_seed(counter, spec.salt or 0) if spec.draws else None
    paths = hot.paths_for(config.path)
    if "wgrad" in strategy.slots:
        # Both operands along tokens: their token-major forms are the sources as stored.
        x = b.q if isinstance(b.q, hot.IntTensor) else hot.compress_tokens(b.src if b.transpose else b.full.t(),
                                                                           config.backend, strategy.lowrank)
        return hot.wgrad(a.src if a.transpose else a.full.t(), x, seed=seed, paths=paths, out_dtype=out_dtype,
                         backend=config.backend, lowrank=strategy.lowrank)
    return hot.dgrad(a.full, b.full, per_token=strategy is Strategy.HOT_INT4_TOKEN, seed=seed, paths=paths,
                     out_dtype=out_dtype, backend=config.backend)


def _rows(q: Quantized | MXFP4Tensor) -> int:
    return (q.codes if q.codes is not None else q.fp8).shape[0]


def _cols(q: Quantized | MXFP4Tensor) -> int:
    return q.codes.shape[1] * 2 if q.codes is not None else q.fp8.shape[1]


def _squared_errors(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    return (out.to(ref.dtype) - ref).square().sum().item(), ref.square().sum().item()


def score_strategies(
    recipe: Recipe, slot: str, a: Operand, b: Operand, salt: int, counter: torch.Tensor | None = None,
    config: GemmConfig = REFERENCE_GEMM,
) -> dict[Strategy, tuple[float, float]]:
    """``(squared error, squared reference)`` of every measured-policy candidate on one GEMM.

    ``a`` and ``b`` must hold full-precision sources; the reference is their product in fp64 on
    CPU (fp32 on GPU, far below MXFP4 error). ``salt`` seeds the candidates' draws.
    """
    ref_dtype = torch.float64 if a.full.device.type == "cpu" else torch.float32
    ref = a.full.to(ref_dtype) @ b.full.to(ref_dtype).t()
    scores = {}
    for cand in MEASURED_CANDIDATES[slot]:
        spec_a, spec_b = slot_specs(recipe, slot, cand, salt)
        ca = Operand(a.src, spec_a, a.transpose)
        cb = Operand(b.src, spec_b, b.transpose)
        scores[cand] = _squared_errors(
            strategy_mm(cand, ca, cb, k=recipe.outlier_k, config=config, counter=counter), ref)
    return scores
