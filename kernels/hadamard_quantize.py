"""Fused block-Hadamard transform + MXFP4 quantization + FP8 GEMM operand, one read of X.

One kernel serves every variant through constexpr flags (:func:`quantize`; the wrappers
:func:`hadamard_quantize` and :func:`hadamard_quantize_dual` keep the MXFP4-only interface): quantize
X ``(M, K)`` along K (the GEMM operand as it lies), along M (the transpose, e.g. Xᵀ along tokens for
``wgrad``), or both from the same tile load. Each program loads a ``(BLOCK_M, BLOCK_K)`` tile, views
each orientation as MX blocks ``(blocks, 32)`` and for each:

1. takes ``max |x|`` of each output row if asked (``amax``, for outlier selection: an int atomic max
   on the fp32 bit patterns, so NaN rows stay NaN and the result does not depend on the tiling);
2. flips signs (optional ±1 vector along the quantized dimension; by the sign bit);
3. multiplies each Hadamard block by the ±1 Sylvester matrix on the tensor cores (``tl.dot``
   with fp32 accumulation; bf16/fp16 operands and ±1 products are exact, fp32 input goes in as
   three exact bf16 pieces), so the sums are exact whenever a block's values span ≤ ~11 binades;
   the 1/√HS factor is folded into the MX scale step and applied with one fma of its two fp32
   halves: the scaled values are the fp64 reference's, correctly rounded, except within ~2^-47
   of a rounding boundary. Sums past the fp32 range (blocks with values from ~2^128/HS up, where
   the reference's fp64 transform is still finite) turn the block bad: the program marks the
   block's 128×128 square, and a second kernel (:func:`_redo_kernel`) redoes each marked square
   with its bad groups pre-scaled by 2^-8, taking the factor back in their scales, so the result
   decides as the reference does up to the fp32 maximum (NaN scale only where the reference's
   fp32 values overflow or the input holds NaN/Inf);
4. quantizes exactly as :func:`adahop.formats.quantize_mxfp4_ref` decides (scale from the fp32
   exponent bits of the block amax, RNE or stochastic rounding, SR's scale bump, NaN/Inf blocks
   → scale 0xFF and codes 0) and, if ``packed``, stores packed codes (low nibble first) and E8M0
   scales;
5. with ``fp8="seg128"`` or ``"tile128"``, writes the exact FP8 E4M3 GEMM operand of DESIGN §3
   itself, scaled per 1×128 segment (A of ``torch._scaled_mm``) or 128×128 tile (Bᵀ): the scale
   2^(R-6) needs only the group's largest block exponent R, and the tile shapes are multiples of
   128 along the quantized dimension (and along the rows for tile128), so a program holds whole
   groups. The rounded E2M1 value stays an fp32 number (the same rounding as the codes'), times
   2^(e-R+6), and the GPU's own conversion writes the E4M3 bytes (two a ``cvt``): no code is formed
   on the way. Exact whenever a group's block exponents span ≤ 14 binades; blocks further below R
   are rounded to E4M3's subnormal step first (ties to even), which is what
   :func:`adahop.formats.to_fp8_ref` does, bit for bit. ``fp8="row"`` needs the whole row's R,
   which no tile holds (and the dual kernel's two orientations have different rows), so it runs the
   rowwise re-encoding (:func:`adahop_kernels.fp8_reencode.fp8_reencode`) on the just-written
   codes and scales.

Why ``tl.dot`` and not a butterfly: the 32×32 product costs the tensor cores ~11% of their bf16
rate at the copy bandwidth and no issue slots worth counting, whereas a five-stage butterfly
needs five adds a value plus cross-lane exchanges (a block spans four lanes in Triton's layouts)
on the CUDA cores, which are the bottleneck here (below).

Random bits for SR are a function of (seed, orientation, output row, output column) only: the
tile shape (autotuned) never changes the result, and a dual call equals two single calls bit for
bit. The seed is an int64 device tensor the kernel loads (an int is put into one), so a new seed
every step neither recompiles nor synchronises under ``torch.compile``; the along-M orientation
draws with bit 62 of the seed set. The bits come from the pcg4d hash of (column group, row, seed's
two halves): 128 bits from three multiply stages over its four words, where Philox-4x32-10, the
SR steps' largest share of instructions before it, takes ten rounds. Each value takes 16 of them: rounding up has probability
frac(x / step) to within 2^-16, against the quantization error's own spread of ~0.29 step.

Throughput. Minimal bytes per value with bf16 input: read 2; write per orientation 0.5 + 1/32
packed, 1 + 1/32 FP8 seg128, 1 + 1/4096 FP8 tile128. An H200 issues 132 SMs × 4
warp-instructions a cycle × ~1.9 GHz; at 85% of the 4.28 TB/s copy rate and 2.53 B a value that
leaves ~0.73 warp-instructions per value. The layer's steps on the H200 at 16384×8192 (X: seg128
along K + packed along M; W: tile128 both ways; dY: SR, seg128 both ways), against the kernel
before the float FP8 path, the pcg4d draws and the register caps, in the same run
(``quantize-ab-pcg4d-caps`` in ``results/microbench/gpu/history/``): X 1209 GB/s (0.29 of copy,
1.03x), W 1102 (0.27, 1.17x), dY 831 (0.20, 1.14x) (that run's other shapes disagree with
every earlier run of the same kernels, by up to 3x either way: not read here).
These changes issue fewer instructions a value (the float path forms no codes for an FP8-only
orientation, the block max is one instruction a value, the hash replaces ten Philox rounds), yet
bought 3-17% of speed: the issue rate is not what holds the steps near a quarter of copy. The Nsight Compute profile of the earlier kernel on the three steps
(``profile_quantize_16384x8192.txt`` in ``results/microbench/gpu/``) said what does: 1.75, 1.85 and
2.95 warp-instructions issued a value (X, W, dY), DRAM 14-23% busy, and about one eligible warp a
scheduler, so the issue slots were 46-59% used; at full issue those counts would have capped the
steps at 0.46, 0.48 and 0.31 of copy (DESIGN §6). What did not help, measured: persistent
programs walking tiles with the next load in flight (0.46-0.82x the best config;
``quantize-sweep`` in ``results/microbench/gpu/history/``, and an earlier multi-tile variant at
half the rate, ``kernels-multitile``). The rare paths moved to a second launch with the configs of
the time measured 0.34-1.07x (``quantize-ab-fixup-launch``, an H200); the split that stays (the
redo kernel of the marked squares) with register caps retuned for it sped the steps 1.20-1.56x on
an H100, the same bytes out (``results/microbench/gpu/quantize-ab.json``; DESIGN §6). Fewer
instructions a value since (powers of two by one integer multiply-add where the exponent is in
the normal range, the E2M1 code from the rounding magic's exponent, SR's power of two folded into
the step's exponent, the SR draws and sign by inline PTX; ``scripts/sass_count.py`` counts them)
sped the SR step (dY) 1.09-1.13x on an H100 in the same process at 16384×8192, 16384×4096 and
65536×768, with X and W at 0.99-1.03x (``quantize-ab-instr.json``,
``quantize-ab-instr-rerun.json``); at 16384×2048, the shortest, the autotuner's picks differ from
run to run (W 0.77x, then 2.07x). The tricks that stay: the rounding by one add of a binade-sized
magic number, a float block max that keeps NaN, eight codes a 32-bit word with the "-0" nibbles
cleared by a SWAR mask, E4M3 bytes from the GPU's conversion, and H's columns permuted so each MMA
lane holds consecutive outputs (no data moves before the packing).

Which pipe binds: the same profile has the ALU pipe (integer and logic, compares, selects, float
min/max, packing conversions; a warp instruction takes it two cycles) the busiest, at 58-69% of the
cycles with the issue slots 61-68% busy, so the ALU share of the instructions (about half; ``ALU
pipe`` in ``scripts/sass_count.py --steps``) is what a change must cut. Hence the f16x2 tails of
the RNE path (:func:`_e4m3_pairs`, :func:`_e2m1_words`; by the static count 1.41 to 1.32
warp-instructions a value for the X step and 1.27 to 1.17 for W): against the kernel before them
in the same process on an H100, three runs, the same bytes out (``quantize-ab-e5m2-pairs.json``,
``-rerun2``, ``-rerun3``), the median ratio at 16384×8192, 16384×4096 and 65536×768 was
X 1.07-1.13x, W 1.04-1.05x and the SR step, which they do not touch, 1.00-1.00x; at 16384×2048
the runs disagree (X 1.02x to 1.85x). A first FP8 tail took four registers of a thread as four
columns and wrote wrong bytes on an H100 (``kernels-hadamard-quantize-f16x2-2026-12-06-h100.json``
in ``results/kernel_tests/gpu/history/``): the accumulator layout alternates rows r and r + 8
every second register, so the tail takes pairs.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from adahop.formats import BLOCK_SIZE, FLOAT_DTYPES, FP8_GROUP, MXFP4Tensor, check_fp8_layout
from adahop_kernels._common import (
    INTERPRETED,
    autotune,
    cdiv,
    check_device,
    exp2_int,
    flip_sign,
    group_broadcast,
    group_max,
    launcher,
    to_fp32,
)

_GPU_ONLY = tl.constexpr(not INTERPRETED)  # instructions the interpreter lacks or runs slowly (popc, a NaN-keeping max)
HADAMARD_SIZES = (16, 32, 64, 128)  # tl.dot needs ≥ 16; 128 keeps H within one tile
SEED_LIMIT = 1 << 62  # the along-M stream sets bit 62 of the seed (in the kernel)
FP8_IN_KERNEL = {None: 0, "row": 0, "seg128": 1, "tile128": 2}  # FP8 constexpr; "row" is re-encoded after
# Blocks whose ±1 sums overflow are redone scaled by 2^-PRESCALE: 128 · 2^128 · 2^-8 < fp32 max.
PRESCALE = tl.constexpr(8)
PRESCALE_DOWN = tl.constexpr(2.0**-8)
PRESCALE_UP = tl.constexpr(2.0**8)
# The squares (rows × columns of the operand as quantized) in which the fast kernel marks bad blocks
# for :func:`_redo_kernel`: whole MX blocks, Hadamard blocks (≤ 128) and 128-groups of either
# orientation, whatever the fast kernel's tile.
REGION = tl.constexpr(128)
REDO_CHUNK = 1024  # flags a redo program reads at once


@triton.jit
def _pcg4d(x, y, z, w):
    """The pcg4d hash (Jarzynski & Olano, "Hash Functions for GPU Rendering", JCGT 2020): four
    uint32 words in, four out, each a function of all inputs, from three multiply stages where
    Philox-4x32-10 takes ten rounds."""
    x = x * 1664525 + 1013904223
    y = y * 1664525 + 1013904223
    z = z * 1664525 + 1013904223
    w = w * 1664525 + 1013904223
    x += y * w
    y += z * x
    z += x * y
    w += y * z
    x ^= x >> 16
    y ^= y >> 16
    z ^= z >> 16
    w ^= w >> 16
    x += y * w
    y += z * x
    z += x * y
    w += y * z
    return x, y, z, w


@triton.jit
def _uniform_blocks(seed, rows, cblk, NB: tl.constexpr):
    """``(NB, 32)`` fp32 ``1 + u`` with u uniform on the 16-bit grid of [0, 1), for the MX blocks at
    (``rows``, ``cblk``): a function of (seed, row, column) alone."""
    # One hash gives four 32-bit draws, two 16-bit ones each: call c of a row (its x) feeds the
    # row's elements 8c..8c+7; the row is y, the 64-bit seed z and w. The 16 bits go to the top of
    # an fp32 mantissa over the exponent of 1.
    calls = (cblk * 4)[:, None] + tl.arange(0, 4)[None, :]
    r0, r1, r2, r3 = _pcg4d(calls.to(tl.uint32), tl.broadcast_to(rows.to(tl.uint32)[:, None], (NB, 4)),
                            tl.full((NB, 4), 0, tl.uint32) + (seed & 0xFFFFFFFF).to(tl.uint32),
                            tl.full((NB, 4), 0, tl.uint32) + (seed >> 32).to(tl.uint32))
    w = tl.reshape(tl.join(tl.join(r0, r1), tl.join(r2, r3)), (NB, 16))
    if _GPU_ONLY:
        # Two instructions a draw (the 16 bits, then a multiply-add), where the compiler's own
        # shift-and-masks took three.
        lo = tl.inline_asm_elementwise("{ .reg .b32 t; and.b32 t, $1, 65535; mad.lo.u32 $0, t, 128, 1065353216; }",
                                       "=r,r", [w], dtype=tl.uint32, is_pure=True, pack=1)
        hi = tl.inline_asm_elementwise("{ .reg .b32 t; shr.u32 t, $1, 16; mad.lo.u32 $0, t, 128, 1065353216; }",
                                       "=r,r", [w], dtype=tl.uint32, is_pure=True, pack=1)
    else:
        lo = ((w & 0xFFFF) << 7) | 0x3F800000
        hi = ((w >> 16) << 7) | 0x3F800000
    return tl.reshape(tl.join(lo, hi), (NB, 32)).to(tl.float32, bitcast=True)


@triton.jit
def _hadamard_pm1(HS: tl.constexpr):
    """The ±1 Sylvester matrix ``(HS, HS)`` (fp32) with its columns permuted for the MMA layout.

    Lane t of a quad holds accumulator columns 8j + 2t + {0, 1}; column d of this matrix is
    column ``(HS/4)·t + 2j + i`` of H (d = 8j + 2t + i), so each lane ends up holding HS/4
    consecutive outputs, which the kernel packs without moving data between lanes. Entry (r, c) of
    H is (-1)^popcount(r & c). Made from indices, not loaded: a device tensor cached by the host
    would be allocated inside whatever CUDA-graph pool is recording at the first launch, and
    overwritten by that pool's later allocations. Its cost is per program: HS² entries against the
    tile's values, a small share at HS = 32 (the recipes'), about one entry per value at HS = 128.
    """
    r = tl.arange(0, HS)[:, None]
    d = tl.arange(0, HS)[None, :]
    p = r & ((HS // 4) * ((d % 8) // 2) + 2 * (d // 8) + d % 2)
    if _GPU_ONLY:
        p = libdevice.popc(p)  # one instruction an entry: at HS = 128 the matrix has a value's worth
    else:  # the interpreter has no popc: the parity of the 7 low bits (HS <= 128) folded into bit 0
        p = p ^ (p >> 4)
        p = p ^ (p >> 2)
        p = p ^ (p >> 1)
    return (1 - 2 * (p & 1)).to(tl.float32)


@triton.jit
def _hadamard_sums(t, h, BR: tl.constexpr, BC: tl.constexpr, HS: tl.constexpr, DOT_FP32: tl.constexpr):
    """The ±1 sums ``(BR·BC/32, 32)`` of each HS-block of ``t (BR, BC)`` by the permuted matrix ``h``."""
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
    # H's columns are permuted (see _hadamard_pm1): this (j, t) swap restores the order without
    # moving data between lanes.
    acc = tl.permute(tl.reshape(acc, (BR * BC // HS, HS // 8, 4, 2)), (0, 2, 1, 3))
    return tl.reshape(acc, (BR * BC // 32, 32))


@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _block_max_bits(s):
    """Bit pattern of each block's max |s| ``(NB,)``: NaN where the block holds one, so NaN and Inf
    blocks are the patterns above the largest finite float. On the GPU a NaN-keeping float max, one
    instruction a value (|s| is an operand modifier); the interpreter, whose reduction calls a
    Python combine function pair by pair, takes the integer max of the patterns (the same order)."""
    if _GPU_ONLY:
        return tl.reduce(tl.abs(s), 1, _max_nan).to(tl.int32, bitcast=True)
    return tl.max(s.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1)


@triton.jit
def _pow2(e, SAFE: tl.constexpr):
    """fp32 ``2**e``: :func:`exp2_int` (subnormals too) where ``SAFE``; else ``e`` must lie in
    [-126, 127], and the pattern is one integer multiply-add, where exp2_int takes about seven
    instructions a block."""
    if SAFE:
        return exp2_int(e)
    return (e * 0x00800000 + 0x3F800000).to(tl.float32, bitcast=True)


@triton.jit
def _e4m3_pairs(v, p_exp):
    """E4M3 bytes of ``clamp(v, ±6) · 2^p_exp`` (``v (NB, 32)``: E2M1 values or ±8, ``p_exp (NB,)`` at
    most 6). GPU only, for the Hadamard product's layout: an instance takes two consecutive
    registers of a thread, which there are two adjacent columns of one row (an MMA accumulator's
    pair, whose columns H's permutation keeps adjacent), and its own power of two; four registers
    are not four columns (rows r and r + 8 alternate). In f16x2: the clamp is one
    ``min.xorsign.abs`` (|·| capped at 6, the sign kept), then the power of two and the conversion,
    where fp32 takes a min, a max and a multiply a value. Exact: the products from 2^-14 up are fp16
    normals with two significant bits; where p_exp is below -14 it is taken as -14 (the power of two
    stays a normal), and every product of either lies below 2^-10, an E4M3 zero of its sign."""
    p16 = tl.broadcast_to((tl.maximum(p_exp, -14) * 0x04000400 + 0x3C003C00)[:, None], v.shape)  # fp16 2^p, twice
    return tl.inline_asm_elementwise(
        """{
        .reg .b32 a, six;
        mov.b32 six, 0x46004600;
        cvt.rn.f16x2.f32 a, $2, $1;
        min.xorsign.abs.f16x2 a, a, six;
        mul.rn.f16x2 a, a, $3;
        cvt.rn.satfinite.e4m3x2.f16x2 $0, a;
        }""",
        "=h,r,r,r,r", [v, p16], dtype=tl.uint8, is_pure=True, pack=2)


@triton.jit
def _e2m1_words(v):
    """Packed E2M1 codes ``(NB, 4)`` int32 of ``v (NB, 32)`` (E2M1 values or ±8; +0 where a value
    rounded to zero, so no "-0"): element 2i in the low nibble of byte i. GPU only: in f16x2 pairs,
    clamped by one ``min.xorsign.abs``, times 2^-14 and converted to E5M2, where each value is exact
    and its byte's bits 3..1 are the code of its magnitude (0.5 is E5M2's subnormal 2^-15, 1 its
    smallest normal, 1.5 to 6 follow with one mantissa bit) and bit 7 its sign; two shifts and a
    mask make each byte a nibble, and a byte permute packs them: about 4 instructions a value,
    where the integer path (which the interpreter runs) takes about 8."""
    # ek: column 8i + k of the block, for word i. Splits, not the registers' order: the Hadamard
    # product's layout does not hold a lane's columns in register order (an FP8 variant that took
    # four registers as four columns wrote wrong bytes on an H100).
    a, b = tl.split(tl.reshape(v, (v.shape[0], 16, 2)))
    a0, a1 = tl.split(tl.reshape(a, (v.shape[0], 8, 2)))
    b0, b1 = tl.split(tl.reshape(b, (v.shape[0], 8, 2)))
    e0, e4 = tl.split(tl.reshape(a0, (v.shape[0], 4, 2)))
    e2, e6 = tl.split(tl.reshape(a1, (v.shape[0], 4, 2)))
    e1, e5 = tl.split(tl.reshape(b0, (v.shape[0], 4, 2)))
    e3, e7 = tl.split(tl.reshape(b1, (v.shape[0], 4, 2)))
    return tl.inline_asm_elementwise(
        """{
        .reg .b32 p0, p1, p2, p3, six, k, x, y, t;
        .reg .b16 h0, h1, h2, h3;
        mov.b32 six, 0x46004600;
        mov.b32 k, 0x04000400;
        cvt.rn.f16x2.f32 p0, $2, $1;
        cvt.rn.f16x2.f32 p1, $4, $3;
        cvt.rn.f16x2.f32 p2, $6, $5;
        cvt.rn.f16x2.f32 p3, $8, $7;
        min.xorsign.abs.f16x2 p0, p0, six;
        min.xorsign.abs.f16x2 p1, p1, six;
        min.xorsign.abs.f16x2 p2, p2, six;
        min.xorsign.abs.f16x2 p3, p3, six;
        mul.rn.f16x2 p0, p0, k;
        mul.rn.f16x2 p1, p1, k;
        mul.rn.f16x2 p2, p2, k;
        mul.rn.f16x2 p3, p3, k;
        cvt.rn.satfinite.e5m2x2.f16x2 h0, p0;
        cvt.rn.satfinite.e5m2x2.f16x2 h1, p1;
        cvt.rn.satfinite.e5m2x2.f16x2 h2, p2;
        cvt.rn.satfinite.e5m2x2.f16x2 h3, p3;
        mov.b32 x, {h0, h1};
        mov.b32 y, {h2, h3};
        shr.b32 t, x, 4;
        shr.b32 x, x, 1;
        lop3.b32 x, x, t, 0x0F0F0F0F, 0xA8;
        shr.b32 t, x, 4;
        or.b32 x, x, t;
        shr.b32 t, y, 4;
        shr.b32 y, y, 1;
        lop3.b32 y, y, t, 0x0F0F0F0F, 0xA8;
        shr.b32 t, y, 4;
        or.b32 y, y, t;
        prmt.b32 $0, x, y, 0x6420;
        }""",
        "=r,r,r,r,r,r,r,r,r", [e0, e1, e2, e3, e4, e5, e6, e7], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _load_tile(x_ptr, stride_r, stride_c, row0, col0, n_rows, n_cols, BR: tl.constexpr, BC: tl.constexpr):
    """The ``(BR, BC)`` tile at (row0, col0) of the ``(n_rows, n_cols)`` operand with strides
    ``(stride_r, stride_c)``, padded with 0."""
    r = row0 + tl.arange(0, BR)
    c = col0 + tl.arange(0, BC)
    return tl.load(x_ptr + r.to(tl.int64)[:, None] * stride_r + c.to(tl.int64)[None, :] * stride_c,
                   mask=(r < n_rows)[:, None] & (c < n_cols)[None, :], other=0.0)


@triton.jit
def _quantize_store(
    t, x_ptr, stride_r, stride_c, row0, col0, n_rows, n_cols,
    codes_ptr, scales_ptr, fp8_ptr, fp8_scale_ptr, amax_ptr, signs_ptr, seed, c_hi, c_lo,
    flag_ptr, flag_stride_r, flag_stride_c,
    BR: tl.constexpr, BC: tl.constexpr, HADAMARD: tl.constexpr, HS: tl.constexpr, HAS_SIGNS: tl.constexpr,
    SR: tl.constexpr, DOT_FP32: tl.constexpr, PACKED: tl.constexpr, FP8: tl.constexpr, AMAX: tl.constexpr,
    SAFE: tl.constexpr,
):
    """Quantize tile ``t (BR, BC)`` at (row0, col0) of an ``(n_rows, n_cols)`` operand along its columns;
    store what the flags ask for. The operand is ``x_ptr`` with strides ``(stride_r, stride_c)``, from
    which the rare overflow path reloads the tile (so that ``t`` need not stay live in registers).

    Two variants. ``SAFE=False`` (:func:`_hadamard_quantize_kernel`) is right for blocks that are
    not bad (NaN/Inf input, or ±1 sums past the fp32 range) and marks the :data:`REGION` square of
    each bad block in ``flag_ptr`` (region (i, j) of the operand as quantized at ``i * flag_stride_r
    + j * flag_stride_c``); ``SAFE=True`` (:func:`_redo_kernel`, run on the marked regions) is right
    for every block. The fast variant carries none of the bad-block fixes: merged into its path,
    their selects, branches and reload, and in the same kernel the safe variant's registers, cost
    the layer's steps 1.20-1.56x of speed on an H100 (DESIGN §6).
    """
    NB: tl.constexpr = BR * BC // 32
    SB: tl.constexpr = BC // 32  # MX blocks of a tile row
    # fp32 (exact): torch.compile's launcher passes a host float as fp64, Triton's own as fp32.
    c_hi = tl.cast(c_hi, tl.float32)
    c_lo = tl.cast(c_lo, tl.float32)
    b = tl.arange(0, NB)
    rows = (row0 + b // SB).to(tl.int64)  # of each block
    cblk = col0 // 32 + b % SB
    ok = (rows < n_rows) & (cblk < n_cols // 32)
    if AMAX:
        # max |x| of each output row, before signs and transform: bit patterns again (int atomics;
        # a NaN row stays NaN); padding is 0, the int32 view of the zero-initialised fp32 output.
        r = row0 + tl.arange(0, BR)
        tl.atomic_max(amax_ptr + r, tl.max(to_fp32(t).to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1),
                      mask=r < n_rows, sem="relaxed")
    cols = col0 + tl.arange(0, BC)
    if HAS_SIGNS:
        flip = (tl.load(signs_ptr + cols, mask=cols < n_cols, other=1.0) < 0)[None, :]
        t = flip_sign(t, flip)
    pexp = tl.zeros((NB,), tl.int32)  # log2 of each block's pre-scale (PRESCALE where its sums overflowed)
    if HADAMARD:
        h = _hadamard_pm1(HS)
        s = _hadamard_sums(t, h, BR, BC, HS, DOT_FP32)  # exact ±1 sums; the 1/√HS factor is applied below, once
        m_bits = _block_max_bits(s)
        bad = m_bits > 0x7F7FFFFF
        # Rare: a NaN/Inf input, or ±1 sums past the fp32 range (values from ~2^128/HS up; never for
        # fp16 input), where the reference's fp64 transform is still finite. Redo the tile (reloaded)
        # with every Hadamard group that holds a bad block scaled by 2^-PRESCALE: exact but for values
        # ~2^-118 and below, which cannot move a block of a group whose values reach 2^121. Other
        # groups get the same products in the same order again (bf16 as the one exact fp32 piece), so
        # the result is a function of the group alone, whatever the tile.
        if SAFE and t.dtype != tl.float16:
            if tl.max(bad.to(tl.int32)) != 0:
                G: tl.constexpr = HS // 32 if HS > 32 else 1  # MX blocks of a Hadamard group
                unit_bad = tl.reshape(tl.broadcast_to(tl.max(tl.reshape(bad.to(tl.int32), (NB // G, G)), axis=1)[:, None],
                                                      (NB // G, G)), (NB,)) != 0
                t = _load_tile(x_ptr, stride_r, stride_c, row0, col0, n_rows, n_cols, BR, BC)
                if HAS_SIGNS:
                    t = flip_sign(t, flip)
                down = tl.where(unit_bad, PRESCALE_DOWN, 1.0)
                s = _hadamard_sums(tl.reshape(tl.reshape(to_fp32(t), (NB, 32)) * down[:, None], (BR, BC)), h,
                                   BR, BC, HS, DOT_FP32)
                # A block that cancels to tiny values takes them back at full scale (exact: far from
                # overflow), so that no scale needs a factor above 2^127.
                big = _block_max_bits(s) >= 0x0B800000  # 2^-104
                s = tl.where((unit_bad & ~big)[:, None], s * PRESCALE_UP, s)
                pexp = tl.where(unit_bad & big, PRESCALE, 0)
                m_bits = _block_max_bits(s)
        amax = m_bits.to(tl.float32, bitcast=True)
        # = max |fl32(s · 1/√HS)| (rounding is monotone), times the pre-scale: inf where the
        # reference's fp32 transform overflows.
        amax = tl.fma(amax, c_hi, amax * c_lo)
        amax_bits = (amax * exp2_int(pexp)).to(tl.int32, bitcast=True)
    else:
        s = tl.reshape(to_fp32(t), (NB, 32))
        m_bits = _block_max_bits(s)
        amax_bits = m_bits
        amax = amax_bits.to(tl.float32, bitcast=True)
    bad = amax_bits > 0x7F7FFFFF
    # floor(log2 amax) - 2 from the exponent field; zero/subnormal amax clamps to byte 0.
    scale = tl.minimum(tl.maximum((amax_bits >> 23) - 2, 0), 254)
    # 2^(127 - scale) is normal but for bad blocks (scale 253 and 254: infinite amax), which the fast
    # variant leaves to the safe one; the safe one's pre-scaled blocks may need 2^135.
    if SR:
        # Saturation would bias SR: a block whose scaled amax exceeds 6 takes the next scale.
        scale += (amax * _pow2(127 - scale + pexp, SAFE) > 6.0).to(tl.int32)
    inv_scale = _pow2(127 - scale + pexp, SAFE)
    # q = s / √HS / 2^e, signed (rounding is symmetric, so |q| is what the reference rounds).
    if HADAMARD:
        # (c_hi + c_lo) 2^-e is exact and the fma keeps ~48 bits: one rounding of s / √HS / 2^e.
        q = tl.fma(s, (c_hi * inv_scale)[:, None], s * (c_lo * inv_scale)[:, None])
    else:
        q = s * inv_scale[:, None]
    # E2M1 grid step is 2^(e-1) in binade [2^e, 2^(e+1)), 0.5 below 1; E = that binade's exponent bits.
    q_exp = q.to(tl.int32, bitcast=True) & 0x7F800000
    if SR:
        e_bits = tl.maximum(q_exp, 0x3F800000)
        # floor(|q| / step + u): up with probability frac(|q| / step), to within 2^-16 (the draws'
        # grid; the fp32 sum's rounding adds at most 2^-21). The draws are 1 + u: fl is one more
        # than the steps kept. |q| / step is exact (a power of two) and below 4.
        fl = tl.floor(tl.abs(q) * (0x7F800000 - e_bits).to(tl.float32, bitcast=True)
                      + _uniform_blocks(seed, rows, cblk, NB))
    else:
        # Adding 1.5 · 2^23 · step rounds to a multiple of step, ties to even, for either sign
        # (0x0B400000 adds 22 to the exponent, and 0.5 to the significand).
        magic = tl.maximum(q_exp + 0x0B400000, 0x3F800000 + 0x0B400000)

    if PACKED:
        if _GPU_ONLY and not SR and not SAFE:
            mf = magic.to(tl.float32, bitcast=True)
            words = _e2m1_words((q + mf) - mf)
        else:
            # The code: steps kept, plus the binade's first code (2^0, 2^1, 2^2 start at 0, 2, 4); 7 is
            # 6.0 (saturation). The sign bit goes on every code here; a "-0" is cleared per word below.
            if SR:
                code = fl.to(tl.int32) - 1 + (e_bits >> 22) - 254
            else:
                # The integer difference of the bit patterns is the number of steps; the binade's
                # exponent is magic's less 45 (0x0B400000 = 45 << 22).
                code = (tl.abs(q) + magic.to(tl.float32, bitcast=True)).to(tl.int32, bitcast=True) - magic + (magic >> 22) - 299
            code = tl.minimum(code, 7) | ((s.to(tl.int32, bitcast=True) >> 28) & 8)
            # Eight codes a 32-bit word, element 2i in the low nibble of byte i (little-endian words).
            lo, hi = tl.split(tl.reshape(code, (NB, 16, 2)))
            w_lo, w_hi = tl.split(tl.reshape(lo | (hi << 4), (NB, 8, 2)))
            w_lo, w_hi = tl.split(tl.reshape(w_lo | (w_hi << 8), (NB, 4, 2)))
            words = w_lo | (w_hi << 16)
            # Per nibble: bit 3 of (low 3 bits + 7) says "magnitude > 0"; keep the sign bit only there.
            words = words & (((words & 0x77777777) + 0x77777777) | 0x77777777)
        if SAFE:
            words = tl.where(bad[:, None], 0, words)
            scale_byte = tl.where(bad, 255, scale)
        else:
            scale_byte = scale
        tl.store(codes_ptr.to(tl.pointer_type(tl.int32)) + (rows * (n_cols // 8) + cblk * 4)[:, None]
                 + tl.arange(0, 4)[None, :], words, mask=ok[:, None])
        tl.store(scales_ptr + rows * (n_cols // 32) + cblk, scale_byte.to(tl.uint8), mask=ok)
    if FP8 != 0:
        # The FP8 operand of DESIGN §3 per 128-group (1×128 segments, FP8 == 1, or 128×128 tiles,
        # FP8 == 2), which lie whole in this tile: R = the group's largest finite block exponent, and
        # each value is its E2M1 value times 2^(e - R + 6), exact in E4M3 for blocks at most 14
        # binades below R. The E2M1 value is kept as an fp32 number (a multiple of its step, ±6 at
        # most), so that the GPU's own conversion writes the byte: no E2M1 code is formed.
        GR: tl.constexpr = 1 if FP8 == 1 else 128
        # RNE values take the f16x2 tail (clamp, power of two and conversion: :func:`_e4m3_pairs`),
        # which needs the Hadamard product's register layout; the rest clamp and scale in fp32.
        PAIRS: tl.constexpr = _GPU_ONLY and HADAMARD and not SR and not SAFE
        e = scale - 127
        if SAFE:
            e = tl.where(bad, -127, e)
        r = group_max(tl.reshape(e, (BR, SB)), BR, SB, GR, 4)  # (BR // GR, BC // 128)
        t_off = e - tl.reshape(group_broadcast(r, BR, SB, GR, 4), (NB,)) + 14  # 2^(t_off - 8) = 2^(e - R + 6)
        # 2^(t_off - 8), clamped at 2^-40, below which every product (|v| ≤ 6) rounds to a signed
        # E4M3 zero: so the power of two is a normal number.
        p_exp = tl.maximum(t_off - 8, -40)
        if SR:
            # (fl - 1) · step · 2^(t_off - 8) with q's sign, the power of two in step's exponent (step ≥
            # 2^-1: still normal): +0 where no step is kept (x - x is +0), as a code "-0" is.
            step_bits = e_bits + ((p_exp - 1) << 23)[:, None]
            if _GPU_ONLY:  # one LOP3 for the sign's and-or, where the compiler emitted two
                step = tl.inline_asm_elementwise("lop3.b32 $0, $1, 0x80000000, $2, 0xEA;", "=r,r,r",
                                                 [s.to(tl.int32, bitcast=True), step_bits], dtype=tl.int32,
                                                 is_pure=True, pack=1).to(tl.float32, bitcast=True)
            else:
                step = (step_bits | (s.to(tl.int32, bitcast=True) & -0x80000000)).to(tl.float32, bitcast=True)
            v = fl * step - step
        else:
            mf = magic.to(tl.float32, bitcast=True)
            v = (q + mf) - mf
            if not PAIRS:
                v = tl.minimum(tl.maximum(v, -6.0), 6.0) * _pow2(p_exp, False)[:, None]
        # Blocks more than 14 binades below R (an all-zero block is one) lie below E4M3's subnormal
        # step 2^-9. The GPU's conversion rounds them to it, ties to even, as the reference does; the
        # interpreter's does not round, so there they are rounded here first.
        if not _GPU_ONLY:
            if tl.min(tl.where(bad, 0, t_off)) < 0:
                sub = ((tl.abs(v) + 24576.0) - 24576.0).to(tl.int32, bitcast=True)  # 1.5 · 2^14: a step of 2^-9
                v = tl.where((t_off < 0)[:, None], (sub | (v.to(tl.int32, bitcast=True) & -0x80000000)).to(tl.float32, bitcast=True), v)
        if PAIRS:
            f8 = _e4m3_pairs(v, p_exp)
        else:
            f8 = v.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
        if SAFE:  # a NaN block is E4M3 NaN, as in the reference
            f8 = tl.where(bad[:, None], 0x7F, f8)
        tl.store(fp8_ptr + (rows * n_cols + cblk * 32)[:, None] + tl.arange(0, 32)[None, :], f8, mask=ok[:, None])
        g = col0 // 128 + tl.arange(0, BC // 128)
        if FP8 == 1:
            # (n_cols/128, n_rows) contiguous: the (rows, n/128) scale with strides (1, rows) of A.
            r_rows = row0 + tl.arange(0, BR)
            tl.store(fp8_scale_ptr + g[None, :].to(tl.int64) * n_rows + r_rows[:, None], exp2_int(r - 6),
                     mask=(r_rows < n_rows)[:, None] & (g < n_cols // 128)[None, :])
        else:
            gr = row0 // 128 + tl.arange(0, BR // 128)
            tl.store(fp8_scale_ptr + gr[:, None] * (n_cols // 128) + g[None, :], exp2_int(r - 6),
                     mask=(gr < n_rows // 128)[:, None] & (g < n_cols // 128)[None, :])
    if not SAFE:
        # Rare: one int atomic a bad block; the flags start at 0.
        # int32 indices: the marks are (n_rows / 128) × (n_cols / 128), far below 2^31.
        rows32 = row0 + b // SB
        tl.atomic_max(flag_ptr + (rows32 // REGION) * flag_stride_r + (cblk // (REGION // 32)) * flag_stride_c, 1,
                      mask=bad & ok, sem="relaxed")


@triton.jit
def _seeds(seed_ptr, SR: tl.constexpr):
    """The SR seeds of the along-K and along-M orientations (0 without SR): a device tensor, so that a
    new seed every step neither recompiles nor syncs; the along-M stream has bit 62 set."""
    if SR:
        seed = tl.load(seed_ptr)
        seed_t = seed | 0x4000000000000000
    else:
        seed = 0
        seed_t = 0
    return seed, seed_t


@triton.jit
def _hadamard_quantize_kernel(
    x_ptr, stride_m, stride_k, M, K,
    codes_ptr, scales_ptr, fp8_ptr, fp8_scale_ptr, amax_ptr, signs_ptr,
    codes_t_ptr, scales_t_ptr, fp8_t_ptr, fp8_scale_t_ptr, amax_t_ptr, signs_t_ptr,
    seed_ptr, c_hi, c_lo, flag_ptr,
    ALONG_K: tl.constexpr, ALONG_M: tl.constexpr, HADAMARD: tl.constexpr, HADAMARD_T: tl.constexpr,
    HAS_SIGNS: tl.constexpr, HAS_SIGNS_T: tl.constexpr, PACKED: tl.constexpr, PACKED_T: tl.constexpr,
    FP8: tl.constexpr, FP8_T: tl.constexpr, AMAX: tl.constexpr, AMAX_T: tl.constexpr,
    HS: tl.constexpr, SR: tl.constexpr, DOT_FP32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):
    m0 = tl.program_id(0) * BLOCK_M
    k0 = tl.program_id(1) * BLOCK_K
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_k = k0 + tl.arange(0, BLOCK_K)
    ptrs = x_ptr + offs_m.to(tl.int64)[:, None] * stride_m + offs_k.to(tl.int64)[None, :] * stride_k
    # Padding is 0: a padded block is all-zero and never stored (the quantized dims divide the tile).
    x = tl.load(ptrs, mask=(offs_m < M)[:, None] & (offs_k < K)[None, :], other=0.0)
    seed, seed_t = _seeds(seed_ptr, SR)
    flag_k = tl.cdiv(K, REGION)
    if ALONG_K:
        _quantize_store(x, x_ptr, stride_m, stride_k, m0, k0, M, K, codes_ptr, scales_ptr, fp8_ptr, fp8_scale_ptr,
                        amax_ptr, signs_ptr, seed, c_hi, c_lo, flag_ptr, flag_k, 1, BLOCK_M, BLOCK_K, HADAMARD, HS,
                        HAS_SIGNS, SR, DOT_FP32, PACKED, FP8, AMAX, False)
    if ALONG_M:
        _quantize_store(tl.trans(x), x_ptr, stride_k, stride_m, k0, m0, K, M, codes_t_ptr, scales_t_ptr, fp8_t_ptr,
                        fp8_scale_t_ptr, amax_t_ptr, signs_t_ptr, seed_t, c_hi, c_lo, flag_ptr, 1, flag_k, BLOCK_K,
                        BLOCK_M, HADAMARD_T, HS, HAS_SIGNS_T, SR, DOT_FP32, PACKED_T, FP8_T, AMAX_T, False)


# Rare work: one binary per flag combination, whatever the sizes (its compile is the safe path's).
@triton.jit(do_not_specialize=["n_flags", "stride_m", "stride_k", "M", "K"],
            do_not_specialize_on_alignment=["n_flags", "stride_m", "stride_k", "M", "K"])
def _redo_kernel(
    flag_ptr, n_flags,
    x_ptr, stride_m, stride_k, M, K,
    codes_ptr, scales_ptr, fp8_ptr, fp8_scale_ptr, signs_ptr,
    codes_t_ptr, scales_t_ptr, fp8_t_ptr, fp8_scale_t_ptr, signs_t_ptr,
    seed_ptr, c_hi, c_lo,
    ALONG_K: tl.constexpr, ALONG_M: tl.constexpr, HADAMARD: tl.constexpr, HADAMARD_T: tl.constexpr,
    HAS_SIGNS: tl.constexpr, HAS_SIGNS_T: tl.constexpr, PACKED: tl.constexpr, PACKED_T: tl.constexpr,
    FP8: tl.constexpr, FP8_T: tl.constexpr, HS: tl.constexpr, SR: tl.constexpr, DOT_FP32: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """The safe variant of :func:`_quantize_store` on each :data:`REGION` square that the fast kernel
    marked, both orientations: its stores replace the fast kernel's there (the row maxima were
    right). A program reads ``CHUNK`` flags at once and returns unless one is set (the usual case)."""
    base = tl.program_id(0) * CHUNK
    idx = base + tl.arange(0, CHUNK)
    if tl.max(tl.load(flag_ptr + idx, mask=idx < n_flags, other=0)) != 0:
        seed, seed_t = _seeds(seed_ptr, SR)
        flag_k = tl.cdiv(K, REGION)
        for j in range(CHUNK):
            r = base + j
            if r < n_flags:
                if tl.load(flag_ptr + r) != 0:
                    m0 = (r // flag_k) * REGION
                    k0 = (r % flag_k) * REGION
                    if ALONG_K:
                        _quantize_store(_load_tile(x_ptr, stride_m, stride_k, m0, k0, M, K, REGION, REGION), x_ptr,
                                        stride_m, stride_k, m0, k0, M, K, codes_ptr, scales_ptr, fp8_ptr, fp8_scale_ptr,
                                        x_ptr, signs_ptr, seed, c_hi, c_lo, flag_ptr, 0, 0, REGION, REGION, HADAMARD,
                                        HS, HAS_SIGNS, SR, DOT_FP32, PACKED, FP8, False, True)
                    if ALONG_M:
                        _quantize_store(_load_tile(x_ptr, stride_k, stride_m, k0, m0, K, M, REGION, REGION), x_ptr,
                                        stride_k, stride_m, k0, m0, K, M, codes_t_ptr, scales_t_ptr, fp8_t_ptr,
                                        fp8_scale_t_ptr, x_ptr, signs_t_ptr, seed_t, c_hi, c_lo, flag_ptr, 0, 0, REGION,
                                        REGION, HADAMARD_T, HS, HAS_SIGNS_T, SR, DOT_FP32, PACKED_T, FP8_T, False, True)


def _tile_units(kw: dict) -> tuple[int, int]:
    """What BLOCK_M and BLOCK_K must be multiples of for the launch flags ``kw``: the quantized
    dimension whole Hadamard and MX blocks (and whole 128-groups for in-kernel FP8), the other
    whole 128-row groups for tile128."""
    unit_m = unit_k = 1
    if kw["ALONG_K"]:
        unit_k = max(BLOCK_SIZE, kw["HS"] if kw["HADAMARD"] else 1, FP8_GROUP if kw["FP8"] else 1)
        unit_m = FP8_GROUP if kw["FP8"] == 2 else 1
    if kw["ALONG_M"]:
        unit_m = max(unit_m, BLOCK_SIZE, kw["HS"] if kw["HADAMARD_T"] else 1, FP8_GROUP if kw["FP8_T"] else 1)
        unit_k = max(unit_k, FP8_GROUP if kw["FP8_T"] == 2 else 1)
    return unit_m, unit_k


def _config_fits(config: triton.Config, kw: dict) -> bool:
    unit_m, unit_k = _tile_units(kw)
    return config.kwargs["BLOCK_M"] % unit_m == 0 and config.kwargs["BLOCK_K"] % unit_k == 0


# 32 or 64 values a thread; wide along K for one orientation, square-ish for the transposing ones,
# 128-multiples for the FP8 groups. Pruned to what the flags need (_config_fits); 128×128 fits
# every launch. Three carry a register cap, each the best config of a layer step at 16384×8192 on
# an H100, every config timed alone (scripts/quantize_sweep.py; quantize-sweep-2026-12-05-h100 in
# results/microbench/gpu/history/): X 32×128 at 4 warps capped at 64 (more programs an SM),
# 1.10x uncapped; W 128×128 at 8 warps capped at 128, 1.24x uncapped; dY 128×128 at 16 warps capped
# at 64, 1.12x uncapped. Persistent programs walking tiles (the next tile's load in flight) ran at
# 0.46-0.82x the best config on an H200 (quantize-sweep-2026-12-04).
_GPU_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_K": bk}, num_warps=w, maxnreg=cap)
    for bm, bk, w, cap in ((16, 256, 4, None), (32, 128, 4, 64), (32, 256, 4, None), (64, 64, 4, None),
                           (64, 128, 4, None), (128, 64, 4, None), (128, 128, 8, 128), (128, 128, 16, 64))
]
_FLAGS = ["ALONG_K", "ALONG_M", "HADAMARD", "HADAMARD_T", "HAS_SIGNS", "HAS_SIGNS_T", "PACKED", "PACKED_T",
          "FP8", "FP8_T", "AMAX", "AMAX_T", "HS", "SR", "DOT_FP32"]
# No reset of the AMAX outputs or the marks between timed configs: a max over the same input is
# idempotent (and an unused pointer argument is x itself, which a reset would zero).
_tuned_kernel = autotune(_hadamard_quantize_kernel, _GPU_CONFIGS, key=["M", "K", *_FLAGS], fits=_config_fits)


@functools.lru_cache(maxsize=None)
def _scale_split(size: int) -> tuple[float, float]:
    """``1/sqrt(size)`` as an fp32 pair ``hi + lo`` (each exactly representable; cached: the
    tensors that round it would cost host time on every launch)."""
    c = 1.0 / size**0.5
    hi = float(torch.tensor(c, dtype=torch.float64).float())
    return hi, float(torch.tensor(c - hi, dtype=torch.float64).float())


def _interpreter_blocks(m: int, k: int, unit_m: int, unit_k: int) -> dict:
    """Few, large programs: the interpreter's cost grows with the program count, not the tile size."""
    block_k = max(unit_k, min(2048, triton.next_power_of_2(k)))
    block_m = max(unit_m, min(65536 // block_k, triton.next_power_of_2(m)))
    return {"BLOCK_M": block_m, "BLOCK_K": block_k}


class Side(NamedTuple):
    """One orientation's request to :func:`quantize`.

    ``hadamard``: block-Hadamard transform before quantizing; ``signs``: ±1 (float) of the length of
    the quantized dimension, or None. ``packed``: write E2M1 codes and E8M0 scales. ``fp8``: also the
    exact FP8 operand in a layout of :data:`adahop.formats.FP8_LAYOUTS` (None: none). ``amax``: also
    fp32 ``max |x|`` of each output row, before signs and transform.
    """

    hadamard: bool
    signs: torch.Tensor | None
    packed: bool = True
    fp8: str | None = None
    amax: bool = False


class SideOut(NamedTuple):
    """One orientation's outputs, ``(rows, n)`` = ``(M, K)`` along K, ``(K, M)`` along M; None where
    not asked for.

    codes ``(rows, n/2)`` uint8 (two E2M1 codes a byte, low nibble first), scales ``(rows, n/32)``
    uint8 E8M0; fp8 ``(rows, n)`` float8_e4m3fn and fp8_scale fp32: ``"row"`` ``(rows, 1)``,
    ``"seg128"`` ``(rows, n/128)`` with strides ``(1, rows)``, ``"tile128"`` ``(rows/128, n/128)``
    contiguous; amax ``(rows,)`` fp32.
    """

    codes: torch.Tensor | None
    scales: torch.Tensor | None
    fp8: torch.Tensor | None
    fp8_scale: torch.Tensor | None
    amax: torch.Tensor | None


def _check_x(x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (rows, K), got shape {tuple(x.shape)}")
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"x must be float32, bfloat16 or float16, got {x.dtype}")
    check_device(x, "x")


def _check_side(side: Side, rows: int, n: int, dim: str, x: torch.Tensor, hadamard_size: int) -> torch.Tensor | None:
    """Check one orientation's request (output ``(rows, n)``, quantized along ``dim``); return its
    signs ready for the kernel."""
    if not (side.packed or side.fp8 or side.amax):
        raise ValueError(f"along_{dim.lower()} asks for no output: set packed, fp8 or amax")
    unit = max(BLOCK_SIZE, hadamard_size) if side.hadamard else BLOCK_SIZE
    if n % unit:
        what = f"the MX block size {BLOCK_SIZE}" if unit == BLOCK_SIZE else f"the Hadamard size {unit}"
        raise ValueError(f"x: the quantized dimension {dim}={n} is not a multiple of {what}; "
                         "pad it or keep this layer in BF16")
    if side.fp8 is not None:
        check_fp8_layout(side.fp8, rows, n, f"x quantized along {dim} ({rows} rows of {n})")
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


def _resolve_seed(rounding: str, seed: int | torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """The SR seed as the int64 ``(1,)`` device tensor the kernel loads; None for RNE."""
    if rounding not in ("rne", "sr"):
        raise ValueError(f"rounding must be 'rne' or 'sr', got {rounding!r}")
    if rounding == "rne":
        return None
    if isinstance(seed, torch.Tensor):
        if seed.dtype != torch.int64 or tuple(seed.shape) != (1,):
            raise ValueError(f"a seed tensor must be int64 of shape (1,), got {seed.dtype} of shape {tuple(seed.shape)}")
        if seed.device != device:
            raise ValueError(f"the seed tensor is on {seed.device} but x is on {device}")
        return seed
    if seed is None:
        # Drawn from torch's global generator, as the reference's SR does without a seed.
        seed = int(torch.randint(0, SEED_LIMIT, ()).item())
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"seed must be an int in [0, 2**62) or an int64 tensor of shape (1,), got {seed!r}")
    return torch.tensor([seed], dtype=torch.int64, device=device)


def _allocate(side: Side | None, rows: int, n: int, device: torch.device) -> dict:
    """The output tensors the kernel writes for ``side`` (codes and scales also for ``fp8="row"``,
    which re-encodes them)."""
    if side is None:
        return {}
    out = {}
    if side.packed or side.fp8 == "row":
        out["codes"] = torch.empty((rows, n // 2), dtype=torch.uint8, device=device)
        out["scales"] = torch.empty((rows, n // BLOCK_SIZE), dtype=torch.uint8, device=device)
    if FP8_IN_KERNEL[side.fp8]:
        out["fp8"] = torch.empty((rows, n), dtype=torch.float8_e4m3fn, device=device)
        shape = (n // FP8_GROUP, rows) if side.fp8 == "seg128" else (rows // FP8_GROUP, n // FP8_GROUP)
        out["fp8_scale"] = torch.empty(shape, dtype=torch.float32, device=device)
    if side.amax:
        out["amax"] = torch.zeros((rows,), dtype=torch.float32, device=device)
    return out


def _side_out(side: Side | None, out: dict, launch=None) -> SideOut | None:
    if side is None:
        return None
    fp8, fp8_scale = out.get("fp8"), out.get("fp8_scale")
    if side.fp8 == "row":
        from adahop_kernels.fp8_reencode import fp8_reencode

        fp8, fp8_scale = fp8_reencode(MXFP4Tensor(out["codes"], out["scales"]), "row", launch=launch)
    elif side.fp8 == "seg128":
        fp8_scale = fp8_scale.t()
    return SideOut(out.get("codes") if side.packed else None, out.get("scales") if side.packed else None,
                   fp8, fp8_scale, out.get("amax"))


def quantize(
    x: torch.Tensor,
    along_k: Side | None,
    along_m: Side | None,
    *,
    hadamard_size: int = 32,
    rounding: str = "rne",
    seed: int | torch.Tensor | None = None,
    nan_policy: str = "propagate",
    launch=None,
) -> tuple[SideOut | None, SideOut | None]:
    """Quantize ``x (M, K)`` along K, along M (its transpose), or both from one read; GPU or interpreter.

    x: float32/bfloat16/float16, any strides. ``along_k`` gives outputs of ``(M, K)`` (quantized
    along K), ``along_m`` of ``(K, M)`` (xᵀ quantized along M); None skips an orientation (not
    both). The quantized dimension must be a multiple of 32, of ``hadamard_size`` (16, 32, 64 or
    128) where transformed, and of 128 for ``fp8`` "seg128"/"tile128"; "tile128" also needs
    the output rows to be a multiple of 128. ``rounding="sr"`` draws from ``seed``: an int in
    [0, 2**62), an int64 ``(1,)`` tensor on x's device holding one (read by the kernel: no
    recompile or sync when it changes), or None (one drawn from torch's generator); the draws are
    a function of (seed, orientation, output row, output column) only. seg128/tile128 FP8 is
    written by the quantizing pass itself; "row" re-encodes its packed codes afterwards. Blocks of
    NaN/Inf input, or whose ±1 sums pass the fp32 range, are redone by a second, small launch that
    returns at once where there are none (a few µs). ``launch``: applied to each kernel handle
    before its launch (``torch.library.wrap_triton`` inside a ``triton_op``); None launches it as is.

    Equivalent to, per requested orientation with ``xo = x`` (along K) or ``x.T`` (along M):
    ``q = adahop.ops.hadamard_quantize_ref(xo, side.hadamard, hadamard_size, side.signs, rounding)``,
    ``to_fp8_ref(q, side.fp8)`` and ``xo.abs().amax(1)``, bit for bit for RNE up to fp32 rounding
    of the transform (SR draws differ, their distribution does not).
    """
    _check_x(x)
    if along_k is None and along_m is None:
        raise ValueError("quantize needs along_k, along_m or both")
    for name, side in (("along_k", along_k), ("along_m", along_m)):
        if side is not None and not isinstance(side, Side):
            raise TypeError(f"{name} must be a Side or None, got {type(side).__name__}")
    m, k = x.shape
    if any(s is not None and s.hadamard for s in (along_k, along_m)) and hadamard_size not in HADAMARD_SIZES:
        raise ValueError(f"the Triton kernel supports Hadamard sizes {HADAMARD_SIZES}, got {hadamard_size}")
    signs = _check_side(along_k, m, k, "K", x, hadamard_size) if along_k is not None else None
    signs_t = _check_side(along_m, k, m, "M", x, hadamard_size) if along_m is not None else None
    seed_t = _resolve_seed(rounding, seed, x.device)
    if nan_policy not in ("propagate", "raise"):
        raise ValueError(f"nan_policy must be 'propagate' or 'raise', got {nan_policy!r}")
    if nan_policy == "raise" and not torch.isfinite(x).all():
        raise ValueError("x holds NaN or Inf values and nan_policy='raise'")

    out_k, out_m = _allocate(along_k, m, k, x.device), _allocate(along_m, k, m, x.device)
    wrap = launcher(launch)
    if m and k:
        c_hi, c_lo = _scale_split(hadamard_size)
        flags = dict(
            ALONG_K=along_k is not None, ALONG_M=along_m is not None,
            HADAMARD=bool(along_k and along_k.hadamard), HADAMARD_T=bool(along_m and along_m.hadamard),
            HAS_SIGNS=signs is not None, HAS_SIGNS_T=signs_t is not None,
            PACKED="codes" in out_k, PACKED_T="codes" in out_m,
            FP8=FP8_IN_KERNEL[along_k.fp8] if along_k else 0, FP8_T=FP8_IN_KERNEL[along_m.fp8] if along_m else 0,
            AMAX="amax" in out_k, AMAX_T="amax" in out_m,
            HS=hadamard_size if hadamard_size in HADAMARD_SIZES else 32, SR=rounding == "sr",
            # bf16/fp16 operands give garbage in the interpreter's tl.dot.
            DOT_FP32=INTERPRETED,
        )

        def ptr(out: dict, name: str, view=None) -> torch.Tensor:
            t = out.get(name)
            return x if t is None else t if view is None else t.view(view)

        args = dict(
            x_ptr=x, stride_m=x.stride(0), stride_k=x.stride(1), M=m, K=k,
            codes_ptr=ptr(out_k, "codes"), scales_ptr=ptr(out_k, "scales"), fp8_ptr=ptr(out_k, "fp8", torch.uint8),
            fp8_scale_ptr=ptr(out_k, "fp8_scale"), amax_ptr=ptr(out_k, "amax", torch.int32),
            signs_ptr=signs if signs is not None else x,
            codes_t_ptr=ptr(out_m, "codes"), scales_t_ptr=ptr(out_m, "scales"),
            fp8_t_ptr=ptr(out_m, "fp8", torch.uint8), fp8_scale_t_ptr=ptr(out_m, "fp8_scale"),
            amax_t_ptr=ptr(out_m, "amax", torch.int32), signs_t_ptr=signs_t if signs_t is not None else x,
            seed_ptr=seed_t if seed_t is not None else x,
            c_hi=c_hi, c_lo=c_lo, **flags,
        )
        # One flag a REGION square, set by the fast kernel where a block is bad; the redo kernel reads them.
        n_flags = cdiv(m, REGION) * cdiv(k, REGION)
        marks = torch.zeros(n_flags, dtype=torch.int32, device=x.device)
        if INTERPRETED:
            unit_m, unit_k = _tile_units(flags)
            blocks = _interpreter_blocks(m, k, max(BLOCK_SIZE, unit_m), max(BLOCK_SIZE, unit_k))
            grid = (cdiv(m, blocks["BLOCK_M"]), cdiv(k, blocks["BLOCK_K"]))
            _hadamard_quantize_kernel[grid](**args, flag_ptr=marks, **blocks)
        else:
            wrap(_tuned_kernel)[lambda meta: (cdiv(m, meta["BLOCK_M"]), cdiv(k, meta["BLOCK_K"]))](
                **args, flag_ptr=marks)
        redo = {n: v for n, v in args.items() if n not in ("amax_ptr", "amax_t_ptr", "AMAX", "AMAX_T")}
        wrap(_redo_kernel)[(cdiv(n_flags, REDO_CHUNK),)](marks, n_flags, **redo, CHUNK=REDO_CHUNK,
                                                         num_warps=8, num_stages=1)
    return _side_out(along_k, out_k, launch), _side_out(along_m, out_m, launch)


def _mxfp4(out: SideOut) -> MXFP4Tensor:
    return MXFP4Tensor(out.codes, out.scales, out.fp8, out.fp8_scale)


def hadamard_quantize(
    x: torch.Tensor,
    *,
    transpose: bool = False,
    hadamard: bool = True,
    hadamard_size: int = 32,
    signs: torch.Tensor | None = None,
    rounding: str = "rne",
    seed: int | torch.Tensor | None = None,
    emit_fp8: bool = False,
    nan_policy: str = "propagate",
) -> MXFP4Tensor:
    """Block-Hadamard (optional) + MXFP4 quantization of ``x (M, K)`` on the GPU (or the interpreter).

    x: float32/bfloat16/float16, any strides. ``transpose=False``: quantized along K, returns
    ``(M, K)``; ``transpose=True``: along M, returns the transpose ``(K, M)``. The quantized
    dimension must be a multiple of 32 and, with ``hadamard``, of ``hadamard_size`` (16, 32, 64
    or 128). ``signs``: ±1, the length of the quantized dimension. ``rounding="sr"`` draws from
    ``seed`` (as in :func:`quantize`). ``emit_fp8`` adds the exact FP8 row-scaled operand.

    Equivalent to ``adahop.ops.hadamard_quantize_ref(x.T if transpose else x, ...)`` (bit-exact
    for RNE up to fp32 rounding of the transform; SR draws differ, their distribution does not).
    """
    side = Side(hadamard, signs, fp8="row" if emit_fp8 else None)
    out_k, out_m = quantize(x, None if transpose else side, side if transpose else None,
                            hadamard_size=hadamard_size, rounding=rounding, seed=seed, nan_policy=nan_policy)
    return _mxfp4(out_m if transpose else out_k)


def hadamard_quantize_dual(
    x: torch.Tensor,
    *,
    hadamard: bool = True,
    hadamard_t: bool = True,
    hadamard_size: int = 32,
    signs: torch.Tensor | None = None,
    signs_t: torch.Tensor | None = None,
    rounding: str = "rne",
    seed: int | torch.Tensor | None = None,
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
    out_k, out_m = quantize(x, Side(hadamard, signs, fp8="row" if emit_fp8 else None),
                            Side(hadamard_t, signs_t, fp8="row" if emit_fp8_t else None),
                            hadamard_size=hadamard_size, rounding=rounding, seed=seed, nan_policy=nan_policy)
    return _mxfp4(out_k), _mxfp4(out_m)
