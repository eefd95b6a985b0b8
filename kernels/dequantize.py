"""MXFP4 → bf16/fp16/fp32, and MXFP4 → the exact FP8 E4M3 row-scaled operand (DESIGN §3).

Both are one row-wise kernel: element = ``e2m1(code) * 2**(block exponent - shift)``. Plain
dequantization uses shift = 127 (the E8M0 bias); the FP8 re-encoding first takes R, the row's
largest block exponent (NaN blocks excluded), in a pass over the row's scales (K/32 bytes, from
L2), writes the row scale ``2**(R - 6)`` and uses element exponents relative to ``R - 6``.
Values are built exactly in fp32 (2-bit significands times exact powers of two) and rounded
once to the output type, as the fp64 references do.

Bandwidth: reads 0.53 B/value, writes 2 (bf16) or 1 (fp8) B/value; no arithmetic worth the
name, so expect the copy rate (to be measured in ``tests/bench/test_bench_quantize.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from adahop.formats import BLOCK_SIZE, MXFP4Tensor
from adahop_kernels._common import INTERPRETED, check_device, e2m1_value, exp2_int

OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_NAN: tl.constexpr = float("nan")


@triton.jit
def _dequantize_kernel(
    codes_ptr, scales_ptr, out_ptr, row_scale_ptr, n_rows, K,
    ROW_RELATIVE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < n_rows
    rows = rows.to(tl.int64)
    n_blocks = K // 32
    if ROW_RELATIVE:
        # R (biased) = the row's largest block scale; a NaN block (0xFF) counts as byte 0, as in the reference.
        r = tl.zeros((BLOCK_R,), tl.int32)
        for b0 in range(0, n_blocks, BLOCK_K // 32):
            b = b0 + tl.arange(0, BLOCK_K // 32)
            s = tl.load(scales_ptr + rows[:, None] * n_blocks + b[None, :],
                        mask=row_ok[:, None] & (b < n_blocks)[None, :], other=0).to(tl.int32)
            r = tl.maximum(r, tl.max(tl.where(s == 255, 0, s), axis=1))
        tl.store(row_scale_ptr + rows, exp2_int(r - 127 - 6), mask=row_ok)
        shift = 6 - r  # element exponent (s - 127) - (r - 127) + 6
    else:
        shift = tl.full((BLOCK_R,), -127, tl.int32)
    for k0 in range(0, K, BLOCK_K):
        kc = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        c = tl.load(codes_ptr + rows[:, None] * (K // 2) + kc[None, :],
                    mask=row_ok[:, None] & (kc < K // 2)[None, :], other=0).to(tl.int32)
        b = k0 // 32 + tl.arange(0, BLOCK_K // 32)
        s = tl.load(scales_ptr + rows[:, None] * n_blocks + b[None, :],
                    mask=row_ok[:, None] & (b < n_blocks)[None, :], other=0).to(tl.int32)
        # Low nibble first: element 2i is byte i & 15, element 2i + 1 is byte i >> 4.
        vals = e2m1_value(tl.reshape(tl.join(c & 15, c >> 4), (BLOCK_R, BLOCK_K // 32, 32)))
        # Below 2^-149 the fp32 product is 0, as is its fp8 rounding (E4M3's smallest step is 2^-9).
        out = vals * exp2_int(tl.maximum(s + shift[:, None], -149))[:, :, None]
        out = tl.where((s == 255)[:, :, None], _NAN, out)
        k = k0 + tl.arange(0, BLOCK_K)
        tl.store(out_ptr + rows[:, None] * K + k[None, :],
                 tl.reshape(out, (BLOCK_R, BLOCK_K)).to(out_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & (k < K)[None, :])


_tuned_kernel = triton.autotune(
    [triton.Config({"BLOCK_R": r, "BLOCK_K": k}, num_warps=w)
     for r, k, w in ((4, 1024, 4), (8, 1024, 8), (16, 512, 8), (2, 2048, 4))],
    key=["n_rows", "K", "ROW_RELATIVE"],
)(_dequantize_kernel)


def _check_mxfp4(t: MXFP4Tensor) -> int:
    """Check an MXFP4Tensor's buffers for the kernel; return K, the quantized length."""
    if not isinstance(t, MXFP4Tensor):
        raise TypeError(f"expected an MXFP4Tensor, got {type(t).__name__}")
    codes, scales = t.codes, t.scales
    if codes.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"codes and scales must be uint8, got {codes.dtype} and {scales.dtype}")
    if codes.dim() < 1 or codes.shape[:-1] != scales.shape[:-1] or codes.shape[-1] * 2 != scales.shape[-1] * BLOCK_SIZE:
        raise ValueError(f"codes {tuple(codes.shape)} and scales {tuple(scales.shape)} do not describe one "
                         f"MXFP4 tensor (codes (..., K/2), scales (..., K/{BLOCK_SIZE}))")
    if not (codes.is_contiguous() and scales.is_contiguous()):
        raise ValueError("codes and scales must be contiguous")
    if scales.device != codes.device:
        raise ValueError(f"codes are on {codes.device} but scales on {scales.device}")
    check_device(codes, "codes")
    return codes.shape[-1] * 2


def _launch(t: MXFP4Tensor, out: torch.Tensor, row_scale: torch.Tensor | None) -> None:
    k = out.shape[-1]
    n_rows = out.numel() // k if k else 0
    if not n_rows:
        return
    args = dict(codes_ptr=t.codes, scales_ptr=t.scales, out_ptr=out,
                row_scale_ptr=row_scale if row_scale is not None else out,
                n_rows=n_rows, K=k, ROW_RELATIVE=row_scale is not None)
    if INTERPRETED:
        # Few, large programs: the interpreter's cost grows with programs × loop iterations.
        block_k = min(2048, triton.next_power_of_2(k))
        block_r = max(1, min(triton.next_power_of_2(n_rows), 65536 // block_k))
        _dequantize_kernel[(triton.cdiv(n_rows, block_r),)](**args, BLOCK_R=block_r, BLOCK_K=block_k)
    else:
        _tuned_kernel[lambda meta: (triton.cdiv(n_rows, meta["BLOCK_R"]),)](**args)


def dequantize(t: MXFP4Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Packed MXFP4 ``(..., K)`` (contiguous codes and scales) to ``dtype`` (fp32, bf16 or fp16).

    NaN-scale blocks (0xFF) dequantize to NaN. Equivalent to
    :func:`adahop.formats.dequantize_mxfp4_ref` ``(t, dtype)``, bit for bit.
    """
    k = _check_mxfp4(t)
    if dtype not in OUT_DTYPES:
        raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype}")
    out = torch.empty((*t.codes.shape[:-1], k), dtype=dtype, device=t.codes.device)
    _launch(t, out, None)
    return out


def to_fp8_rowwise(t: MXFP4Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Re-encode a 2-D MXFP4 tensor ``(M, K)`` as FP8 E4M3 ``(M, K)`` plus fp32 row scales ``(M, 1)``.

    Element ``q * 2**(e_block - R + 6)``, row scale ``2**(R - 6)``, R the row's largest block
    exponent: exact when a row's exponents span ≤ 14 binades. Equivalent to
    :func:`adahop.formats.to_fp8_rowwise_ref`, bit for bit.
    """
    k = _check_mxfp4(t)
    if t.codes.dim() != 2:
        raise ValueError(f"FP8 re-encoding takes a 2-D MXFP4 tensor, got shape {tuple(t.shape)}")
    m = t.codes.shape[0]
    fp8 = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=t.codes.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=t.codes.device)
    _launch(t, fp8, scale)
    return fp8, scale

