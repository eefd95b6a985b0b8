"""Block Hadamard reference (adahop.hadamard)."""

import pytest
import torch

from adahop.hadamard import block_hadamard_ref, hadamard_matrix, random_signs


@pytest.mark.parametrize("b", [2, 16, 32, 64, 128], ids=lambda b: f"b{b}")
def test_hadamard_is_orthonormal_and_symmetric(b):
    h = hadamard_matrix(b, torch.float64)
    assert torch.allclose(h @ h.t(), torch.eye(b, dtype=torch.float64), atol=1e-14)
    assert torch.equal(h, h.t())


def test_entries_are_plus_minus_one_over_sqrt_b():
    h = hadamard_matrix(32, torch.float64)
    assert torch.allclose(h.abs(), torch.full((32, 32), 32**-0.5, dtype=torch.float64), rtol=1e-15, atol=0)


@pytest.mark.parametrize("signed", [False, True], ids=["plain", "random_signs"])
def test_transform_preserves_the_gemm(signed):
    torch.manual_seed(0)
    a, b = torch.randn(48, 256, dtype=torch.float64), torch.randn(40, 256, dtype=torch.float64)
    s = random_signs(256, seed=3) if signed else None
    prod = block_hadamard_ref(a, 32, s) @ block_hadamard_ref(b, 32, s).t()
    assert torch.allclose(prod, a @ b.t(), rtol=1e-12, atol=1e-11)


def test_transform_is_blockwise():
    x = torch.zeros(1, 64, dtype=torch.float64)
    x[0, 33] = 1.0  # only the second block is touched
    y = block_hadamard_ref(x)
    assert y[0, :32].eq(0).all()
    assert torch.allclose(y[0, 32:].abs(), torch.full((32,), 32**-0.5, dtype=torch.float64), rtol=1e-15, atol=0)


def test_column_outlier_is_spread_over_its_block():
    x = torch.randn(8, 64, dtype=torch.float64) * 0.01
    x[:, 5] = 100.0
    y = block_hadamard_ref(x)
    # The outlier's energy is spread over 32 entries: the block's max drops by ~sqrt(32).
    assert y[:, :32].abs().amax() < 100.0 / 32**0.5 * 1.01


def test_random_signs_are_deterministic_and_balanced():
    s1, s2 = random_signs(4096, seed=7), random_signs(4096, seed=7)
    assert torch.equal(s1, s2) and set(s1.unique().tolist()) == {-1.0, 1.0}
    assert not torch.equal(s1, random_signs(4096, seed=8))
    assert abs(s1.sum().item()) < 4 * 4096**0.5


def lowbias32_uint32(x: int) -> int:
    """lowbias32 with plain Python ints wrapped to 32 bits: the textbook form the tensor one must match."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_random_signs_are_the_top_bit_of_lowbias32_computed_exactly():
    # The int64 tensor arithmetic (split multiplies) equals 32-bit wrapping arithmetic, so any
    # device gives the same vector; checked against the textbook form for a few seeds.
    for seed in (0, 3, 2**31 - 1, 2**40 + 5):
        mix = lowbias32_uint32((seed ^ (seed >> 32)) & 0xFFFFFFFF)
        expected = [1.0 - 2.0 * (lowbias32_uint32(i ^ mix) >> 31) for i in range(300)]
        assert random_signs(300, seed).tolist() == expected
    assert lowbias32_uint32(1) != 1 and random_signs(8, 3, dtype=torch.bfloat16).dtype == torch.bfloat16


def test_random_signs_of_different_seeds_are_uncorrelated():
    signs = torch.stack([random_signs(65536, seed) for seed in range(8)])
    corr = (signs @ signs.t()) / 65536
    off_diagonal = corr[~torch.eye(8, dtype=torch.bool)]
    assert off_diagonal.abs().max() < 4 / 65536**0.5  # 4 sigma of independent ±1 vectors


@pytest.mark.parametrize("seed", [-1, 2**64], ids=["negative", "2**64"])
def test_random_signs_reject_a_seed_out_of_range(seed):
    with pytest.raises(ValueError, match=r"seed must be an int \[0, 2\*\*64\)"):
        random_signs(4, seed)


@pytest.mark.parametrize("seed", [1.5, True, "3"], ids=["float", "bool", "str"])
def test_random_signs_reject_a_seed_that_is_not_an_int(seed):
    with pytest.raises(TypeError, match="seed must be an int, got"):
        random_signs(4, seed)


@pytest.mark.parametrize(("n", "error"), [(2.5, TypeError), (-1, ValueError)], ids=["float", "negative"])
def test_random_signs_reject_a_bad_length(n, error):
    with pytest.raises(error, match="n must be an int"):
        random_signs(n, 0)


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool], ids=str)
def test_random_signs_reject_a_dtype_that_is_not_floating(dtype):
    with pytest.raises(ValueError, match="dtype must be one of"):
        random_signs(4, 0, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool], ids=str)
def test_hadamard_matrix_refuses_a_dtype_that_is_not_floating(dtype):
    # ±1/sqrt(n) truncates to 0 in an integer dtype: refused rather than a matrix of zeros.
    with pytest.raises(ValueError, match="dtype must be a floating dtype"):
        hadamard_matrix(32, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_hadamard_matrix_in_each_floating_dtype_is_the_fp64_one_rounded(dtype):
    h = hadamard_matrix(32, dtype=dtype)
    assert h.dtype == dtype and torch.equal(h, hadamard_matrix(32, torch.float64).to(dtype))


@pytest.mark.parametrize("bad", [32.0, True, "32"], ids=["float", "bool", "str"])
def test_block_size_that_is_not_an_int_raises_type_error(bad):
    with pytest.raises(TypeError, match="Hadamard block size must be an int"):
        hadamard_matrix(bad)


@pytest.mark.parametrize(
    ("signs", "match"),
    [
        (torch.full((64,), 2.0), "signs must hold only \\+1 and -1"),
        (torch.full((64,), 0.5), "signs must hold only \\+1 and -1"),
        (torch.ones(64, dtype=torch.int64), "signs must be a floating ±1 vector"),
        (torch.ones(64, dtype=torch.int8), "signs must be a floating ±1 vector"),
        (torch.ones(64, device="meta"), "signs are on meta but the input is on cpu"),
        (torch.ones(2, 32), r"signs must have shape \(64,\)"),
    ],
    ids=["two", "half", "int64", "int8", "other-device", "2-D"],
)
def test_block_hadamard_ref_refuses_signs_the_kernel_would_read_otherwise(signs, match):
    # The kernel flips where signs < 0; the reference multiplies: the same for ±1 only.
    with pytest.raises(ValueError, match=match):
        block_hadamard_ref(torch.randn(2, 64), signs=signs)


def test_block_hadamard_ref_flips_by_the_signs():
    x, s = torch.randn(3, 64, dtype=torch.float64), random_signs(64, 5, dtype=torch.float64)
    assert torch.equal(block_hadamard_ref(x, signs=s), block_hadamard_ref(x * s))


@pytest.mark.parametrize("bad", [0, 1, 24, 33], ids=lambda b: f"b{b}")
def test_bad_block_size_raises(bad):
    with pytest.raises(ValueError, match="power of two"):
        hadamard_matrix(bad)


def test_dimension_not_multiple_of_block_raises():
    with pytest.raises(ValueError, match="not a multiple of the Hadamard block size 32"):
        block_hadamard_ref(torch.randn(2, 48))


def test_wrong_signs_shape_raises():
    with pytest.raises(ValueError, match=r"signs must have shape \(64,\)"):
        block_hadamard_ref(torch.randn(2, 64), signs=torch.ones(32))
