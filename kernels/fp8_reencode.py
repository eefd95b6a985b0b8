"""Exact FP8 E4M3 re-encoding of an MXFP4 GEMM operand (Hopper's FP8 tensor cores), in three layouts.

An MXFP4 element is ``q * 2**e`` (q an E2M1 value, e its block's exponent). With ``R`` the largest
finite block exponent of the element's scale group, the element is written as
``q * 2**(e - R + 6)`` in E4M3 and the group gets the fp32 scale ``2**(R - 6)``;
``torch._scaled_mm`` with these scales then computes the MXFP4 product exactly (DESIGN.md §3).
Groups (:data:`adahop.formats.FP8_LAYOUTS`): a whole row (``"row"``, cuBLAS rowwise scaling),
1×128 segments along K (``"seg128"``, blockwise scaling of A) or 128×128 tiles (``"tile128"``,
blockwise scaling of Bᵀ). Bit-identical to :func:`adahop.formats.to_fp8_ref`.

The E4M3 bytes come from integer arithmetic (:func:`adahop_kernels._common.e4m3_bits_of_e2m1`).
Byte-wise fast path: when every nonzero block of a tile lies at most 11 binades below its group's
R (t >= 3, every value a normal E4M3 number), the codes are read as 32-bit words and four E4M3
bytes are built per 32-bit operation (:func:`adahop_kernels._common.e4m3_words_of_code_words`);
other tiles (a group spanning more, or zero-scale blocks holding nonzero codes) take the general
code-by-code path.

Two kernels, because the row scale needs the whole row before any element: the rowwise one makes
two passes over a row's scales (one for R, one to encode); the grouped one (``seg128``/``tile128``)
reads each tile once, since its program holds whole groups. Cost: reads K/2 code bytes and K/32
(rowwise: 2·K/32) scale bytes a row and writes K bytes, 1.53-1.56 B a value, memory-bound only
below ~0.38 warp-instructions a value on an H200. The rowwise kernel's byte-wise path counts
<= 0.31 warp-instructions a value on the sm_90 SASS (8x1024 tile, 4 warps, pass 1 included, 56
registers; ``scripts/sass_count.py``). Measured figures: ``tests/bench/test_bench_mxfp4_mm.py``
(rowwise) and ``tests/bench/test_bench_quantize.py`` (tile128), in ``results/microbench/gpu/``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from adahop.checks import check_mxfp4_operand
from adahop.formats import FP8_GROUP, check_fp8_layout
from adahop_kernels._common import (
    INTERPRETED,
    autotune,
    cdiv,
    check_device,
    e4m3_bits_of_e2m1,
    e4m3_words_of_code_words,
    exp2_int,
    group_broadcast,
    group_max,
    launcher,
)

GENERAL_K = tl.constexpr(32)  # columns a slice of the rowwise general path
ROWWISE = tl.constexpr(0)  # GROUP_M of the rowwise kernel: R comes from the row, not from the slice


@triton.jit
def _store_general(codes_ptr, scales_ptr, fp8_ptr, rows, row_ok, r, K, k0,
                   BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """Encode columns [k0, k0 + BLOCK_K) of ``rows`` code by code (any t); store them.

    ``GROUP_M == ROWWISE``: against the row maxima ``r (BLOCK_M,)``; else the slice is one column of
    128-groups of GROUP_M rows (BLOCK_K = 128), whose R is found from its own scales.
    """
    SB: tl.constexpr = BLOCK_K // 32
    # Unpack two codes a byte (low nibble first) and encode each against R.
    half_cols = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    packed = tl.load(codes_ptr + rows[:, None] * (K // 2) + half_cols[None, :],
                     mask=row_ok[:, None] & (half_cols < K // 2)[None, :], other=0).to(tl.int32)
    codes = tl.reshape(tl.join(packed & 0xF, packed >> 4), (BLOCK_M, BLOCK_K))
    b = k0 // 32 + tl.arange(0, SB)
    s = tl.load(scales_ptr + rows[:, None] * (K // 32) + b[None, :],
                mask=row_ok[:, None] & (b < K // 32)[None, :], other=0).to(tl.int32)
    if GROUP_M == ROWWISE:
        rb = tl.broadcast_to(r[:, None], (BLOCK_M, SB))
    else:
        e = tl.where(s == 255, -127, s - 127)
        rb = group_broadcast(group_max(e, BLOCK_M, SB, GROUP_M, SB), BLOCK_M, SB, GROUP_M, SB)
    t = s - 127 - rb + 14
    t = tl.reshape(tl.broadcast_to(t[:, :, None], (BLOCK_M, SB, 32)), (BLOCK_M, BLOCK_K))
    nan = tl.reshape(tl.broadcast_to((s == 255)[:, :, None], (BLOCK_M, SB, 32)), (BLOCK_M, BLOCK_K))
    bits = tl.where(nan, 0x7F, e4m3_bits_of_e2m1(codes, t))  # a NaN block is E4M3 NaN, as in the reference
    cols = k0 + tl.arange(0, BLOCK_K)
    tl.store(fp8_ptr + rows[:, None] * K + cols[None, :], bits.to(tl.uint8), mask=row_ok[:, None] & (cols < K)[None, :])


@triton.jit
def _encode_tile(codes_ptr, scales_ptr, fp8_ptr, rows, row_ok, s, rb, r, K, k0,
                 BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """Encode columns [k0, k0 + BLOCK_K) of ``rows``: scale bytes ``s`` and group maxima ``rb``, both
    ``(BLOCK_M, BLOCK_K // 32)``; ``r`` and GROUP_M as in :func:`_store_general`."""
    SB: tl.constexpr = BLOCK_K // 32
    # Eight codes a 32-bit word in, two words of four E4M3 bytes out.
    wcol = k0 // 8 + tl.arange(0, BLOCK_K // 8)
    ok = row_ok[:, None] & (wcol < K // 8)[None, :]
    words = tl.load(codes_ptr.to(tl.pointer_type(tl.int32)) + rows[:, None] * (K // 8) + wcol[None, :],
                    mask=ok, other=0)
    t = s - 127 - rb + 14  # (BLOCK_M, SB): the block's exponent offset, as in e4m3_bits_of_e2m1
    t = tl.reshape(tl.broadcast_to(t[:, :, None], (BLOCK_M, SB, 4)), (BLOCK_M, BLOCK_K // 8))
    nan = tl.reshape(tl.broadcast_to((s == 255)[:, :, None], (BLOCK_M, SB, 4)), (BLOCK_M, BLOCK_K // 8))
    # The byte-wise encoding holds for t >= 3 (every value normal in E4M3); a nonzero code in a
    # block further below R (rare: a group spanning > 11 binades) sends the tile to the general path.
    general = ((words & 0x77777777) != 0) & (t < 3) & ~nan
    if tl.max(general.to(tl.int32)) == 0:
        out = e4m3_words_of_code_words(words, t, BLOCK_M, BLOCK_K // 8)
        out = tl.where(tl.reshape(tl.join(nan, nan), (BLOCK_M, BLOCK_K // 4)), 0x7F7F7F7F, out)
        ocol = k0 // 4 + tl.arange(0, BLOCK_K // 4)
        tl.store(fp8_ptr.to(tl.pointer_type(tl.int32)) + rows[:, None] * (K // 4) + ocol[None, :], out,
                 mask=row_ok[:, None] & (ocol < K // 4)[None, :])
    else:
        # General path, in narrow slices so that it does not set the fast path's register budget.
        SLICE: tl.constexpr = GENERAL_K if GROUP_M == ROWWISE else 128
        for c0 in range(k0, k0 + BLOCK_K, SLICE):
            _store_general(codes_ptr, scales_ptr, fp8_ptr, rows, row_ok, r, K, c0, BLOCK_M, SLICE, GROUP_M)


@triton.jit
def _fp8_reencode_kernel(
    codes_ptr, scales_ptr, fp8_ptr, row_scale_ptr, M, K,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Rowwise: pass 1 finds each row's R, pass 2 encodes the row tile by tile."""
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
    for k0 in range(0, K, BLOCK_K):
        b = k0 // 32 + tl.arange(0, SB)
        s = tl.load(scales_ptr + rows[:, None] * n_blocks + b[None, :],
                    mask=row_ok[:, None] & (b < n_blocks)[None, :], other=0).to(tl.int32)
        _encode_tile(codes_ptr, scales_ptr, fp8_ptr, rows, row_ok, s, tl.broadcast_to(r[:, None], (BLOCK_M, SB)), r,
                     K, k0, BLOCK_M, BLOCK_K, ROWWISE)


@triton.jit
def _fp8_group_kernel(
    codes_ptr, scales_ptr, fp8_ptr, group_scale_ptr, M, K,
    GROUP_M: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Groups of GROUP_M rows × 128 columns (1: seg128, 128: tile128), each within one program's tile."""
    pid_m = tl.program_id(0)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    rows = rows.to(tl.int64)
    k0 = tl.program_id(1) * BLOCK_K
    SB: tl.constexpr = BLOCK_K // 32
    GB: tl.constexpr = 128 // 32  # blocks of a row in one group
    b = k0 // 32 + tl.arange(0, SB)
    s = tl.load(scales_ptr + rows[:, None] * (K // 32) + b[None, :],
                mask=row_ok[:, None] & (b < K // 32)[None, :], other=0).to(tl.int32)
    r = group_max(tl.where(s == 255, -127, s - 127), BLOCK_M, SB, GROUP_M, GB)  # (BLOCK_M // GROUP_M, SB // GB)
    g = k0 // 128 + tl.arange(0, SB // GB)
    if GROUP_M == 1:
        # (K/128, M) contiguous: the (M, K/128) scale with strides (1, M) that _scaled_mm takes for A.
        tl.store(group_scale_ptr + g[None, :].to(tl.int64) * M + rows[:, None], exp2_int(r - 6),
                 mask=row_ok[:, None] & (g < K // 128)[None, :])
    else:
        gr = pid_m * (BLOCK_M // GROUP_M) + tl.arange(0, BLOCK_M // GROUP_M)
        tl.store(group_scale_ptr + gr[:, None] * (K // 128) + g[None, :], exp2_int(r - 6),
                 mask=(gr < M // GROUP_M)[:, None] & (g < K // 128)[None, :])
    _encode_tile(codes_ptr, scales_ptr, fp8_ptr, rows, row_ok, s, group_broadcast(r, BLOCK_M, SB, GROUP_M, GB), r,
                 K, k0, BLOCK_M, BLOCK_K, GROUP_M)


_tuned_kernel = autotune(
    _fp8_reencode_kernel,
    [triton.Config({"BLOCK_M": m, "BLOCK_K": k}, num_warps=w)
     for m, k, w in ((8, 1024, 4), (16, 512, 4), (16, 1024, 8), (32, 512, 8), (4, 2048, 4))],
    key=["M", "K"],
)
# Tiles of whole groups: seg128 takes any row count, tile128 multiples of 128 rows.
_tuned_group_kernel = autotune(
    _fp8_group_kernel,
    [triton.Config({"BLOCK_M": m, "BLOCK_K": k}, num_warps=w)
     for m, k, w in ((8, 1024, 4), (16, 512, 4), (32, 512, 8), (128, 128, 4), (128, 256, 8), (128, 512, 16))],
    key=["M", "K", "GROUP_M"], fits=lambda c, kw: c.kwargs["BLOCK_M"] % kw["GROUP_M"] == 0,
)


def fp8_reencode(t: MXFP4Tensor, layout: str = "row", launch=None) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 E4M3 ``(M, K)`` and its fp32 scales of a 2-D MXFP4 tensor ``(M, K)`` in ``layout``.

    ``layout``: ``"row"`` (scales ``(M, 1)``), ``"seg128"`` (``(M, K/128)`` with strides ``(1, M)``;
    K a multiple of 128) or ``"tile128"`` (``(M/128, K/128)`` contiguous; M and K multiples of
    128). K is a multiple of 32 (as for every MXFP4 tensor). CUDA tensors, or CPU tensors under
    ``TRITON_INTERPRET=1``. Equivalent to :func:`adahop.formats.to_fp8_ref` bit for bit.
    ``launch`` wraps the kernel handle before it runs (``torch.library.wrap_triton`` inside a
    ``triton_op``); None runs the handle itself.
    """
    check_mxfp4_operand(t, "t")
    check_device(t.codes, "t")
    m, k = t.shape
    check_fp8_layout(layout, m, k)
    fp8 = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=t.device)
    if layout == "row":
        scale = torch.empty((m, 1), dtype=torch.float32, device=t.device)
    elif layout == "seg128":
        scale = torch.empty((k // FP8_GROUP, m), dtype=torch.float32, device=t.device).t()
    else:
        scale = torch.empty((m // FP8_GROUP, k // FP8_GROUP), dtype=torch.float32, device=t.device)
    if m == 0 or k == 0:
        return fp8, scale
    # Read as 32-bit words: allocations start aligned, so the offset says (and a traced tensor has no address).
    codes = t.codes if t.codes.storage_offset() % 4 == 0 else t.codes.clone()
    args = dict(codes_ptr=codes, scales_ptr=t.scales, fp8_ptr=fp8.view(torch.uint8), M=m, K=k)
    if layout == "row":
        if INTERPRETED:
            # Interpreter cost grows with programs x iterations: few, large tiles there.
            _fp8_reencode_kernel[(cdiv(m, 64),)](**args, row_scale_ptr=scale, BLOCK_M=64,
                                                        BLOCK_K=min(512, triton.next_power_of_2(k)))
        else:
            launcher(launch)(_tuned_kernel)[lambda meta: (cdiv(m, meta["BLOCK_M"]),)](**args, row_scale_ptr=scale)
        return fp8, scale
    group_m = 1 if layout == "seg128" else FP8_GROUP
    args.update(group_scale_ptr=scale, GROUP_M=group_m)
    if INTERPRETED:
        block_k = min(1024, triton.next_power_of_2(k))
        block_m = max(group_m, min(65536 // block_k, triton.next_power_of_2(m)))
        _fp8_group_kernel[(cdiv(m, block_m), cdiv(k, block_k))](**args, BLOCK_M=block_m, BLOCK_K=block_k)
    else:
        launcher(launch)(_tuned_group_kernel)[lambda meta: (cdiv(m, meta["BLOCK_M"]), cdiv(k, meta["BLOCK_K"]))](
            **args)
    return fp8, scale
