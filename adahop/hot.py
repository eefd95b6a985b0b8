"""HOT, Hadamard-based Optimized Training (Kim, Shin, Woo & Park, CVPR 2025), as a peer recipe.

HOT keeps the forward in full precision and changes the two backward GEMMs of a linear layer
(``Y = X·Wᵀ``; :mod:`adahop.policy` for the slots):

* ``dgrad`` (dX = dY·W): a block-diagonal 16×16 Hadamard along ``out`` (the GEMM's inner
  dimension) on dY and W, both to INT4 (:func:`dgrad`). dY is rounded stochastically with one
  scale per tensor or per token (HOT's ``stoch_quantizer`` / ``norm_quantizer``, chosen per layer
  by :func:`selection_errors`); W is SAWB-clipped per tensor and rounded to nearest (HOT's
  ``sawb_quantizer``).
* ``wgrad`` (dW = dYᵀ·X): dY and X projected along tokens onto the lower half of the
  sequency-ordered Walsh basis (HOT's "Hadamard low-rank approximation"), then INT8
  (:func:`wgrad`). X is stored for the backward already projected and in INT8 (HOT's activation
  buffer compression, :func:`compress_tokens`): 1 byte per two tokens' values, a quarter of BF16.

Readings of HOT's public code (``utils/quant_matmul.py``, ``utils/hadamard_matmul.py``,
``ViT_main.py``, transform scheme ``gih_gwlr``) that this module had to decide:

1. Which coefficients the low-rank projection keeps. HOT's ``make_WHT`` keeps a triangle of the
   2-D sequencies of an s×s patch grid (image tokens). Language tokens are one sequence, so
   here the lower half of the 1-D sequencies is kept. That subspace is exactly the functions
   constant on adjacent token pairs (:func:`walsh_sequency`, tested), so the projection is "sum
   each pair of tokens, then rotate" and its size along tokens (:data:`TOKEN_BLOCK`) only sets how
   far a token's outlier is spread before the per-tensor INT8 scale; HOT rotates each sequence
   whole (its length's power-of-two part), a layer here sees flattened tokens: 32 at a time.
2. The projection is HOT's orthogonal projector, not rescaled: on tokens uncorrelated with their
   neighbours it keeps about half of dW's expected value (AdamW's update is invariant to that
   scale) and adds the cross products of neighbouring tokens.
3. Bits. HOT's paper puts dY and X at INT8 in ``wgrad``; its code, when the layer-wise selection
   is on, quantizes the ``wgrad`` dY with the ``dgrad`` bit width (4). Here: 8, as the paper says.
4. X's INT8 quantizer is HOT's default ``sawb`` (per tensor, clip ``12.1·rms − 12.2·mean|x|``,
   round to nearest). Those are SAWB's 4-bit coefficients, which HOT uses at every width: at 8
   bits they clip at ≈2.4 rms, so outlier channels of X are clipped. The ``wgrad`` dY is
   per-tensor stochastic INT8 (HOT's choice for ``_gw`` in every layer).
5. Where SAWB's formula gives no positive clip (a tensor of near-constant magnitude) the clip is
   the absmax; an all-zero tensor gets scale 1 (HOT divides by ``scale + 1e-11``).
6. Per tensor means over the layer's whole ``(tokens, ·)`` operand (HOT's batched tensors are
   scaled per sample: its quantizers run under ``vmap`` over the batch).
7. The selection's errors are measured on the untransformed dY at 4 bits, one stochastic draw per
   calibrating backward, summed over the calibration (HOT: on the calibration pass's gradients),
   and during the recipe's first steps, which run in BF16 and train (HOT calibrates a throwaway
   full-precision copy of the model on held-out data before training).

Beyond HOT: the ``hot-int8`` ``wgrad`` (``lowrank=False`` in :func:`compress_tokens` and
:func:`wgrad`) runs the same INT8 quantizers without the projection, X saved in INT8 at every token;
the ``hot-no-lowrank`` recipe asks with it what the low-rank ``wgrad`` costs in pretraining.

GEMM paths (:func:`hot_gemm_path`): INT4 values are exact in FP8 E4M3, so on Hopper/Ada the INT4
GEMM runs on the FP8 tensor cores (``torch._scaled_mm``, the scales per row); the INT8 GEMM runs
on the INT8 tensor cores (``torch._int_mm``, int32 accumulation, exact). On CPU, and under the
reference backend, both are exact integer products in float64.

Nothing here reads the host: SR draws come from a seed tensor (:func:`uniform`). The transforms,
scales and GEMM casts are PyTorch ops that a compiled graph traces; the rounding to integers is
one operator (``adahop.library.hot_round``: a Triton pass on a GPU, :func:`round_int_ref` on CPU),
because its counter hash, traced, is a long integer expression that Inductor generates slowly and
that eager PyTorch runs as a dozen temporaries the size of the operand.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import NamedTuple

import torch

from adahop import library
from adahop.backend import Backend, resolve_backend
from adahop.hadamard import _seed_tensor_hash
from adahop.ops import GemmPath, device_gemm_path, fp8_mm

DGRAD_BLOCK = 16  # HOT's block-diagonal Hadamard along `out` (``biggest_power2_factor_max16``)
TOKEN_BLOCK = 32  # tokens per low-rank block: 16 pair sums rotated together
SAWB_COEFFS = (12.1, 12.2)  # HOT's sawb_quantizer (SAWB's 4-bit fit)
SCALINGS = ("tensor", "token", "sawb")

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IntTensor:
    """Symmetric integers ``values`` (int8, ``(rows, K)``) and fp32 ``scale`` (``(rows, 1)`` per row,
    or ``(1, 1)`` per tensor): the value is ``values * scale``."""

    values: torch.Tensor
    scale: torch.Tensor

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        wide = torch.float64 if dtype is torch.float64 else torch.float32
        return (self.values.to(wide) * self.scale.to(wide)).to(dtype)


class HotPaths(NamedTuple):
    """How HOT's two integer GEMMs run: ``int4`` (``fp8-rowwise``, ``dequant-matmul`` or
    ``reference``) and ``int8`` (``int-mm`` or ``reference``)."""

    int4: str
    int8: str


def paths_for(path: GemmPath) -> HotPaths:
    """HOT's GEMM paths on a device whose MXFP4 GEMM takes ``path`` (traceable)."""
    if path is GemmPath.REFERENCE:
        return HotPaths("reference", "reference")
    return HotPaths("fp8-rowwise" if path is GemmPath.FP8_ROWWISE else "dequant-matmul", "int-mm")


