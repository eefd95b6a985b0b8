"""Public MXFP4 ops: checked inputs, one backend switch, kernel or reference underneath.

Every op here has a Triton kernel in ``kernels/`` and a pure-PyTorch reference; which one runs
is decided by :func:`adahop.backend.resolve_backend` (for :func:`abs_median` on CUDA without a
backend named, by timing both: :data:`ABS_MEDIAN_CUDA`). Layers and recipes call these functions,
never a kernel directly.
"""

from __future__ import annotations

import enum
import functools
import logging
import os

import torch

from adahop import library
from adahop.backend import Backend, FasterOf, resolve_backend
from adahop.checks import (
    DEQUANTIZE_DTYPES,
    MM_OUT_DTYPES,
    check_2d,
    check_float_matrix,
    check_mxfp4_operand,
    check_mxfp4_operands,
    check_mxfp4_tensor,
    check_quantize_options,
    check_scaled_mean_squares_input,
    check_signs,
)
from adahop.formats import (
    BLOCK_SIZE,
    BLOCKWISE_K,
    FLOAT_DTYPES,
    MXFP4Tensor,
    NanPolicy,
    Rounding,
    check_quantize_input,
    dequantize_mxfp4_ref,
    quantize_mxfp4_ref,
    to_fp8_rowwise_ref,
)
from adahop.hadamard import DEFAULT_HADAMARD_SIZE, block_hadamard_ref


def _generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    return None if seed is None else torch.Generator(device=device).manual_seed(seed)


def hadamard_quantize_ref(
    x: torch.Tensor,
    hadamard: bool = True,
    hadamard_size: int = DEFAULT_HADAMARD_SIZE,
    signs: torch.Tensor | None = None,
    rounding: Rounding = "rne",
    seed: int | None = None,
    emit_fp8: bool = False,
    nan_policy: NanPolicy = "propagate",
) -> MXFP4Tensor:
    """Reference of :func:`hadamard_quantize` along the last dimension (transform in fp64)."""
    check_quantize_options(dict(hadamard=hadamard, emit_fp8=emit_fp8), hadamard, hadamard_size, rounding, seed,
                           nan_policy)
    check_quantize_input(x, "x", max(32, hadamard_size if hadamard else 32))
    check_signs(signs, x.shape[-1], x.device, "signs", hadamard)
    xt = block_hadamard_ref(x, hadamard_size, signs).float() if hadamard else x
    q = quantize_mxfp4_ref(xt, rounding, _generator(seed, x.device), nan_policy)
    if emit_fp8:
        return MXFP4Tensor(q.codes, q.scales, *to_fp8_rowwise_ref(q))
    return q


