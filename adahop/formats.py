"""MXFP4 (OCP Microscaling v1.0) reference: E8M0 scales, E2M1 elements, packing.

This module is the oracle for every kernel in ``kernels/`` and the CPU path. It works in
fp32 (exact for every decision it makes: scale selection is bit arithmetic, the scaled values
are exact power-of-two multiples, and the E2M1 decision thresholds are exact in fp32).

Layout (the single convention of the suite): an :class:`MXFP4Tensor` is always quantized along
its **last** dimension, in blocks of 32 consecutive values. That is exactly a GEMM operand's
layout (A as M×K, Bᵀ as N×K, blocks along K). Quantizing "along the first dimension" means
quantizing the transpose, and the result's logical shape is the transposed one.

Decisions (each tested bit-exactly in ``tests/test_formats.py``):

* Scale: ``e = floor(log2(amax)) - 2`` (E2M1's largest exponent is 2), stored as E8M0
  ``e + 127``. ``floor(log2)`` is read from the fp32 exponent field, so a subnormal or zero
  ``amax`` clamps to the smallest scale, byte 0 (2^-127). Finite fp32 inputs never need a
  byte above 252, so no clamping happens at the top.
* All-zero block: scale byte 0, codes 0 (a consequence of the rule above, not a special case).
* NaN/Inf: a block holding any NaN or ±Inf gets the E8M0 NaN scale 0xFF, codes 0, and
  dequantizes to all-NaN, as the spec prescribes (E2M1 has no NaN/Inf). ``nan_policy="raise"``
  raises instead.
* Round to nearest, ties to even (the even E2M1 code), saturating at ±6.
* Stochastic rounding: unbiased between the two neighbouring grid points. Saturation would bias
  it, so a block whose scaled amax exceeds 6 takes the next scale up (``e + 1``). This keeps
  E[q] = x exactly and stays inside the format, where the common 3/4 pre-scale would need a
  correction after the GEMM.
* Sign: -0.0 and values that round to zero are stored as code 0 (positive zero).
* Packing: element ``2i`` in the low nibble of byte ``i``, element ``2i+1`` in the high nibble.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

BLOCK_SIZE = 32
E8M0_BIAS = 127
E8M0_NAN = 0xFF
E2M1_MAX = 6.0
E2M1_EMAX = 2
# Magnitudes of E2M1 codes 0..7 (the code's low three bits index this table).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Midpoints between neighbouring magnitudes; a tie at midpoint i goes to the even index.
E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)

Rounding = Literal["rne", "sr"]
NanPolicy = Literal["propagate", "raise"]
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class MXFP4Tensor:
    """A tensor quantized to MXFP4 along its last dimension (immutable: a new encoding is a new value).

    codes:  uint8 ``(..., K // 2)``, two E2M1 codes per byte (low nibble first).
    scales: uint8 ``(..., K // 32)``, E8M0 biased exponents (0xFF = NaN).
    fp8, fp8_scale: optional exact FP8 E4M3 re-encoding ``(..., K)`` with fp32 row scales
        ``(..., 1)`` (see :func:`to_fp8_rowwise_ref`), emitted by the fused kernels for
        Hopper's FP8 tensor cores.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    fp8: torch.Tensor | None = None
    fp8_scale: torch.Tensor | None = None

    @property
    def shape(self) -> torch.Size:
        return torch.Size((*self.codes.shape[:-1], self.codes.shape[-1] * 2))

    @property
    def device(self) -> torch.device:
        return self.codes.device

    def nbytes(self) -> int:
        """Bytes of the MXFP4 payload (codes + scales): 4.25 bits per value."""
        return self.codes.numel() * self.codes.element_size() + self.scales.numel()

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize_mxfp4_ref(self, dtype)


def check_quantize_input(x: torch.Tensor, name: str = "x", block_size: int = BLOCK_SIZE) -> None:
    """Raise a ValueError naming what is wrong with a tensor about to be quantized."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be float32, bfloat16 or float16, got {x.dtype}")
    if x.dim() < 1:
        raise ValueError(f"{name} must have at least one dimension, got a scalar")
    if x.shape[-1] % block_size != 0:
        unit = f"MX block size {block_size}" if block_size == BLOCK_SIZE else f"Hadamard block size {block_size}"
        raise ValueError(
            f"{name}: the quantized (last) dimension is {x.shape[-1]}, not a multiple of the "
            f"{unit}; pad it or keep this layer in BF16"
        )


def _check_nan_policy(x: torch.Tensor, nan_policy: NanPolicy, name: str) -> None:
    if nan_policy not in ("propagate", "raise"):
        raise ValueError(f"nan_policy must be 'propagate' or 'raise', got {nan_policy!r}")
    if nan_policy == "raise" and not torch.isfinite(x).all():
        raise ValueError(f"{name} holds NaN or Inf values and nan_policy='raise'")


def shared_exponent_ref(amax: torch.Tensor) -> torch.Tensor:
    """E8M0 biased scale byte (int32) for fp32 block maxima: ``clamp(floor(log2 amax) - 2)``.

    Equivalent to ``floor(log2(amax)) - 2 + 127`` for normal ``amax``; 0 for zero/subnormal.
    """
    if not isinstance(amax, torch.Tensor) or not amax.dtype.is_floating_point:
        raise ValueError(f"amax must be a floating tensor, got {getattr(amax, 'dtype', type(amax).__name__)}")
    biased = (amax.float().view(torch.int32) >> 23) & 0xFF
    return (biased - E2M1_EMAX).clamp(0, 254)


def _round_e2m1_rne(mag: torch.Tensor) -> torch.Tensor:
    """Index 0..7 of the nearest E2M1 magnitude, ties to the even index, saturating."""
    idx = torch.zeros_like(mag, dtype=torch.int32)
    for i, t in enumerate(E2M1_MIDPOINTS):
        idx += (mag > t) if i % 2 == 0 else (mag >= t)
    return idx


def _round_e2m1_sr(mag: torch.Tensor, rand: torch.Tensor) -> torch.Tensor:
    """Index of an E2M1 magnitude drawn so that E[value] = mag (mag must be <= 6)."""
    values = torch.tensor(E2M1_VALUES, device=mag.device)
    lo = torch.searchsorted(values, mag.contiguous(), right=True) - 1
    lo = lo.clamp(0, 6)
    lo_val, hi_val = values[lo], values[lo + 1]
    p_up = (mag - lo_val) / (hi_val - lo_val)
    return (lo + (rand < p_up).int()).to(torch.int32)


def quantize_mxfp4_ref(
    x: torch.Tensor,
    rounding: Rounding = "rne",
    generator: torch.Generator | None = None,
    nan_policy: NanPolicy = "propagate",
) -> MXFP4Tensor:
    """Quantize ``x (..., K)`` to MXFP4 along the last dimension (K a multiple of 32).

    Equivalent to: per block of 32, ``s = 2**(floor(log2 amax) - 2)``, ``codes = e2m1(x / s)``.
    """
    check_quantize_input(x)
    _check_nan_policy(x, nan_policy, "x")
    if rounding not in ("rne", "sr"):
        raise ValueError(f"rounding must be 'rne' or 'sr', got {rounding!r}")
    lead, k = x.shape[:-1], x.shape[-1]
    blocks = x.float().reshape(*lead, k // BLOCK_SIZE, BLOCK_SIZE)
    bad = ~torch.isfinite(blocks).all(dim=-1)
    blocks = torch.where(bad.unsqueeze(-1), torch.zeros_like(blocks), blocks)
    amax = blocks.abs().amax(dim=-1)
    scale = shared_exponent_ref(amax)
    if rounding == "sr":
        # Bump the scale where the scaled amax would exceed 6, so nothing saturates.
        over = amax * torch.exp2(-(scale - E8M0_BIAS).float()) > E2M1_MAX
        scale = scale + over.int()
    scaled = blocks * torch.exp2(-(scale - E8M0_BIAS).float()).unsqueeze(-1)
    mag = scaled.abs()
    if rounding == "rne":
        idx = _round_e2m1_rne(mag)
    else:
        rand = torch.rand(mag.shape, generator=generator, device=mag.device)
        idx = _round_e2m1_sr(mag, rand)
    sign = ((scaled < 0) & (idx > 0)).int() << 3
    codes = (idx | sign).reshape(*lead, k)
    scale = torch.where(bad, torch.full_like(scale, E8M0_NAN), scale)
    codes = torch.where(bad.repeat_interleave(BLOCK_SIZE, dim=-1), torch.zeros_like(codes), codes)
    return MXFP4Tensor(pack_e2m1(codes.to(torch.uint8)), scale.to(torch.uint8))


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """Pack uint8 codes ``(..., K)`` (values 0..15, K even) into ``(..., K // 2)`` bytes.

    Equivalent to ``codes[..., 0::2] | codes[..., 1::2] << 4``; a code above 15 raises ValueError.
    """
    if not isinstance(codes, torch.Tensor):
        raise TypeError(f"codes must be a torch.Tensor, got {type(codes).__name__}")
    if codes.dtype != torch.uint8 or codes.dim() < 1:
        raise ValueError(f"codes must be uint8 of at least one dimension, got {codes.dtype} of shape {tuple(codes.shape)}")
    if codes.device.type != "meta" and codes.numel() and int(codes.max()) > 15:
        raise ValueError(f"codes must be E2M1 codes 0..15, got a {int(codes.max())}")
    if codes.shape[-1] % 2:
        raise ValueError(f"cannot pack an odd number of codes ({codes.shape[-1]})")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_e2m1`: ``(..., K // 2)`` uint8 bytes to ``(..., K)`` codes."""
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8:
        raise ValueError(f"packed must be uint8, got {getattr(packed, 'dtype', type(packed).__name__)}")
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


def e2m1_to_float(codes: torch.Tensor) -> torch.Tensor:
    """Value of each E2M1 code (uint8 0..15) as fp32."""
    if not isinstance(codes, torch.Tensor) or codes.dtype != torch.uint8:
        raise ValueError(f"codes must be uint8, got {getattr(codes, 'dtype', type(codes).__name__)}")
    if codes.device.type != "meta" and codes.numel() and int(codes.max()) > 15:
        raise ValueError(f"codes must be E2M1 codes 0..15, got a {int(codes.max())}")
    return _e2m1_values(codes)


def _e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    # Unchecked: for nibbles unpacked from bytes, always 0..15 (no data-dependent check, which
    # would sync the device and stop torch.compile from tracing the reference GEMM).
    table = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), device=codes.device)
    return table[codes.long()]


def e8m0_to_float(scales: torch.Tensor) -> torch.Tensor:
    """Value of each E8M0 byte as fp32 (0xFF is NaN; byte 0 is 2^-127, a subnormal)."""
    if not isinstance(scales, torch.Tensor) or scales.dtype != torch.uint8:
        raise ValueError(f"scales must be uint8, got {getattr(scales, 'dtype', type(scales).__name__)}")
    exp = scales.to(torch.int32) - E8M0_BIAS
    out = torch.exp2(exp.double()).float()
    return torch.where(scales == E8M0_NAN, torch.full_like(out, float("nan")), out)


def dequantize_mxfp4_ref(t: MXFP4Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Dequantize to ``dtype``. Equivalent to ``e2m1(codes) * 2**(scale - 127)`` per block."""
    from adahop.checks import check_mxfp4_tensor  # adahop.checks imports this module

    check_mxfp4_tensor(t, "t")
    vals = _e2m1_values(unpack_e2m1(t.codes))
    lead, k = vals.shape[:-1], vals.shape[-1]
    scale = e8m0_to_float(t.scales).unsqueeze(-1)
    out = vals.double().reshape(*lead, k // BLOCK_SIZE, BLOCK_SIZE) * scale.double()
    return out.reshape(*lead, k).to(dtype)


# Every E2M1 value times 2^j for j in [-8, 6] is exact in E4M3 (see DESIGN §3).
FP8_EXACT_BINADES = 14
FP8_ROW_OFFSET = 6


def to_fp8_rowwise_ref(t: MXFP4Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Re-encode a 2-D MXFP4 tensor ``(M, K)`` as FP8 E4M3 ``(M, K)`` plus fp32 row scales ``(M, 1)``.

    Each row takes ``R`` = its largest block exponent; element = ``q * 2**(e_block - R + 6)`` in
    E4M3, row scale ``2**(R - 6)``. Exact when a row's block exponents span at most 14 binades;
    beyond that, E4M3 rounding (ties to even, subnormals) loses bits of the small blocks only.
    Equivalent to ``fp8 * scale == dequantize(t)`` under that condition.
    """
    from adahop.checks import check_mxfp4_tensor  # adahop.checks imports this module

    check_mxfp4_tensor(t, "t")
    if t.codes.dim() != 2:
        raise ValueError(f"FP8 re-encoding takes a 2-D MXFP4 tensor, got shape {tuple(t.shape)}")
    exp = t.scales.to(torch.int32) - E8M0_BIAS
    # A NaN block must not set R; it is written as NaN below.
    finite_exp = torch.where(t.scales == E8M0_NAN, torch.full_like(exp, -E8M0_BIAS), exp)
    row_max = finite_exp.amax(dim=-1, keepdim=True)
    rel = (finite_exp - row_max + FP8_ROW_OFFSET).double()
    vals = _e2m1_values(unpack_e2m1(t.codes)).double()
    m, k = vals.shape
    vals = vals.reshape(m, k // BLOCK_SIZE, BLOCK_SIZE) * torch.exp2(rel).unsqueeze(-1)
    nan_blocks = (t.scales == E8M0_NAN).unsqueeze(-1).expand_as(vals)
    vals = torch.where(nan_blocks, torch.full_like(vals, float("nan")), vals)
    fp8 = vals.reshape(m, k).to(torch.float8_e4m3fn)
    scale = torch.exp2((row_max - FP8_ROW_OFFSET).double()).float()
    return fp8, scale


FP8_LAYOUTS = ("row", "seg128", "tile128")
FP8_GROUP = 128  # values a side of an FP8 scale group (cuBLAS blockwise scaling on Hopper)
# The blockwise GEMM's K in whole groups of four scale blocks (adahop.ops.fp8_mm says why).
BLOCKWISE_K = 4 * FP8_GROUP


def check_fp8_layout(layout: str, rows: int, n: int, name: str = "t") -> None:
    """Raise a ValueError unless an FP8 operand ``(rows, n)`` can take ``layout`` (one of FP8_LAYOUTS)."""
    if layout not in FP8_LAYOUTS:
        raise ValueError(f"layout must be one of {FP8_LAYOUTS}, got {layout!r}")
    if layout != "row" and n % FP8_GROUP:
        raise ValueError(f"{name}: layout {layout!r} needs the quantized dimension ({n}) to be a multiple of "
                         f"{FP8_GROUP}; pad it or use layout 'row'")
    if layout == "tile128" and rows % FP8_GROUP:
        raise ValueError(f"{name}: layout 'tile128' needs the rows ({rows}) to be a multiple of {FP8_GROUP}; "
                         "pad them or use layout 'seg128' or 'row'")


def to_fp8_ref(t: MXFP4Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Re-encode a 2-D MXFP4 tensor ``(M, K)`` as FP8 E4M3 ``(M, K)`` plus fp32 scales, per scale group.

    The rowwise encoding of :func:`to_fp8_rowwise_ref` applied to each group of ``layout``: R = the
    group's largest finite block exponent (NaN blocks do not count, and are written as E4M3 NaN;
    -127 for a group without a finite block), element = ``q * 2**(e_block - R + 6)``, group scale
    ``2**(R - 6)``. Layouts and scale tensors (what ``torch._scaled_mm`` takes on Hopper):

    * ``"row"``: one group a row; scale ``(M, 1)`` (= :func:`to_fp8_rowwise_ref`).
    * ``"seg128"``: 1×128 segments along K (A operand); scale ``(M, K/128)`` with strides
      ``(1, M)``, the transpose of a contiguous ``(K/128, M)``. K a multiple of 128.
    * ``"tile128"``: 128×128 tiles (Bᵀ operand, ``(N, K)``); scale ``(M/128, K/128)``
      contiguous (``torch._scaled_mm`` takes its transpose as B's scale). M and K multiples of 128.

    Exact when the block exponents inside each group span at most 14 binades (FP8_EXACT_BINADES):
    ``fp8.float() * scale`` broadcast over its group equals ``dequantize(t)``; beyond that E4M3
    rounding (ties to even, subnormals) loses bits of the group's small blocks only.
    """
    if t.codes.dim() != 2:
        raise ValueError(f"FP8 re-encoding takes a 2-D MXFP4 tensor, got shape {tuple(t.shape)}")
    m, k = t.shape
    check_fp8_layout(layout, m, k)
    if layout == "row":
        return to_fp8_rowwise_ref(t)
    exp = t.scales.to(torch.int32) - E8M0_BIAS
    finite_exp = torch.where(t.scales == E8M0_NAN, torch.full_like(exp, -E8M0_BIAS), exp)
    per_group = FP8_GROUP // BLOCK_SIZE  # blocks of a row in one group
    if layout == "seg128":
        r = finite_exp.reshape(m, k // FP8_GROUP, per_group).amax(-1)
        r_blocks = r.repeat_interleave(per_group, -1)
        # (K/128, M) contiguous, viewed as (M, K/128): the strides (1, M) that _scaled_mm takes for A.
        scale = torch.empty((k // FP8_GROUP, m), dtype=torch.float32, device=t.device).t()
        scale.copy_(torch.exp2((r - FP8_ROW_OFFSET).double()))
    else:
        r = finite_exp.reshape(m // FP8_GROUP, FP8_GROUP, k // FP8_GROUP, per_group).amax((1, 3))
        r_blocks = r.repeat_interleave(FP8_GROUP, 0).repeat_interleave(per_group, 1)
        scale = torch.exp2((r - FP8_ROW_OFFSET).double()).float()
    rel = (finite_exp - r_blocks + FP8_ROW_OFFSET).double()
    vals = _e2m1_values(unpack_e2m1(t.codes)).double().reshape(m, k // BLOCK_SIZE, BLOCK_SIZE)
    vals = vals * torch.exp2(rel).unsqueeze(-1)
    vals = torch.where((t.scales == E8M0_NAN).unsqueeze(-1), torch.full_like(vals, float("nan")), vals)
    return vals.reshape(m, k).to(torch.float8_e4m3fn), scale


def fp8_group_scale(scale: torch.Tensor, layout: str, shape: tuple[int, int]) -> torch.Tensor:
    """The scale of every element of an FP8 operand of ``shape`` (fp32 ``(M, K)``): ``scale`` of
    :func:`to_fp8_ref` broadcast over its groups, so that ``fp8.float() * fp8_group_scale(...)`` is the
    dequantized operand."""
    m, k = shape
    check_fp8_layout(layout, m, k, "shape")
    if layout == "row":
        return scale.expand(m, k)
    if layout == "seg128":
        return scale.repeat_interleave(FP8_GROUP, 1)
    return scale.repeat_interleave(FP8_GROUP, 0).repeat_interleave(FP8_GROUP, 1)
