"""MXFP4 x MXFP4 GEMM through Triton's ``tl.dot_scaled`` (native MXFP4 on sm_100+ and AMD CDNA4).

``C = A · Bᵀ`` with A ``(M, K)`` and B ``(N, K)`` packed E2M1 codes and E8M0 block scales, both
along K, accumulated in fp32. On GPUs without FP4 tensor cores Triton lowers ``dot_scaled`` to a
bf16 upcast and a bf16 MMA (DESIGN.md §3 measured ≈230 TFLOP/s on an H200, a third of cuBLAS
bf16), so ``adahop.ops.mxfp4_mm`` takes this kernel by default only where the hardware is native;
elsewhere it is there to be forced and measured (``path=GemmPath.DOT_SCALED``).

Tiles follow Triton's block-scaled matmul tutorial (128x128 outputs, 128 of K a step). They are not
tuned: no sm_100 machine was available to tune on.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from adahop.checks import MM_OUT_DTYPES, check_mxfp4_operands
from adahop_kernels._common import INTERPRETED, cdiv, check_device


@triton.jit
def _mxfp4_mm_kernel(
    a_ptr, a_scale_ptr, b_ptr, b_scale_ptr, c_ptr, M, N, K,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = rm < M, rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kb = k0 // 2 + tl.arange(0, BLOCK_K // 2)  # packed bytes along K
        ks = k0 // 32 + tl.arange(0, BLOCK_K // 32)  # scale blocks along K
        kb_ok, ks_ok = kb < K // 2, ks < K // 32
        # Masked-off codes are 0 and masked-off scales 2^-127: padding contributes exact zeros.
        a = tl.load(a_ptr + rm[:, None] * (K // 2) + kb[None, :], mask=m_ok[:, None] & kb_ok[None, :], other=0)
        # B's codes as the (K/2, N) right operand: row-major (N, K/2) read transposed.
        b = tl.load(b_ptr + rn[None, :] * (K // 2) + kb[:, None], mask=kb_ok[:, None] & n_ok[None, :], other=0)
        sa = tl.load(a_scale_ptr + rm[:, None] * (K // 32) + ks[None, :], mask=m_ok[:, None] & ks_ok[None, :], other=0)
        sb = tl.load(b_scale_ptr + rn[:, None] * (K // 32) + ks[None, :], mask=n_ok[:, None] & ks_ok[None, :], other=0)
        acc = tl.dot_scaled(a, sa, "e2m1", b, sb, "e2m1", acc)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(c_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def mxfp4_mm_dot_scaled(a, b, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``A · Bᵀ`` ``(M, N)`` in ``out_dtype`` for MXFP4 A ``(M, K)`` and B ``(N, K)``, fp32 accumulation.

    K a multiple of 32 (any M, N). CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1`` (Triton
    >= 3.8 for ``dot_scaled`` there). Equivalent to ``adahop.ops.mxfp4_mm_ref(a, b, out_dtype)`` up
    to fp32 accumulation order.
    """
    check_mxfp4_operands(a, b, out_dtype)
    check_device(a.codes, "a")
    (m, k), n = a.shape, b.shape[0]
    # Triton's interpreter truncates fp32 -> bf16/fp16 where a GPU rounds to nearest even: there
    # the kernel writes fp32 and PyTorch rounds.
    c = torch.empty((m, n), dtype=torch.float32 if INTERPRETED else out_dtype, device=a.device)
    if m == 0 or n == 0:
        return c.to(out_dtype)
    if INTERPRETED:
        # Interpreter cost grows with programs x iterations: one large tile where possible.
        block_m, block_n, block_k, extra = 64, 64, min(256, triton.next_power_of_2(k)), {}
    else:
        block_m, block_n, block_k, extra = 128, 128, 128, {"num_warps": 8, "num_stages": 3}
    grid = (cdiv(m, block_m), cdiv(n, block_n))
    _mxfp4_mm_kernel[grid](a.codes, a.scales, b.codes, b.scales, c, m, n, k,
                           BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, **extra)
    return c.to(out_dtype)
