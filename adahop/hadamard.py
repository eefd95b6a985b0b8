"""Block Hadamard transform reference (the IHT of AdaHOP).

The transform multiplies each block of ``block_size`` consecutive values along the last
dimension by the normalised Sylvester Hadamard matrix ``H / sqrt(block_size)``, optionally after
flipping signs with a ±1 vector ``D`` drawn from a seed. ``H`` is symmetric and orthonormal, so for
two GEMM operands transformed along their shared inner dimension,
``(A D H)(B D H)^T = A D H H^T D B^T = A B^T`` exactly: no inverse transform is needed.
"""

from __future__ import annotations

import functools

import torch

from adahop.checks import SIGNS_DTYPES, check_int, check_signs

DEFAULT_HADAMARD_SIZE = 32


def _check_block_size(block_size: int) -> None:
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise TypeError(f"Hadamard block size must be an int, got {type(block_size).__name__} {block_size!r}")
    if block_size < 2 or block_size & (block_size - 1):
        raise ValueError(f"Hadamard block size must be a power of two >= 2, got {block_size}")


@functools.lru_cache(maxsize=16)
def _sylvester(block_size: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < block_size:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h


def hadamard_matrix(
    block_size: int = DEFAULT_HADAMARD_SIZE,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The normalised Sylvester Hadamard matrix ``(block_size, block_size)``: ``H @ H.T = I``.

    dtype: a floating dtype (the entries are ±1/sqrt(block_size)); any other raises ValueError.
    Equivalent to ``scipy.linalg.hadamard(block_size) / sqrt(block_size)``.
    """
    _check_block_size(block_size)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating dtype (entries are ±1/sqrt({block_size})), got {dtype}")
    return (_sylvester(block_size) / block_size**0.5).to(dtype=dtype, device=device)


_MASK32 = 0xFFFFFFFF


def _mul32(x, c: int):
    """``(x * c) mod 2**32`` for ``x`` in [0, 2**32) (a Python int or an int64 tensor), without
    int64 overflow: ``c`` is split into 16-bit halves."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _MASK32


def _lowbias32(x):
    """The ``lowbias32`` integer hash (xorshift-multiply, full avalanche) of 32-bit ``x``."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def _index_hash(n: int, mix, device: torch.device | str | None) -> torch.Tensor:
    """``lowbias32(i XOR mix)`` for each index ``i`` in [0, n), int64 holding 32 bits: the counter
    hash behind every draw keyed on an element's index (random signs, HOT's stochastic rounding).
    ``mix``: a 32-bit int or int64 tensor. Indices wrap at 2**32, as the kernels' uint32 ones do."""
    index = torch.arange(n, dtype=torch.int64, device=device) & _MASK32
    return _lowbias32(index ^ mix)


def _seed_tensor_hash(n: int, seed: torch.Tensor) -> torch.Tensor:
    """:func:`_index_hash` keyed on ``lowbias32`` of an int64 seed tensor's low 32 bits, on its
    device (no host read)."""
    return _index_hash(n, _lowbias32(seed.reshape(()) & _MASK32), seed.device)


SIGNS_SEED_LIMIT = 1 << 64


def random_signs(
    n: int, seed: int, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """A deterministic ±1 vector ``(n,)`` of ``dtype`` drawn from ``seed`` (an int in [0, 2**64)).

    Sign ``i`` is the top bit of ``lowbias32(i XOR lowbias32(seed))``: exact integer arithmetic,
    so the same vector on every device, computed on ``device`` itself (on a GPU by one Triton
    launch, ``adahop_kernels.signs``: no host-side draw or copy in a training step). ``n``: an int
    >= 0; ``dtype``: float32, bfloat16, float16 or float64 (what :func:`adahop.checks.check_signs`
    takes). A seed or ``n`` that is not an int raises TypeError, one out of range ValueError.
    Equivalent to ``1 - 2 * (lowbias32(arange(n) ^ lowbias32(seed ^ seed >> 32)) >> 31)``.
    """
    check_int(n, "n")
    check_int(seed, "seed", 0, SIGNS_SEED_LIMIT)
    if dtype not in SIGNS_DTYPES:
        raise ValueError(f"dtype must be one of {SIGNS_DTYPES} (signs are a floating ±1 vector), got {dtype}")
    mix = _lowbias32((seed ^ (seed >> 32)) & _MASK32)
    if torch.device(device or "cpu").type == "cuda":
        from adahop_kernels.signs import random_signs as kernel  # the same values in one launch

        return kernel(n, mix, torch.device(device), dtype)
    return (1 - 2 * (_index_hash(n, mix, device) >> 31)).to(dtype)


def block_hadamard_ref(
    x: torch.Tensor,
    block_size: int = DEFAULT_HADAMARD_SIZE,
    signs: torch.Tensor | None = None,
) -> torch.Tensor:
    """Transform ``x (..., K)`` blockwise along the last dimension, in fp64, returning fp64.

    x: a floating tensor of at least one dimension. ``signs``: ``None`` or ``(K,)`` of exact ±1,
    floating, on x's device (:func:`adahop.checks.check_signs`), flips signs before the transform.
    ``K`` must be a multiple of ``block_size``. Equivalent to ``(x * signs).reshape(..., K // b, b) @ H_b``.
    """
    _check_block_size(block_size)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point or x.dim() < 1:
        raise ValueError(f"x must be a floating tensor of at least one dimension, got {x.dtype} of shape {tuple(x.shape)}")
    k = x.shape[-1]
    if k % block_size:
        raise ValueError(f"last dimension {k} is not a multiple of the Hadamard block size {block_size}")
    check_signs(signs, k, x.device)
    xd = x.double()
    if signs is not None:
        # A flip where signs < 0, as the kernel's sign-bit flip: for ±1 the product x * signs.
        xd = torch.where(signs < 0, -xd, xd)
    h = hadamard_matrix(block_size, torch.float64, x.device)
    return (xd.reshape(*x.shape[:-1], k // block_size, block_size) @ h).reshape(x.shape)
