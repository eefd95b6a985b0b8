"""Bad input to the public API, one table: every case on both backends, the same answer from each.

The API: ``adahop.__all__``, and the public functions of ``adahop.ops``, ``adahop.formats`` and
``adahop.hadamard`` (``test_every_public_function_has_a_case`` keeps the table complete). Each case
is a call with one thing wrong (dtype, rank, device, a length that is not a multiple of the block,
strides, emptiness, NaN/Inf, operands that do not match, an unknown name, an option of the wrong
type) and its documented answer: a TypeError/ValueError whose message names the argument and the
problem, or a documented result (``nan_policy="propagate"``: a NaN block; empty in, empty out).

Each case runs on the reference backend and on the Triton one (through the interpreter on a CPU,
which tests/conftest.py turns on): passed as ``backend=`` where the function takes one, else set as
``ADAHOP_BACKEND`` (what a layer's ops read). Both must give the documented answer, and the same
one: the same exception and message, or equal results. A 'meta' tensor stands in for a tensor on
another device.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Callable

import pytest
import torch
from torch import nn

import adahop
from adahop import formats, hadamard, ops
from adahop.formats import MXFP4Tensor
from adahop.policy import Strategy

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
DEVICE = "cuda" if ON_GPU else "cpu"
BACKENDS = ("reference", "triton")
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny ops, one thread


# ----------------------------------------------------------------------------- inputs


def x(rows: int = 64, cols: int = 64, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g).to(dtype=dtype, device=DEVICE)


def poisoned(value: float, rows: int = 64, cols: int = 64) -> torch.Tensor:
    t = x(rows, cols)
    t[3, 5] = value
    return t


def q(t: torch.Tensor | None = None) -> MXFP4Tensor:
    return ops.hadamard_quantize(x() if t is None else t, hadamard=False, backend="reference")


def mx(codes: torch.Tensor, scales: torch.Tensor) -> MXFP4Tensor:
    return MXFP4Tensor(codes.to(DEVICE) if codes.device.type != "meta" else codes,
                       scales.to(DEVICE) if scales.device.type != "meta" else scales)


def u8(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.uint8, device=DEVICE)


def ones(n: int, dtype: torch.dtype = torch.float32, device: str = DEVICE) -> torch.Tensor:
    return torch.ones(n, dtype=dtype, device=device)


def linear(recipe: str = "mxfp4") -> nn.Module:
    torch.manual_seed(0)
    return adahop.convert(nn.Sequential(nn.Linear(64, 64)).to(DEVICE), recipe)


def forward(layer: nn.Module, inp: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return layer(inp)


def model_of(recipe: str) -> nn.Module:
    torch.manual_seed(0)
    return adahop.convert(nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64)), recipe)


# ----------------------------------------------------------------------------- documented results


def nan_block_only(t: MXFP4Tensor) -> bool:
    """The block holding x[3, 5] is NaN (scale byte 0xFF, codes 0); every other block is finite."""
    nan_scale = t.scales.cpu() == formats.E8M0_NAN
    want = torch.zeros_like(nan_scale)
    want[3, 0] = True
    return torch.equal(nan_scale, want) and int(t.codes.cpu()[3, :16].max()) == 0


def nan_row_only(y: torch.Tensor, row: int = 3) -> bool:
    bad = ~torch.isfinite(y.cpu())
    return bool(bad[row].all()) and not bool(bad[torch.arange(y.shape[0]) != row].any())


def shaped(*shape: int) -> Callable[[Any], bool]:
    def check(out) -> bool:
        if isinstance(out, MXFP4Tensor):
            return (tuple(out.codes.shape), tuple(out.scales.shape)) == shape
        return tuple(out.shape) == shape[0]

    return check


def equals(expected: Callable[[], Any]) -> Callable[[Any], bool]:
    return lambda out: same(out, expected())


def same(a: Any, b: Any, exact: bool = True) -> bool:
    """Equal values: tensors element for element (NaN equal to NaN; fp32 rounding apart unless
    ``exact``), MXFP4 tensors field by field, sequences item by item."""
    if isinstance(a, MXFP4Tensor) and isinstance(b, MXFP4Tensor):
        return all(same(getattr(a, f), getattr(b, f), exact) for f in ("codes", "scales", "fp8", "fp8_scale"))
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        a, b = a.cpu(), b.cpu()
        if not a.dtype.is_floating_point:
            return torch.equal(a, b)
        a, b = a.double(), b.double()
        return torch.allclose(a, b, rtol=0 if exact else 1e-5, atol=0, equal_nan=True)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(same(i, j, exact) for i, j in zip(a, b))
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


# ----------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Case:
    """One bad input: ``call(backend)`` must raise ``error`` matching ``match`` (a regex), or return a
    result for which ``check`` holds. ``api``: the function under test, as ``module.name``."""

    id: str
    api: str
    call: Callable[[str | None], Any]
    error: type[Exception] | None = None
    match: str | None = None
    check: Callable[[Any], bool] | None = None
    exact: bool = True  # results of both backends bit for bit (False: to fp32 rounding, other sum orders)
    gap: str | None = None  # why the code answers otherwise today (the case is an expected failure until fixed)


def raises(id: str, api: str, call, error: type[Exception], match: str) -> Case:
    return Case(id, api, call, error=error, match=match)


def gives(id: str, api: str, call, check: Callable[[Any], bool], exact: bool = True) -> Case:
    return Case(id, api, call, check=check, exact=exact)


HQ, DUAL, HQREF = "ops.hadamard_quantize", "ops.hadamard_quantize_dual", "ops.hadamard_quantize_ref"
NOT_FLOAT = r"x must be float32, bfloat16 or float16, got torch"
PM1 = r"signs must hold only \+1 and -1"


def not_pm1(id: str, api: str, call, unflipped: Callable[[], Any], name: str = "signs") -> Case:
    """Signs that are not ±1 (none negative here): refused, except on CUDA, where reading them would
    cost a device sync; there both backends flip where signs < 0, so the result is ``unflipped()``."""
    if DEVICE == "cuda":
        return gives(id, api, call, equals(unflipped))
    return raises(id, api, call, ValueError, PM1.replace("signs", name, 1))

CASES = [
    # -- ops.hadamard_quantize: dtype, rank, block multiples, strides, emptiness, NaN/Inf, options
    raises("hq-int32", HQ, lambda b: ops.hadamard_quantize(x(dtype=torch.int32), backend=b), ValueError, NOT_FLOAT),
    raises("hq-float64", HQ, lambda b: ops.hadamard_quantize(x(dtype=torch.float64), backend=b), ValueError, NOT_FLOAT),
    raises("hq-not-a-tensor", HQ, lambda b: ops.hadamard_quantize([[1.0] * 32], backend=b), TypeError,
           "x must be a torch.Tensor, got list"),
    raises("hq-rank-1", HQ, lambda b: ops.hadamard_quantize(x()[0], backend=b), ValueError, r"x must be 2-D .* \(64,\)"),
    raises("hq-rank-3", HQ, lambda b: ops.hadamard_quantize(x().reshape(2, 32, 64), backend=b), ValueError,
           "x must be 2-D"),
    raises("hq-K-not-a-multiple-of-32", HQ, lambda b: ops.hadamard_quantize(x(64, 48), hadamard=False, backend=b),
           ValueError, "dimension is 48, not a multiple of the MX block size 32"),
    raises("hq-K-not-a-multiple-of-the-hadamard-size", HQ,
           lambda b: ops.hadamard_quantize(x(64, 96), hadamard_size=64, backend=b), ValueError,
           "dimension is 96, not a multiple of the Hadamard block size 64"),
    raises("hq-transposed-M-not-a-multiple-of-32", HQ, lambda b: ops.hadamard_quantize(x(48, 64), transpose=True, backend=b),
           ValueError, r"x\.T: the quantized \(last\) dimension is 48"),
    gives("hq-non-contiguous", HQ, lambda b: ops.hadamard_quantize(x(64, 128)[:, ::2], backend=b),
          equals(lambda: ops.hadamard_quantize(x(64, 128)[:, ::2].contiguous(), backend="reference"))),
    gives("hq-transposed-view", HQ, lambda b: ops.hadamard_quantize(x().t(), backend=b),
          equals(lambda: ops.hadamard_quantize(x().t().contiguous(), backend="reference"))),
    gives("hq-no-rows", HQ, lambda b: ops.hadamard_quantize(x(0, 64), backend=b), shaped((0, 32), (0, 2))),
    gives("hq-no-columns", HQ, lambda b: ops.hadamard_quantize(x(64, 0), backend=b), shaped((64, 0), (64, 0))),
    gives("hq-nan-propagates-to-its-block", HQ,
          lambda b: ops.hadamard_quantize(poisoned(math.nan), hadamard=False, backend=b), nan_block_only),
    gives("hq-inf-propagates-to-its-block", HQ,
          lambda b: ops.hadamard_quantize(poisoned(math.inf), hadamard=False, backend=b), nan_block_only),
    gives("hq-nan-through-the-transform", HQ, lambda b: ops.hadamard_quantize(poisoned(math.nan), backend=b),
          nan_block_only),
    raises("hq-nan-raise", HQ, lambda b: ops.hadamard_quantize(poisoned(math.nan), nan_policy="raise", backend=b),
           ValueError, "x holds NaN or Inf values and nan_policy='raise'"),
    raises("hq-inf-raise", HQ, lambda b: ops.hadamard_quantize(poisoned(-math.inf), nan_policy="raise", backend=b),
           ValueError, "x holds NaN or Inf values and nan_policy='raise'"),
    raises("hq-unknown-nan-policy", HQ, lambda b: ops.hadamard_quantize(x(), nan_policy="ignore", backend=b),
           ValueError, "nan_policy must be 'propagate' or 'raise', got 'ignore'"),
    raises("hq-unknown-rounding", HQ, lambda b: ops.hadamard_quantize(x(), rounding="floor", backend=b), ValueError,
           "rounding must be 'rne' or 'sr', got 'floor'"),
    raises("hq-hadamard-size-24", HQ, lambda b: ops.hadamard_quantize(x(64, 96), hadamard_size=24, backend=b),
           ValueError, r"hadamard_size must be one of \(16, 32, 64, 128\), got 24"),
    raises("hq-hadamard-size-256", HQ, lambda b: ops.hadamard_quantize(x(64, 256), hadamard_size=256, backend=b),
           ValueError, r"hadamard_size must be one of \(16, 32, 64, 128\), got 256"),
    raises("hq-hadamard-size-float", HQ, lambda b: ops.hadamard_quantize(x(), hadamard_size=32.0, backend=b),
           TypeError, "hadamard_size must be an int, got float"),
    raises("hq-seed-negative", HQ, lambda b: ops.hadamard_quantize(x(), rounding="sr", seed=-1, backend=b),
           ValueError, r"seed must be an int \[0, 2\*\*62\), got -1"),
    raises("hq-seed-2**62", HQ, lambda b: ops.hadamard_quantize(x(), rounding="sr", seed=1 << 62, backend=b),
           ValueError, r"seed must be an int \[0, 2\*\*62\)"),
    raises("hq-seed-float", HQ, lambda b: ops.hadamard_quantize(x(), rounding="sr", seed=1.0, backend=b), TypeError,
           "seed must be an int, got float"),
    raises("hq-seed-negative-under-rne", HQ, lambda b: ops.hadamard_quantize(x(), seed=-1, backend=b), ValueError,
           r"seed must be an int \[0, 2\*\*62\), got -1"),
    raises("hq-flag-not-a-bool", HQ, lambda b: ops.hadamard_quantize(x(), hadamard="no", backend=b), TypeError,
           "hadamard must be a bool, got str"),
    raises("hq-signs-int", HQ, lambda b: ops.hadamard_quantize(x(), signs=ones(64, torch.int32), backend=b), ValueError,
           "signs must be a floating ±1 vector"),
    not_pm1("hq-signs-two", HQ, lambda b: ops.hadamard_quantize(x(), signs=2 * ones(64), backend=b),
            lambda: ops.hadamard_quantize(x(), backend="reference")),
    not_pm1("hq-signs-zero", HQ, lambda b: ops.hadamard_quantize(x(), signs=0 * ones(64), backend=b),
            lambda: ops.hadamard_quantize(x(), backend="reference")),
    raises("hq-signs-wrong-length", HQ, lambda b: ops.hadamard_quantize(x(), signs=ones(32), backend=b), ValueError,
           r"signs must have shape \(64,\)"),
    raises("hq-signs-other-device", HQ, lambda b: ops.hadamard_quantize(x(), signs=ones(64, device="meta"), backend=b),
           ValueError, f"signs are on meta but the input is on {DEVICE}"),
    raises("hq-signs-without-transform", HQ, lambda b: ops.hadamard_quantize(x(), hadamard=False, signs=ones(64), backend=b),
           ValueError, "signs flip the input of the Hadamard transform"),
    raises("hq-signs-not-a-tensor", HQ, lambda b: ops.hadamard_quantize(x(), signs=[1.0] * 64, backend=b), TypeError,
           "signs must be a torch.Tensor or None, got list"),
    raises("hq-unknown-backend", HQ, lambda b: ops.hadamard_quantize(x(), backend="cuda-fast"), ValueError,
           "unknown backend 'cuda-fast'"),
    # -- ops.hadamard_quantize_dual
    raises("dual-M-not-a-multiple-of-32", DUAL, lambda b: ops.hadamard_quantize_dual(x(48, 64), backend=b), ValueError,
           r"x\.T: the quantized \(last\) dimension is 48"),
    raises("dual-int32", DUAL, lambda b: ops.hadamard_quantize_dual(x(dtype=torch.int32), backend=b), ValueError, NOT_FLOAT),
    raises("dual-signs_t-wrong-length", DUAL, lambda b: ops.hadamard_quantize_dual(x(32, 64), signs_t=ones(64), backend=b),
           ValueError, r"signs_t must have shape \(32,\)"),
    not_pm1("dual-signs_t-half", DUAL, lambda b: ops.hadamard_quantize_dual(x(), signs_t=0.5 * ones(64), backend=b),
            lambda: ops.hadamard_quantize_dual(x(), backend="reference"), "signs_t"),
    raises("dual-flag-not-a-bool", DUAL, lambda b: ops.hadamard_quantize_dual(x(), emit_fp8_t=1, backend=b), TypeError,
           "emit_fp8_t must be a bool, got int"),
    gives("dual-nan-propagates-to-its-block", DUAL,
          lambda b: ops.hadamard_quantize_dual(poisoned(math.nan), hadamard=False, hadamard_t=False, backend=b)[0],
          nan_block_only),
    # -- ops.hadamard_quantize_ref (the reference alone: the same contract)
    raises("hqref-signs-int", HQREF, lambda b: ops.hadamard_quantize_ref(x(), signs=ones(64, torch.int64)), ValueError,
           "signs must be a floating ±1 vector"),
    not_pm1("hqref-signs-two", HQREF, lambda b: ops.hadamard_quantize_ref(x(), signs=2 * ones(64)),
            lambda: ops.hadamard_quantize_ref(x())),
    raises("hqref-seed-negative", HQREF, lambda b: ops.hadamard_quantize_ref(x(), rounding="sr", seed=-5), ValueError,
           r"seed must be an int \[0, 2\*\*62\)"),
    raises("hqref-hadamard-size-8", HQREF, lambda b: ops.hadamard_quantize_ref(x(), hadamard_size=8), ValueError,
           "hadamard_size must be one of"),
    # -- ops.dequantize
    raises("deq-not-mxfp4", "ops.dequantize", lambda b: ops.dequantize(x(), backend=b), TypeError,
           "t must be an MXFP4Tensor, got Tensor"),
    raises("deq-codes-int32", "ops.dequantize", lambda b: ops.dequantize(mx(u8(64, 32).int(), u8(64, 2)), backend=b),
           ValueError, "t.codes must be uint8, got torch.int32"),
    raises("deq-scales-float", "ops.dequantize", lambda b: ops.dequantize(mx(u8(64, 32), u8(64, 2).float()), backend=b),
           ValueError, "t.scales must be uint8, got torch.float32"),
    raises("deq-scales-wrong-shape", "ops.dequantize", lambda b: ops.dequantize(mx(u8(64, 32), u8(64, 3)), backend=b),
           ValueError, r"codes \(64, 32\) and scales \(64, 3\) do not describe one MXFP4 tensor"),
    raises("deq-scales-other-rows", "ops.dequantize", lambda b: ops.dequantize(mx(u8(64, 32), u8(32, 2)), backend=b),
           ValueError, "do not describe one MXFP4 tensor"),
    raises("deq-codes-scalar", "ops.dequantize", lambda b: ops.dequantize(mx(u8(), u8(1)), backend=b), ValueError,
           "do not describe one MXFP4 tensor"),
    raises("deq-dtype-int", "ops.dequantize", lambda b: ops.dequantize(q(), torch.int32, backend=b), ValueError,
           "dtype must be float32, bfloat16, float16 or float64, got torch.int32"),
    raises("deq-non-contiguous", "ops.dequantize", lambda b: ops.dequantize(mx(u8(32, 64).t(), u8(64, 2)), backend=b),
           ValueError, "t: codes and scales must be contiguous"),
    raises("deq-scales-other-device", "ops.dequantize",
           lambda b: ops.dequantize(mx(u8(64, 32), u8(64, 2, ).to("meta")), backend=b), ValueError,
           f"t: codes are on {DEVICE}(:0)? but scales on meta"),
    gives("deq-nan-scale-is-a-nan-block", "ops.dequantize",
          lambda b: ops.dequantize(q(poisoned(math.nan)), torch.float32, backend=b),
          lambda y: bool(y[3, :32].isnan().all()) and int(y.isnan().sum()) == 32),
    gives("deq-no-rows", "ops.dequantize", lambda b: ops.dequantize(mx(u8(0, 16), u8(0, 1)), backend=b),
          shaped((0, 32))),
    gives("deq-three-dims", "ops.dequantize", lambda b: ops.dequantize(mx(u8(2, 3, 16), u8(2, 3, 1)), backend=b),
          shaped((2, 3, 32))),
    gives("deq-float64", "ops.dequantize", lambda b: ops.dequantize(q(), torch.float64, backend=b),
          equals(lambda: formats.dequantize_mxfp4_ref(q(), torch.float64))),
    # -- ops.select_outliers, extract_outliers(_ref)
    raises("rank-2d", "ops.rank_outliers", lambda b: ops.rank_outliers(x(), 1), ValueError,
           r"amax must be a 1-D float tensor, got shape \(64, 64\)"),
    raises("rank-int", "ops.rank_outliers", lambda b: ops.rank_outliers(torch.arange(4), 1), ValueError,
           "amax must be a 1-D float tensor, got shape .4,. and dtype torch.int64"),
    raises("rank-list", "ops.rank_outliers", lambda b: ops.rank_outliers([1.0, 2.0], 1), TypeError,
           "amax must be a torch.Tensor, got list"),
    raises("rank-k-too-large", "ops.rank_outliers", lambda b: ops.rank_outliers(x()[0], 65), ValueError,
           "k=65 outlier rows requested from a tensor with 64 rows"),
    raises("sel-k-too-large", "ops.select_outliers", lambda b: ops.select_outliers(x(), 65), ValueError,
           "k=65 outlier rows requested from a tensor with 64 rows"),
    raises("sel-k-float", "ops.select_outliers", lambda b: ops.select_outliers(x(), 2.0), TypeError,
           "k must be an int, got float"),
    raises("sel-rank-1", "ops.select_outliers", lambda b: ops.select_outliers(x()[0], 1), ValueError, "x must be 2-D"),
    raises("ext-k-negative", "ops.extract_outliers", lambda b: ops.extract_outliers(x(), -1, backend=b), ValueError,
           "k=-1 outlier rows requested"),
    raises("ext-k-bool", "ops.extract_outliers", lambda b: ops.extract_outliers(x(), True, backend=b), TypeError,
           "k must be an int, got bool"),
    raises("ext-int32", "ops.extract_outliers", lambda b: ops.extract_outliers(x(dtype=torch.int32), 2, backend=b),
           ValueError, NOT_FLOAT),
    raises("ext-rank-3", "ops.extract_outliers", lambda b: ops.extract_outliers(x().reshape(2, 32, 64), 2, backend=b),
           ValueError, "x must be 2-D"),
    raises("ext-empty-rows", "ops.extract_outliers", lambda b: ops.extract_outliers(x(8, 0), 2, backend=b), ValueError,
           r"x of shape \(8, 0\) has empty rows"),
    gives("ext-k-zero", "ops.extract_outliers", lambda b: ops.extract_outliers(x(), 0, backend=b),
          lambda out: out[0].shape == (0,) and out[1].shape == (0, 64)),
    gives("ext-nan-row-ranks-first", "ops.extract_outliers", lambda b: ops.extract_outliers(poisoned(math.nan), 1, backend=b),
          lambda out: out[0].tolist() == [3]),
    gives("ext-transposed-view", "ops.extract_outliers", lambda b: ops.extract_outliers(x().t(), 4, backend=b),
          equals(lambda: ops.extract_outliers_ref(x().t().contiguous(), 4))),
    raises("extref-k-float", "ops.extract_outliers_ref", lambda b: ops.extract_outliers_ref(x(), 1.5), TypeError,
           "k must be an int, got float"),
    # -- ops.abs_median(_ref), scaled_mean_squares(_ref)
    raises("med-int32", "ops.abs_median", lambda b: ops.abs_median(x(dtype=torch.int32), backend=b), ValueError, NOT_FLOAT),
    raises("med-rank-3", "ops.abs_median", lambda b: ops.abs_median(x().reshape(2, 32, 64), backend=b), ValueError,
           "x must be 2-D"),
    raises("med-empty-rows", "ops.abs_median", lambda b: ops.abs_median(x(8, 0), backend=b), ValueError,
           r"x of shape \(8, 0\) has empty rows"),
    gives("med-nan-row-is-nan", "ops.abs_median", lambda b: ops.abs_median(poisoned(math.nan), backend=b),
          lambda m: bool(m[3].isnan()) and int(m.isnan().sum()) == 1),
    gives("med-transposed-view", "ops.abs_median", lambda b: ops.abs_median(x().t(), backend=b),
          equals(lambda: ops.abs_median_ref(x().t().contiguous()))),
    gives("med-no-rows", "ops.abs_median", lambda b: ops.abs_median(x(0, 8), backend=b), shaped((0,))),
    raises("medref-float64", "ops.abs_median_ref", lambda b: ops.abs_median_ref(x(dtype=torch.float64)), ValueError,
           NOT_FLOAT),
    raises("sms-one-divisor", "ops.scaled_mean_squares", lambda b: ops.scaled_mean_squares(x(), ones(64), backend=b),
           ValueError, "pass both col_div and row_div, or neither"),
    raises("sms-col_div-wrong-length", "ops.scaled_mean_squares",
           lambda b: ops.scaled_mean_squares(x(), ones(32), ones(64), backend=b), ValueError,
           r"col_div must be fp32 of shape \(64,\)"),
    raises("sms-row_div-float16", "ops.scaled_mean_squares",
           lambda b: ops.scaled_mean_squares(x(), ones(64), ones(64, torch.float16), backend=b), ValueError,
           r"row_div must be fp32 of shape \(64,\) .* got torch.float16"),
    raises("sms-col_div-other-device", "ops.scaled_mean_squares",
           lambda b: ops.scaled_mean_squares(x(), ones(64, device="meta"), ones(64), backend=b), ValueError,
           "col_div must be fp32 .* on meta"),
    raises("sms-empty", "ops.scaled_mean_squares", lambda b: ops.scaled_mean_squares(x(0, 64), backend=b), ValueError,
           "has no entries to average"),
    raises("sms-int32", "ops.scaled_mean_squares", lambda b: ops.scaled_mean_squares(x(dtype=torch.int32), backend=b),
           ValueError, NOT_FLOAT),
    gives("sms-nan-is-counted", "ops.scaled_mean_squares", lambda b: ops.scaled_mean_squares(poisoned(math.nan), backend=b),
          lambda out: int(out[2]) == 1 and bool(out[0][3].isnan()) and int(out[0].isnan().sum()) == 1, exact=False),
    gives("sms-transposed-view", "ops.scaled_mean_squares", lambda b: ops.scaled_mean_squares(x().t(), backend=b),
          lambda out: same(out, ops.scaled_mean_squares_ref(x().t().contiguous()), exact=False), exact=False),
    raises("smsref-one-divisor", "ops.scaled_mean_squares_ref", lambda b: ops.scaled_mean_squares_ref(x(), None, ones(64)),
           ValueError, "pass both col_div and row_div, or neither"),
    # -- ops.mxfp4_mm(_ref), to_fp8_rowwise, gemm_path (the dequant-matmul path runs the backend's dequantize)
    raises("mm-K-differs", "ops.mxfp4_mm", lambda b: ops.mxfp4_mm(q(x(4, 64)), q(x(4, 32)), path="dequant-matmul", backend=b),
           ValueError, "inner dimensions differ"),
    raises("mm-b-other-device", "ops.mxfp4_mm",
           lambda b: ops.mxfp4_mm(q(), mx(u8(64, 32).to("meta"), u8(64, 2).to("meta")), backend=b), ValueError,
           f"a is on {DEVICE}(:0)? but b is on meta"),
    raises("mm-out-dtype-int", "ops.mxfp4_mm", lambda b: ops.mxfp4_mm(q(), q(), torch.int32, backend=b), ValueError,
           "out_dtype must be one of"),
    raises("mm-not-mxfp4", "ops.mxfp4_mm", lambda b: ops.mxfp4_mm(x(), q(), backend=b), TypeError,
           "a must be an MXFP4Tensor, got Tensor"),
    raises("mm-three-dims", "ops.mxfp4_mm", lambda b: ops.mxfp4_mm(q(), mx(u8(2, 4, 32), u8(2, 4, 2)), backend=b),
           ValueError, "b must be a 2-D MXFP4 tensor"),
    raises("mm-scales-wrong-shape", "ops.mxfp4_mm", lambda b: ops.mxfp4_mm(q(), mx(u8(64, 32), u8(64, 1)), backend=b),
           ValueError, r"b: scales of shape \(64, 1\) do not match"),
    raises("mm-unknown-path", "ops.mxfp4_mm", lambda b: ops.mxfp4_mm(q(), q(), path="fastest", backend=b), ValueError,
           "'fastest' is not a valid GemmPath"),
    gives("mm-nan-block-is-a-nan-row", "ops.mxfp4_mm",
          lambda b: ops.mxfp4_mm(q(poisoned(math.nan)), q(x(32, 64)), torch.float32, path="dequant-matmul", backend=b),
          nan_row_only, exact=False),
    gives("mm-no-rows", "ops.mxfp4_mm", lambda b: ops.mxfp4_mm(q(x(0, 64)), q(x(32, 64)), path="dequant-matmul", backend=b),
          shaped((0, 32))),
    raises("mmref-K-differs", "ops.mxfp4_mm_ref", lambda b: ops.mxfp4_mm_ref(q(x(4, 64)), q(x(4, 32))), ValueError,
           "inner dimensions differ"),
    raises("fp8-three-dims", "ops.to_fp8_rowwise", lambda b: ops.to_fp8_rowwise(mx(u8(2, 4, 32), u8(2, 4, 2)), backend=b),
           ValueError, "t must be a 2-D MXFP4 tensor"),
    raises("fp8-not-mxfp4", "ops.to_fp8_rowwise", lambda b: ops.to_fp8_rowwise(x(), backend=b), TypeError,
           "t must be an MXFP4Tensor"),
    raises("fp8-codes-int32", "ops.to_fp8_rowwise", lambda b: ops.to_fp8_rowwise(mx(u8(64, 32).int(), u8(64, 2)), backend=b),
           ValueError, "codes and scales must be uint8"),
    gives("fp8-nan-block", "ops.to_fp8_rowwise", lambda b: ops.to_fp8_rowwise(q(poisoned(math.nan)), backend=b),
          lambda out: bool(out[0][3, :32].float().isnan().all()) and int(out[0].float().isnan().sum()) == 32),
    raises("gemm-path-unknown-backend", "ops.gemm_path", lambda b: ops.gemm_path(DEVICE, backend="fast"), ValueError,
           "unknown backend 'fast'"),
    gives("gemm-path-meta-device", "ops.gemm_path", lambda b: ops.gemm_path("meta", backend=b),
          lambda path: path is ops.GemmPath.REFERENCE),
    # -- adahop.formats
    raises("fmt-check-float64", "formats.check_quantize_input", lambda b: formats.check_quantize_input(x(dtype=torch.float64)),
           ValueError, NOT_FLOAT),
    raises("fmt-check-scalar", "formats.check_quantize_input", lambda b: formats.check_quantize_input(x()[0, 0]),
           ValueError, "x must have at least one dimension, got a scalar"),
    raises("fmt-quantize-K-48", "formats.quantize_mxfp4_ref", lambda b: formats.quantize_mxfp4_ref(x(4, 48)), ValueError,
           "dimension is 48, not a multiple of the MX block size 32"),
    raises("fmt-quantize-int8", "formats.quantize_mxfp4_ref", lambda b: formats.quantize_mxfp4_ref(x(dtype=torch.int8)),
           ValueError, NOT_FLOAT),
    raises("fmt-quantize-unknown-rounding", "formats.quantize_mxfp4_ref",
           lambda b: formats.quantize_mxfp4_ref(x(), "stochastic"), ValueError, "rounding must be 'rne' or 'sr'"),
    raises("fmt-quantize-nan-raise", "formats.quantize_mxfp4_ref",
           lambda b: formats.quantize_mxfp4_ref(poisoned(math.nan), nan_policy="raise"), ValueError,
           "x holds NaN or Inf values and nan_policy='raise'"),
    gives("fmt-quantize-nan-propagates", "formats.quantize_mxfp4_ref",
          lambda b: formats.quantize_mxfp4_ref(poisoned(math.nan)), nan_block_only),
    raises("fmt-pack-code-16", "formats.pack_e2m1", lambda b: formats.pack_e2m1(torch.full((4, 32), 16, dtype=torch.uint8)),
           ValueError, "codes must be E2M1 codes 0..15, got a 16"),
    raises("fmt-pack-int32", "formats.pack_e2m1", lambda b: formats.pack_e2m1(torch.zeros(4, 32, dtype=torch.int32)),
           ValueError, "codes must be uint8"),
    raises("fmt-pack-odd", "formats.pack_e2m1", lambda b: formats.pack_e2m1(torch.zeros(4, 31, dtype=torch.uint8)),
           ValueError, "cannot pack an odd number of codes"),
    raises("fmt-pack-not-a-tensor", "formats.pack_e2m1", lambda b: formats.pack_e2m1([1, 2]), TypeError,
           "codes must be a torch.Tensor"),
    raises("fmt-unpack-int32", "formats.unpack_e2m1", lambda b: formats.unpack_e2m1(torch.zeros(4, 16, dtype=torch.int32)),
           ValueError, "packed must be uint8"),
    raises("fmt-e2m1-code-16", "formats.e2m1_to_float", lambda b: formats.e2m1_to_float(torch.tensor([16], dtype=torch.uint8)),
           ValueError, "codes must be E2M1 codes 0..15"),
    raises("fmt-e2m1-float", "formats.e2m1_to_float", lambda b: formats.e2m1_to_float(torch.ones(4)), ValueError,
           "codes must be uint8"),
    raises("fmt-e8m0-float", "formats.e8m0_to_float", lambda b: formats.e8m0_to_float(torch.ones(4)), ValueError,
           "scales must be uint8"),
    raises("fmt-shared-exponent-int", "formats.shared_exponent_ref",
           lambda b: formats.shared_exponent_ref(torch.ones(4, dtype=torch.int32)), ValueError,
           "amax must be a floating tensor"),
    raises("fmt-dequantize-codes-int32", "formats.dequantize_mxfp4_ref",
           lambda b: formats.dequantize_mxfp4_ref(mx(u8(64, 32).int(), u8(64, 2))), ValueError, "t.codes must be uint8"),
    raises("fmt-dequantize-scales-wrong-shape", "formats.dequantize_mxfp4_ref",
           lambda b: formats.dequantize_mxfp4_ref(mx(u8(64, 32), u8(64, 3))), ValueError,
           "do not describe one MXFP4 tensor"),
    raises("fmt-fp8-three-dims", "formats.to_fp8_rowwise_ref",
           lambda b: formats.to_fp8_rowwise_ref(mx(u8(2, 4, 32), u8(2, 4, 2))), ValueError,
           "FP8 re-encoding takes a 2-D MXFP4 tensor"),
    raises("fmt-fp8-scales-wrong-shape", "formats.to_fp8_rowwise_ref",
           lambda b: formats.to_fp8_rowwise_ref(mx(u8(64, 32), u8(64, 3))), ValueError,
           "do not describe one MXFP4 tensor"),
    # -- adahop.hadamard
    raises("hm-int32", "hadamard.hadamard_matrix", lambda b: hadamard.hadamard_matrix(32, torch.int32), ValueError,
           r"dtype must be a floating dtype \(entries are ±1/sqrt\(32\)\), got torch.int32"),
    raises("hm-block-24", "hadamard.hadamard_matrix", lambda b: hadamard.hadamard_matrix(24), ValueError,
           "Hadamard block size must be a power of two >= 2, got 24"),
    raises("hm-block-float", "hadamard.hadamard_matrix", lambda b: hadamard.hadamard_matrix(32.0), TypeError,
           "Hadamard block size must be an int, got float"),
    raises("hm-dtype-not-a-dtype", "hadamard.hadamard_matrix", lambda b: hadamard.hadamard_matrix(32, "float32"),
           TypeError, "dtype must be a torch.dtype, got str"),
    raises("rs-seed-negative", "hadamard.random_signs", lambda b: hadamard.random_signs(64, -1, DEVICE), ValueError,
           r"seed must be an int \[0, 2\*\*64\), got -1"),
    raises("rs-seed-float", "hadamard.random_signs", lambda b: hadamard.random_signs(64, 0.5, DEVICE), TypeError,
           "seed must be an int, got float"),
    raises("rs-n-float", "hadamard.random_signs", lambda b: hadamard.random_signs(2.5, 0, DEVICE), TypeError,
           "n must be an int, got float"),
    raises("rs-int-dtype", "hadamard.random_signs", lambda b: hadamard.random_signs(64, 0, DEVICE, torch.int8), ValueError,
           "dtype must be one of"),
    raises("bh-signs-int", "hadamard.block_hadamard_ref",
           lambda b: hadamard.block_hadamard_ref(x(), signs=ones(64, torch.int32)), ValueError,
           "signs must be a floating ±1 vector"),
    not_pm1("bh-signs-two", "hadamard.block_hadamard_ref", lambda b: hadamard.block_hadamard_ref(x(), signs=2 * ones(64)),
            lambda: hadamard.block_hadamard_ref(x())),
    raises("bh-signs-other-device", "hadamard.block_hadamard_ref",
           lambda b: hadamard.block_hadamard_ref(x(), signs=ones(64, device="meta")), ValueError,
           f"signs are on meta but the input is on {DEVICE}"),
    raises("bh-int32", "hadamard.block_hadamard_ref", lambda b: hadamard.block_hadamard_ref(x(dtype=torch.int32)),
           ValueError, "x must be a floating tensor"),
    raises("bh-K-48", "hadamard.block_hadamard_ref", lambda b: hadamard.block_hadamard_ref(x(4, 48)), ValueError,
           "last dimension 48 is not a multiple of the Hadamard block size 32"),
    # -- adahop (the model-level API): recipes, layers, conversion, strategy maps
    raises("recipe-unknown", "adahop.get_recipe", lambda b: adahop.get_recipe("adahop2"), ValueError,
           "unknown recipe 'adahop2'; registered:"),
    raises("recipe-unknown-override", "adahop.get_recipe", lambda b: adahop.get_recipe("adahop", outlier_kk=3), TypeError,
           r"unknown recipe overrides \['outlier_kk'\]"),
    raises("recipe-outlier_k-float", "adahop.get_recipe", lambda b: adahop.get_recipe("adahop", outlier_k=2.5), TypeError,
           "outlier_k must be an int, got float 2.5"),
    raises("recipe-outlier_k-str", "adahop.get_recipe", lambda b: adahop.get_recipe("adahop", outlier_k="64"), TypeError,
           "outlier_k must be an int, got str '64'"),
    raises("recipe-seed-str", "adahop.get_recipe", lambda b: adahop.get_recipe("tseng", seed="x"), TypeError,
           "seed must be an int, got str 'x'"),
    raises("recipe-calibration_steps-bool", "adahop.get_recipe",
           lambda b: adahop.get_recipe("adahop", calibration_steps=True), TypeError,
           "calibration_steps must be an int, got bool True"),
    raises("recipe-strategy-int", "adahop.get_recipe",
           lambda b: adahop.get_recipe("mxfp4", fwd=1, dgrad="iht", wgrad="iht"), TypeError,
           "fwd must be a Strategy or None, got int 1"),
    raises("recipe-not-a-name", "adahop.get_recipe", lambda b: adahop.get_recipe(3), TypeError,
           "recipe must be a name or a Recipe, got int"),
    raises("recipe-built-with-a-float-k", "adahop.Recipe",
           lambda b: adahop.Recipe("r", fwd=Strategy.IHT, dgrad=Strategy.IHT, wgrad=Strategy.IHT, outlier_k=8.0),
           TypeError, "recipe 'r': outlier_k must be an int, got float 8.0"),
    raises("layer-features-not-multiples", "adahop.QuantLinear", lambda b: adahop.QuantLinear(48, 64, recipe="mxfp4"),
           ValueError, r"QuantLinear\(48, 64\): in and out features must be multiples of 32"),
    raises("layer-bf16-recipe", "adahop.QuantLinear", lambda b: adahop.QuantLinear(64, 64, recipe="bf16"), ValueError,
           "recipe 'bf16' runs every GEMM in BF16: use nn.Linear"),
    raises("layer-override-wrong-type", "adahop.QuantLinear", lambda b: adahop.QuantLinear(64, 64, outlier_k="8"),
           TypeError, "outlier_k must be an int, got str '8'"),
    raises("layer-input-other-dtype", "adahop.QuantLinear", lambda b: forward(linear(), x(dtype=torch.float64)),
           ValueError, "input dtype torch.float64 differs from weight dtype torch.float32"),
    raises("layer-input-wrong-features", "adahop.QuantLinear", lambda b: forward(linear(), x(8, 32)), ValueError,
           r"input of shape \(8, 32\) does not end in in_features=64"),
    raises("layer-input-not-a-tensor", "adahop.QuantLinear", lambda b: forward(linear()[0], [1.0] * 64), TypeError,
           "QuantLinear takes a torch.Tensor, got list"),
    gives("layer-nan-input-is-a-nan-row", "adahop.QuantLinear", lambda b: forward(linear(), poisoned(math.nan)),
          nan_row_only, exact=False),
    raises("convert-unknown-recipe", "adahop.convert", lambda b: adahop.convert(nn.Linear(64, 64), "fp4"), ValueError,
           "unknown recipe 'fp4'"),
    raises("convert-override-wrong-type", "adahop.convert",
           lambda b: adahop.convert(nn.Linear(64, 64), "adahop", measured_margin="0.1"), TypeError,
           "measured_margin must be a float, got str"),
    raises("convert-linear-not-a-multiple", "adahop.convert", lambda b: adahop.convert(nn.Linear(48, 64), "mxfp4"),
           ValueError, r"nn.Linear\(48, 64\): features must be multiples of 32"),
    raises("fix-no-policy-layers", "adahop.fix_strategies", lambda b: adahop.fix_strategies(model_of("mxfp4"), {}),
           ValueError, "the model has no QuantLinear of a policy recipe"),
    raises("fix-unknown-layer", "adahop.fix_strategies",
           lambda b: adahop.fix_strategies(model_of("adahop"), {"9": {"fwd": "iht", "dgrad": "iht", "wgrad": "iht"}}),
           ValueError, r"the map does not match the model's policy layers: missing \['0', '1'\]"),
    raises("fix-unknown-strategy", "adahop.fix_strategies",
           lambda b: adahop.fix_strategies(model_of("adahop"), {n: {"fwd": "fp4", "dgrad": "iht", "wgrad": "iht"}
                                                                for n in ("0", "1")}),
           ValueError, "unknown strategy 'fp4'"),
    raises("fix-strategy-int", "adahop.fix_strategies",
           lambda b: adahop.fix_strategies(model_of("adahop"), {n: {"fwd": 4, "dgrad": "iht", "wgrad": "iht"}
                                                                for n in ("0", "1")}),
           TypeError, "a strategy must be a Strategy or its name, got int 4"),
    raises("fix-missing-slot", "adahop.fix_strategies",
           lambda b: adahop.fix_strategies(model_of("adahop"), {n: {"fwd": "iht"} for n in ("0", "1")}), ValueError,
           r"a strategy map names the slots \['fwd', 'dgrad', 'wgrad'\], got \['fwd'\]"),
    gives("export-model-without-quant-layers", "adahop.export_strategies",
          lambda b: adahop.export_strategies(nn.Sequential(nn.Linear(64, 64))), lambda out: out == {}),
    gives("step-model-without-quant-layers", "adahop.on_optimizer_step",
          lambda b: adahop.on_optimizer_step(nn.Sequential(nn.Linear(64, 64))), lambda out: out is None),
]
CASES += [
    raises("convert-not-a-module", "adahop.convert", lambda b: adahop.convert("model", "mxfp4"), TypeError,
           "model must be an nn.Module, got str"),
    # A single name is a name, not its characters: layer "0" stays nn.Linear, layer "1" is converted.
    gives("convert-skip-a-str", "adahop.convert",
          lambda b: [type(m).__name__ for m in adahop.convert(nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64)),
                                                                  "mxfp4", skip="0")],
          lambda out: out == ["Linear", "QuantLinear"]),
    raises("convert-skip-not-names", "adahop.convert",
           lambda b: adahop.convert(nn.Sequential(nn.Linear(64, 64)), "mxfp4", skip=3), TypeError,
           "skip must be a module name or an iterable of names, got int"),
    raises("export-not-a-module", "adahop.export_strategies", lambda b: adahop.export_strategies("model"), TypeError,
           "model must be an nn.Module, got str"),
    raises("step-not-a-module", "adahop.on_optimizer_step", lambda b: adahop.on_optimizer_step("model"), TypeError,
           "model must be an nn.Module, got str"),
    raises("refresh-not-a-module", "adahop.refresh_weights", lambda b: adahop.refresh_weights("model"), TypeError,
           "model must be an nn.Module, got str"),
    raises("refresh-dtype-a-str", "adahop.refresh_weights",
           lambda b: adahop.refresh_weights(adahop.convert(nn.Linear(64, 64), "mxfp4", weight_cache=True), "bf16"),
           TypeError, "dtype must be a torch.dtype or None, got str 'bf16'"),
    gives("refresh-uncached-model", "adahop.refresh_weights",
          lambda b: adahop.refresh_weights(adahop.convert(nn.Linear(64, 64), "mxfp4")), lambda out: out == 0),
    raises("eager-not-a-module", "adahop.eager_while_calibrating", lambda b: adahop.eager_while_calibrating("model"),
           TypeError, "model must be an nn.Module, got str"),
    gives("eager-model-without-quant-layers", "adahop.eager_while_calibrating",
          lambda b: type(adahop.eager_while_calibrating(nn.Sequential(nn.Linear(64, 64)))),
          lambda out: out is contextlib.nullcontext),
    raises("fp8-layout-unknown", "formats.check_fp8_layout", lambda b: formats.check_fp8_layout("tile64", 128, 128),
           ValueError, "layout must be one of"),
    raises("fp8-ref-rows-not-tiles", "formats.to_fp8_ref",
           lambda b: formats.to_fp8_ref(ops.hadamard_quantize(torch.randn(96, 128), backend="reference"), "tile128"),
           ValueError, r"layout 'tile128' needs the rows \(96\)"),
    raises("fp8-group-scale-layout-unknown", "formats.fp8_group_scale",
           lambda b: formats.fp8_group_scale(torch.ones(128, 1), "rows", (128, 128)), ValueError,
           "layout must be one of"),
    gives("gemm-path-of-the-reference", "ops.device_gemm_path",
          lambda b: ops.device_gemm_path(torch.device("cpu"), ops.Backend.REFERENCE),
          lambda out: out[0] is ops.GemmPath.REFERENCE),
    raises("fp8-mm-mixed-layouts", "ops.fp8_mm",
           lambda b: ops.fp8_mm(*(torch.zeros(128, 128, dtype=torch.float8_e4m3fn), torch.ones(128, 1), "row") * 1,
                                torch.zeros(128, 128, dtype=torch.float8_e4m3fn), torch.ones(1, 1), "tile128",
                                torch.bfloat16), ValueError, "FP8 layouts A='row', B='tile128'"),
    raises("seed-tensor-negative", "ops.seed_tensor", lambda b: ops.seed_tensor(-1, torch.device("cpu")), ValueError,
           r"seed must be an int in \[0, 2\*\*62\)"),
    raises("layer-features-float", "adahop.QuantLinear", lambda b: adahop.QuantLinear(64.0, 64, recipe="mxfp4"),
           TypeError, "in_features must be an int, got float"),
]


def case_params(cases: list[Case]) -> list:
    return [pytest.param(c, id=c.id, marks=[pytest.mark.xfail(strict=True, reason=c.gap)] if c.gap else [])
            for c in cases]


# A tensor on a device the Triton kernels cannot run (meta): the one place the backends answer
# differently, by design. The Triton backend refuses it naming the device; the reference computes
# on it as torch does (a meta result of the right shape, what shape inference needs).
NO_KERNEL_DEVICE = {
    "hadamard_quantize": lambda b: ops.hadamard_quantize(x().to("meta"), backend=b),
    "abs_median": lambda b: ops.abs_median(x().to("meta"), backend=b),
    "scaled_mean_squares": lambda b: ops.scaled_mean_squares(x().to("meta"), backend=b),
    "extract_outliers": lambda b: ops.extract_outliers(x().to("meta"), 2, backend=b),
    "dequantize": lambda b: ops.dequantize(mx(u8(64, 32).to("meta"), u8(64, 2).to("meta")), backend=b),
}


def run(case: Case, backend: str, monkeypatch) -> tuple[str, Any]:
    """``("raised", exception)`` or ``("returned", result)`` of the case on ``backend``."""
    monkeypatch.setenv("ADAHOP_BACKEND", backend)
    if backend == "triton" and not ON_GPU:
        assert os.environ.get("TRITON_INTERPRET") == "1", "tests/conftest.py sets the interpreter on a CPU machine"
    try:
        return "returned", case.call(backend)
    except Exception as err:  # noqa: BLE001 - every exception is an answer to compare
        return "raised", err


def test_case_ids_are_unique():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


def public_api() -> set[str]:
    names = {f"adahop.{n}" for n in adahop.__all__ if callable(getattr(adahop, n)) and n != "RECIPES"}
    for module, short in ((ops, "ops"), (formats, "formats"), (hadamard, "hadamard")):
        names |= {f"{short}.{n}" for n, obj in vars(module).items()
                  if not n.startswith("_") and inspect.isfunction(obj) and obj.__module__ == module.__name__}
    return names


def test_every_public_function_has_a_case():
    covered = {c.api for c in CASES}
    assert sorted(public_api() - covered) == []
    assert sorted(covered - public_api()) == []


@pytest.mark.parametrize("case", case_params(CASES))
def test_bad_input_gets_the_documented_answer_on_both_backends(case: Case, monkeypatch):
    answers = {b: run(case, b, monkeypatch) for b in BACKENDS}
    for backend, (kind, value) in answers.items():
        if case.error is not None:
            assert kind == "raised", f"{backend}: returned {value!r} instead of raising {case.error.__name__}"
            assert type(value) is case.error, f"{backend}: {type(value).__name__}: {value}"
            assert re.search(case.match, str(value)), f"{backend}: message {str(value)!r} does not match {case.match!r}"
        else:
            assert kind == "returned", f"{backend}: raised {type(value).__name__}: {value}"
            assert case.check(value), f"{backend}: the result is not the documented one"
    (ref_kind, ref), (tri_kind, tri) = answers["reference"], answers["triton"]
    if case.error is not None:
        assert str(ref) == str(tri), f"the backends' messages differ: {str(ref)!r} vs {str(tri)!r}"
    else:
        assert same(ref, tri, case.exact), "the backends' results differ"


@pytest.mark.parametrize("op", list(NO_KERNEL_DEVICE))
def test_a_tensor_on_meta_gets_shapes_alike_from_both_backends(op, monkeypatch):
    """Every op is an operator with a fake implementation: on meta tensors (shapes only, as
    torch.compile traces them) both backends answer alike, with meta outputs of the real shapes."""
    def first_tensor(out):
        first = out[0] if isinstance(out, tuple) else out
        return first.codes if isinstance(first, MXFP4Tensor) else first

    answers = {b: run(Case(op, op, NO_KERNEL_DEVICE[op]), b, monkeypatch) for b in BACKENDS}
    for backend, (kind, out) in answers.items():
        assert kind == "returned", (backend, out)
        assert first_tensor(out).device.type == "meta", backend
    assert first_tensor(answers["reference"][1]).shape == first_tensor(answers["triton"][1]).shape
