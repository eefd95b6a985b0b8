"""adahop_kernels.hot_round: HOT's integer rounding in one pass equals the reference bit for bit."""

import pytest
import torch

from adahop import hot
from adahop.hot import round_int_ref

SEEDS = [None, 0, 12345, -3, 2**62 + 5]


def draw(seed: int | None, device: str) -> torch.Tensor | None:
    return None if seed is None else torch.tensor([seed], dtype=torch.int64, device=device)


@pytest.mark.parametrize("shape", [(1, 7), (3, 5), (64, 96), (130, 600)])
@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("qmax", [1, 7, 127])
@pytest.mark.parametrize("seed", SEEDS)
def test_kernel_equals_the_reference(device, shape, per_row, qmax, seed):
    from adahop_kernels.hot_round import hot_round

    g = torch.Generator().manual_seed(shape[0] * 1000 + qmax)
    t = torch.randn(shape, generator=g) * torch.logspace(-3, 3, shape[1])
    scale = (t.abs().amax(1, keepdim=True) if per_row else t.abs().amax().reshape(1, 1)) / qmax * 0.7  # some clipped
    want = round_int_ref(t, scale, qmax, draw(seed, "cpu"))
    got = hot_round(t.to(device), scale.to(device), qmax, draw(seed, device))
    assert got.dtype == torch.int8 and torch.equal(got.cpu(), want)


def test_ties_round_to_even_and_draws_only_round_up_or_down(device):
    from adahop_kernels.hot_round import hot_round

    t = torch.arange(-8.5, 9.0, 0.5).reshape(1, -1)  # every half-integer tie and the integers between
    one = torch.ones(1, 1)
    got = hot_round(t.to(device), one.to(device), 127, None).cpu()
    assert torch.equal(got, t.round().to(torch.int8))  # torch.round: ties to even
    sr = hot_round(t.to(device), one.to(device), 127, draw(9, device)).cpu().float()
    assert ((sr == t.floor()) | (sr == t.ceil())).all()


def test_non_finite_values_give_zero_codes_and_the_scale_shows_them(device):
    from adahop_kernels.hot_round import hot_round

    t = torch.tensor([[1.0, float("nan"), -2.0, float("inf")]])
    scale = torch.full((1, 1), 0.5)
    for seed in (None, 4):
        want = round_int_ref(t, scale, 7, draw(seed, "cpu"))
        assert torch.equal(hot_round(t.to(device), scale.to(device), 7, draw(seed, device)).cpu(), want)
    assert want.tolist() == [[2, 0, -4, 7]]
    assert not torch.isfinite(hot.quantize_int(t.to(device), 4, "tensor", backend="triton").scale).any()


@pytest.mark.parametrize("scaling", hot.SCALINGS)
@pytest.mark.parametrize("bits", [4, 8])
def test_quantize_int_answers_alike_on_both_backends(device, scaling, bits):
    g = torch.Generator().manual_seed(bits)
    t = torch.randn(96, 64, generator=g).to(device)
    for seed in (None, draw(3, device)):
        a = hot.quantize_int(t, bits, scaling, seed, backend="triton")
        b = hot.quantize_int(t, bits, scaling, seed, backend="reference")
        assert torch.equal(a.values, b.values) and torch.equal(a.scale, b.scale)
