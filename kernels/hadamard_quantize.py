"""Fused block-Hadamard transform + MXFP4 quantization, one read of X for one or two orientations.

One kernel serves every variant through constexpr flags: quantize X ``(M, K)`` along K (the GEMM
operand as it lies), along M (the transpose, e.g. Xᵀ along tokens for ``wgrad``), or both from
the same tile load (:func:`hadamard_quantize_dual`). Each program loads a ``(BLOCK_M, BLOCK_K)``
tile, views each orientation as MX blocks ``(blocks, 32)`` and for each:

1. flips signs (optional ±1 vector along the quantized dimension);
2. multiplies each Hadamard block by the ±1 Sylvester matrix on the tensor cores (``tl.dot``;
   bf16/fp16 operands are exact, products of ±1 are exact and the fp32 accumulator is exact
   whenever a block's values span ≤ ~11 binades), then by ``1/√HS = c_hi + c_lo`` with one fma,
   so the fp32 result is the correctly rounded value of the fp64 reference in all but ~1e-7 of
   cases (HS = 16, 64: a power of two, always exact);
3. quantizes exactly as :func:`adahop.formats.quantize_mxfp4_ref` decides (scale from the fp32
   exponent bits of the block amax, RNE or stochastic rounding, SR's scale bump, NaN/Inf blocks
   → scale 0xFF and codes 0) and stores packed codes (low nibble first) and E8M0 scales.

The FP8 row-scaled operand (DESIGN §3) needs R, the largest block exponent of a whole output
row, before any element can be written; a tile sees only part of a row (and the dual kernel's
two orientations have different rows). Decision: ``emit_fp8`` runs the row-wise re-encoding
kernel (:func:`adahop_kernels.fp8_reencode.fp8_reencode`: a pass over the row's scales for R,
then one over the codes) on the just-written codes and scales. It re-reads 0.53 B/value and
writes 1 B/value, against 2.53 B/value for the quantize pass (bf16 in), so the FP8 emission costs
~15% more traffic than a fused one would. The alternatives cost more where it hurts: a per-row
program with two passes over X repeats the transform and quantization (the kernel is already
near its issue budget, below) and gives up the dual kernel's single read; the same re-encoding
kernel is needed anyway for saved MXFP4 tensors (Xᵀ for ``wgrad``) in the backward.

Random bits for SR are a function of (seed, orientation, output row, output column) only: the
tile shape (autotuned) never changes the result, and :func:`hadamard_quantize_dual` equals two
single calls bit for bit. The along-M orientation draws from Philox key ``seed | 2**62``.

Bandwidth (to be measured: ``tests/bench/test_bench_quantize.py``). Bytes per value with bf16
input: read 2, write 0.5 + 1/32 per orientation; the dual kernel moves 3.06 B/value against
5.06 for two single calls. At the H200's ~4.3 TB/s copy rate a single orientation has ≈20 issue
slots per value (132 SMs × 128 lanes × ~1.9 GHz / 1.7e12 values/s); the RNE path needs about that
(compare/select/round ≈ 15, amax and stores ≈ 3, the fma epilogue 2), the 32×32 product runs on
the tensor cores at ~11% of their bf16 rate. Expectation: ~80–90% of copy bandwidth for RNE with
or without the Hadamard, lower for SR (one Philox call per 4 values, ~25 integer ops per value:
compute-bound, ~50–70%) and for fp32 input (the Hadamard product runs as exact fp32 FMAs).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from adahop.formats import BLOCK_SIZE, FLOAT_DTYPES, MXFP4Tensor
from adahop_kernels._common import INTERPRETED, check_device, exp2_int, flip_sign, to_fp32

HADAMARD_SIZES = (16, 32, 64, 128)  # tl.dot needs ≥ 16; 128 keeps H within one tile
SEED_LIMIT = 1 << 62
TRANSPOSED_STREAM = 1 << 62  # OR-ed into the seed for the along-M orientation

_FP32_MAX: tl.constexpr = 3.4028234663852886e38
# t + 1.5·2^23 − 1.5·2^23 rounds fp32 t (|t| < 2^22) to an integer, ties to even, in one addition.
_ROUND_MAGIC: tl.constexpr = 12582912.0


@triton.jit
def _uniform_blocks(seed, rows, cblk, n_cols, NB: tl.constexpr):
    """``(NB, 32)`` uniforms in [0, 1) for the MX blocks at (``rows``, ``cblk``) of an ``n_cols``-wide operand."""
    # One Philox call gives four 32-bit draws: group g of a row feeds its elements 4g..4g+3.
    groups = (rows.to(tl.int64) * (n_cols // 4) + cblk * 8)[:, None] + tl.arange(0, 8)[None, :]
    r0, r1, r2, r3 = tl.randint4x(seed, groups)
    draws = tl.reshape(tl.join(tl.join(r0, r1), tl.join(r2, r3)), (NB, 32))
    return tl.uint_to_uniform_float(draws)


@triton.jit
def _quantize_store(
    t, row0, col0, n_rows, n_cols,
    codes_ptr, scales_ptr, signs_ptr, seed, c_hi, c_lo,
    BR: tl.constexpr, BC: tl.constexpr,
    HADAMARD: tl.constexpr, HS: tl.constexpr, HAS_SIGNS: tl.constexpr, SR: tl.constexpr, DOT_FP32: tl.constexpr,
):
    """Quantize tile ``t (BR, BC)`` at (row0, col0) of an ``(n_rows, n_cols)`` operand along its columns; store it."""
    NB: tl.constexpr = BR * BC // 32
    cols = col0 + tl.arange(0, BC)
    if HAS_SIGNS:
        t = flip_sign(t, (tl.load(signs_ptr + cols, mask=cols < n_cols, other=1.0) < 0)[None, :])
    if HADAMARD:
        # Sylvester H: entry (i, j) is (-1)^popcount(i & j); fold the parity of up to 8 bits.
        i = tl.arange(0, HS)
        p = i[:, None] & i[None, :]
        p = p ^ (p >> 4)
        p = p ^ (p >> 2)
        p = p ^ (p >> 1)
        h = 1.0 - 2.0 * (p & 1).to(tl.float32)
        a = tl.reshape(t, (BR * BC // HS, HS))
        if DOT_FP32:
            acc = tl.dot(to_fp32(a), h, input_precision="ieee")
        else:
            acc = tl.dot(a, h.to(a.dtype))
        v = tl.reshape(tl.fma(acc, c_hi, acc * c_lo), (NB, 32))
    else:
        v = tl.reshape(to_fp32(t), (NB, 32))

    mag = tl.abs(v)
    finite = mag <= _FP32_MAX
    bad = tl.max(tl.where(finite, 0, 1), axis=1) > 0
    amax = tl.max(tl.where(finite, mag, 0.0), axis=1)
    # floor(log2 amax) - 2 from the exponent field; zero/subnormal amax clamps to byte 0.
    scale = tl.minimum(tl.maximum((amax.to(tl.int32, bitcast=True) >> 23) - 2, 0), 254)
    if SR:
        # Saturation would bias SR: a block whose scaled amax exceeds 6 takes the next scale.
        scale += (amax * exp2_int(127 - scale) > 6.0).to(tl.int32)
    q = mag * exp2_int(127 - scale)[:, None]
    # E2M1 grid spacing is 0.5 below 2, 1 in [2, 4), 2 above: code = q / spacing + offset.
    inv = tl.where(q < 2.0, 2.0, tl.where(q < 4.0, 1.0, 0.5))
    offset = tl.where(q < 2.0, 0.0, tl.where(q < 4.0, 2.0, 4.0))
    steps = q * inv
    if SR:
        lo = tl.floor(steps)
        u = _uniform_blocks(seed, row0 + tl.arange(0, NB) // (BC // 32), col0 // 32 + tl.arange(0, NB) % (BC // 32),
                            n_cols, NB)
        steps = lo + tl.where(u < steps - lo, 1.0, 0.0)
    else:
        steps = (steps + _ROUND_MAGIC) - _ROUND_MAGIC
    idx = tl.minimum(steps + offset, 7.0).to(tl.int32)  # 7 = 6.0: saturation
    code = tl.where((v < 0) & (idx > 0), idx + 8, idx)
    code = tl.where(bad[:, None], 0, code)
    scale = tl.where(bad, 255, scale)

    lo_nib, hi_nib = tl.split(tl.reshape(code, (NB, 16, 2)))
    packed = (lo_nib | (hi_nib << 4)).to(tl.uint8)
    b = tl.arange(0, NB)
    rows = (row0 + b // (BC // 32)).to(tl.int64)
    cblk = col0 // 32 + b % (BC // 32)
    ok = (rows < n_rows) & (cblk < n_cols // 32)
    tl.store(codes_ptr + (rows * (n_cols // 2) + cblk * 16)[:, None] + tl.arange(0, 16)[None, :], packed,
             mask=ok[:, None])
    tl.store(scales_ptr + rows * (n_cols // 32) + cblk, scale.to(tl.uint8), mask=ok)


@triton.jit(do_not_specialize=["seed", "seed_t"])
def _hadamard_quantize_kernel(
    x_ptr, stride_m, stride_k, M, K,
    codes_ptr, scales_ptr, signs_ptr, seed,
    codes_t_ptr, scales_t_ptr, signs_t_ptr, seed_t,
    c_hi, c_lo,
    ALONG_K: tl.constexpr, ALONG_M: tl.constexpr, HADAMARD: tl.constexpr, HADAMARD_T: tl.constexpr,
    HAS_SIGNS: tl.constexpr, HAS_SIGNS_T: tl.constexpr, HS: tl.constexpr, SR: tl.constexpr,
    DOT_FP32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):
    m0 = tl.program_id(0) * BLOCK_M
    k0 = tl.program_id(1) * BLOCK_K
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_k = k0 + tl.arange(0, BLOCK_K)
    ptrs = x_ptr + offs_m.to(tl.int64)[:, None] * stride_m + offs_k.to(tl.int64)[None, :] * stride_k
    # Padding is 0: a padded block is all-zero and never stored (the quantized dims divide the tile).
    x = tl.load(ptrs, mask=(offs_m < M)[:, None] & (offs_k < K)[None, :], other=0.0)
    if ALONG_K:
        _quantize_store(x, m0, k0, M, K, codes_ptr, scales_ptr, signs_ptr, seed, c_hi, c_lo,
                        BLOCK_M, BLOCK_K, HADAMARD, HS, HAS_SIGNS, SR, DOT_FP32)
    if ALONG_M:
        _quantize_store(tl.trans(x), k0, m0, K, M, codes_t_ptr, scales_t_ptr, signs_t_ptr, seed_t, c_hi, c_lo,
                        BLOCK_K, BLOCK_M, HADAMARD_T, HS, HAS_SIGNS_T, SR, DOT_FP32)


def _quantized_dim_ok(config: triton.Config, kwargs: dict) -> bool:
    unit = max(BLOCK_SIZE, kwargs["HS"])
    return not ((kwargs["ALONG_K"] and config.kwargs["BLOCK_K"] % unit)
                or (kwargs["ALONG_M"] and config.kwargs["BLOCK_M"] % unit))


_GPU_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_K": bk}, num_warps=w)
    for bm, bk, w in ((32, 256, 4), (64, 256, 8), (32, 512, 8), (64, 128, 4), (128, 64, 4), (128, 128, 8))
]
_tuned_kernel = triton.autotune(
    _GPU_CONFIGS,
    key=["M", "K", "ALONG_K", "ALONG_M", "HADAMARD", "HADAMARD_T", "HS", "SR", "DOT_FP32"],
    prune_configs_by={"early_config_prune": lambda configs, nargs, **kw: [c for c in configs if _quantized_dim_ok(c, kw)]},
)(_hadamard_quantize_kernel)


def _interpreter_blocks(m: int, k: int, unit_m: int, unit_k: int) -> dict:
    """Few, large programs: the interpreter's cost grows with the program count, not the tile size."""
    block_k = max(unit_k, min(2048, triton.next_power_of_2(k)))
    block_m = max(unit_m, min(65536 // block_k, triton.next_power_of_2(m)))
    return {"BLOCK_M": block_m, "BLOCK_K": block_k}


class _Side(NamedTuple):
    """One quantized orientation of X: its transform and whether it also wants the FP8 operand."""

    hadamard: bool
    signs: torch.Tensor | None
    emit_fp8: bool


def _check_x(x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (rows, K), got shape {tuple(x.shape)}")
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"x must be float32, bfloat16 or float16, got {x.dtype}")
    check_device(x, "x")


def _check_side(side: _Side, n: int, dim: str, x: torch.Tensor, hadamard_size: int) -> torch.Tensor | None:
    """Check one orientation's divisibility and signs; return the signs ready for the kernel."""
    unit = max(BLOCK_SIZE, hadamard_size) if side.hadamard else BLOCK_SIZE
    if n % unit:
        what = f"the MX block size {BLOCK_SIZE}" if unit == BLOCK_SIZE else f"the Hadamard size {unit}"
        raise ValueError(f"x: the quantized dimension {dim}={n} is not a multiple of {what}; "
                         "pad it or keep this layer in BF16")
    s = side.signs
    if s is None:
        return None
    if not isinstance(s, torch.Tensor) or s.shape != (n,):
        raise ValueError(f"signs for the {dim} orientation must be a tensor of shape ({n},), got "
                         f"{tuple(s.shape) if isinstance(s, torch.Tensor) else type(s).__name__}")
    if s.device != x.device:
        raise ValueError(f"signs are on {s.device} but x is on {x.device}")
    if not s.dtype.is_floating_point:
        raise ValueError(f"signs must be a floating ±1 vector, got {s.dtype}")
    return s.contiguous()


def _resolve_seed(rounding: str, seed: int | None) -> int:
    if rounding not in ("rne", "sr"):
        raise ValueError(f"rounding must be 'rne' or 'sr', got {rounding!r}")
    if rounding == "rne":
        return 0
    if seed is None:
        # Drawn from torch's global generator, as the reference's SR does without a seed.
        return int(torch.randint(0, SEED_LIMIT, ()).item())
    if not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"seed must be an int in [0, 2**62), got {seed!r}")
    return seed


def _quantize(
    x: torch.Tensor,
    along_k: _Side | None,
    along_m: _Side | None,
    hadamard_size: int,
    rounding: str,
    seed: int | None,
    nan_policy: str,
) -> tuple[MXFP4Tensor | None, MXFP4Tensor | None]:
    """Launch the kernel for the requested orientations of ``x (M, K)``; ``None`` for one not requested."""
    _check_x(x)
    m, k = x.shape
    if any(s is not None and s.hadamard for s in (along_k, along_m)) and hadamard_size not in HADAMARD_SIZES:
        raise ValueError(f"the Triton kernel supports Hadamard sizes {HADAMARD_SIZES}, got {hadamard_size}")
    signs = _check_side(along_k, k, "K", x, hadamard_size) if along_k else None
    signs_t = _check_side(along_m, m, "M", x, hadamard_size) if along_m else None
    seed = _resolve_seed(rounding, seed)
    if nan_policy not in ("propagate", "raise"):
        raise ValueError(f"nan_policy must be 'propagate' or 'raise', got {nan_policy!r}")
    if nan_policy == "raise" and not torch.isfinite(x).all():
        raise ValueError("x holds NaN or Inf values and nan_policy='raise'")

    def empty(rows: int, n: int) -> MXFP4Tensor:
        return MXFP4Tensor(torch.empty((rows, n // 2), dtype=torch.uint8, device=x.device),
                           torch.empty((rows, n // BLOCK_SIZE), dtype=torch.uint8, device=x.device))

    out_k = empty(m, k) if along_k else None
    out_m = empty(k, m) if along_m else None
    if m and k:
        c = 1.0 / hadamard_size**0.5
        c_hi = float(torch.tensor(c, dtype=torch.float64).float())
        args = dict(
            x_ptr=x, stride_m=x.stride(0), stride_k=x.stride(1), M=m, K=k,
            codes_ptr=out_k.codes if out_k else x, scales_ptr=out_k.scales if out_k else x,
            signs_ptr=signs if signs is not None else x, seed=seed,
            codes_t_ptr=out_m.codes if out_m else x, scales_t_ptr=out_m.scales if out_m else x,
            signs_t_ptr=signs_t if signs_t is not None else x, seed_t=seed | TRANSPOSED_STREAM,
            c_hi=c_hi, c_lo=float(torch.tensor(c - c_hi, dtype=torch.float64).float()),
            ALONG_K=along_k is not None, ALONG_M=along_m is not None,
            HADAMARD=bool(along_k and along_k.hadamard), HADAMARD_T=bool(along_m and along_m.hadamard),
            HAS_SIGNS=signs is not None, HAS_SIGNS_T=signs_t is not None,
            HS=hadamard_size if hadamard_size in HADAMARD_SIZES else 32, SR=rounding == "sr",
            # bf16 operands give garbage in the interpreter's tl.dot; fp32 must not go through TF32.
            DOT_FP32=INTERPRETED or x.dtype == torch.float32,
        )
        if INTERPRETED:
            unit = max(BLOCK_SIZE, args["HS"])
            blocks = _interpreter_blocks(m, k, unit if along_m else BLOCK_SIZE, unit if along_k else BLOCK_SIZE)
            grid = (triton.cdiv(m, blocks["BLOCK_M"]), triton.cdiv(k, blocks["BLOCK_K"]))
            _hadamard_quantize_kernel[grid](**args, **blocks)
        else:
            _tuned_kernel[lambda meta: (triton.cdiv(m, meta["BLOCK_M"]), triton.cdiv(k, meta["BLOCK_K"]))](**args)

    for out, side in ((out_k, along_k), (out_m, along_m)):
        if out is not None and side.emit_fp8:
            from adahop_kernels.fp8_reencode import fp8_reencode

            out.fp8, out.fp8_scale = fp8_reencode(out)
    return out_k, out_m


def hadamard_quantize(
    x: torch.Tensor,
    *,
    transpose: bool = False,
    hadamard: bool = True,
    hadamard_size: int = 32,
    signs: torch.Tensor | None = None,
    rounding: str = "rne",
    seed: int | None = None,
    emit_fp8: bool = False,
    nan_policy: str = "propagate",
) -> MXFP4Tensor:
    """Block-Hadamard (optional) + MXFP4 quantization of ``x (M, K)`` on the GPU (or the interpreter).

    x: float32/bfloat16/float16, any strides. ``transpose=False``: quantized along K, returns
    ``(M, K)``; ``transpose=True``: along M, returns the transpose ``(K, M)``. The quantized
    dimension must be a multiple of 32 and, with ``hadamard``, of ``hadamard_size`` (16, 32, 64
    or 128). ``signs``: ±1, the length of the quantized dimension. ``rounding="sr"`` draws from
    ``seed`` (an int in [0, 2**62); ``None`` draws one from torch's generator). ``emit_fp8`` adds
    the exact FP8 row-scaled operand.

    Equivalent to ``adahop.ops.hadamard_quantize_ref(x.T if transpose else x, ...)`` (bit-exact
    for RNE up to fp32 rounding of the transform; SR draws differ, their distribution does not).
    """
    side = _Side(hadamard, signs, emit_fp8)
    out_k, out_m = _quantize(x, None if transpose else side, side if transpose else None,
                             hadamard_size, rounding, seed, nan_policy)
    return out_m if transpose else out_k


def hadamard_quantize_dual(
    x: torch.Tensor,
    *,
    hadamard: bool = True,
    hadamard_t: bool = True,
    hadamard_size: int = 32,
    signs: torch.Tensor | None = None,
    signs_t: torch.Tensor | None = None,
    rounding: str = "rne",
    seed: int | None = None,
    emit_fp8: bool = False,
    emit_fp8_t: bool = False,
    nan_policy: str = "propagate",
) -> tuple[MXFP4Tensor, MXFP4Tensor]:
    """One read of ``x (M, K)``, two quantized orientations: ``(x along K (M, K), xᵀ along M (K, M))``.

    The forward's X (GEMM operand along ``in``) and the Xᵀ along tokens that ``wgrad`` needs,
    each with its own Hadamard flag, signs (length K for ``x``, M for ``xᵀ``) and FP8 request.
    Both M and K must be multiples of 32 (and of ``hadamard_size`` where transformed).

    Equivalent to ``(hadamard_quantize(x, hadamard=hadamard, signs=signs, ...),
    hadamard_quantize(x, transpose=True, hadamard=hadamard_t, signs=signs_t, ...))``, bit for bit.
    """
    return _quantize(x, _Side(hadamard, signs, emit_fp8), _Side(hadamard_t, signs_t, emit_fp8_t),
                     hadamard_size, rounding, seed, nan_policy)
