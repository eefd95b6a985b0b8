"""The pattern detector's two statistics, as kernels: exact line medians of ``|x|`` and scaled mean squares.

``adahop.patterns.PatternDetector`` scores an operand ``x (M, K)`` by the RMS of its rows and
columns after dividing each column by its median ``|x|`` and each row by its own. In PyTorch that
is two ``torch.median(dim=1)`` (a selection per line) and half a dozen fp32 elementwise passes:
on the H200 that detector runs at 20-29 GB/s on the activation shapes, under 1% of the copy
bandwidth (peer ``torch-reference`` of ``test_pattern_detection`` in
``results/microbench/gpu/kernels.json``), and AdaHOP's calibrating steps label every layer's x, w
and grad_output.

**Medians** (:func:`abs_median`). A median is an order statistic, so it needs counting rather
than sorting. The magnitude bits of a float (sign bit cleared) order like the values, so the lower
median of a line of ``n`` is the key ``v`` with at most ``r`` keys below it and more than ``r`` at
or below it, ``r = (n - 1) // 2``. It is found a digit at a time, most significant first (a radix
select):

* one launch per 2-bit digit (8 for bf16/fp16's 15 magnitude bits, 16 for fp32's 31), each one
  read of x, whatever its strides (a 2-D tile coalesces along the contiguous axis, so column
  medians are the rows of ``x.t()``, a view, with no transposed copy);
* each counts, per line, the keys below ``prefix + j·4^d`` for ``j = 1, 2, 3``: three elementwise
  counters over the tiles, summed once at the end of the program;
* the digit is the number of those counts that stay ``<= r``. The next launch reads the counts,
  adds the digit to the prefix (every program of a line alike) and goes on; PyTorch adds the
  last digit. No host sync.

Long lines are split across programs (the 768 columns of a 64k-token activation give 12 line
blocks; ~500 programs fill the GPU), each writing partial counts that the next launch sums. The
result is bit-identical to ``x.abs().median(dim=1).values`` (the lower median; a line holding NaN
gives NaN).

**Mean squares** (:func:`scaled_mean_squares`). Both axes' mean of ``(x / scale)²`` and the count
of non-finite entries, in one read of x: each program owns a block of rows (their sums complete in
the program) and writes its partial column sums, which PyTorch adds (no atomics: the same result
every run). The PyTorch reference upcasts x, checks finiteness, divides and squares in separate
passes (about 50 bytes moved per bf16 element against 2 here); the sums agree to fp32 rounding
(the order of additions differs).

tests/bench/test_bench_patterns.py times the detector built on both.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from adahop.checks import check_scaled_mean_squares_input
from adahop_kernels._common import INTERPRETED, cdiv, check_device, check_line_input, split_lines, to_fp32

# Bits resolved per pass. Each candidate digit keeps an elementwise counter across the line (summed
# once per program, not per tile): 4-bit passes, counting all 16 digits with a per-tile reduction
# each, measure 0.33-0.52x torch.median's detector on the H200 (16 reductions per tile against one
# read of x, the likely bound, not profiled). Two bits: three counters, eight passes of x; the
# detector on it runs at 2.3-3.5x torch.median's (peer ``torch-reference`` in
# results/microbench/gpu/kernels.json).
RADIX_BITS = 2
# Per dtype: the integer view of its bits, the magnitude-bit mask, the number of magnitude bits, and
# the largest finite-or-infinite key (a key above it is a NaN).
_KEYS = {
    torch.bfloat16: (torch.int16, 0x7FFF, 15, 0x7F80),
    torch.float16: (torch.int16, 0x7FFF, 15, 0x7C00),
    torch.float32: (torch.int32, 0x7FFFFFFF, 31, 0x7F800000),
}


# Scalars that change per pass or per shape: specializing them (== 1, % 16) buys nothing and would
# compile more variants.
@triton.jit(do_not_specialize=["n_per_split", "splits", "shift", "rank"])
def _radix_pass_kernel(
    keys_ptr, prefix_in_ptr, prefix_out_ptr, prev_ptr, counts_ptr, nan_ptr,
    L, N, stride_l, stride_n, n_per_split, splits, shift, rank,
    KEY_MASK: tl.constexpr, INF_KEY: tl.constexpr, FIRST: tl.constexpr,
    BLOCK_L: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One 2-bit digit of the radix select, at bit ``shift``.

    Finishes the previous pass first: its digit is the number of its candidates (``prefix + j << (shift
    + 2)``, j = 1..3) with at most ``rank`` keys below, from the (splits, L, 3) counts it left. Every
    split of a line computes that prefix alike; split 0 stores it for the next pass. Then counts,
    per line in this split, the keys below ``prefix + j << shift`` for j = 1..3.
    """
    lines = tl.program_id(0) * BLOCK_L + tl.arange(0, BLOCK_L)
    split = tl.program_id(1)
    line_ok = lines < L
    if FIRST:
        prefix = tl.zeros((BLOCK_L,), dtype=tl.int32)
    else:
        prefix = tl.load(prefix_in_ptr + lines, mask=line_ok, other=0)
        c1 = tl.zeros((BLOCK_L,), dtype=tl.int32)
        c2 = tl.zeros((BLOCK_L,), dtype=tl.int32)
        c3 = tl.zeros((BLOCK_L,), dtype=tl.int32)
        for s in range(0, splits):
            base = prev_ptr + (s * L + lines) * 3
            c1 += tl.load(base, mask=line_ok, other=0)
            c2 += tl.load(base + 1, mask=line_ok, other=0)
            c3 += tl.load(base + 2, mask=line_ok, other=0)
        digit = (c1 <= rank).to(tl.int32) + (c2 <= rank).to(tl.int32) + (c3 <= rank).to(tl.int32)
        prefix += digit << (shift + 2)
    if split == 0:
        tl.store(prefix_out_ptr + lines, prefix, mask=line_ok)
    n_lo = split * n_per_split
    n_hi = tl.minimum(n_lo + n_per_split, N)
    a1 = tl.zeros((BLOCK_L, BLOCK_N), dtype=tl.int32)
    a2 = tl.zeros((BLOCK_L, BLOCK_N), dtype=tl.int32)
    a3 = tl.zeros((BLOCK_L, BLOCK_N), dtype=tl.int32)
    n_nan = tl.zeros((BLOCK_L, BLOCK_N), dtype=tl.int32)
    for n0 in range(n_lo, n_hi, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        ok = line_ok[:, None] & (cols < n_hi)[None, :]
        key = tl.load(keys_ptr + lines[:, None] * stride_l + cols[None, :] * stride_n, mask=ok, other=0)
        key = key.to(tl.int32) & KEY_MASK
        if FIRST:
            n_nan += (ok & (key > INF_KEY)).to(tl.int32)
        # The key's digit relative to the prefix: -1 below it (counted for every j), its digit if it
        # shares the prefix's higher digits, 4 above them or masked (never counted). Shifting the
        # difference, not the candidate, keeps fp32's top digit inside int32.
        diff = key - prefix[:, None]
        dig = tl.where(diff < 0, -1, tl.minimum(diff >> shift, 4))
        dig = tl.where(ok, dig, 4)
        a1 += (dig < 1).to(tl.int32)
        a2 += (dig < 2).to(tl.int32)
        a3 += (dig < 3).to(tl.int32)
    out = counts_ptr + (split * L + lines) * 3
    tl.store(out, tl.sum(a1, axis=1), mask=line_ok)
    tl.store(out + 1, tl.sum(a2, axis=1), mask=line_ok)
    tl.store(out + 2, tl.sum(a3, axis=1), mask=line_ok)
    if FIRST:
        tl.store(nan_ptr + split * L + lines, tl.sum(n_nan, axis=1), mask=line_ok)


def _tiles(x: torch.Tensor) -> tuple[int, int]:
    """(BLOCK_L, BLOCK_N): 128-byte loads along whichever axis of x is contiguous."""
    if INTERPRETED:
        return 64, 256  # the interpreter's cost grows with programs x iterations: few, large tiles
    row_major = x.stride(1) == 1 and x.stride(0) != 1
    return (16, 128) if row_major else (64, 32)


def abs_median(x: torch.Tensor, splits: int | None = None) -> torch.Tensor:
    """Lower median of ``|x|`` along each row of ``x (M, N)``, fp32 ``(M,)``; NaN for a row holding NaN.

    x: float32/bfloat16/float16, any strides (``x.t()`` gives column medians without a copy).
    ``splits``: programs along N (default: about four programs per SM on a GPU, one under the
    interpreter). CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``. Bit-identical to
    ``x.abs().median(dim=1).values.float()``. One launch per 2-bit digit (8 for bf16/fp16, 16 for
    fp32), no host sync.
    """
    check_line_input(x, splits, "no median")
    m, n = x.shape
    if m == 0:
        return torch.empty(0, dtype=torch.float32, device=x.device)
    key_dtype, key_mask, key_bits, inf_key = _KEYS[x.dtype]
    block_l, block_n = _tiles(x)
    n_per_split, splits = split_lines(x, block_l, block_n, splits, min_tiles=8)
    keys = x.view(key_dtype)  # same element size: a view for any strides
    prefix = torch.empty((2, m), dtype=torch.int32, device=x.device)  # ping-pong between passes
    counts = torch.empty((2, splits, m, 3), dtype=torch.int32, device=x.device)
    nans = torch.empty((splits, m), dtype=torch.int32, device=x.device)
    rank = (n - 1) // 2
    grid = (cdiv(m, block_l), splits)
    top = RADIX_BITS * ((key_bits - 1) // RADIX_BITS)
    for i, shift in enumerate(range(top, -1, -RADIX_BITS)):
        cur, prev = i % 2, 1 - i % 2
        _radix_pass_kernel[grid](
            keys, prefix[prev], prefix[cur], counts[prev], counts[cur], nans,
            m, n, keys.stride(0), keys.stride(1), n_per_split, splits, shift, rank,
            KEY_MASK=key_mask, INF_KEY=inf_key, FIRST=i == 0, BLOCK_L=block_l, BLOCK_N=block_n,
        )
    # The last pass's digit (bit 0), as the kernel finishes the others.
    below = counts[cur].sum(dim=0, dtype=torch.int32)
    key = prefix[cur] + (below <= rank).sum(dim=1, dtype=torch.int32)
    values = (key.to(key_dtype) if key_dtype is torch.int16 else key).view(x.dtype).float()
    return values.masked_fill(nans.sum(dim=0) > 0, float("nan"))


@triton.jit
def _scaled_sq_sums_kernel(
    x_ptr, col_div_ptr, row_div_ptr, row_out_ptr, col_part_ptr, bad_ptr, M, K, stride_m, stride_k,
    SCALED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Row sums of (x / col_div)² (complete), this block's column sums of (x / row_div)², non-finite count."""
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    if SCALED:
        row_div = tl.load(row_div_ptr + rows, mask=row_ok, other=1.0)
    row_acc = tl.zeros((BLOCK_M,), dtype=tl.float32)
    n_bad = tl.zeros((BLOCK_M,), dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        col_ok = cols < K
        ok = row_ok[:, None] & col_ok[None, :]
        v = to_fp32(tl.load(x_ptr + rows[:, None] * stride_m + cols[None, :] * stride_k, mask=ok, other=0.0))
        n_bad += tl.sum((ok & ~(tl.abs(v) < float("inf"))).to(tl.int32), axis=1)  # NaN fails < too
        if SCALED:
            col_div = tl.load(col_div_ptr + cols, mask=col_ok, other=1.0)
            by_col = v / col_div[None, :]
            by_row = v / row_div[:, None]
            row_acc += tl.sum(by_col * by_col, axis=1)
            tl.store(col_part_ptr + pid * K + cols, tl.sum(by_row * by_row, axis=0), mask=col_ok)
        else:
            sq = v * v
            row_acc += tl.sum(sq, axis=1)
            tl.store(col_part_ptr + pid * K + cols, tl.sum(sq, axis=0), mask=col_ok)
    tl.store(row_out_ptr + rows, row_acc, mask=row_ok)
    tl.store(bad_ptr + rows, n_bad, mask=row_ok)


def scaled_mean_squares(
    x: torch.Tensor, col_div: torch.Tensor | None = None, row_div: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(row_ms (M,), col_ms (K,), nonfinite ())`` of ``x (M, K)``, fp32 except the int64 count.

    ``row_ms[m]``: mean over row m of ``(x[m, k] / col_div[k])²``; ``col_ms[k]``: mean over column
    k of ``(x[m, k] / row_div[m])²``; without divisors (both None) the plain mean squares.
    ``nonfinite``: how many entries of x are NaN or ±Inf (the sums are then meaningless).
    x: float32/bfloat16/float16, any strides; the divisors fp32, on x's device.
    Equivalent, to fp32 rounding, to ``adahop.ops.scaled_mean_squares_ref``; the same checks.
    """
    check_scaled_mean_squares_input(x, col_div, row_div)
    check_device(x, "x")
    m, k = x.shape
    scaled = col_div is not None
    block_m, block_k = (64, 256) if INTERPRETED else (32, 128)
    blocks = cdiv(m, block_m)
    row_sum = torch.empty(m, dtype=torch.float32, device=x.device)
    col_part = torch.empty((blocks, k), dtype=torch.float32, device=x.device)
    bad = torch.empty(m, dtype=torch.int32, device=x.device)
    dummy = row_sum  # never read without SCALED
    _scaled_sq_sums_kernel[(blocks,)](
        x, col_div if scaled else dummy, row_div if scaled else dummy, row_sum, col_part, bad,
        m, k, x.stride(0), x.stride(1), SCALED=scaled, BLOCK_M=block_m, BLOCK_K=block_k,
    )
    return row_sum / k, col_part.sum(dim=0) / m, bad.sum()
