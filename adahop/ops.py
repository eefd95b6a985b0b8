"""Public MXFP4 ops: checked inputs, one backend switch, kernel or reference underneath.

Every op here has a Triton kernel in ``kernels/`` and a pure-PyTorch reference; which one runs
is decided by :func:`adahop.backend.resolve_backend`. Layers and recipes call these functions,
never a kernel directly.
"""

from __future__ import annotations

import torch

from adahop.backend import Backend, resolve_backend
from adahop.formats import (
    MXFP4Tensor,
    NanPolicy,
    Rounding,
    check_quantize_input,
    dequantize_mxfp4_ref,
    quantize_mxfp4_ref,
    to_fp8_rowwise_ref,
)
from adahop.hadamard import DEFAULT_HADAMARD_SIZE, block_hadamard_ref


def _check_2d(x: torch.Tensor, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D (rows, K), got shape {tuple(x.shape)}")


def _check_signs(signs: torch.Tensor | None, k: int, device: torch.device) -> None:
    if signs is None:
        return
    if signs.shape != (k,):
        raise ValueError(f"signs must have shape ({k},) to match the quantized dimension, got {tuple(signs.shape)}")
    if signs.device != device:
        raise ValueError(f"signs are on {signs.device} but the input is on {device}")


def _generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    return None if seed is None else torch.Generator(device=device).manual_seed(seed)


def hadamard_quantize_ref(
    x: torch.Tensor,
    hadamard: bool = True,
    hadamard_size: int = DEFAULT_HADAMARD_SIZE,
    signs: torch.Tensor | None = None,
    rounding: Rounding = "rne",
    seed: int | None = None,
    emit_fp8: bool = False,
    nan_policy: NanPolicy = "propagate",
) -> MXFP4Tensor:
    """Reference of :func:`hadamard_quantize` along the last dimension (transform in fp64)."""
    xt = block_hadamard_ref(x, hadamard_size, signs).float() if hadamard else x
    q = quantize_mxfp4_ref(xt, rounding, _generator(seed, x.device), nan_policy)
    if emit_fp8:
        q.fp8, q.fp8_scale = to_fp8_rowwise_ref(q)
    return q


def hadamard_quantize(
    x: torch.Tensor,
    *,
    transpose: bool = False,
    hadamard: bool = True,
    hadamard_size: int = DEFAULT_HADAMARD_SIZE,
    signs: torch.Tensor | None = None,
    rounding: Rounding = "rne",
    seed: int | None = None,
    emit_fp8: bool = False,
    nan_policy: NanPolicy = "propagate",
    backend: Backend | str | None = None,
) -> MXFP4Tensor:
    """Block-Hadamard transform (optional) fused with MXFP4 quantization of a 2-D tensor.

    x: ``(M, K)`` float32/bfloat16/float16. ``transpose=False`` quantizes along K and returns an
    ``(M, K)`` MXFP4 tensor; ``transpose=True`` quantizes along M and returns the transpose,
    ``(K, M)`` (e.g. Xᵀ along tokens for ``wgrad``). The quantized dimension must be a multiple
    of 32 and of ``hadamard_size``. ``signs`` (±1, length of the quantized dimension) flips signs
    before the transform. ``rounding="sr"`` draws from ``seed``.

    Equivalent to ``quantize_mxfp4_ref(block_hadamard_ref(x.T if transpose else x))``.
    """
    _check_2d(x, "x")
    xt = x.t() if transpose else x
    check_quantize_input(xt, "x.T" if transpose else "x", max(32, hadamard_size if hadamard else 32))
    _check_signs(signs, xt.shape[-1], x.device)
    if resolve_backend(x.device, backend) is Backend.TRITON:
        from adahop_kernels.hadamard_quantize import hadamard_quantize as kernel

        return kernel(x, transpose=transpose, hadamard=hadamard, hadamard_size=hadamard_size,
                      signs=signs, rounding=rounding, seed=seed, emit_fp8=emit_fp8, nan_policy=nan_policy)
    return hadamard_quantize_ref(xt, hadamard, hadamard_size, signs, rounding, seed, emit_fp8, nan_policy)


def hadamard_quantize_dual(
    x: torch.Tensor,
    *,
    hadamard: bool = True,
    hadamard_t: bool = True,
    hadamard_size: int = DEFAULT_HADAMARD_SIZE,
    signs: torch.Tensor | None = None,
    signs_t: torch.Tensor | None = None,
    rounding: Rounding = "rne",
    seed: int | None = None,
    emit_fp8: bool = False,
    emit_fp8_t: bool = False,
    nan_policy: NanPolicy = "propagate",
    backend: Backend | str | None = None,
) -> tuple[MXFP4Tensor, MXFP4Tensor]:
    """One read of ``x (M, K)``, both orientations: ``(x along K (M, K), xᵀ along M (K, M))``.

    The forward's GEMM operand X along ``in`` and the Xᵀ along tokens that ``wgrad`` needs (what
    the forward saves), each with its own Hadamard flag, signs (length K for ``x``, M for ``xᵀ``)
    and FP8 request. M and K must both be multiples of 32 (and of ``hadamard_size`` where
    transformed). On the Triton backend one kernel reads X once and the SR draws equal those of
    the two single calls.

    Equivalent to ``(hadamard_quantize(x, hadamard=hadamard, signs=signs, emit_fp8=emit_fp8, ...),
    hadamard_quantize(x, transpose=True, hadamard=hadamard_t, signs=signs_t, emit_fp8=emit_fp8_t, ...))``.
    """
    _check_2d(x, "x")
    check_quantize_input(x, "x", max(32, hadamard_size if hadamard else 32))
    check_quantize_input(x.t(), "x.T", max(32, hadamard_size if hadamard_t else 32))
    _check_signs(signs, x.shape[1], x.device)
    _check_signs(signs_t, x.shape[0], x.device)
    if resolve_backend(x.device, backend) is Backend.TRITON:
        from adahop_kernels.hadamard_quantize import hadamard_quantize_dual as kernel

        return kernel(x, hadamard=hadamard, hadamard_t=hadamard_t, hadamard_size=hadamard_size, signs=signs,
                      signs_t=signs_t, rounding=rounding, seed=seed, emit_fp8=emit_fp8, emit_fp8_t=emit_fp8_t,
                      nan_policy=nan_policy)
    return (hadamard_quantize_ref(x, hadamard, hadamard_size, signs, rounding, seed, emit_fp8, nan_policy),
            hadamard_quantize_ref(x.t(), hadamard_t, hadamard_size, signs_t, rounding, seed, emit_fp8_t, nan_policy))


def dequantize(t: MXFP4Tensor, dtype: torch.dtype = torch.bfloat16, backend: Backend | str | None = None) -> torch.Tensor:
    """Packed MXFP4 ``(..., K)`` to ``dtype``. Equivalent to :func:`adahop.formats.dequantize_mxfp4_ref`."""
    if resolve_backend(t.device, backend) is Backend.TRITON:
        from adahop_kernels.dequantize import dequantize as kernel

        return kernel(t, dtype)
    return dequantize_mxfp4_ref(t, dtype)


def select_outliers(x: torch.Tensor, k: int) -> torch.Tensor:
    """Indices ``(k,)`` (int64, ascending) of the ``k`` rows of ``x (M, K)`` with the largest absmax.

    Equivalent to ``x.abs().amax(1).topk(k).indices.sort().values``.
    """
    _check_2d(x, "x")
    if not 0 <= k <= x.shape[0]:
        raise ValueError(f"k={k} outlier rows requested from a tensor with {x.shape[0]} rows")
    return x.abs().amax(dim=1).topk(k).indices.sort().values


def mxfp4_mm_ref(a: MXFP4Tensor, b: MXFP4Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``A · Bᵀ`` for A ``(M, K)`` and B ``(N, K)`` in MXFP4, computed in fp64 from the dequantized operands."""
    return (dequantize_mxfp4_ref(a, torch.float64) @ dequantize_mxfp4_ref(b, torch.float64).t()).to(out_dtype)