@functools.lru_cache(maxsize=None)
def _logged(device: torch.device, backend: Backend) -> HotPaths:
    paths = paths_for(device_gemm_path(device, backend)[0])
    _log.info("HOT's GEMMs on %s: INT4 through %s, INT8 through %s", device, paths.int4, paths.int8)
    return paths


def hot_gemm_path(device: torch.device | str, backend: Backend | str | None = None) -> HotPaths:
    """The :class:`HotPaths` HOT's GEMMs take on ``device`` (logged once per device, at INFO on the
    ``adahop.hot`` logger). Equivalent to ``paths_for(adahop.ops.gemm_path(device, backend))``."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return _logged(device, resolve_backend(device, backend))


# ---------------------------------------------------------------------------------------------
# Transforms


def hadamard(n: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The normalised Sylvester Hadamard matrix ``(n, n)`` fp32, built on ``device`` from integer
    bit counts (no host copy, traceable). Equivalent to :func:`adahop.hadamard.hadamard_matrix`."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"a Hadamard size must be a power of two, got {n}")
    i = torch.arange(n, device=device)
    both = i[:, None] & i[None, :]
    parity = torch.zeros_like(both)
    for bit in range(n.bit_length()):
        parity = parity ^ ((both >> bit) & 1)
    return (1 - 2 * parity).to(torch.float32) * n**-0.5


def walsh_sequency(n: int) -> torch.Tensor:
    """The ±1 Walsh basis ``(n, n)`` fp64, rows in sequency order (by sign changes), as HOT's
    ``make_WHT`` builds it before selecting rows. The oracle of :func:`lowrank_tokens`."""
    h = hadamard(n).sign().double()
    changes = (h[:, 1:] != h[:, :-1]).sum(1)
    return h[changes.argsort()]


def block_hadamard(t: torch.Tensor, size: int = DGRAD_BLOCK) -> torch.Tensor:
    """``t (..., K)`` times the block-diagonal normalised Hadamard of ``size`` along K, fp32.

    K a multiple of ``size``. Equivalent to ``adahop.hadamard.block_hadamard_ref(t, size).float()``.
    """
    k = t.shape[-1]
    if k % size:
        raise ValueError(f"HOT's Hadamard runs along a dimension that is a multiple of {size}, got {k}")
    blocks = t.to(torch.float32).reshape(*t.shape[:-1], k // size, size)
    return (blocks @ hadamard(size, t.device)).reshape(t.shape)


def lowrank_tokens(t: torch.Tensor) -> torch.Tensor:
    """``t (T, C)`` projected along tokens onto the lower half of the Walsh sequencies of each
    block of :data:`TOKEN_BLOCK` tokens: ``(T/2, C)`` fp32, T a multiple of the block.

    The kept rows span the functions constant on token pairs, so the projection sums each pair
    (÷√2) and rotates the block's pair sums by a normalised Hadamard. Equivalent to
    ``blockdiag(P) @ t`` with ``P = walsh_sequency(TOKEN_BLOCK)[:TOKEN_BLOCK // 2] / sqrt(TOKEN_BLOCK)``,
    up to the order of the rows within each block (which neither a GEMM over them nor a
    per-tensor scale sees); ``Pᵀ P`` is the orthogonal projector that HOT's ``wgrad`` applies.
    """
    tokens, c = t.shape
    if tokens % TOKEN_BLOCK:
        raise ValueError(f"HOT's low-rank projection takes tokens in blocks of {TOKEN_BLOCK}, got {tokens}")
    half = TOKEN_BLOCK // 2
    pairs = t.to(torch.float32).reshape(tokens // TOKEN_BLOCK, half, 2, c).sum(2) * 2**-0.5
    return torch.einsum("ij,bjc->bic", hadamard(half, t.device), pairs).reshape(tokens // 2, c)


# ---------------------------------------------------------------------------------------------
# Integer quantizers


def uniform(shape: tuple[int, ...], seed: torch.Tensor) -> torch.Tensor:
    """Uniform draws in [0, 1) of ``shape`` (fp32, 24 bits) from an int64 seed tensor, on its device.

    Element ``i`` is the top 24 bits of ``lowbias32(i XOR lowbias32(seed))``: a counter-based hash,
    so no generator state and no host read. Equivalent to ``torch.rand(shape)`` in distribution.
    """
    n = 1
    for d in shape:
        n *= d
    return ((_seed_tensor_hash(n, seed) >> 8).to(torch.float32) * 2.0**-24).reshape(shape)


def quantize_int(t: torch.Tensor, bits: int, scaling: str, seed: torch.Tensor | None = None,
                 backend: Backend | str | None = None) -> IntTensor:
    """``t (rows, K)`` to symmetric integers in ``[-(2**(bits-1) - 1), 2**(bits-1) - 1]`` (int8).

    scaling: ``"tensor"`` (one scale, absmax / qmax: HOT's ``stoch``/``int`` quantizers),
    ``"token"`` (a scale per row: HOT's ``norm_quantizer``) or ``"sawb"`` (one scale from the clip
    ``12.1·rms − 12.2·mean|t|``, values beyond it clipped; the absmax where that clip is not
    positive). seed: None rounds to nearest (ties to even); an int64 ``(1,)`` tensor rounds
    stochastically, ``floor(|t|/s + u)`` with ``u`` from :func:`uniform` (unbiased within the clip).
    A non-finite ``t`` gives a non-finite scale, so the product shows it (its NaN values are 0).
    bits: 2 to 8. backend: where the rounding runs (``adahop.library.hot_round``: one Triton pass,
    or :func:`round_int_ref`; the same bits), resolved by :func:`adahop.backend.resolve_backend` on
    ``t``'s device. No temporary of ``t``'s size outlives its reduction.

    Equivalent to HOT's ``*_quantizer_BWD(t, bits)`` returning ``(x_int, s)``.
    """
    if scaling not in SCALINGS:
        raise ValueError(f"scaling must be one of {SCALINGS}, got {scaling!r}")
    if not 2 <= bits <= 8:
        raise ValueError(f"bits must be in [2, 8] (int8 storage), got {bits}")
    if t.dim() != 2:
        raise ValueError(f"HOT quantizes 2-D operands, got shape {tuple(t.shape)}")
    backend = resolve_backend(t.device, backend).value
    qmax = 2 ** (bits - 1) - 1
    tf = t.to(torch.float32)
    if scaling == "token":
        lo, hi = torch.aminmax(tf, dim=1, keepdim=True)
    else:
        lo, hi = (m.reshape(1, 1) for m in torch.aminmax(tf))
    top = torch.maximum(-lo, hi)  # max |t| without an |t| copy; NaN propagates
    if scaling == "sawb":
        c1, c2 = SAWB_COEFFS
        # fp32 means of one transient temporary each (the two terms cancel to about a fifth).
        clip = (c1 * tf.square().mean().sqrt() - c2 * tf.abs().mean()).reshape(1, 1)
        top = torch.where(clip > 0, clip, top)
    scale = top / qmax
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)  # all zeros: any scale; NaN stays
    return IntTensor(library.hot_round(tf, scale, seed, qmax, backend), scale)


def round_int_ref(t: torch.Tensor, scale: torch.Tensor, qmax: int, seed: torch.Tensor | None) -> torch.Tensor:
    """The reference of ``adahop.library.hot_round``: int8 ``clamp(t / scale, ±qmax)`` rounded to
    nearest (ties to even) or, with ``seed``, ``sign · floor(|·| + u)`` (:func:`uniform`); NaN to 0."""
    y = (t / scale).clamp(-qmax, qmax)
    q = y.round() if seed is None else torch.sign(y) * torch.floor(y.abs() + uniform(tuple(y.shape), seed))
    return torch.nan_to_num(q, nan=0.0).to(torch.int8)


# ---------------------------------------------------------------------------------------------
# Integer GEMMs: A · Bᵀ with the scales applied after the exact integer product


def _scaled(c: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    # The exact integer product rounded once to fp32, then the two scales in fp32: the same bits
    # on every path.
    return (c.to(torch.float32) * sa * sb).to(out_dtype)


def mm_int4(a: IntTensor, b: IntTensor, path: str, out_dtype: torch.dtype) -> torch.Tensor:
    """``A · Bᵀ`` of INT4 operands A ``(M, K)`` and Bᵀ ``(N, K)`` (per-row or per-tensor scales).

    ``fp8-rowwise``: the integers as FP8 E4M3 (exact) through ``torch._scaled_mm``, K a multiple
    of 16; ``dequant-matmul``: an fp32 GEMM of the integers (exact while K·49 < 2**24);
    ``reference``: the float64 product. The integer product is exact on every path, rounded once to
    fp32, then scaled (inside cuBLAS for a bfloat16 output on ``fp8-rowwise``).
    """
    m, n = a.values.shape[0], b.values.shape[0]
    sa, sb = a.scale.expand(m, 1), b.scale.expand(n, 1)
    if path == "fp8-rowwise":
        fa = a.values.to(torch.float32).to(torch.float8_e4m3fn)
        fb = b.values.to(torch.float32).to(torch.float8_e4m3fn)
        return fp8_mm(fa, sa.contiguous(), "row", fb, sb.contiguous(), "row", out_dtype)
    dtype = torch.float64 if path == "reference" else torch.float32
    return _scaled(a.values.to(dtype) @ b.values.to(dtype).t(), sa, sb.t(), out_dtype)


def int_mm_fits(m: int, k: int, n: int) -> bool:
    """Whether ``torch._int_mm`` takes an ``(m, k) · (k, n)`` product (m > 16; k, n multiples of 8)."""
    return m > 16 and k % 8 == 0 and n % 8 == 0


def mm_int8(a: IntTensor, b_t: IntTensor, path: str, out_dtype: torch.dtype) -> torch.Tensor:
    """``A · Bᵀ`` for INT8 A ``(M, K)`` and B given as ``b_t (K, N)`` (K-major, as saved): per-tensor
    or per-row scales of A, a per-tensor scale of B.

    ``int-mm``: ``torch._int_mm`` (int32 accumulation, exact) where its shapes fit
    (:func:`int_mm_fits`), else the float64 product on the device (exact too); ``reference``: float64.
    Both paths give the same bits (the exact product, rounded once to fp32, then scaled).
    """
    m, k = a.values.shape
    n = b_t.values.shape[1]
    if path == "int-mm" and int_mm_fits(m, k, n):
        # In the layout cuBLASLt's INT8 tensor-core kernels take (library.int8_mm): the fallback
        # kernel that other layouts get, cutlass_80_wmma_tensorop_i161616gemm_s8_forwardCompat, was
        # 31% of HOT's GPU time at 125m on an H100
        # (results/throughput/gpu/profiles/profile_125m_cudagraphs_hot.txt).
        c = library.int8_mm(a.values, b_t.values)
    else:
        c = a.values.to(torch.float64) @ b_t.values.to(torch.float64)
    return _scaled(c, a.scale, b_t.scale, out_dtype)


# ---------------------------------------------------------------------------------------------
# HOT's two backward GEMMs and its buffer compression


def dgrad(a: torch.Tensor, b: torch.Tensor, *, per_token: bool, seed: torch.Tensor | None, paths: HotPaths,
          out_dtype: torch.dtype, backend: Backend | str | None = None) -> torch.Tensor:
    """HOT's ``dgrad``: ``A · Bᵀ`` for A = dY ``(T, out)`` and Bᵀ = Wᵀ ``(in, out)``, returns ``(T, in)``.

    Both transformed by the block-16 Hadamard along ``out`` (it cancels in the product), dY to
    INT4 stochastically (``seed``; None: to nearest) with a scale per token (``per_token``) or per
    tensor, Wᵀ to INT4 by SAWB. Equivalent to ``a @ b.T`` up to INT4 error.
    """
    qa = quantize_int(block_hadamard(a), 4, "token" if per_token else "tensor", seed, backend)
    qb = quantize_int(block_hadamard(b), 4, "sawb", backend=backend)
    return mm_int4(qa, qb, paths.int4, out_dtype)


def compress_tokens(x: torch.Tensor, backend: Backend | str | None = None, lowrank: bool = True) -> IntTensor:
    """HOT's activation buffer compression: ``x (T, in)`` projected along tokens
    (:func:`lowrank_tokens`) and SAWB-quantized to INT8: ``(T/2, in)`` int8 and a ``(1, 1)`` scale.
    ``lowrank=False`` (the ``hot-int8`` ablation): not projected, ``(T, in)``."""
    return quantize_int(lowrank_tokens(x) if lowrank else x, 8, "sawb", backend=backend)


def wgrad(g: torch.Tensor, x: IntTensor, *, seed: torch.Tensor | None, paths: HotPaths,
          out_dtype: torch.dtype, backend: Backend | str | None = None, lowrank: bool = True) -> torch.Tensor:
    """HOT's ``wgrad``: dW ``(out, in)`` from dY ``g (T, out)`` and the compressed X (``(T/2, in)``,
    :func:`compress_tokens`): dY projected along tokens, to INT8 stochastically (``seed``) per tensor.

    Equivalent to ``g.T @ Π @ x`` (Π the orthogonal projector onto the kept sequencies) up to INT8 error.
    ``lowrank=False`` (the ``hot-int8`` ablation): neither is projected, X is ``(T, in)``, and the
    product is ``g.T @ x`` up to INT8 error.
    """
    tokens = x.values.shape[0] * (2 if lowrank else 1)
    if g.shape[0] != tokens:
        raise ValueError(f"dY has {g.shape[0]} tokens, the compressed X {x.values.shape[0]} "
                         f"(expected {'half' if lowrank else 'as many'})")
    qg = quantize_int(lowrank_tokens(g) if lowrank else g, 8, "tensor", seed, backend)
    return mm_int8(IntTensor(qg.values.t(), qg.scale), x, paths.int8, out_dtype)


def selection_errors(g: torch.Tensor, seed: torch.Tensor,
                     backend: Backend | str | None = None) -> dict[str, tuple[float, float]]:
    """``(squared error, squared reference)`` of dY ``g (T, out)`` under HOT's two INT4 dgrad
    quantizers, by strategy name: ``hot-int4`` (per tensor) and ``hot-int4-token`` (per token), one
    stochastic draw each from ``seed``, measured on dY as it is (HOT's layer-wise selection).
    Reads the host (calibration only)."""
    gf = g.to(torch.float32)
    ref2 = gf.double().square().sum().item()
    out = {}
    for name, scaling in (("hot-int4", "tensor"), ("hot-int4-token", "token")):
        err = quantize_int(gf, 4, scaling, seed, backend).dequantize() - gf
        out[name] = (err.double().square().sum().item(), ref2)
    return out
