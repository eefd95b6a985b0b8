"""HOT's integer rounding in one pass: fp32 ``t (rows, K)`` and its scales to int8 values.

The reference (:func:`adahop.hot.round_int_ref`) is about twelve elementwise kernels: the
division, the clamp, the counter hash of the stochastic draws in int64 (two 32-bit multiplies,
each split in 16-bit halves) and the rounding, each writing a whole-tensor temporary of 4 or 8
bytes per value. That made HOT's eager backward hold 11–20× the memory of a BF16 layer's, and
under ``torch.compile`` it is a long fused expression for Inductor to generate per shape. Here:
one read of ``t`` (4 bytes a value), one write of the int8 codes, the hash in 32-bit unsigned
arithmetic, bit for bit the reference's:

* ``y = clamp(t / scale, -qmax, qmax)`` with the correctly rounded division (``div_rn``), as
  PyTorch divides;
* to nearest, ties to even: ``|y| + 2^23`` rounds ``|y|`` (at most 127) to an integer in the
  binade whose step is 1, read back from its bits;
* stochastically: ``floor(|y| + u)``, ``u`` the top 24 bits of ``lowbias32(i XOR lowbias32(seed))``
  times 2^-24 for the value's flat index ``i``;
* the sign of ``y`` restored; a NaN value gives 0 (its scale is NaN: the product shows it).

Measured on one H100 at the layer shapes of ``tests/bench/test_bench_hot.py``
(``results/microbench/gpu/hot-round.json``): 0.87–0.99 of the same-run copy bandwidth to nearest
and 0.70–0.99 stochastically, 7.6–8.5× and 72–100× the speed of the eager reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from adahop_kernels._common import INTERPRETED, cdiv, check_device
from adahop_kernels.signs import _lowbias32

BLOCK = 1024


@triton.jit(do_not_specialize=["qmax"])  # qmax 1 (2 bits) would become a constexpr int, with no .to()
def _hot_round_kernel(t_ptr, scale_ptr, seed_ptr, out_ptr, k, qmax,
                      PER_ROW: tl.constexpr, SR: tl.constexpr, BLOCK: tl.constexpr):
    # One row per program along axis 0 (its scale is one load; no index division), BLOCK columns
    # per program along axis 1.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < k
    i = row * k + cols  # the value's flat index: what the reference's draws are keyed on
    t = tl.load(t_ptr + i, mask=mask, other=0.0)
    s = tl.load(scale_ptr + row) if PER_ROW else tl.load(scale_ptr)
    y = tl.math.div_rn(t, s)
    nan = y != y
    a = tl.minimum(tl.abs(y), qmax.to(tl.float32))
    if SR:
        mix = _lowbias32(tl.load(seed_ptr).to(tl.uint32))
        h = _lowbias32(i.to(tl.uint32) ^ mix)
        # Exact even if contracted to an fma: (h >> 8) · 2^-24 is exact.
        u = (h >> 8).to(tl.float32) * (1.0 / 16777216.0)
        r = tl.floor(a + u)
    else:
        # 2^23 has a step of 1: the fp32 sum rounds |y| to an integer, ties to even.
        r = ((a + 8388608.0).to(tl.int32, bitcast=True) - 0x4B000000).to(tl.float32)
    q = tl.where(y < 0, -r, r)
    q = tl.where(nan, 0.0, q)
    tl.store(out_ptr + i, q.to(tl.int8), mask=mask)


def hot_round(t: torch.Tensor, scale: torch.Tensor, qmax: int, seed: torch.Tensor | None) -> torch.Tensor:
    """int8 ``(rows, K)`` of fp32 ``t (rows, K)`` over ``scale`` (fp32 ``(rows, 1)`` or ``(1, 1)``):
    to nearest where ``seed`` is None, else stochastically from the int64 ``seed`` ``(1,)``."""
    check_device(t, "t")
    rows, k = t.shape
    t = t.contiguous()
    out = torch.empty((rows, k), dtype=torch.int8, device=t.device)
    if rows * k:
        # The interpreter pays per program: one per row there.
        block = min(triton.next_power_of_2(k), 1 << 16) if INTERPRETED else BLOCK
        per_row = scale.shape[0] == rows and rows > 1
        _hot_round_kernel[(rows, cdiv(k, block))](
            t, scale.contiguous(), seed if seed is not None else scale, out, k, qmax,
            PER_ROW=per_row, SR=seed is not None, BLOCK=block)
    return out
