"""Pieces shared by the MXFP4 kernels: exact powers of two, E2M1 values, launch checks.

Triton picks interpreter or compiler when a kernel module is imported (``TRITON_INTERPRET=1``
must be set before the first ``import triton``), so :data:`INTERPRETED` is read once, here.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from adahop.checks import check_float_matrix

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


def check_line_input(x: torch.Tensor, splits: int | None, empty_rows: str) -> None:
    """The checks of a per-row reduction split along its rows (``row_absmax``, ``abs_median``): a float
    matrix this machine can run, rows that are not empty (``empty_rows`` says why they must not be),
    ``splits`` None or a positive int."""
    check_float_matrix(x)
    check_device(x, "x")
    if x.shape[1] == 0:
        raise ValueError(f"x of shape {tuple(x.shape)} has empty rows: {empty_rows}")
    if splits is not None and (isinstance(splits, bool) or not isinstance(splits, int) or splits < 1):
        raise ValueError(f"splits must be a positive int, got {splits!r}")


def split_lines(x: torch.Tensor, block_l: int, block_n: int, splits: int | None, min_tiles: int) -> tuple[int, int]:
    """``(n_per_split, splits)`` for a kernel whose programs take ``block_l`` rows of ``x (L, N)`` and
    one of ``splits`` stretches of N. Default ``splits``: enough for about four programs per SM, so a
    few long rows still fill the GPU, but at least ``min_tiles`` tiles of ``block_n`` per stretch (one
    stretch under the interpreter). ``n_per_split`` is a multiple of ``block_n``; ``splits`` is
    recomputed from it (no empty stretch)."""
    lines, n = x.shape
    if splits is None:
        splits = 1
        if not INTERPRETED:
            want = 4 * torch.cuda.get_device_properties(x.device).multi_processor_count
            splits = max(1, min(triton.cdiv(want, triton.cdiv(lines, block_l)), triton.cdiv(n, min_tiles * block_n)))
    n_per_split = triton.cdiv(triton.cdiv(n, splits), block_n) * block_n
    return n_per_split, triton.cdiv(n, n_per_split)


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
