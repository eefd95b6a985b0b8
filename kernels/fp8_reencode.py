"""Exact FP8 E4M3 row-scaled re-encoding of an MXFP4 GEMM operand (Hopper's FP8 tensor cores).

An MXFP4 element is ``q * 2**e`` (q an E2M1 value, e its block's exponent). With ``R`` the row's
largest finite block exponent, the element is written as ``q * 2**(e - R + 6)`` in E4M3 and the
row gets the fp32 scale ``2**(R - 6)``; ``torch._scaled_mm`` with these row scales then computes
the MXFP4 product exactly (DESIGN.md §3). Bit-identical to :func:`adahop.formats.to_fp8_rowwise_ref`.

The E4M3 bits are built with integer arithmetic instead of a float->fp8 cast: the value in units
of E4M3's smallest subnormal (2^-9) is ``n << t`` with ``n = 2|q|`` in {0,1,2,3,4,6,8,12} and
``t = e - R + 14``. For ``t >= 0`` (a block at most 14 binades below the row's largest: the exact
case) that is an integer with at most two significant bits, so the encoding is exact; for ``t < 0``
it is rounded to the subnormal grid, ties to even, like the reference. The cast would round the
same way on a GPU, but Triton's interpreter neither rounds to nearest-even nor keeps NaN.

Byte-wise fast path: when every nonzero block of a tile lies at most 11 binades below R
(t >= 3, every value a normal E4M3 number), the codes are read as 32-bit words and four E4M3
bytes are built per 32-bit operation (:func:`_e4m3_words_fast`); other tiles (a row spanning
more, or zero-scale blocks holding nonzero codes) take the general code-by-code path above.

Cost: reads K/2 code bytes and 2·K/32 scale bytes a row, writes K bytes (the scales twice: one
pass finds R, the next encodes); 1.56 B a value, memory-bound only below ~0.38 warp-instructions
a value on an H200. Measured on the H200 at commit 0192140 (code-by-code encoding, 1.47
warp-instructions a value on the sm_90 SASS): 660-730 GB/s, 0.16-0.17 of copy bandwidth.
Byte-wise fast path (sm_90 SASS, 8x1024 tile, 4 warps): <= 0.31 warp-instructions a value, pass 1
included, at 56 registers. Expectation, not yet measured: 0.5-0.7 of copy.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from adahop.checks import check_mxfp4_operand
from adahop_kernels._common import INTERPRETED, check_device, exp2_int

GENERAL_K = tl.constexpr(32)  # columns a slice of the general path


@triton.jit
def e4m3_bits_of_e2m1(code, t):
    """E4M3 byte of ``e2m1(code) * 2**(t - 8)`` (int32 ``code`` 0..15, int32 ``t <= 14``), RNE."""
    idx = code & 7
    # n = 2|q|: codes 0..3 -> 0,1,2,3; 4..7 -> 4,6,8,12.
    n = tl.where(idx < 2, idx, (2 + (idx & 1)) << tl.maximum((idx >> 1) - 1, 0))
    exact = n << tl.minimum(tl.maximum(t, 0), 14)
    # t < 0: shift right by s (values >= 2^5 below the grid round to 0 for every n <= 12).
    s = tl.minimum(tl.maximum(-t, 1), 5)
    kept = n >> s
    rem = n - (kept << s)
    half = 1 << (s - 1)
    up = (rem > half) | ((rem == half) & ((kept & 1) == 1))
    units = tl.where(t >= 0, exact, kept + up.to(tl.int32))
    # units < 8: subnormal, bits = units. Else exponent p = floor(log2 units) from the fp32 bits
    # (exact below 2^24), biased exponent p - 2, three mantissa bits below the leading one.
    p = (units.to(tl.float32).to(tl.int32, bitcast=True) >> 23) - 127
    normal = (((p - 2) << 3) | ((units >> tl.maximum(p - 3, 0)) - 8)) & 0x7F
    bits = tl.where(units < 8, units, normal)
    return bits | ((code >> 3) << 7)


@triton.jit
def _spread_nibbles(x):
    """The four nibbles of the low 16 bits of int32 ``x``, one a byte, nibble i in byte i."""
    x = (x | (x << 8)) & 0x00FF00FF
    return (x | (x << 4)) & 0x0F0F0F0F


@triton.jit
def _e4m3_words_fast(c, t):
    """E4M3 bytes of four E2M1 codes (one a byte of int32 ``c``) in a block with ``t = e - R + 14 >= 3``.

    There every nonzero value is a normal E4M3 number: |q| = 2^(E-1)(1 + m/2) for code
    idx = 2E + m >= 2 has exponent field E - 1 + (t - 8) + 7 and mantissa m << 2, i.e. bits
    (idx + 2t - 4) << 2; idx 1 (0.5) has field t - 2, bits (2t - 4) << 2; idx 0 is 0. Byte-wise
    (SWAR), no carries: idx + 2t - 4 <= 31 for t <= 14 (larger t only in NaN blocks, overwritten),
    and a block with t < 3 reaches here only with all codes ±0 (its multiplier then meets zeros).
    """
    a = c & 0x07070707
    nonzero = ((a + 0x07070707) >> 3) & 0x01010101  # 1 in a byte: idx >= 1
    ge2 = (((c & 0x06060606) + 0x06060606) >> 3) & 0x01010101  # 1 in a byte: idx >= 2
    v = a + ge2 + nonzero * (2 * t - 5)
    return (v << 2) | ((c & 0x08080808) << 4)


@triton.jit
def _store_general(codes_ptr, scales_ptr, fp8_ptr, rows, row_ok, r, K, k0, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """Encode columns [k0, k0 + BLOCK_K) of ``rows`` against their ``r`` code by code (any t); store them."""
    SB: tl.constexpr = BLOCK_K // 32
    # Unpack two codes a byte (low nibble first) and encode each against R.
    half_cols = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    packed = tl.load(codes_ptr + rows[:, None] * (K // 2) + half_cols[None, :],
                     mask=row_ok[:, None] & (half_cols < K // 2)[None, :], other=0).to(tl.int32)
    codes = tl.reshape(tl.join(packed & 0xF, packed >> 4), (BLOCK_M, BLOCK_K))
    b = k0 // 32 + tl.arange(0, SB)
    s = tl.load(scales_ptr + rows[:, None] * (K // 32) + b[None, :],
                mask=row_ok[:, None] & (b < K // 32)[None, :], other=0).to(tl.int32)
    s = tl.reshape(tl.broadcast_to(s[:, :, None], (BLOCK_M, SB, 32)), (BLOCK_M, BLOCK_K))
    bits = e4m3_bits_of_e2m1(codes, s - 127 - r[:, None] + 14)
    bits = tl.where(s == 255, 0x7F, bits)  # a NaN block is E4M3 NaN, as in the reference
    cols = k0 + tl.arange(0, BLOCK_K)
    tl.store(fp8_ptr + rows[:, None] * K + cols[None, :], bits.to(tl.uint8), mask=row_ok[:, None] & (cols < K)[None, :])


@triton.jit
def _fp8_reencode_kernel(
    codes_ptr, scales_ptr, fp8_ptr, row_scale_ptr, M, K,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    rows = rows.to(tl.int64)
    n_blocks = K // 32
    SB: tl.constexpr = BLOCK_K // 32
    # Pass 1: R = the row's largest finite block exponent (NaN blocks do not count; -127 if none).
    r = tl.full((BLOCK_M,), -127, tl.int32)
    for b0 in range(0, n_blocks, SB):
        b = b0 + tl.arange(0, SB)
        ok = row_ok[:, None] & (b < n_blocks)[None, :]
        s = tl.load(scales_ptr + rows[:, None] * n_blocks + b[None, :], mask=ok, other=0).to(tl.int32)
        e = tl.where(s == 255, -127, s - 127)  # E8M0: bias 127, 0xFF = NaN
        r = tl.maximum(r, tl.max(e, axis=1))
    tl.store(row_scale_ptr + rows, exp2_int(r - 6), mask=row_ok)
    # Pass 2: per tile, eight codes a 32-bit word in, two words of four E4M3 bytes out.
    for k0 in range(0, K, BLOCK_K):
        wcol = k0 // 8 + tl.arange(0, BLOCK_K // 8)
        ok = row_ok[:, None] & (wcol < K // 8)[None, :]
        words = tl.load(codes_ptr.to(tl.pointer_type(tl.int32)) + rows[:, None] * (K // 8) + wcol[None, :],
                        mask=ok, other=0)
        b = k0 // 32 + tl.arange(0, SB)
        s_ok = row_ok[:, None] & (b < n_blocks)[None, :]
        s = tl.load(scales_ptr + rows[:, None] * n_blocks + b[None, :], mask=s_ok, other=0).to(tl.int32)
        t = s - 127 - r[:, None] + 14  # (BLOCK_M, SB): the block's exponent offset, as in e4m3_bits_of_e2m1
        t = tl.reshape(tl.broadcast_to(t[:, :, None], (BLOCK_M, SB, 4)), (BLOCK_M, BLOCK_K // 8))
        nan = tl.reshape(tl.broadcast_to((s == 255)[:, :, None], (BLOCK_M, SB, 4)), (BLOCK_M, BLOCK_K // 8))
        # The byte-wise encoding holds for t >= 3 (every value normal in E4M3); a nonzero code in a
        # block further below R (rare: a row spanning > 11 binades) sends the tile to the general path.
        general = ((words & 0x77777777) != 0) & (t < 3) & ~nan
        if tl.max(general.to(tl.int32)) == 0:
            lo = _e4m3_words_fast(_spread_nibbles(words & 0xFFFF), t)
            hi = _e4m3_words_fast(_spread_nibbles((words >> 16) & 0xFFFF), t)
            out = tl.reshape(tl.join(lo, hi), (BLOCK_M, BLOCK_K // 4))
            out = tl.where(tl.reshape(tl.join(nan, nan), (BLOCK_M, BLOCK_K // 4)), 0x7F7F7F7F, out)
            ocol = k0 // 4 + tl.arange(0, BLOCK_K // 4)
            tl.store(fp8_ptr.to(tl.pointer_type(tl.int32)) + rows[:, None] * (K // 4) + ocol[None, :], out,
                     mask=row_ok[:, None] & (ocol < K // 4)[None, :])
        else:
            # General path, in narrow slices so that it does not set the fast path's register budget.
            for c0 in range(k0, k0 + BLOCK_K, GENERAL_K):
                _store_general(codes_ptr, scales_ptr, fp8_ptr, rows, row_ok, r, K, c0, BLOCK_M, GENERAL_K)


_tuned_kernel = triton.autotune(
    [triton.Config({"BLOCK_M": m, "BLOCK_K": k}, num_warps=w)
     for m, k, w in ((8, 1024, 4), (16, 512, 4), (16, 1024, 8), (32, 512, 8), (4, 2048, 4))],
    key=["M", "K"],
)(_fp8_reencode_kernel)


def fp8_reencode(t: MXFP4Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 E4M3 ``(M, K)`` and fp32 row scales ``(M, 1)`` of a 2-D MXFP4 tensor ``(M, K)``.

    K is a multiple of 32 (as for every MXFP4 tensor). CUDA tensors, or CPU tensors under
    ``TRITON_INTERPRET=1``. Equivalent to :func:`adahop.formats.to_fp8_rowwise_ref` bit for bit.
    """
    check_mxfp4_operand(t, "t")
    check_device(t.codes, "t")
    m, k = t.shape
    fp8 = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=t.device)
    row_scale = torch.empty((m, 1), dtype=torch.float32, device=t.device)
    if m == 0:
        return fp8, row_scale
    codes = t.codes if t.codes.data_ptr() % 4 == 0 else t.codes.clone()  # read as 32-bit words
    args = dict(codes_ptr=codes, scales_ptr=t.scales, fp8_ptr=fp8.view(torch.uint8), row_scale_ptr=row_scale, M=m, K=k)
    if INTERPRETED:
        # Interpreter cost grows with programs x iterations: few, large tiles there.
        _fp8_reencode_kernel[(triton.cdiv(m, 64),)](**args, BLOCK_M=64, BLOCK_K=min(512, triton.next_power_of_2(k)))
    else:
        _tuned_kernel[lambda meta: (triton.cdiv(m, meta["BLOCK_M"]),)](**args)
    return fp8, row_scale