def seed_tensor(seed: int | torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """``seed`` as the int64 ``(1,)`` tensor on ``device`` that the operators read (None stays None).

    An int must lie in [0, 2**62); ``None`` under SR draws one from torch's global generator (as the
    reference's SR does without a seed).
    """
    if isinstance(seed, torch.Tensor):
        if seed.dtype != torch.int64 or seed.numel() != 1 or seed.device != device:
            raise ValueError(f"a seed tensor must be int64 with one element on {device}, got "
                             f"{seed.dtype} of shape {tuple(seed.shape)} on {seed.device}")
        return seed.reshape(1)
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 1 << 62:
        raise ValueError(f"seed must be an int in [0, 2**62) or an int64 tensor, got {seed!r}")
    return torch.tensor([seed], dtype=torch.int64, device=device)


def _mxfp4_of(outs: tuple[torch.Tensor, ...], emit_fp8: bool) -> MXFP4Tensor:
    codes, scales, fp8, fp8_scale, _ = outs
    return MXFP4Tensor(codes, scales, fp8, fp8_scale) if emit_fp8 else MXFP4Tensor(codes, scales)


def _draw_seed(rounding: str, seed: int | torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    if rounding not in ("rne", "sr"):
        raise ValueError(f"rounding must be 'rne' or 'sr', got {rounding!r}")
    if rounding == "sr" and seed is None:
        seed = int(torch.randint(0, 1 << 62, ()).item())
    return seed_tensor(seed, device) if rounding == "sr" else None


def hadamard_quantize(
    x: torch.Tensor,
    *,
    transpose: bool = False,
    hadamard: bool = True,
    hadamard_size: int = DEFAULT_HADAMARD_SIZE,
    signs: torch.Tensor | None = None,
    rounding: Rounding = "rne",
    seed: int | None = None,
    emit_fp8: bool = False,
    nan_policy: NanPolicy = "propagate",
    backend: Backend | str | None = None,
) -> MXFP4Tensor:
    """Block-Hadamard transform (optional) fused with MXFP4 quantization of a 2-D tensor.

    x: ``(M, K)`` float32/bfloat16/float16. ``transpose=False`` quantizes along K and returns an
    ``(M, K)`` MXFP4 tensor; ``transpose=True`` quantizes along M and returns the transpose,
    ``(K, M)`` (e.g. Xᵀ along tokens for ``wgrad``). The quantized dimension must be a multiple
    of 32 and of ``hadamard_size``. ``signs`` (±1, length of the quantized dimension) flips signs
    before the transform. ``rounding="sr"`` draws from ``seed``.

    Equivalent to ``quantize_mxfp4_ref(block_hadamard_ref(x.T if transpose else x))``.
    """
    check_2d(x, "x")
    check_quantize_options(dict(transpose=transpose, hadamard=hadamard, emit_fp8=emit_fp8), hadamard, hadamard_size,
                           rounding, seed, nan_policy)
    xt = x.t() if transpose else x
    check_quantize_input(xt, "x.T" if transpose else "x", max(32, hadamard_size if hadamard else 32))
    check_signs(signs, xt.shape[-1], x.device, "signs", hadamard)
    req = library.request(hadamard, fp8="row" if emit_fp8 else None)
    outs = library.quantize(x, None if transpose else signs, signs if transpose else None,
                            _draw_seed(rounding, seed, x.device), "" if transpose else req, req if transpose else "",
                            hadamard_size, rounding, nan_policy, resolve_backend(x.device, backend).value)
    return _mxfp4_of(outs[5:] if transpose else outs[:5], emit_fp8)


def hadamard_quantize_dual(
    x: torch.Tensor,
    *,
    hadamard: bool = True,
    hadamard_t: bool = True,
    hadamard_size: int = DEFAULT_HADAMARD_SIZE,
    signs: torch.Tensor | None = None,
    signs_t: torch.Tensor | None = None,
    rounding: Rounding = "rne",
    seed: int | None = None,
    emit_fp8: bool = False,
    emit_fp8_t: bool = False,
    nan_policy: NanPolicy = "propagate",
    backend: Backend | str | None = None,
) -> tuple[MXFP4Tensor, MXFP4Tensor]:
    """One read of ``x (M, K)``, both orientations: ``(x along K (M, K), xᵀ along M (K, M))``.

    The forward's GEMM operand X along ``in`` and the Xᵀ along tokens that ``wgrad`` needs (what
    the forward saves), each with its own Hadamard flag, signs (length K for ``x``, M for ``xᵀ``)
    and FP8 request. M and K must both be multiples of 32 (and of ``hadamard_size`` where
    transformed). On the Triton backend one kernel reads X once and the SR draws equal those of
    the two single calls.

    Equivalent to ``(hadamard_quantize(x, hadamard=hadamard, signs=signs, emit_fp8=emit_fp8, ...),
    hadamard_quantize(x, transpose=True, hadamard=hadamard_t, signs=signs_t, emit_fp8=emit_fp8_t, ...))``.
    """
    check_2d(x, "x")
    check_quantize_options(dict(hadamard=hadamard, hadamard_t=hadamard_t, emit_fp8=emit_fp8, emit_fp8_t=emit_fp8_t),
                           hadamard or hadamard_t, hadamard_size, rounding, seed, nan_policy)
    check_quantize_input(x, "x", max(32, hadamard_size if hadamard else 32))
    check_quantize_input(x.t(), "x.T", max(32, hadamard_size if hadamard_t else 32))
    check_signs(signs, x.shape[1], x.device, "signs", hadamard)
    check_signs(signs_t, x.shape[0], x.device, "signs_t", hadamard_t)
    outs = library.quantize(x, signs, signs_t, _draw_seed(rounding, seed, x.device),
                            library.request(hadamard, fp8="row" if emit_fp8 else None),
                            library.request(hadamard_t, fp8="row" if emit_fp8_t else None),
                            hadamard_size, rounding, nan_policy, resolve_backend(x.device, backend).value)
    return _mxfp4_of(outs[:5], emit_fp8), _mxfp4_of(outs[5:], emit_fp8_t)


def dequantize(t: MXFP4Tensor, dtype: torch.dtype = torch.bfloat16, backend: Backend | str | None = None) -> torch.Tensor:
    """Packed MXFP4 ``(..., K)`` to ``dtype`` (float32, bfloat16, float16 or float64).

    codes and scales uint8 and contiguous, on one device (:func:`adahop.checks.check_mxfp4_tensor`).
    Equivalent to :func:`adahop.formats.dequantize_mxfp4_ref`.
    """
    check_mxfp4_tensor(t, "t")
    if dtype not in DEQUANTIZE_DTYPES:
        raise ValueError(f"dtype must be float32, bfloat16, float16 or float64, got {dtype}")
    backend = resolve_backend(t.device, backend).value
    # Every MXFP4 value is exact in fp32, so float64 is the fp32 result widened.
    if dtype is torch.float64 and backend == "triton":
        return library.dequantize(t.codes, t.scales, torch.float32, backend).double()
    return library.dequantize(t.codes, t.scales, dtype, backend)


def _check_k(k: int, rows: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    if not 0 <= k <= rows:
        raise ValueError(f"k={k} outlier rows requested from a tensor with {rows} rows")


def rank_outliers(amax: torch.Tensor, k: int) -> torch.Tensor:
    """Indices ``(k,)`` (int64, ascending) of the ``k`` largest values of ``amax (M,)``, the rows'
    ``max |x|``: among equal values the lower index goes first, and NaN ranks above every number.

    The one ranking rule of every backend and device. ``torch.topk`` leaves which of several equal
    values it keeps to its implementation, so the CPU and a GPU could pick different rows at the
    k-th place, and bf16 operands often hold rows of equal maxima; a stable sort does not.
    """
    if not isinstance(amax, torch.Tensor):
        raise TypeError(f"amax must be a torch.Tensor, got {type(amax).__name__}")
    if amax.dim() != 1 or not amax.is_floating_point():
        raise ValueError(f"amax must be a 1-D float tensor, got shape {tuple(amax.shape)} and dtype {amax.dtype}")
    _check_k(k, amax.shape[0])
    return torch.sort(amax, descending=True, stable=True).indices[:k].sort().values


def select_outliers(x: torch.Tensor, k: int) -> torch.Tensor:
    """Indices ``(k,)`` (int64, ascending) of the ``k`` rows of ``x (M, K)`` with the largest absmax.

    Rows rank by their ``max |x|`` under :func:`rank_outliers`' rule: equal maxima to the lower
    index, NaN first.
    """
    check_2d(x, "x")
    return rank_outliers(x.abs().amax(dim=1), k)


# ---------------------------------------------------------------------------------------------
# Outlier extraction (OE)


def _check_outlier_input(x: torch.Tensor, k: int) -> None:
    check_float_matrix(x)
    if x.shape[1] == 0:
        raise ValueError(f"x of shape {tuple(x.shape)} has empty rows: no magnitude to rank them by")
    _check_k(k, x.shape[0])


def extract_outliers_ref(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference of :func:`extract_outliers`: :func:`select_outliers` and a gather."""
    _check_outlier_input(x, k)
    idx = select_outliers(x, k)
    return idx, x.index_select(0, idx).to(torch.bfloat16)


def extract_outliers(
    x: torch.Tensor, k: int, backend: Backend | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` rows of ``x (M, K)`` with the largest ``max |x|``: indices and a BF16 slice.

    x: float32/bfloat16/float16, any strides. Returns ``indices`` ``(k,)`` int64 in ascending order
    and ``rows`` ``(k, K)`` bfloat16 (``x[indices]``). A row holding NaN ranks above every finite
    row, and equal maxima go to the lower index (:func:`rank_outliers`), so a diverged row goes to the
    BF16 GEMM and shows there.

    *Column outliers* are the rows of the transposed operand: ``extract_outliers(x.t(), k)`` (a
    view, no copy; the kernel reads it in place) returns column indices of x and ``x[:, idx].t()``,
    ``(k, M)``.

    *The rest* is x itself. Along K every row has its own MXFP4 blocks, so the outlier rows do not
    disturb the others: quantize all of x, run the MXFP4 GEMM, and overwrite output rows
    ``indices`` with the BF16 product ``rows @ other.T`` (``out.index_copy_(0, indices, ...)``).
    Only a tensor quantized along M (e.g. Xᵀ along tokens, saved for ``wgrad``) shares blocks
    across rows; zero the outliers there first: ``x.index_fill(0, indices, 0)``.

    Equivalent to ``idx = select_outliers(x, k); (idx, x[idx].to(torch.bfloat16))``.
    """
    _check_outlier_input(x, k)
    if resolve_backend(x.device, backend) is Backend.REFERENCE:
        return extract_outliers_ref(x, k)
    idx = rank_outliers(library.row_absmax(x, Backend.TRITON.value), k)
    return idx, x.index_select(0, idx).to(torch.bfloat16)


# ---------------------------------------------------------------------------------------------
# Pattern statistics (adahop.patterns): line medians of |x|, scaled mean squares


def abs_median_ref(x: torch.Tensor) -> torch.Tensor:
    """Reference of :func:`abs_median`: ``torch.median`` of ``|x|`` over each row (made contiguous)."""
    check_float_matrix(x)
    if x.shape[1] == 0:
        raise ValueError(f"x of shape {tuple(x.shape)} has empty rows: no median")
    # In x's own dtype (an order statistic of |x| is one of its values, and widening keeps the
    # order) and over contiguous lines (torch reads a strided line one element at a time).
    return x.abs().contiguous().median(dim=1).values.float()


def _abs_median_kernel(x: torch.Tensor) -> torch.Tensor:
    return library.abs_median(x)


# What :func:`abs_median` runs on a CUDA tensor when neither its caller nor ADAHOP_BACKEND names a
# backend: the faster of the radix-select kernel and torch.median for that input, timed on its
# first call (both give the same bits). Their ranking is a measurement, not a constant: on the
# H200 the kernel ran at 52-87 GB/s, 2.3-3.5x torch.median's in the same run, and this chose the
# kernel at every shape (results/microbench/gpu/kernels.json, peer kernel-medians).
ABS_MEDIAN_CUDA = FasterOf({"torch.median": abs_median_ref, "radix-select kernel": _abs_median_kernel})


def abs_median(x: torch.Tensor, backend: Backend | str | None = None) -> torch.Tensor:
    """Lower median of ``|x|`` along each row of ``x (M, N)``, fp32 ``(M,)``; NaN for a row holding NaN.

    x: float32/bfloat16/float16, any strides (``abs_median(x.t())``: column medians). ``backend``:
    as every op here, except that without one (and without ``ADAHOP_BACKEND``) a CUDA tensor goes
    to :data:`ABS_MEDIAN_CUDA` (the faster of kernel and reference for its shape, measured on first
    use) and any other to the reference. The Triton kernel is a radix select
    (``kernels/pattern_stats.py``), bit-identical to the reference.
    """
    check_float_matrix(x)
    if backend is None and not os.environ.get("ADAHOP_BACKEND"):
        return ABS_MEDIAN_CUDA(x) if x.device.type == "cuda" else abs_median_ref(x)
    if resolve_backend(x.device, backend) is Backend.REFERENCE:
        return abs_median_ref(x)
    return _abs_median_kernel(x)


def scaled_mean_squares_ref(
    x: torch.Tensor, col_div: torch.Tensor | None = None, row_div: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reference of :func:`scaled_mean_squares`, in fp32 PyTorch."""
    check_scaled_mean_squares_input(x, col_div, row_div)
    xf = x.float()
    nonfinite = (~torch.isfinite(xf)).sum()
    if col_div is None:
        sq = xf.square()
        return sq.mean(dim=1), sq.mean(dim=0), nonfinite
    return (xf / col_div).square().mean(dim=1), (xf / row_div[:, None]).square().mean(dim=0), nonfinite


def scaled_mean_squares(
    x: torch.Tensor,
    col_div: torch.Tensor | None = None,
    row_div: torch.Tensor | None = None,
    backend: Backend | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(row_ms (M,), col_ms (K,), nonfinite ())`` of ``x (M, K)``: fp32 means, an int64 count.

    ``row_ms[m]``: mean over row m of ``(x[m, k] / col_div[k])²``; ``col_ms[k]``: mean over column k
    of ``(x[m, k] / row_div[m])²``; without divisors (both None) the plain mean squares.
    ``nonfinite``: how many entries of x are NaN or ±Inf (the means are then meaningless).
    x: float32/bfloat16/float16, any strides; the divisors fp32, on x's device. The Triton kernel
    reads x once; its sums agree with the reference's to fp32 rounding (another order of additions).
    """
    check_scaled_mean_squares_input(x, col_div, row_div)
    if resolve_backend(x.device, backend) is Backend.REFERENCE:
        return scaled_mean_squares_ref(x, col_div, row_div)
    return library.scaled_mean_squares(x, col_div, row_div)


# ---------------------------------------------------------------------------------------------
# MXFP4 GEMM: A · Bᵀ, one of four paths per device, always reported

_log = logging.getLogger(__name__)


class GemmPath(str, enum.Enum):
    """How :func:`mxfp4_mm` computes ``A · Bᵀ``.

    DOT_SCALED: Triton ``tl.dot_scaled`` on the packed operands (native MXFP4 on sm_100+ and AMD
        CDNA4; elsewhere Triton emulates it through bf16, about a third of cuBLAS bf16 on Hopper).
    FP8_ROWWISE: exact FP8 E4M3 re-encoding with fp32 row scales + cuBLAS rowwise
        ``torch._scaled_mm`` (Hopper and Ada, sm_89/sm_90: FP8 tensor cores, no FP4 ones).
    DEQUANT_MATMUL: exact dequantization to bf16 (fp32 for a non-bf16 output) + the device's matmul.
    REFERENCE: :func:`mxfp4_mm_ref`, the fp64 product of the dequantized operands (CPU default).
    """

    DOT_SCALED = "triton-dot-scaled"
    FP8_ROWWISE = "fp8-rowwise"
    DEQUANT_MATMUL = "dequant-matmul"
    REFERENCE = "reference"


def _hardware_gemm_path(device: torch.device) -> tuple[GemmPath, str]:
    """The fastest exact path the device has, and why."""
    if device.type != "cuda":
        return GemmPath.REFERENCE, f"{device.type} device"
    props = torch.cuda.get_device_properties(device)
    if torch.version.hip:
        arch = getattr(props, "gcnArchName", "")
        if arch.startswith("gfx950"):
            return GemmPath.DOT_SCALED, f"{props.name} ({arch}) has MXFP4 matrix cores"
        return GemmPath.DEQUANT_MATMUL, f"{props.name} ({arch}) has no MXFP4 and no OCP E4M3 matrix cores"
    cap = f"sm_{props.major}{props.minor}"
    if props.major >= 10:
        return GemmPath.DOT_SCALED, f"{props.name} ({cap}) has FP4 tensor cores"
    if (props.major, props.minor) >= (8, 9):
        return GemmPath.FP8_ROWWISE, f"{props.name} ({cap}) has FP8 but no FP4 tensor cores"
    return GemmPath.DEQUANT_MATMUL, f"{props.name} ({cap}) has neither FP8 nor FP4 tensor cores"


def device_gemm_path(device: torch.device, backend: Backend) -> tuple[GemmPath, str]:
    """The :class:`GemmPath` for ``device`` under ``backend``, and why (traceable: no logging, no cache)."""
    if backend is Backend.REFERENCE:
        return GemmPath.REFERENCE, "the reference backend was chosen"
    return _hardware_gemm_path(device)


@functools.lru_cache(maxsize=None)
def _gemm_path_logged(device: torch.device, backend: Backend) -> GemmPath:
    path, why = device_gemm_path(device, backend)
    _log.info("mxfp4_mm on %s takes the %s path: %s", device, path.value, why)
    return path


def gemm_path(device: torch.device | str, backend: Backend | str | None = None) -> GemmPath:
    """The :class:`GemmPath` that :func:`mxfp4_mm` takes by default on ``device``.

    CUDA: DOT_SCALED on sm_100+ and CDNA4 (gfx950), FP8_ROWWISE on sm_89/sm_90, DEQUANT_MATMUL
    elsewhere; any other device: REFERENCE; REFERENCE also where :func:`resolve_backend` resolves
    to the reference backend (``ADAHOP_BACKEND=reference``). Logged once per device at INFO on the
    ``adahop.ops`` logger; benchmarks record it next to every figure.
    """
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return _gemm_path_logged(device, resolve_backend(device, backend))


def to_fp8_rowwise(t: MXFP4Tensor, backend: Backend | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact FP8 E4M3 ``(M, K)`` + fp32 row scales ``(M, 1)`` of an MXFP4 ``(M, K)`` (DESIGN.md §3).

    Equivalent to :func:`adahop.formats.to_fp8_rowwise_ref` bit for bit.
    """
    check_mxfp4_operand(t, "t")
    return library.fp8_encode(t.codes, t.scales, "row", resolve_backend(t.device, backend).value)


@functools.lru_cache(maxsize=None)
def _info_once(message: str) -> None:
    _log.info(message)


def _fp8_operand(t: MXFP4Tensor, backend: Backend | str | None) -> tuple[torch.Tensor, torch.Tensor]:
    if t.fp8 is not None:
        return t.fp8, t.fp8_scale
    _info_once("mxfp4_mm re-encodes MXFP4 operands to FP8 (an extra pass); quantize with emit_fp8=True to skip it")
    return to_fp8_rowwise(t, backend)


def fp8_mm(fa: torch.Tensor, sa: torch.Tensor, layout_a: str, fb: torch.Tensor, sb: torch.Tensor, layout_b: str,
           out_dtype: torch.dtype) -> torch.Tensor:
    """``A · Bᵀ`` of exact FP8 operands A ``(M, K)`` and Bᵀ ``(N, K)`` through cuBLAS's scaled GEMM.

    Layouts (:func:`adahop.library.fp8_scale_shape`): both ``row`` (fp32 scale per row), or A
    ``seg128`` and Bᵀ ``tile128`` (blockwise: per 1×128 segment of A, per 128×128 tile of Bᵀ;
    bfloat16 output only, K a multiple of 512). Every path is exact up to the fp32 accumulation
    and the output rounding.

    Blockwise needs whole groups of four K-blocks because cuBLASLt reads the tile scales with a
    leading dimension rounded up to a multiple of 4 (pytorch/pytorch#166752), while the torch
    releases before that change accept only the unpadded one: at other K the product would be
    made of the wrong scales, silently, or refused, depending on the release.
    """
    if (layout_a, layout_b) == ("seg128", "tile128"):
        if out_dtype is not torch.bfloat16:
            raise ValueError(f"the blockwise FP8 GEMM gives bfloat16 only, got out_dtype {out_dtype}")
        if fa.shape[-1] % BLOCKWISE_K:
            raise ValueError(f"the blockwise FP8 GEMM needs K a multiple of {BLOCKWISE_K}, got fa of shape "
                             f"{tuple(fa.shape)}: use layouts ('row', 'row')")
    elif (layout_a, layout_b) != ("row", "row"):
        raise ValueError(f"FP8 layouts A={layout_a!r}, B={layout_b!r}: use ('row', 'row') or ('seg128', 'tile128')")
    return library.fp8_mm(fa, sa, layout_a, fb, sb, layout_b, out_dtype)


def _mm_fp8_rowwise(a: MXFP4Tensor, b: MXFP4Tensor, out_dtype: torch.dtype, backend) -> torch.Tensor:
    fa, sa = _fp8_operand(a, backend)
    fb, sb = _fp8_operand(b, backend)
    return fp8_mm(fa, sa, "row", fb, sb, "row", out_dtype)


def _mm_dequant(a: MXFP4Tensor, b: MXFP4Tensor, out_dtype: torch.dtype, backend) -> torch.Tensor:
    # Dequantized MXFP4 values (two significant bits, exponents within bf16's range) are exact in
    # bf16 and in TF32, so only the GEMM's accumulation and output rounding remain.
    dtype = torch.bfloat16 if out_dtype is torch.bfloat16 else torch.float32
    return (dequantize(a, dtype, backend) @ dequantize(b, dtype, backend).t()).to(out_dtype)


def mxfp4_mm_ref(a: MXFP4Tensor, b: MXFP4Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``A · Bᵀ`` for A ``(M, K)`` and B ``(N, K)`` in MXFP4, computed in fp64 from the dequantized operands."""
    check_mxfp4_operands(a, b, out_dtype, (*MM_OUT_DTYPES, torch.float64))
    return (dequantize_mxfp4_ref(a, torch.float64) @ dequantize_mxfp4_ref(b, torch.float64).t()).to(out_dtype)


def mxfp4_mm(
    a: MXFP4Tensor,
    b: MXFP4Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    *,
    path: GemmPath | str | None = None,
    backend: Backend | str | None = None,
) -> torch.Tensor:
    """``A · Bᵀ`` ``(M, N)`` in ``out_dtype`` for MXFP4 A ``(M, K)`` and B ``(N, K)``, both along K.

    K a multiple of 32; any M and N. out_dtype: bfloat16 (default), float32 or float16. ``path``
    forces a :class:`GemmPath` (default: :func:`gemm_path` of the device, logged once); ``backend``
    picks kernel or reference for the sub-steps (FP8 re-encoding, dequantization). The FP8 path uses
    ``a.fp8``/``b.fp8`` when the quantizer emitted them (``emit_fp8=True``), else re-encodes.
    Every path is exact up to fp32 accumulation and the output rounding.

    Equivalent to ``mxfp4_mm_ref(a, b, out_dtype)``.
    """
    check_mxfp4_operands(a, b, out_dtype)
    path = gemm_path(a.device, backend) if path is None else GemmPath(path)
    if path is GemmPath.REFERENCE:
        return mxfp4_mm_ref(a, b, out_dtype)
    if path is GemmPath.DEQUANT_MATMUL:
        return _mm_dequant(a, b, out_dtype, backend)
    if path is GemmPath.FP8_ROWWISE:
        return _mm_fp8_rowwise(a, b, out_dtype, backend)
    return library.mm_dot_scaled(a.codes, a.scales, b.codes, b.scales, out_dtype)
