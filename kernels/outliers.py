"""Row absmax for outlier extraction (OE): the statistic that ranks rows, in one read of x.

``adahop.ops.extract_outliers`` ranks the rows of ``x (M, K)`` by ``max |x|``, keeps the top k
(``adahop.ops.rank_outliers``: a stable sort of M values) and gathers them as a BF16 slice
(``index_select`` of k rows). Of the three steps only the ranking statistic touches all of x, so
that is the one kernel here:

* one read of x, whatever its strides: a 2-D tile is loaded and Triton coalesces it along the
  contiguous axis, so column outliers (rows of ``x.t()``, a view) cost no transposed copy;
* the reference ``x.abs().amax(1)`` reads x twice and writes |x| once (3x the bytes);
* NaN is explicit: a row holding NaN gets NaN (ranked first, as in the reference),
  where a GPU ``max`` alone would drop it;
* K is split across programs when M alone gives too few programs (e.g. the 4096 channels of an
  activation read along 16k tokens); the (splits, M) partial maxima are reduced by ``amax``.

The top-k and the gather stay in PyTorch: they touch M values and k rows (k=64 of 8k-16k tokens
is under 1% of x), so a kernel would save launches, not bandwidth. tests/bench/test_bench_outliers.py
measures this kernel against the copy bandwidth and against ``torch.linalg.vector_norm(x, inf, 1)``
(PyTorch's own single-pass reduction) in the same run.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from adahop_kernels._common import INTERPRETED, cdiv, check_line_input, split_lines


@triton.jit
def _row_absmax_kernel(
    x_ptr, part_ptr, M, K, stride_m, stride_k, k_per_split,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    split = tl.program_id(1)
    row_ok = rows < M
    k_lo = split * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    amax = tl.zeros((BLOCK_M,), dtype=tl.float32)
    n_nan = tl.zeros((BLOCK_M,), dtype=tl.int32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        ok = row_ok[:, None] & (cols < k_hi)[None, :]
        a = tl.abs(tl.load(x_ptr + rows[:, None] * stride_m + cols[None, :] * stride_k, mask=ok, other=0.0).to(tl.float32))
        nan = a != a
        n_nan += tl.sum(nan.to(tl.int32), axis=1)
        amax = tl.maximum(amax, tl.max(tl.where(nan, 0.0, a), axis=1))
    amax = tl.where(n_nan > 0, float("nan"), amax)
    tl.store(part_ptr + split * M + rows, amax, mask=row_ok)


def row_absmax(x: torch.Tensor, splits: int | None = None) -> torch.Tensor:
    """``max |x|`` of each row of ``x (M, K)`` as fp32 ``(M,)``; NaN for a row holding NaN.

    x: float32/bfloat16/float16, any strides (``x.t()`` gives column maxima without a copy).
    ``splits``: programs along K (default: enough for about four programs per SM on a GPU, one
    under the interpreter). CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``.
    Equivalent to ``x.abs().amax(1).float()``.
    """
    check_line_input(x, splits, "no maximum to rank them by")
    m, k = x.shape
    if m == 0:
        return torch.empty(0, dtype=torch.float32, device=x.device)
    # 64x64 tiles (8-16 KiB) coalesce along either axis; under the interpreter, whose cost grows
    # with programs x iterations, few large tiles.
    block_m, block_k = (64, 512) if INTERPRETED else (64, 64)
    k_per_split, splits = split_lines(x, block_m, block_k, splits, min_tiles=4)
    part = torch.empty((splits, m), dtype=torch.float32, device=x.device)
    grid = (cdiv(m, block_m), splits)
    _row_absmax_kernel[grid](x, part, m, k, x.stride(0), x.stride(1), k_per_split,
                             BLOCK_M=block_m, BLOCK_K=block_k)
    return part[0] if splits == 1 else part.amax(dim=0)
