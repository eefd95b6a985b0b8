"""Pieces shared by the MXFP4 kernels: exact powers of two, E2M1 values, launch checks.

Triton picks interpreter or compiler when a kernel module is imported (``TRITON_INTERPRET=1``
must be set before the first ``import triton``), so :data:`INTERPRETED` is read once, here.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_device(t: torch.Tensor, name: str) -> None:
    """Raise a ValueError unless ``t`` can run here: a CUDA tensor, or a CPU one under the interpreter."""
    if t.device.type == "cuda" or (t.device.type == "cpu" and INTERPRETED):
        return
    if t.device.type == "cpu":
        raise ValueError(
            f"{name} is on the CPU but adahop_kernels was imported without TRITON_INTERPRET=1; "
            "set it before anything imports triton, or use the reference backend"
        )
    raise ValueError(f"{name} is on {t.device}; the Triton kernels take CUDA tensors (or CPU ones under the interpreter)")


@triton.jit
def exp2_int(e):
    """fp32 ``2**e`` for int32 ``e`` in [-149, 127], exact (subnormals built from their bit pattern).

    Bit construction rather than ``tl.exp2``: the GPU's ex2.approx is not exact and flushes subnormals.
    """
    normal = (tl.maximum(e + 127, 1) << 23).to(tl.float32, bitcast=True)
    subnormal = (1 << tl.minimum(tl.maximum(e + 149, 0), 22)).to(tl.float32, bitcast=True)
    return tl.where(e >= -126, normal, subnormal)


@triton.jit
def e2m1_value(code):
    """fp32 value of each E2M1 code (int32 0..15): ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}, built from bits."""
    idx = code & 7
    # Codes 2..7 are normal, exponent (idx >> 1) - 1 and mantissa idx & 1: fp32 bits (idx + 252) << 22.
    # Code 1 is 0.5 (0x3F000000), code 0 is 0.
    bits = tl.where(idx >= 2, (idx + 252) << 22, idx * 0x3F000000)
    return (bits | ((code & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def to_fp32(x):
    """Exact upcast to fp32; bf16 by its bits (the interpreter's bf16->fp32 cast drops subnormals)."""
    if x.dtype == tl.bfloat16:
        return (x.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    return x.to(tl.float32)


@triton.jit
def flip_sign(x, neg):
    """``x`` with the sign flipped where ``neg``: exact, by the sign bit (the interpreter has no bf16 arithmetic)."""
    if x.dtype.primitive_bitwidth == 16:
        bits = x.to(tl.int16, bitcast=True) ^ (neg.to(tl.int16) << 15)
    else:
        bits = x.to(tl.int32, bitcast=True) ^ (neg.to(tl.int32) << 31)
    return bits.to(x.dtype, bitcast=True)
