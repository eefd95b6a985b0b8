"""Global constexprs used by kernels must compare equal to themselves.

Compiled Triton (3.6) re-checks at every launch that the globals a kernel read are unchanged
(``old != new`` raises), so a NaN-valued global makes every second launch fail on a GPU, while
the interpreter never checks. This catches it on CPU.
"""

import importlib
import math
import pkgutil

import adahop_kernels
import pytest
import triton.language as tl

MODULES = sorted(m.name for m in pkgutil.iter_modules(adahop_kernels.__path__))


@pytest.mark.parametrize("name", MODULES)
def test_no_nan_global_constexpr(name):
    module = importlib.import_module(f"adahop_kernels.{name}")
    for attr, value in vars(module).items():
        raw = value.value if isinstance(value, tl.constexpr) else value
        if isinstance(raw, float):
            assert not math.isnan(raw), f"adahop_kernels.{name}.{attr} is NaN: build NaN from bits in the kernel"
