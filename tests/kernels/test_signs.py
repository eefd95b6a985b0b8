"""adahop_kernels.signs: the GPU's one-launch random signs equal the reference hash bit for bit."""

import pytest
import torch

from adahop.hadamard import _MASK32, _lowbias32, random_signs


@pytest.mark.parametrize("n", [0, 1, 1000, 65537])
@pytest.mark.parametrize("seed", [0, 7, 2**31 - 1, 2**63 + 11])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_equals_the_reference_hash(device, n, seed, dtype):
    from adahop_kernels.signs import random_signs as kernel

    mix = _lowbias32((seed ^ (seed >> 32)) & _MASK32)
    got = kernel(n, mix, torch.device(device), dtype)
    assert got.dtype == dtype and got.shape == (n,)
    assert torch.equal(got.cpu(), random_signs(n, seed, dtype=dtype))


@pytest.mark.parametrize("n", [0, 1, 1000, 65537])
@pytest.mark.parametrize("seed", [0, 7, 2**31 - 1, -5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_seeded_kernel_equals_the_reference_on_the_seed_tensor(device, n, seed, dtype):
    from adahop_kernels.signs import signs_from_seed as kernel

    from adahop.linear.seeds import signs_from_seed_ref

    t = torch.tensor([seed], dtype=torch.int64)
    got = kernel(n, t.to(device), dtype)
    assert got.dtype == dtype and got.shape == (n,)
    assert torch.equal(got.cpu(), signs_from_seed_ref(n, t, dtype))
    if 0 <= seed < 2**31:  # the seed's own hash equals random_signs' for seeds below 2**32
        assert torch.equal(got.cpu(), random_signs(n, seed, dtype=dtype))


@pytest.mark.gpu
def test_random_signs_on_cuda_take_the_kernel_and_match_the_cpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    assert torch.equal(random_signs(70000, 5, device="cuda").cpu(), random_signs(70000, 5))
