"""±1 sign vectors from a seed, in one launch: :func:`adahop.hadamard.random_signs` on the GPU.

Sign ``i`` is the top bit of ``lowbias32(i XOR lowbias32(seed))`` in 32-bit unsigned arithmetic,
the reference's integer hash bit for bit; one launch instead of the reference's ~25 elementwise
kernels, which a training step of the random-sign recipes (tseng, quartet-style) asks for four
times per layer. :func:`signs_from_seed` reads the seed from an int64 device tensor (the layer's
per-step draws): no host read, and under ``torch.compile`` one opaque operator instead of the
hash traced, whose code generation doubled tseng's first compiled step on a CPU (kernels/README).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from adahop_kernels._common import INTERPRETED, cdiv, check_device

BLOCK = 1024


@triton.jit
def _lowbias32(x):
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


@triton.jit(do_not_specialize=["mix_lo", "mix_hi"])  # a half equal to 1 would become a constexpr int, with no .to()
def _signs_kernel(out_ptr, n, mix_lo, mix_hi, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mix = (mix_hi.to(tl.uint32) << 16) | mix_lo.to(tl.uint32)  # two 16-bit halves: no int64 argument
    h = _lowbias32(i.to(tl.uint32) ^ mix)
    sign = 1.0 - 2.0 * (h >> 31).to(tl.float32)
    tl.store(out_ptr + i, sign.to(out_ptr.dtype.element_ty), mask=i < n)


@triton.jit
def _seeded_signs_kernel(out_ptr, n, seed_ptr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mix = _lowbias32(tl.load(seed_ptr).to(tl.uint32))  # the seed's low 32 bits, as the reference masks
    h = _lowbias32(i.to(tl.uint32) ^ mix)
    sign = 1.0 - 2.0 * (h >> 31).to(tl.float32)
    tl.store(out_ptr + i, sign.to(out_ptr.dtype.element_ty), mask=i < n)


def signs_from_seed(n: int, seed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The ±1 vector of length ``n`` for the int64 seed tensor ``seed`` (one element), on its device."""
    check_device(seed, "seed")
    out = torch.empty(n, dtype=dtype, device=seed.device)
    if n:
        block = 1 << 16 if INTERPRETED else BLOCK
        _seeded_signs_kernel[(cdiv(n, block),)](out, n, seed, BLOCK=block)
    return out


def random_signs(n: int, mix: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The ±1 vector of length ``n`` for the already-hashed seed ``mix`` (32 bits) on ``device``."""
    out = torch.empty(n, dtype=dtype, device=device)
    check_device(out, "signs")
    if n:
        block = 1 << 16 if INTERPRETED else BLOCK  # the interpreter pays per program
        _signs_kernel[(cdiv(n, block),)](out, n, mix & 0xFFFF, mix >> 16, BLOCK=block)
    return out
