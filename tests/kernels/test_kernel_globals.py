"""Global constexprs used by kernels must compare equal to themselves.

Compiled Triton (3.6) re-checks at every launch that the globals a kernel read are unchanged
(``old != new`` raises), so a NaN-valued global makes every second launch fail on a GPU, while
the interpreter never checks. This catches it on CPU.
"""

import gc
import importlib
import math
import pkgutil

import adahop_kernels
import adahop_kernels.fp8_reencode as fr
import adahop_kernels.hadamard_quantize as hq
import pytest
import torch
import triton.language as tl


MODULES = sorted(m.name for m in pkgutil.iter_modules(adahop_kernels.__path__))


@pytest.mark.parametrize("name", MODULES)
def test_no_nan_global_constexpr(name):
    module = importlib.import_module(f"adahop_kernels.{name}")
    for attr, value in vars(module).items():
        raw = value.value if isinstance(value, tl.constexpr) else value
        if isinstance(raw, float):
            assert not math.isnan(raw), f"adahop_kernels.{name}.{attr} is NaN: build NaN from bits in the kernel"


def _live_tensors() -> dict[int, torch.Tensor]:
    gc.collect()
    return {id(o): o for o in gc.get_objects() if isinstance(o, torch.Tensor)}


def test_launches_keep_no_tensor_alive(device):
    """A kernel launch leaves no tensor behind (a host-side cache of a device tensor, say): under CUDA
    graphs the first launch may run inside a graph pool's warm-up or capture, and a tensor kept from
    it lives in memory the pool hands out again."""
    x = torch.randn(128, 256, device=device)
    seed = torch.tensor([3], dtype=torch.int64, device=device)
    before = _live_tensors()
    for size in hq.HADAMARD_SIZES:
        for rounding in ("rne", "sr"):
            outs = hq.quantize(x, hq.Side(True, None, fp8="seg128", amax=True), hq.Side(True, None, fp8="tile128"),
                               hadamard_size=size, rounding=rounding, seed=seed if rounding == "sr" else None)
            del outs
    q = hq.hadamard_quantize(x)
    for layout in ("row", "seg128", "tile128"):
        fr.fp8_reencode(q, layout)
    del q
    left = [tuple(t.shape) for i, t in _live_tensors().items() if i not in before]
    assert not left, f"tensors kept alive by the launches: {left}"
