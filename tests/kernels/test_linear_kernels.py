"""QuantLinear on the kernel backend (Triton: interpreter on CPU, compiled on a GPU) vs the reference.

The layer's numerics are tested on the reference backend in tests/test_linear.py and
tests/test_recipes.py; this checks that the kernels it calls on the way (dual quantize of X, W and
dY, transposing quantize, outlier extraction, dequantize, mxfp4_mm on the device's GEMM path)
compute the same layer. With round-to-nearest everywhere the CPU interpreter matches the reference
bit for bit; on a GPU the GEMM accumulates in fp32 (the reference in fp64), so outputs agree to
fp32 rounding. Stochastic rounding draws from different generators on the two backends: those
runs are checked against fp64 at the format's error instead.
"""

import pytest
import torch
from torch import nn

import adahop
from adahop.backend import Backend, resolve_backend
from adahop.patterns import planted_outliers

STRATEGY_SETS = {
    "mxfp4": ("mxfp4", {}),
    "iht": ("uniform-iht", {}),
    "tseng": ("tseng", {}),
    "quartet-style": ("quartet-style", {}),
    "oe-right-oe-left-oe-right": ("uniform-iht", {"fwd": "iht+oe-right", "dgrad": "iht+oe-left", "wgrad": "iht+oe-right"}),
    "oe-left-oe-right-bf16": ("uniform-iht", {"fwd": "iht+oe-left", "dgrad": "iht+oe-right", "wgrad": "bf16"}),
}


def run(device, recipe, **overrides):
    torch.manual_seed(0)
    layer = adahop.convert(nn.Linear(64, 64, bias=False), recipe, outlier_k=4, **overrides).to(device)
    x = planted_outliers(64, 64, n_cols=2, col_factor=20, seed=0).to(device).requires_grad_()
    g = planted_outliers(64, 64, n_rows=2, row_factor=20, seed=1).to(device)
    y = layer(x)
    y.backward(g)
    return [t.detach().double().cpu() for t in (y, x.grad, layer.weight.grad, layer.weight, x, g)]


def relative(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("name", list(STRATEGY_SETS))
def test_kernel_backend_matches_reference_with_rne(device, monkeypatch, name):
    recipe, overrides = STRATEGY_SETS[name]
    overrides = {**overrides, "grad_rounding": "rne", "saved_rounding": "rne"}
    assert resolve_backend(device) is Backend.TRITON
    kernel = run(device, recipe, **overrides)
    monkeypatch.setenv("ADAHOP_BACKEND", "reference")
    reference = run(device, recipe, **overrides)
    for k, r in zip(kernel[:3], reference[:3]):
        if device == "cpu":
            assert torch.equal(k, r)
        else:
            assert relative(k, r) < 1e-5


@pytest.mark.parametrize("name", ["iht", "tseng", "oe-right-oe-left-oe-right"])
def test_kernel_backend_with_stochastic_rounding(device, name):
    recipe, overrides = STRATEGY_SETS[name]
    y, dx, dw, w, x, g = run(device, recipe, **overrides)
    # Error floors of tests/test_recipes.py (one SR draw of dY, planted outliers).
    assert relative(y, x @ w.t()) < 0.25
    assert relative(dx, g @ w) < 0.35
    assert relative(dw, g.t() @ x) < 0.35
