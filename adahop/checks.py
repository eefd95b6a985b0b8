"""Input checks shared by :mod:`adahop.ops` and the kernel launchers of ``kernels/``.

Both layers import this module and nothing of each other's, so the arrows point one way:
``adahop.ops`` → ``adahop_kernels`` → ``adahop.checks`` / ``adahop.formats``.
"""

from __future__ import annotations

import torch

from adahop.formats import BLOCK_SIZE, FLOAT_DTYPES, MXFP4Tensor

MM_OUT_DTYPES = (torch.bfloat16, torch.float32, torch.float16)


def check_2d(x: torch.Tensor, name: str) -> None:
    """Raise a TypeError/ValueError unless ``x`` is a 2-D tensor."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D (rows, K), got shape {tuple(x.shape)}")


def check_float_matrix(x: torch.Tensor, name: str = "x") -> None:
    """Raise a TypeError/ValueError unless ``x`` is a 2-D float32/bfloat16/float16 tensor."""
    check_2d(x, name)
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be float32, bfloat16 or float16, got {x.dtype}")


def check_scaled_mean_squares_input(x: torch.Tensor, col_div: torch.Tensor | None, row_div: torch.Tensor | None) -> None:
    """The checks of :func:`adahop.ops.scaled_mean_squares`: a non-empty float matrix, both divisors or none."""
    check_float_matrix(x)
    m, k = x.shape
    if m == 0 or k == 0:
        raise ValueError(f"x of shape {tuple(x.shape)} has no entries to average")
    if (col_div is None) != (row_div is None):
        raise ValueError("pass both col_div and row_div, or neither")
    if col_div is not None:
        for name, d, size in (("col_div", col_div, k), ("row_div", row_div, m)):
            if d.shape != (size,) or d.dtype != torch.float32 or d.device != x.device:
                raise ValueError(f"{name} must be fp32 of shape ({size},) on {x.device}, got "
                                 f"{d.dtype} of shape {tuple(d.shape)} on {d.device}")


def check_mxfp4_operand(t: MXFP4Tensor, name: str) -> None:
    """Raise a TypeError/ValueError naming what is wrong with a 2-D MXFP4 GEMM operand ``(rows, K)``."""
    if not isinstance(t, MXFP4Tensor):
        raise TypeError(f"{name} must be an MXFP4Tensor, got {type(t).__name__}")
    if t.codes.dim() != 2:
        raise ValueError(f"{name} must be a 2-D MXFP4 tensor (rows, K), got shape {tuple(t.shape)}")
    rows, k = t.shape
    if t.codes.dtype != torch.uint8 or t.scales.dtype != torch.uint8:
        raise ValueError(f"{name}: codes and scales must be uint8, got {t.codes.dtype} and {t.scales.dtype}")
    if k % BLOCK_SIZE or tuple(t.scales.shape) != (rows, k // BLOCK_SIZE):
        raise ValueError(
            f"{name}: scales of shape {tuple(t.scales.shape)} do not match codes of logical shape "
            f"{(rows, k)} (K must be a multiple of {BLOCK_SIZE}, scales ({rows}, K/{BLOCK_SIZE}))"
        )
    if t.scales.device != t.codes.device:
        raise ValueError(f"{name}: codes are on {t.codes.device} but scales on {t.scales.device}")
    if not (t.codes.is_contiguous() and t.scales.is_contiguous()):
        raise ValueError(f"{name}: codes and scales must be contiguous")
    if t.fp8 is not None:
        if t.fp8.dtype != torch.float8_e4m3fn or tuple(t.fp8.shape) != (rows, k) or t.fp8.device != t.device:
            raise ValueError(f"{name}.fp8 must be float8_e4m3fn of shape {(rows, k)} on {t.device}, "
                             f"got {t.fp8.dtype} {tuple(t.fp8.shape)} on {t.fp8.device}")
        s = t.fp8_scale
        if s is None or s.dtype != torch.float32 or tuple(s.shape) != (rows, 1) or s.device != t.device:
            raise ValueError(f"{name}.fp8_scale must be float32 of shape {(rows, 1)} on {t.device} next to fp8")


def check_mxfp4_operands(a: MXFP4Tensor, b: MXFP4Tensor, out_dtype: torch.dtype) -> None:
    """Checks of ``A · Bᵀ``: both operands, equal K, one device, a supported output dtype."""
    check_mxfp4_operand(a, "a")
    check_mxfp4_operand(b, "b")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"inner dimensions differ: a is {tuple(a.shape)}, b is {tuple(b.shape)} (A·Bᵀ needs equal K)")
    if a.device != b.device:
        raise ValueError(f"a is on {a.device} but b is on {b.device}")
    if out_dtype not in MM_OUT_DTYPES:
        raise ValueError(f"out_dtype must be one of {MM_OUT_DTYPES}, got {out_dtype}")
