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

Cost: reads K/2 code bytes and 2·K/32 scale bytes a row, writes K bytes (the scales twice: one
pass finds R, the next encodes). Memory-bound; the fused quantize kernel emits the same operand
without this pass, so ``mxfp4_mm`` runs it only for tensors that lack ``fp8``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from adahop.ops import check_mxfp4_operand
from adahop_kernels._common import INTERPRETED, check_device, exp2_int


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
def _fp8_reencode_kernel(
    codes_ptr, scales_ptr, fp8_ptr, row_scale_ptr, M, K,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
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
    # Pass 2: unpack two codes a byte (low nibble first) and encode each against R.
    for k0 in range(0, K, BLOCK_K):
        half_cols = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        ok = row_ok[:, None] & (half_cols < K // 2)[None, :]
        packed = tl.load(codes_ptr + rows[:, None] * (K // 2) + half_cols[None, :], mask=ok, other=0).to(tl.int32)
        codes = tl.reshape(tl.join(packed & 0xF, packed >> 4), (BLOCK_M, BLOCK_K))
        b = k0 // 32 + tl.arange(0, SB)
        s_ok = row_ok[:, None] & (b < n_blocks)[None, :]
        s = tl.load(scales_ptr + rows[:, None] * n_blocks + b[None, :], mask=s_ok, other=0).to(tl.int32)
        s = tl.reshape(tl.broadcast_to(s[:, :, None], (BLOCK_M, SB, 32)), (BLOCK_M, BLOCK_K))
        bits = e4m3_bits_of_e2m1(codes, s - 127 - r[:, None] + 14)
        bits = tl.where(s == 255, 0x7F, bits)  # a NaN block is E4M3 NaN, as in the reference
        cols = k0 + tl.arange(0, BLOCK_K)
        out_ok = row_ok[:, None] & (cols < K)[None, :]
        tl.store(fp8_ptr + rows[:, None] * K + cols[None, :], bits.to(tl.uint8), mask=out_ok)


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
    # Interpreter cost grows with programs x iterations: few, large tiles there.
    block_m, block_k = (64, 512) if INTERPRETED else (16, 256)
    block_k = min(block_k, triton.next_power_of_2(k))
    grid = (triton.cdiv(m, block_m),)
    _fp8_reencode_kernel[grid](t.codes, t.scales, fp8.view(torch.uint8), row_scale, m, k,
                               BLOCK_M=block_m, BLOCK_K=block_k)
    return fp8, row_scale

