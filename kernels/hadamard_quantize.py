"""Fused block-Hadamard transform + MXFP4 quantization, one read of X for one or two orientations.

One kernel serves every variant through constexpr flags: quantize X ``(M, K)`` along K (the GEMM
operand as it lies), along M (the transpose, e.g. Xᵀ along tokens for ``wgrad``), or both from
the same tile load (:func:`hadamard_quantize_dual`). Each program loads a ``(BLOCK_M, BLOCK_K)``
tile, views each orientation as MX blocks ``(blocks, 32)`` and for each:

1. flips signs (optional ±1 vector along the quantized dimension; by the sign bit);
2. multiplies each Hadamard block by the ±1 Sylvester matrix on the tensor cores (``tl.dot``
   with fp32 accumulation; bf16/fp16 operands and ±1 products are exact, fp32 input goes in as
   three exact bf16 pieces), so the sums are exact whenever a block's values span ≤ ~11 binades;
   the 1/√HS factor is folded into the MX scale step and applied with one fma of its two fp32
   halves: the scaled values are the fp64 reference's, correctly rounded, except within ~2^-47
   of a rounding boundary;
3. quantizes exactly as :func:`adahop.formats.quantize_mxfp4_ref` decides (scale from the fp32
   exponent bits of the block amax, RNE or stochastic rounding, SR's scale bump, NaN/Inf blocks
   → scale 0xFF and codes 0) and stores packed codes (low nibble first) and E8M0 scales.

Why ``tl.dot`` and not a butterfly: the 32×32 product costs the tensor cores ~11% of their bf16
rate at the copy bandwidth and no issue slots worth counting, whereas a five-stage butterfly
needs five adds a value plus cross-lane exchanges (a block spans four lanes in Triton's layouts)
on the CUDA cores, which are the bottleneck here (below).

The FP8 row-scaled operand (DESIGN §3) needs R, the largest block exponent of a whole output
row, before any element can be written; a tile sees only part of a row (and the dual kernel's
two orientations have different rows). Decision: ``emit_fp8`` runs the row-wise re-encoding
kernel (:func:`adahop_kernels.fp8_reencode.fp8_reencode`: a pass over the row's scales for R,
then one over the codes) on the just-written codes and scales. It re-reads 0.53 B/value and
writes 1 B/value, against 2.53 B/value for the quantize pass (bf16 in), so the FP8 emission costs
~15% more traffic than a fused one would. The alternatives cost more where it hurts: a per-row
program with two passes over X repeats the transform and quantization (the kernel is near its
issue budget, below) and gives up the dual kernel's single read; the same re-encoding kernel is
needed anyway for saved MXFP4 tensors (Xᵀ for ``wgrad``) in the backward.

Random bits for SR are a function of (seed, orientation, output row, output column) only: the
tile shape (autotuned) never changes the result, and :func:`hadamard_quantize_dual` equals two
single calls bit for bit. The along-M orientation draws from Philox key ``seed | 2**62``.

Throughput (to be measured on the H200: ``tests/bench/test_bench_quantize.py``). Bytes per value
with bf16 input: read 2, write 0.5 + 1/32 per orientation; the dual kernel moves 3.06 B/value
against 5.06 for two single calls. At 85% of the 4.28 TB/s copy rate an H200 has ~0.73
warp-instructions per value to issue (132 SMs × 4 a cycle × ~1.9 GHz / 1.44e12 values/s), so the
CUDA-core work is the constraint, not the tensor cores. Counted on the sm_90 SASS
(``scripts/sass_count.py``), per value: along K, RNE, H32 0.69 (no Hadamard 0.60, with signs
0.76, fp32 input 0.93 against its own budget of ~1.1); along M 0.72; dual 1.34 for two
orientations (budget ~0.88 at its 3.06 B/value); SR 1.56 (one 10-round Philox call per four
values). Expectation: RNE single-orientation kernels near or just under the 85% target, the
dual kernel ~55–60% of copy (still less time than two single calls, which need 1.4 together),
SR ~40%: SR is compute-bound by its random bits. The packing tricks that got RNE there: codes
from the fp32 bit patterns (one add rounds to the grid), integer block max (also finds NaN/Inf),
eight codes a 32-bit word with the "-0" nibbles cleared by a SWAR mask, and H's columns permuted
so each MMA lane holds consecutive outputs (no data moves before the packing).

Measured on the H200 (``results/microbench/gpu/``): this kernel at 0192140 moved 2.0–2.3 TB/s
(0.48–0.54 of the same-run copy rate) for RNE along K with H32 at Llama shapes. A variant with
several row tiles per program (next load in flight), 16-bit SR draws and register-capped configs
(46df528) measured 1.04 TB/s (0.245) on 16384×4096 in the run at 69dc9c0, so it was reverted to
this one. The 85% target is missed: the kernel is bound by instruction issue, not memory.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from adahop.formats import BLOCK_SIZE, FLOAT_DTYPES, MXFP4Tensor
from adahop.hadamard import hadamard_matrix
from adahop_kernels._common import INTERPRETED, check_device, exp2_int, flip_sign, to_fp32

HADAMARD_SIZES = (16, 32, 64, 128)  # tl.dot needs ≥ 16; 128 keeps H within one tile
SEED_LIMIT = 1 << 62
TRANSPOSED_STREAM = 1 << 62  # OR-ed into the seed for the along-M orientation


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
    codes_ptr, scales_ptr, signs_ptr, seed, h_ptr, c_hi, c_lo,
    BR: tl.constexpr, BC: tl.constexpr,
    HADAMARD: tl.constexpr, HS: tl.constexpr, HAS_SIGNS: tl.constexpr, SR: tl.constexpr, DOT_FP32: tl.constexpr,
):
    """Quantize tile ``t (BR, BC)`` at (row0, col0) of an ``(n_rows, n_cols)`` operand along its columns; store it."""
    NB: tl.constexpr = BR * BC // 32
    cols = col0 + tl.arange(0, BC)
    if HAS_SIGNS:
        t = flip_sign(t, (tl.load(signs_ptr + cols, mask=cols < n_cols, other=1.0) < 0)[None, :])
    if HADAMARD:
        # The ±1 Sylvester matrix with its columns permuted (see _hadamard_pm1): the (j, t) swap
        # below restores the order without moving data between lanes.
        i = tl.arange(0, HS)
        h = tl.load(h_ptr + i[:, None] * HS + i[None, :])
        a = tl.reshape(t, (BR * BC // HS, HS))
        if a.dtype == tl.float32:
            # Three exact 8-bit pieces (bf16 on the GPU): three bf16 products replace 32 fp32
            # FMAs a value. In the interpreter the pieces stay fp32 (its bf16 tl.dot is wrong).
            hi = (a.to(tl.int32, bitcast=True) & -65536).to(tl.float32, bitcast=True)
            rest = a - hi
            mid = (rest.to(tl.int32, bitcast=True) & -65536).to(tl.float32, bitcast=True)
            lo = rest - mid
            op_dtype = tl.float32 if DOT_FP32 else tl.bfloat16
            h = h.to(op_dtype)
            acc = tl.dot(hi.to(op_dtype), h)
            acc = tl.dot(mid.to(op_dtype), h, acc)
            acc = tl.dot(lo.to(op_dtype), h, acc)
        elif DOT_FP32:
            acc = tl.dot(to_fp32(a), h)
        else:
            acc = tl.dot(a, h.to(a.dtype))
        acc = tl.permute(tl.reshape(acc, (BR * BC // HS, HS // 8, 4, 2)), (0, 2, 1, 3))
        s = tl.reshape(acc, (NB, 32))  # exact ±1 sums; the 1/√HS factor is applied below, once
    else:
        s = tl.reshape(to_fp32(t), (NB, 32))
    # Block max of |s| on the bit patterns: integer order is float order for |s|, and NaN and Inf
    # sort above every finite value, so the same max finds the bad blocks.
    m_bits = tl.max(s.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1)
    bad = m_bits > 0x7F7FFFFF
    amax = m_bits.to(tl.float32, bitcast=True)
    if HADAMARD:
        amax = tl.fma(amax, c_hi, amax * c_lo)  # = max |fl32(s · 1/√HS)|: rounding is monotone
    # floor(log2 amax) - 2 from the exponent field; zero/subnormal amax clamps to byte 0.
    scale = tl.minimum(tl.maximum((amax.to(tl.int32, bitcast=True) >> 23) - 2, 0), 254)
    if SR:
        # Saturation would bias SR: a block whose scaled amax exceeds 6 takes the next scale.
        scale += (amax * exp2_int(127 - scale) > 6.0).to(tl.int32)
    inv_scale = exp2_int(127 - scale)
    if HADAMARD:
        # |s| / √HS / 2^e rounded once: (c_hi + c_lo) 2^-e is exact, the fma keeps ~48 bits.
        q = tl.fma(tl.abs(s), (c_hi * inv_scale)[:, None], tl.abs(s) * (c_lo * inv_scale)[:, None])
    else:
        q = tl.abs(s) * inv_scale[:, None]
    # E2M1 grid step is 2^(e-1) in binade [2^e, 2^(e+1)), 0.5 below 1; E = that binade's exponent bits.
    e_bits = tl.maximum(q.to(tl.int32, bitcast=True) & 0x7F800000, 0x3F800000)
    if SR:
        steps = q * (0x7F800000 - e_bits).to(tl.float32, bitcast=True)  # q / step, exact, in [0, 4)
        down = tl.floor(steps)
        u = _uniform_blocks(seed, row0 + tl.arange(0, NB) // (BC // 32), col0 // 32 + tl.arange(0, NB) % (BC // 32),
                            n_cols, NB)
        n = down.to(tl.int32) + (u < steps - down).to(tl.int32)  # up with probability frac(steps)
    else:
        # Adding 1.5 · 2^23 · step rounds q to a multiple of step, ties to even; the integer
        # difference of the bit patterns is the number of steps.
        magic = e_bits + 0x0B400000
        n = (q + magic.to(tl.float32, bitcast=True)).to(tl.int32, bitcast=True) - magic
    # Binades 2^0, 2^1, 2^2 start at codes 2·(e - 127) = 0, 2, 4; 7 is 6.0 (saturation). The sign
    # bit goes on every code here; a "-0" (code 8) is cleared per word below.
    code = tl.minimum(n + (e_bits >> 22) - 254, 7) | ((s.to(tl.int32, bitcast=True) >> 28) & 8)
    scale = tl.where(bad, 255, scale)

    # Eight codes a 32-bit word, element 2i in the low nibble of byte i (little-endian words).
    lo, hi = tl.split(tl.reshape(code, (NB, 16, 2)))
    lo, hi = tl.split(tl.reshape(lo | (hi << 4), (NB, 8, 2)))
    lo, hi = tl.split(tl.reshape(lo | (hi << 8), (NB, 4, 2)))
    words = lo | (hi << 16)
    # Per nibble: bit 3 of (low 3 bits + 7) says "magnitude > 0"; keep the sign bit only there.
    words = words & (((words & 0x77777777) + 0x77777777) | 0x77777777)
    words = tl.where(bad[:, None], 0, words)
    b = tl.arange(0, NB)
    rows = (row0 + b // (BC // 32)).to(tl.int64)
    cblk = col0 // 32 + b % (BC // 32)
    ok = (rows < n_rows) & (cblk < n_cols // 32)
    tl.store(codes_ptr.to(tl.pointer_type(tl.int32)) + (rows * (n_cols // 8) + cblk * 4)[:, None]
             + tl.arange(0, 4)[None, :], words, mask=ok[:, None])
    tl.store(scales_ptr + rows * (n_cols // 32) + cblk, scale.to(tl.uint8), mask=ok)


@triton.jit(do_not_specialize=["seed", "seed_t"])
def _hadamard_quantize_kernel(
    x_ptr, stride_m, stride_k, M, K,
    codes_ptr, scales_ptr, signs_ptr, seed,
    codes_t_ptr, scales_t_ptr, signs_t_ptr, seed_t,
    h_ptr, c_hi, c_lo,
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
        _quantize_store(x, m0, k0, M, K, codes_ptr, scales_ptr, signs_ptr, seed, h_ptr, c_hi, c_lo,
                        BLOCK_M, BLOCK_K, HADAMARD, HS, HAS_SIGNS, SR, DOT_FP32)
    if ALONG_M:
        _quantize_store(tl.trans(x), k0, m0, K, M, codes_t_ptr, scales_t_ptr, signs_t_ptr, seed_t, h_ptr, c_hi, c_lo,
                        BLOCK_K, BLOCK_M, HADAMARD_T, HS, HAS_SIGNS_T, SR, DOT_FP32)


def _quantized_dim_ok(config: triton.Config, kwargs: dict) -> bool:
    unit = max(BLOCK_SIZE, kwargs["HS"])
    return not ((kwargs["ALONG_K"] and config.kwargs["BLOCK_K"] % unit)
                or (kwargs["ALONG_M"] and config.kwargs["BLOCK_M"] % unit))


# 32 or 64 values a thread (the MMA accumulator of a 64-value slice takes ~130 registers); wide
# along K for one orientation, square-ish for the transposing ones. Pruned to the Hadamard size.
_GPU_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_K": bk}, num_warps=w)
    for bm, bk, w in ((16, 256, 4), (32, 128, 4), (32, 256, 4), (64, 256, 8), (64, 64, 4), (64, 128, 4), (128, 64, 4),
                     (128, 128, 8))
]
_tuned_kernel = triton.autotune(
    _GPU_CONFIGS,
    key=["M", "K", "ALONG_K", "ALONG_M", "HADAMARD", "HADAMARD_T", "HS", "SR", "DOT_FP32"],
    prune_configs_by={"early_config_prune": lambda configs, nargs, **kw: [c for c in configs if _quantized_dim_ok(c, kw)]},
)(_hadamard_quantize_kernel)


@functools.lru_cache(maxsize=None)
def _scale_split(size: int) -> tuple[float, float]:
    """``1/sqrt(size)`` as an fp32 pair ``hi + lo`` (each exactly representable; cached: the
    tensors that round it would cost host time on every launch)."""
    c = 1.0 / size**0.5
    hi = float(torch.tensor(c, dtype=torch.float64).float())
    return hi, float(torch.tensor(c - hi, dtype=torch.float64).float())


@functools.lru_cache(maxsize=16)
def _hadamard_pm1(size: int, device: torch.device) -> torch.Tensor:
    """The ±1 Sylvester matrix ``(size, size)`` (fp32) with its columns permuted for the MMA layout.

    Lane t of a quad holds accumulator columns 8j + 2t + {0, 1}; column d of this matrix is
    column ``(size/4)·t + 2j + i`` of H (d = 8j + 2t + i), so each lane ends up holding size/4
    consecutive outputs, which the kernel packs without moving data between lanes.
    """
    d = torch.arange(size)
    col = (size // 4) * ((d % 8) // 2) + 2 * (d // 8) + d % 2
    h = torch.round(hadamard_matrix(size, torch.float64) * size**0.5)
    return h[:, col].float().contiguous().to(device)


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
        c_hi, c_lo = _scale_split(hadamard_size)
        args = dict(
            x_ptr=x, stride_m=x.stride(0), stride_k=x.stride(1), M=m, K=k,
            codes_ptr=out_k.codes if out_k else x, scales_ptr=out_k.scales if out_k else x,
            signs_ptr=signs if signs is not None else x, seed=seed,
            codes_t_ptr=out_m.codes if out_m else x, scales_t_ptr=out_m.scales if out_m else x,
            signs_t_ptr=signs_t if signs_t is not None else x, seed_t=seed | TRANSPOSED_STREAM,
            h_ptr=_hadamard_pm1(hadamard_size, x.device) if hadamard_size in HADAMARD_SIZES else x,
            c_hi=c_hi, c_lo=c_lo,
            ALONG_K=along_k is not None, ALONG_M=along_m is not None,
            HADAMARD=bool(along_k and along_k.hadamard), HADAMARD_T=bool(along_m and along_m.hadamard),
            HAS_SIGNS=signs is not None, HAS_SIGNS_T=signs_t is not None,
            HS=hadamard_size if hadamard_size in HADAMARD_SIZES else 32, SR=rounding == "sr",
            # bf16/fp16 operands give garbage in the interpreter's tl.dot.
            DOT_FP32=INTERPRETED,
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
