"""HOT's rounding to integers (``adahop.library.hot_round``): GB/s against the copy bandwidth, beside
the pure-PyTorch reference it replaces.

fp32 ``t (rows, K)`` in, int8 out: 5 bytes a value, the scale (one per tensor or per row) aside.
Peer ``reference``: :func:`adahop.hot.round_int_ref` run eagerly, a dozen whole-tensor ops (the SR
draws' counter hash in int64 among them). On a CPU the figure itself is the reference's, as for
every CPU benchmark.
"""

import pytest
import torch

from adahop import library
from adahop.backend import Backend
from adahop.hot import round_int_ref


@pytest.mark.parametrize("scaling", ["tensor", "token"])
@pytest.mark.parametrize("rounding", ["rne", "sr"])
def test_hot_round(benchmark, bench, activation_shape, scaling, rounding):
    t = bench.randn(*activation_shape, dtype=torch.float32)
    rows, cols = t.shape
    scale = (t.abs().amax(1, keepdim=True) if scaling == "token" else t.abs().amax().reshape(1, 1)) / 7
    seed = torch.tensor([7], dtype=torch.int64, device=t.device) if rounding == "sr" else None
    backend = (bench.backend or Backend.TRITON).value
    bench.run(benchmark, lambda: library.hot_round(t, scale, seed, 7, backend),
              op=f"hot_round (per {scaling}, {rounding})", shape=(rows, cols), dtype="fp32 -> int8",
              work=rows * cols * 5, unit="GB/s", ceiling="copy",
              peers={"reference": lambda: round_int_ref(t, scale, 7, seed)})
