"""Input checks shared by :mod:`adahop.ops` and the kernel launchers of ``kernels/``.

Both layers import this module and nothing of each other's, so the arrows point one way:
``adahop.ops`` → ``adahop_kernels`` → ``adahop.checks`` / ``adahop.formats``.
"""

from __future__ import annotations

import torch

from adahop.formats import BLOCK_SIZE, FLOAT_DTYPES, MXFP4Tensor

MM_OUT_DTYPES = (torch.bfloat16, torch.float32, torch.float16)
# Output dtypes of dequantization on both backends (float64 on the kernel's path: its fp32, widened).
DEQUANTIZE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
# Stochastic-rounding seeds of the quantizers: the Triton kernel's range (kernels/hadamard_quantize.py).
SR_SEED_LIMIT = 1 << 62
# Hadamard sizes of the quantizers: what the Triton kernel's MMA transform takes (tl.dot needs >= 16,
# 128 keeps H within one tile); the reference takes the same, so both answer alike.
HADAMARD_SIZES = (16, 32, 64, 128)
ROUNDINGS = ("rne", "sr")
NAN_POLICIES = ("propagate", "raise")
# Dtypes a sign vector may have: every floating type both backends read (the kernel compares < 0).
SIGNS_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def check_int(value, name: str, low: int = 0, high: int | None = None) -> None:
    """Raise a TypeError unless ``value`` is an int (bool is not), a ValueError unless ``low <= value``
    (and ``value < high`` when given)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < low or (high is not None and value >= high):
        bound = f"[{low}, {_power_of_two(high)})" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be an int {bound}, got {value}")


def _power_of_two(n: int) -> str:
    return f"2**{n.bit_length() - 1}" if n > 1024 and n & (n - 1) == 0 else str(n)


def check_signs(signs: torch.Tensor | None, n: int, device: torch.device, name: str = "signs",
                transformed: bool = True) -> None:
    """The contract of a sign vector, one for every backend: ``None``, or a floating tensor ``(n,)``
    of exact ±1 on ``device`` (the input's), given only with a transform (``transformed``: signs
    flip the input of the Hadamard transform; without one the kernel would still flip them).

    The documented operation is ``x * signs``; both backends flip where ``signs < 0`` (the kernel
    by the sign bit), which is that product only for ±1, so other values are refused. Reading the
    values costs a device sync, so on CUDA they are not read: there both backends still flip alike,
    and :func:`adahop.hadamard.random_signs` draws ±1 by construction.
    """
    if signs is None:
        return
    if not isinstance(signs, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(signs).__name__}")
    if not transformed:
        raise ValueError(f"{name} flip the input of the Hadamard transform: pass none without it")
    if signs.dtype not in SIGNS_DTYPES:
        raise ValueError(f"{name} must be a floating ±1 vector (float32, bfloat16, float16 or float64), got {signs.dtype}")
    if tuple(signs.shape) != (n,):
        raise ValueError(f"{name} must have shape ({n},) to match the transformed dimension, got {tuple(signs.shape)}")
    if signs.device != torch.device(device):
        raise ValueError(f"{name} are on {signs.device} but the input is on {device}")
    if signs.device.type not in ("cuda", "meta") and not (signs.abs() == 1).all():
        raise ValueError(f"{name} must hold only +1 and -1")


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


def check_mxfp4_operands(a: MXFP4Tensor, b: MXFP4Tensor, out_dtype: torch.dtype,
                         out_dtypes: tuple[torch.dtype, ...] = MM_OUT_DTYPES) -> None:
    """Checks of ``A · Bᵀ``: both operands, equal K, one device, an output dtype of ``out_dtypes``."""
    check_mxfp4_operand(a, "a")
    check_mxfp4_operand(b, "b")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"inner dimensions differ: a is {tuple(a.shape)}, b is {tuple(b.shape)} (A·Bᵀ needs equal K)")
    if a.device != b.device:
        raise ValueError(f"a is on {a.device} but b is on {b.device}")
    if out_dtype not in out_dtypes:
        raise ValueError(f"out_dtype must be one of {out_dtypes}, got {out_dtype}")


def check_mxfp4_tensor(t: MXFP4Tensor, name: str = "t") -> int:
    """Raise a TypeError/ValueError naming what is wrong with an MXFP4 tensor ``(..., K)``; return K.

    codes uint8 ``(..., K/2)`` and scales uint8 ``(..., K/32)`` on one device, both contiguous:
    what the dequantization kernel reads, and so what both backends take.
    """
    if not isinstance(t, MXFP4Tensor):
        raise TypeError(f"{name} must be an MXFP4Tensor, got {type(t).__name__}")
    codes, scales = t.codes, t.scales
    for part, v in (("codes", codes), ("scales", scales)):
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"{name}.{part} must be a torch.Tensor, got {type(v).__name__}")
        if v.dtype != torch.uint8:
            raise ValueError(f"{name}.{part} must be uint8, got {v.dtype}")
    if codes.dim() < 1 or codes.shape[:-1] != scales.shape[:-1] or codes.shape[-1] * 2 != scales.shape[-1] * BLOCK_SIZE:
        raise ValueError(f"{name}: codes {tuple(codes.shape)} and scales {tuple(scales.shape)} do not describe one "
                         f"MXFP4 tensor (codes (..., K/2), scales (..., K/{BLOCK_SIZE}))")
    if scales.device != codes.device:
        raise ValueError(f"{name}: codes are on {codes.device} but scales on {scales.device}")
    if not (codes.is_contiguous() and scales.is_contiguous()):
        raise ValueError(f"{name}: codes and scales must be contiguous")
    return codes.shape[-1] * 2


def check_quantize_options(flags: dict[str, object], transformed: bool, hadamard_size: int, rounding: str,
                           seed: int | None, nan_policy: str) -> None:
    """The options of :func:`adahop.ops.hadamard_quantize` (and ``_dual``), checked in one order for
    both backends: ``flags`` (name -> value) bools; ``hadamard_size`` one of :data:`HADAMARD_SIZES`
    when ``transformed``; ``rounding`` and ``nan_policy`` known names; ``seed`` None or an int in
    [0, 2**62)."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    if isinstance(hadamard_size, bool) or not isinstance(hadamard_size, int):
        raise TypeError(f"hadamard_size must be an int, got {type(hadamard_size).__name__} {hadamard_size!r}")
    if transformed and hadamard_size not in HADAMARD_SIZES:
        raise ValueError(f"hadamard_size must be one of {HADAMARD_SIZES}, got {hadamard_size}")
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be 'rne' or 'sr', got {rounding!r}")
    if nan_policy not in NAN_POLICIES:
        raise ValueError(f"nan_policy must be 'propagate' or 'raise', got {nan_policy!r}")
    if seed is not None and not isinstance(seed, torch.Tensor):  # a device seed is checked where it is read
        check_int(seed, "seed", 0, SR_SEED_LIMIT)
