"""MXFP4 → bf16/fp16/fp32: ``e2m1(code) * 2**(scale - 127)`` per block of 32.

Values are built exactly in fp32 (2-bit significands times exact powers of two, subnormal scales
included) and rounded once to the output type, as the fp64 reference does. A NaN-scale block
(0xFF) dequantizes to NaN.

Bandwidth: reads 0.53 B/value, writes 2 (bf16/fp16) or 4 (fp32). Values come from their bit
patterns (no int->float conversions): 0.50 warp-instructions a value on the sm_90 SASS
(``scripts/sass_count.py``) against a budget of ~0.73 at 85% of the copy rate, so expect it
memory-bound (measured in ``tests/bench/test_bench_quantize.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from adahop.checks import check_mxfp4_tensor
from adahop.formats import MXFP4Tensor
from adahop_kernels._common import INTERPRETED, autotune, cdiv, check_device, e2m1_value, exp2_int

OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# The fp32 NaN bit pattern: a NaN-valued global constexpr breaks triton 3.6's check that globals
# are unchanged since compilation (NaN != NaN), so the kernel builds it from bits.
_NAN_BITS = tl.constexpr(0x7FC00000)


@triton.jit
def _dequantize_kernel(codes_ptr, scales_ptr, out_ptr, n_rows, K, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = (rows < n_rows)[:, None]
    rows = rows.to(tl.int64)[:, None]
    k0 = tl.program_id(1) * BLOCK_K
    kc = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    c = tl.load(codes_ptr + rows * (K // 2) + kc[None, :], mask=row_ok & (kc < K // 2)[None, :], other=0).to(tl.int32)
    b = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    s = tl.load(scales_ptr + rows * (K // 32) + b[None, :], mask=row_ok & (b < K // 32)[None, :], other=0).to(tl.int32)
    # Low nibble first: element 2i is byte i & 15, element 2i + 1 is byte i >> 4.
    vals = e2m1_value(tl.reshape(tl.join(c & 15, c >> 4), (BLOCK_R, BLOCK_K // 32, 32)))
    out = vals * exp2_int(tl.minimum(s, 254) - 127)[:, :, None]  # 0xFF: NaN below, not 2^128
    nan = tl.full((1, 1, 1), _NAN_BITS, tl.int32).to(tl.float32, bitcast=True)
    out = tl.where((s == 255)[:, :, None], nan, out)
    out = tl.reshape(out, (BLOCK_R, BLOCK_K))
    if out_ptr.dtype.element_ty == tl.bfloat16:
        # An MXFP4 value has two significant bits, so its bf16 is the top half of its fp32, subnormals
        # included (the interpreter's fp32->bf16 cast truncates and mishandles subnormals).
        out = (out.to(tl.int32, bitcast=True) >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    k = k0 + tl.arange(0, BLOCK_K)
    tl.store(out_ptr + rows * K + k[None, :], out.to(out_ptr.dtype.element_ty), mask=row_ok & (k < K)[None, :])


_tuned_kernel = autotune(
    _dequantize_kernel,
    [triton.Config({"BLOCK_R": r, "BLOCK_K": k}, num_warps=w)
     for r, k, w in ((8, 512, 4), (16, 512, 8), (4, 1024, 4), (32, 256, 8))],
    key=["n_rows", "K"],
)


def dequantize(t: MXFP4Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Packed MXFP4 ``(..., K)`` (contiguous codes and scales) to ``dtype`` (fp32, bf16 or fp16).

    CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``. Equivalent to
    :func:`adahop.formats.dequantize_mxfp4_ref` ``(t, dtype)``, bit for bit.
    """
    k = check_mxfp4_tensor(t, "t")
    check_device(t.codes, "t.codes")
    if dtype not in OUT_DTYPES:
        raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype}")
    out = torch.empty((*t.codes.shape[:-1], k), dtype=dtype, device=t.codes.device)
    n_rows = out.numel() // k if k else 0
    if not n_rows:
        return out
    args = dict(codes_ptr=t.codes, scales_ptr=t.scales, out_ptr=out, n_rows=n_rows, K=k)
    if INTERPRETED:
        # Few, large programs: the interpreter's cost grows with the program count.
        block_k = min(4096, triton.next_power_of_2(k))
        block_r = min(triton.next_power_of_2(n_rows), max(1, 65536 // block_k))
        _dequantize_kernel[(cdiv(n_rows, block_r), cdiv(k, block_k))](
            **args, BLOCK_R=block_r, BLOCK_K=block_k)
    else:
        _tuned_kernel[lambda meta: (cdiv(n_rows, meta["BLOCK_R"]), cdiv(k, meta["BLOCK_K"]))](**args)
    return out
