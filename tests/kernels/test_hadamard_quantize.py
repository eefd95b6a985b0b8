"""Fused block-Hadamard + MXFP4 quantize kernel against the reference (adahop.formats / adahop.ops).

Tiers: bit-exact for every decision the quantizer makes (no transform, so no rounding before it);
the Hadamard path bit-exact where its fp32 transform is exact, and within a stated mismatch rate
of the fp64 path where it is not; stochastic rounding by its support and its mean over many draws;
FP8 emission, the transposing and dual variants, and the launcher's errors; then the general
launcher :func:`quantize`: the in-kernel FP8 layouts against :func:`adahop.formats.to_fp8_ref`, row
amax, device-tensor seeds, and blocks whose ±1 sums overflow fp32.
"""

import math

import pytest
import torch

import adahop_kernels.hadamard_quantize as hq
from adahop import ops
from adahop.formats import (
    E2M1_MIDPOINTS,
    E2M1_VALUES,
    E8M0_NAN,
    MXFP4Tensor,
    dequantize_mxfp4_ref,
    fp8_group_scale,
    quantize_mxfp4_ref,
    to_fp8_ref,
    to_fp8_rowwise_ref,
    unpack_e2m1,
)
from adahop.hadamard import block_hadamard_ref, random_signs
from adahop_kernels.fp8_reencode import fp8_reencode
from adahop_kernels.hadamard_quantize import Side, hadamard_quantize, hadamard_quantize_dual, quantize

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# Llama-3 `in` features at 1B/8B/70B (hidden and MLP sizes): K of X (tokens × in) and of W.
# NaN and Inf inputs: the interpreter's numpy warns about the arithmetic the kernel does on them.
NAN_INPUT = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
LLAMA_IN = {"1b-hidden": 2048, "8b-hidden": 4096, "1b-mlp": 8192, "8b-mlp": 14336, "70b-mlp": 28672}


def assert_same(q, r):
    """Bit-exact codes and scales (compared on the CPU)."""
    assert q.codes.shape == r.codes.shape and q.scales.shape == r.scales.shape
    assert torch.equal(q.scales.cpu(), r.scales.cpu()), "scales differ"
    assert torch.equal(q.codes.cpu(), r.codes.cpu()), "codes differ"


def spread_input(rows, k, seed, dtype=torch.float32, binades=3.0):
    """Normal values times 2^(3·N(0,1)): blocks span many binades, as activations and gradients do."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, k, generator=g) * torch.exp2(torch.randn(rows, k, generator=g) * binades)).to(dtype)


def exact_transform_input(rows, k, seed):
    """bf16 values with |x| in [2^-8, 8): any ±1 sum of 128 of them is exact in fp32 (≤ 23 bits)."""
    g = torch.Generator().manual_seed(seed)
    mag = torch.exp2(torch.rand(rows, k, generator=g) * 11 - 8)
    sign = torch.randint(0, 2, (rows, k), generator=g) * 2 - 1
    return (mag * sign).bfloat16()


# ---- bit-exact tier: no transform, every quantizer decision -------------------------------------


@pytest.mark.parametrize("rows", [127, 128, 129], ids=lambda r: f"rows{r}")
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_codes_and_scales_match_reference(rows, dtype, device):
    x = spread_input(rows, 256, rows, dtype)
    assert_same(hadamard_quantize(x.to(device), hadamard=False), quantize_mxfp4_ref(x))


def test_scale_is_floor_log2_amax_minus_2(device):
    x = torch.zeros(4, 32)
    x[0, 3], x[1, 0], x[2, 7], x[3, 31] = 1.0, 7.99, -0.3, 2.0**-100
    q = hadamard_quantize(x.to(device), hadamard=False)
    assert q.scales.flatten().tolist() == [127 - 2, 127 + 2 - 2, 127 - 2 - 2, 127 - 100 - 2]


@pytest.mark.parametrize("exponent", [-20, 0, 7], ids=lambda e: f"scale2^{e}")
def test_ties_to_even(exponent, device):
    # Row: amax 4 fixes the scale at 2^e; then every midpoint, just below and just above it, ±.
    mids = torch.tensor(E2M1_MIDPOINTS)
    vals = torch.cat((mids, torch.nextafter(mids, torch.zeros(())), torch.nextafter(mids, torch.full((), 8.0))))
    x = torch.zeros(1, 64)
    x[0, 0] = 4.0
    x[0, 1:1 + len(vals)] = vals
    x[0, 32:32 + len(vals)] = -vals
    x[0, 63] = 4.0
    x = x * 2.0**exponent
    q = hadamard_quantize(x.to(device), hadamard=False)
    assert_same(q, quantize_mxfp4_ref(x))
    expected_ties = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]  # the even neighbour of each midpoint
    deq = dequantize_mxfp4_ref(q) / 2.0**exponent
    assert deq[0, 1:8].tolist() == expected_ties and deq[0, 32:39].tolist() == [-v for v in expected_ties]


def test_every_grid_value_is_kept(device):
    grid = torch.tensor(E2M1_VALUES)
    x = torch.cat((grid, -grid, grid * 0.5**3, -grid * 2.0**5)).reshape(1, 32)
    x = x.repeat(1, 2)
    x[0, 32:48] = x[0, 32:48] * 2.0**3  # second block: the scaled grid at another scale
    assert_same(hadamard_quantize(x.to(device), hadamard=False), quantize_mxfp4_ref(x))


def test_saturates_at_six(device):
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1] = 7.9, -7.0  # scale 2^0: 7.9 and 7 lie beyond the grid
    q = hadamard_quantize(x.to(device), hadamard=False)
    assert dequantize_mxfp4_ref(q)[0, :2].tolist() == [6.0, -6.0]


def test_zero_block_has_scale_byte_zero_and_zero_codes(device):
    x = torch.zeros(3, 64)
    x[1, 40] = 1.0  # the other block of row 1 stays zero
    q = hadamard_quantize(x.to(device), hadamard=False)
    assert q.scales.tolist() == [[0, 0], [0, 125], [0, 0]]
    assert_same(q, quantize_mxfp4_ref(x))


def test_negative_zero_and_values_rounding_to_zero_are_code_zero(device):
    x = torch.full((1, 32), -0.0)
    x[0, 0] = 1.0
    x[0, 1] = -0.01
    q = hadamard_quantize(x.to(device), hadamard=False)
    assert unpack_e2m1(q.codes.cpu())[0, 1:].eq(0).all()


@NAN_INPUT
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("hadamard", [False, True], ids=["plain", "hadamard"])
def test_nonfinite_block_gets_nan_scale_and_zero_codes(bad, hadamard, device):
    x = torch.ones(2, 64)
    x[1, 40] = bad
    q = hadamard_quantize(x.to(device), hadamard=hadamard)
    assert_same(q, ops.hadamard_quantize_ref(x, hadamard=hadamard))
    assert q.scales[1, 1].item() == E8M0_NAN and q.codes[1, 16:].eq(0).all()
    assert q.scales[0].ne(E8M0_NAN).all() and q.scales[1, 0].item() != E8M0_NAN


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_tiny_values_clamp_to_smallest_scale(dtype, device):
    x = torch.zeros(2, 32)
    x[0, 0] = 2.0**-130  # subnormal amax: scale byte 0 (2^-127), rounds to 0
    x[0, 1] = torch.finfo(torch.float32).tiny  # 2^-126 = 2 * 2^-127, exactly
    x[1, :8] = torch.tensor([2.0**-133, -(2.0**-128), 3 * 2.0**-129, 2.0**-127, 0, 0, 0, 0])
    x = x.to(dtype)
    q = hadamard_quantize(x.to(device), hadamard=False)
    assert q.scales.flatten().tolist() == [0, 0]
    assert_same(q, quantize_mxfp4_ref(x))


def test_largest_finite_input(device):
    x = torch.full((1, 32), torch.finfo(torch.float32).max)
    q = hadamard_quantize(x.to(device), hadamard=False)
    assert q.scales.item() == 254 - 2
    assert dequantize_mxfp4_ref(q, torch.float64)[0, 0].item() == 6.0 * 2.0**125


def test_packing_low_nibble_first(device):
    x = torch.zeros(1, 32)
    x[0, :4] = torch.tensor([0.5, 1.0, -6.0, 0.0])  # codes 1, 2, 15, 0 at scale 2^0 (amax 6)
    q = hadamard_quantize(x.to(device), hadamard=False)
    assert q.codes[0, :2].tolist() == [0x21, 0x0F]


@pytest.mark.parametrize("name", LLAMA_IN, ids=LLAMA_IN.keys())
def test_llama_shapes_along_in(name, device):
    # X of 32 tokens × in, bf16, through the Hadamard: bit-exact where the fp32 transform is exact.
    x = exact_transform_input(32, LLAMA_IN[name], 1)
    assert_same(hadamard_quantize(x.to(device)), ops.hadamard_quantize_ref(x))


@pytest.mark.parametrize("out_features", [1024, 14336], ids=["8b-kv", "8b-mlp"])
def test_llama_shapes_transposed_along_out(out_features, device):
    # Wᵀ along `out` (dgrad's right operand) at 32 input features.
    w = exact_transform_input(out_features, 32, 2)
    assert_same(hadamard_quantize(w.to(device), transpose=True), ops.hadamard_quantize_ref(w.t()))


# ---- Hadamard tier ------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [16, 32, 64, 128], ids=lambda s: f"H{s}")
@pytest.mark.parametrize("with_signs", [False, True], ids=["nosigns", "signs"])
@pytest.mark.parametrize("transpose", [False, True], ids=["alongK", "alongM"])
def test_hadamard_bit_exact_when_the_transform_is_exact(size, with_signs, transpose, device):
    # Every ±1 sum is exact in fp32 and 1/√size is applied with one rounding (an fma of its two
    # fp32 halves), so the kernel's fp32 transform is the fp64 one rounded once: equal bytes.
    x = exact_transform_input(128, 256, size)
    n = x.shape[0] if transpose else x.shape[1]
    signs = random_signs(n, seed=size) if with_signs else None
    q = hadamard_quantize(x.to(device), transpose=transpose, hadamard_size=size,
                          signs=None if signs is None else signs.to(device))
    r = ops.hadamard_quantize_ref(x.t() if transpose else x, hadamard_size=size, signs=signs)
    assert_same(q, r)


@pytest.mark.parametrize("transpose", [False, True], ids=["alongK", "alongM"])
def test_fp32_input_in_three_pieces_is_exact(transpose, device):
    # 19-bit values in [1, 2): the kernel's three 8-bit pieces all carry bits, and every ±1 sum of
    # 32 of them (< 2^6, 2^-18 steps) is exact in fp32, so the bytes equal the fp64 path's.
    g = torch.Generator().manual_seed(16)
    x = torch.randint(2**18, 2**19, (256, 512), generator=g) * 2.0**-18
    x = x * (torch.randint(0, 2, x.shape, generator=g) * 2 - 1)
    q = hadamard_quantize(x.float().to(device), transpose=transpose)
    assert_same(q, ops.hadamard_quantize_ref(x.float().t() if transpose else x.float()))


# Values within fp32 rounding of an E2M1 decision point may land on the other side: ~1 value in
# 10^6 on these inputs (measured). Tolerance: 1e-4 of the codes, 1e-3 of the scales, and every
# differing value one grid step from the reference's.
MISMATCH_TOL = {"codes": 1e-4, "scales": 1e-3}


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_hadamard_matches_fp64_path_within_rounding(dtype, device):
    x = spread_input(256, 1024, 7, dtype)
    q = hadamard_quantize(x.to(device))
    r = ops.hadamard_quantize_ref(x)
    code_rate = (unpack_e2m1(q.codes.cpu()) != unpack_e2m1(r.codes)).double().mean().item()
    scale_rate = (q.scales.cpu() != r.scales).double().mean().item()
    assert code_rate <= MISMATCH_TOL["codes"] and scale_rate <= MISMATCH_TOL["scales"]
    deq, ref = dequantize_mxfp4_ref(q, torch.float64).cpu(), dequantize_mxfp4_ref(r, torch.float64)
    step = ref.reshape(256, -1, 32).abs().amax(-1, keepdim=True).expand(-1, -1, 32).reshape(256, -1) / 2
    assert ((deq - ref).abs() <= step).all()


def test_hadamard_of_a_unit_vector_is_flat(device):
    # e_0 in every block transforms to 1/√32 = 2^-2.5 everywhere (H's first row): scale
    # floor(-2.5) - 2 = -5, and 2^-2.5 * 2^5 = 5.66 rounds to the grid's 6.
    x = torch.zeros(2, 64)
    x[:, ::32] = 1.0
    q = hadamard_quantize(x.to(device))
    assert q.scales.eq(127 - 5).all()
    assert dequantize_mxfp4_ref(q).eq(6 * 2.0**-5).all()


# ---- stochastic rounding -------------------------------------------------------------------------


@NAN_INPUT
def test_sr_scales_match_reference_bump_rule(device):
    x = spread_input(64, 256, 3)
    x[:, 0] = 7.9  # saturates at 2^0: SR takes 2^1
    x[5, 100] = float("nan")
    q = hadamard_quantize(x.to(device), hadamard=False, rounding="sr", seed=1)
    assert torch.equal(q.scales.cpu(), quantize_mxfp4_ref(x, "sr").scales)


@pytest.mark.parametrize("hadamard", [False, True], ids=["plain", "hadamard"])
def test_sr_picks_one_of_the_two_neighbours(hadamard, device):
    x = exact_transform_input(64, 128, 4).float()  # the kernel's fp32 transform is the reference's
    q = hadamard_quantize(x.to(device), hadamard=hadamard, rounding="sr", seed=2)
    xt = (block_hadamard_ref(x).float() if hadamard else x).double()
    scale = 2.0 ** (q.scales.cpu().double() - 127).repeat_interleave(32, -1)
    grid = torch.tensor(E2M1_VALUES, dtype=torch.float64)
    mag = (xt.abs() / scale).clamp(max=6.0)
    lo = grid[torch.searchsorted(grid, mag, right=True) - 1]
    hi = grid[torch.searchsorted(grid, mag, right=False).clamp(max=7)]
    got = dequantize_mxfp4_ref(q, torch.float64).cpu().abs() / scale
    assert ((got == lo) | (got == hi)).all()
    assert (dequantize_mxfp4_ref(q, torch.float64).cpu() * xt >= 0).all()  # never flips a sign


@pytest.mark.parametrize("hadamard", [False, True], ids=["plain", "hadamard"])
def test_sr_is_unbiased(hadamard, device):
    # 4096 draws of each of 256 values: one tensor, each row a copy (the draws differ by position).
    base = spread_input(4, 64, 5, binades=1.0)
    x = base.repeat(4096, 1)
    q = hadamard_quantize(x.to(device), hadamard=hadamard, rounding="sr", seed=3)
    mean = dequantize_mxfp4_ref(q, torch.float64).cpu().reshape(4096, 4, 64).mean(0)
    target = block_hadamard_ref(base).float().double() if hadamard else base.double()
    spacing = q.scales[:4].cpu().double().sub(127).exp2().repeat_interleave(32, -1) * 2  # top grid step
    # Each draw's error is within one step, so the mean's std is ≤ step / (2 √n); 5 sigma over 256 values.
    tol = 5 * spacing / (2 * math.sqrt(4096))
    assert ((mean - target).abs() <= tol).all()


def test_sr_never_saturates(device):
    x = torch.randn(64, 64)
    x[:, 0] = 7.9  # at scale 2^1, 7.9 lies between 6 and 8
    q = hadamard_quantize(x.to(device), hadamard=False, rounding="sr", seed=4)
    assert set(dequantize_mxfp4_ref(q).cpu()[:, 0].tolist()) == {6.0, 8.0}


def test_sr_draws_depend_on_seed_and_position_only(device, monkeypatch):
    x = spread_input(64, 256, 6).to(device)
    a = hadamard_quantize(x, rounding="sr", seed=11)
    assert_same(hadamard_quantize(x, rounding="sr", seed=11), a)
    assert not torch.equal(hadamard_quantize(x, rounding="sr", seed=12).codes, a.codes)
    if device == "cpu":  # another tile shape must give the same bytes
        monkeypatch.setattr(hq, "_interpreter_blocks", lambda m, k, um, uk: {"BLOCK_M": 32, "BLOCK_K": 64})
        assert_same(hadamard_quantize(x, rounding="sr", seed=11), a)


def test_sr_without_seed_follows_torch_generator(device):
    x = spread_input(32, 64, 8).to(device)
    torch.manual_seed(0)
    a = hadamard_quantize(x, rounding="sr")
    torch.manual_seed(0)
    assert_same(hadamard_quantize(x, rounding="sr"), a)


# ---- FP8 emission, transposition, dual output ----------------------------------------------------


@NAN_INPUT
@pytest.mark.parametrize("transpose", [False, True], ids=["alongK", "alongM"])
def test_emit_fp8_equals_reference_reencoding(transpose, device):
    x = spread_input(128, 256, 9, binades=4.0)  # row exponents span > 14 binades: rounding matters
    x[3, 17] = float("nan")
    q = hadamard_quantize(x.to(device), transpose=transpose, emit_fp8=True)
    fp8, scale = to_fp8_rowwise_ref(q)
    assert torch.equal(q.fp8.view(torch.uint8), fp8.view(torch.uint8))
    assert torch.equal(q.fp8_scale, scale)
    assert_same(q, ops.hadamard_quantize_ref(x.t() if transpose else x))


def test_transpose_equals_quantizing_the_transpose(device):
    x = spread_input(96, 160, 10, torch.bfloat16).to(device)
    assert_same(hadamard_quantize(x, transpose=True, hadamard=False), hadamard_quantize(x.t().contiguous(), hadamard=False))


def test_strided_input_equals_contiguous(device):
    big = spread_input(64, 512, 12).to(device)
    x = big[:, ::2]  # stride (512, 2)
    assert_same(hadamard_quantize(x), hadamard_quantize(x.contiguous()))
    assert_same(hadamard_quantize(big.t(), transpose=True), hadamard_quantize(big))


@pytest.mark.parametrize("rounding", ["rne", "sr"])
@pytest.mark.parametrize("flags", [(True, True), (True, False), (False, True)], ids=["HH", "H-", "-H"])
def test_dual_equals_two_single_calls(rounding, flags, device):
    x = spread_input(128, 96, 13, torch.bfloat16).to(device)
    signs, signs_t = random_signs(96, 1).to(device), random_signs(128, 2).to(device)
    had, had_t = flags
    a, b = hadamard_quantize_dual(x, hadamard=had, hadamard_t=had_t, signs=signs, signs_t=signs_t,
                                  rounding=rounding, seed=5, emit_fp8=True, emit_fp8_t=had_t)
    sa = hadamard_quantize(x, hadamard=had, signs=signs, rounding=rounding, seed=5, emit_fp8=True)
    sb = hadamard_quantize(x, transpose=True, hadamard=had_t, signs=signs_t, rounding=rounding, seed=5, emit_fp8=had_t)
    assert_same(a, sa)
    assert_same(b, sb)
    assert torch.equal(a.fp8.view(torch.uint8), sa.fp8.view(torch.uint8))
    assert (b.fp8 is None) == (not had_t)


@pytest.mark.parametrize("rows", [200, 224], ids=lambda r: f"rows{r}")
def test_programs_of_several_tiles_match_reference(rows, device, monkeypatch):
    # 32-row tiles over several programs: 200 rows end in a partial tile (masked rows), 224 in a
    # whole one.
    if device == "cpu":
        monkeypatch.setattr(hq, "_interpreter_blocks", lambda m, k, um, uk: {"BLOCK_M": 32, "BLOCK_K": 64})
    x = exact_transform_input(rows, 128, rows)
    assert_same(hadamard_quantize(x.to(device), hadamard=False), quantize_mxfp4_ref(x))
    assert_same(hadamard_quantize(x.to(device)), ops.hadamard_quantize_ref(x))
    if rows % 32 == 0:
        a, b = hadamard_quantize_dual(x.to(device))
        assert_same(a, ops.hadamard_quantize_ref(x))
        assert_same(b, ops.hadamard_quantize_ref(x.t()))


def test_empty_rows_give_empty_outputs(device):
    q = hadamard_quantize(torch.zeros(0, 64, device=device))
    assert q.codes.shape == (0, 32) and q.scales.shape == (0, 2)


# ---- public op -----------------------------------------------------------------------------------


def test_ops_dual_triton_equals_reference(device):
    x = exact_transform_input(64, 128, 14).to(device)
    got = ops.hadamard_quantize_dual(x, hadamard_t=False, emit_fp8=True, backend="triton")
    ref = ops.hadamard_quantize_dual(x.cpu(), hadamard_t=False, emit_fp8=True, backend="reference")
    for g, r in zip(got, ref):
        assert_same(g, r)
    assert torch.equal(got[0].fp8.cpu().view(torch.uint8), ref[0].fp8.view(torch.uint8))


def test_ops_dual_reference_is_two_single_references():
    x = spread_input(64, 96, 15)
    a, b = ops.hadamard_quantize_dual(x, hadamard=False, backend="reference")
    assert_same(a, ops.hadamard_quantize(x, hadamard=False, backend="reference"))
    assert_same(b, ops.hadamard_quantize(x, transpose=True, backend="reference"))


def test_ops_dual_checks_both_dimensions():
    with pytest.raises(ValueError, match="x.T"):
        ops.hadamard_quantize_dual(torch.zeros(48, 64), backend="reference")


# ---- bad inputs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,shape,match",
    [
        ({}, (4, 48), "K=48 is not a multiple of the MX block size 32"),
        ({"transpose": True}, (100, 64), "M=100 is not a multiple of the MX block size 32"),
        ({"hadamard_size": 64}, (4, 96), "K=96 is not a multiple of the Hadamard size 64"),
        ({"hadamard_size": 8}, (4, 64), "Hadamard sizes"),
        ({}, (4, 2, 32), "must be 2-D"),
        ({}, (32,), "must be 2-D"),
        ({"rounding": "nearest"}, (4, 32), "rounding must be"),
        ({"rounding": "sr", "seed": -1}, (4, 32), "seed must be"),
        ({"rounding": "sr", "seed": 2**62}, (4, 32), "seed must be"),
        ({"nan_policy": "ignore"}, (4, 32), "nan_policy must be"),
    ],
    ids=["K48", "transposed-M100", "K96-H64", "H8", "rank3", "rank1", "rounding", "seed-neg", "seed-big", "nan-policy"],
)
def test_bad_arguments_raise(kwargs, shape, match, device):
    with pytest.raises(ValueError, match=match):
        hadamard_quantize(torch.ones(shape, device=device), **kwargs)


def test_dual_needs_both_dimensions_divisible(device):
    with pytest.raises(ValueError, match="M=48 is not a multiple"):
        hadamard_quantize_dual(torch.ones(48, 64, device=device))


def test_integer_dtype_raises(device):
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        hadamard_quantize(torch.ones(4, 32, dtype=torch.int32, device=device))


def test_non_tensor_raises():
    with pytest.raises(TypeError, match="torch.Tensor"):
        hadamard_quantize([[1.0] * 32])


@pytest.mark.parametrize(
    "signs,match",
    [(torch.ones(31), r"shape \(32,\)"), (torch.ones(32, dtype=torch.int32), "floating"), ("ones", r"shape \(32,\)")],
    ids=["length", "dtype", "type"],
)
def test_bad_signs_raise(signs, match, device):
    if isinstance(signs, torch.Tensor):
        signs = signs.to(device)
    with pytest.raises(ValueError, match=match):
        hadamard_quantize(torch.ones(4, 32, device=device), signs=signs)


@NAN_INPUT
def test_nan_policy_raise_names_the_problem(device):
    x = torch.ones(2, 32)
    x[1, 3] = float("inf")
    with pytest.raises(ValueError, match="NaN or Inf"):
        hadamard_quantize(x.to(device), nan_policy="raise")


def test_cpu_tensor_without_interpreter_raises(monkeypatch):
    import adahop_kernels._common as common

    monkeypatch.setattr(common, "INTERPRETED", False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        hadamard_quantize(torch.ones(4, 32))


# ---- quantize(): in-kernel FP8 operands, amax, seeds -----------------------------------------------

LAYOUTS = ("row", "seg128", "tile128")


def u8(t):
    return t.view(torch.uint8).cpu()


def reference_side(x, side, along, hadamard_size=32):
    """(MXFP4 reference, (fp8, scale) reference, amax reference) of one orientation, RNE, on the CPU."""
    xo = (x if along == "K" else x.t()).cpu()
    signs = None if side.signs is None else side.signs.cpu()
    q = ops.hadamard_quantize_ref(xo, side.hadamard, hadamard_size, signs)
    return q, to_fp8_ref(q, side.fp8) if side.fp8 else None, xo.float().abs().amax(1)


def assert_side_equals_reference(out, side, x, along, hadamard_size=32):
    q, fp8_ref, amax_ref = reference_side(x, side, along, hadamard_size)
    if side.packed:
        assert_same(MXFP4Tensor(out.codes, out.scales), q)
    else:
        assert out.codes is None and out.scales is None
    if side.fp8:
        assert torch.equal(u8(out.fp8), u8(fp8_ref[0])), "fp8 bytes differ"
        assert torch.equal(out.fp8_scale.cpu(), fp8_ref[1]) and out.fp8_scale.stride() == fp8_ref[1].stride()
    else:
        assert out.fp8 is None and out.fp8_scale is None
    if side.amax:
        assert torch.equal(out.amax.cpu().nan_to_num(-1.0), amax_ref.nan_to_num(-1.0)), "amax differs"
    else:
        assert out.amax is None


def group_span_input(rows, k, seed, span, dtype=torch.bfloat16):
    """bf16 values in [2^-8, 8) times a per-block power of two: blocks of a 128-group (and of a row)
    span up to ``span`` binades, and every Hadamard sum stays exact (a block's values share a binade
    range of 11)."""
    g = torch.Generator().manual_seed(seed)
    x = exact_transform_input(rows, k, seed).float()
    e = torch.randint(-span // 2, span - span // 2 + 1, (rows, k // 128, 1), generator=g).float()
    return (x * torch.exp2(e).expand(-1, -1, 128).reshape(rows, k)).to(dtype)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("along", ["K", "M"], ids=["alongK", "alongM"])
@pytest.mark.parametrize("hadamard", [False, True], ids=["plain", "hadamard"])
def test_quantize_fp8_equals_reference(layout, along, hadamard, device):
    x = group_span_input(256, 384, 1, span=6)
    side = Side(hadamard, None, fp8=layout, amax=True)
    out_k, out_m = quantize(x.to(device), side if along == "K" else None, side if along == "M" else None)
    assert (out_m if along == "K" else out_k) is None
    assert_side_equals_reference(out_k if along == "K" else out_m, side, x, along)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_fp8_times_scale_is_the_mxfp4_value(layout, device):
    # Row spans of 20 binades, 128-group spans of at most 14: exact for seg128 and tile128 (only the
    # rowwise encoding rounds the small blocks, as its reference does).
    x = spread_input(256, 512, 2, binades=1.0)
    x = x * torch.exp2(torch.arange(4).repeat_interleave(128) * 5.0 - 10)
    out, _ = quantize(x.to(device), Side(False, None, fp8=layout), None)
    q = MXFP4Tensor(out.codes.cpu(), out.scales.cpu())
    back = out.fp8.cpu().double() * fp8_group_scale(out.fp8_scale.cpu(), layout, (256, 512)).double()
    deq = dequantize_mxfp4_ref(q, torch.float64)
    if layout == "row":
        assert not torch.equal(back, deq)  # the input's point: a row spans more than E4M3 keeps
        fp8, scale = to_fp8_rowwise_ref(q)
        assert torch.equal(back, fp8.double() * scale.double())
    else:
        assert torch.equal(back, deq)


@pytest.mark.parametrize(
    "rows,n,layout",
    [(127, 128, "seg128"), (129, 384, "seg128"), (1, 640, "seg128"), (128, 128, "tile128"), (384, 256, "tile128"),
     (128, 640, "tile128")],
    ids=lambda v: str(v),
)
def test_fp8_boundary_shapes(rows, n, layout, device):
    x = group_span_input(rows, n, rows + n, span=10, dtype=torch.float32)
    side = Side(True, None, fp8=layout)
    out, _ = quantize(x.to(device), side, None)
    assert_side_equals_reference(out, side, x, "K")


@NAN_INPUT
@pytest.mark.parametrize("layout", ["seg128", "tile128"])
@pytest.mark.parametrize("along", ["K", "M"], ids=["alongK", "alongM"])
def test_fp8_nan_inf_zero_and_wide_groups(layout, along, device):
    # NaN and Inf blocks (E4M3 NaN, not counted in R), all-zero blocks and groups, a group whose only
    # finite block is zero, and groups spanning 12-20 binades: the byte-wise and the code-by-code
    # encodings, and E4M3's rounding of the small blocks, bit for bit against the reference.
    x = group_span_input(256, 256, 3, span=4, dtype=torch.float32)
    x[:, :32] = x[:, :32] * 2.0**13  # block 0 of every segment in column group 0: 13+ binades up
    x[0:2, 128:256] = x[0:2, 128:256] * 2.0**-20
    x[0, 130:134] = 2.0**5  # one block 20+ binades above its neighbours
    x[3, 40] = float("nan")
    x[4, 200] = float("inf")
    x[5:7] = 0.0
    x[7, :] = 0.0
    x[7, 0] = float("-inf")
    x = x if along == "K" else x.t().contiguous()
    side = Side(False, None, fp8=layout, amax=True)
    out_k, out_m = quantize(x.to(device), side if along == "K" else None, side if along == "M" else None)
    out = out_k if along == "K" else out_m
    assert_side_equals_reference(out, side, x, along)
    q, _, _ = reference_side(x, side, along)
    nan_blocks = (q.scales == E8M0_NAN).repeat_interleave(32, 1)
    assert nan_blocks.any() and out.fp8.cpu().float()[nan_blocks].isnan().all()
    assert not out.fp8.cpu().float()[~nan_blocks].isnan().any()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_dual_fp8_and_amax_equal_single_calls(dtype, device):
    x = spread_input(256, 384, 4, dtype, binades=2.0).to(device)
    signs, signs_t = random_signs(384, 3).to(device), random_signs(256, 4).to(device)
    kside = Side(True, signs, packed=False, fp8="seg128", amax=True)
    mside = Side(True, signs_t, fp8="tile128", amax=True)
    a, b = quantize(x, kside, mside, rounding="sr", seed=9)
    a1, _ = quantize(x, kside, None, rounding="sr", seed=9)
    _, b1 = quantize(x, None, mside, rounding="sr", seed=9)
    for got, single in ((a, a1), (b, b1)):
        for name in SideOut_FIELDS:
            g, r = getattr(got, name), getattr(single, name)
            assert (g is None) == (r is None), name
            if g is not None:
                assert torch.equal(g.view(torch.uint8) if g.dtype == torch.float8_e4m3fn else g,
                                   r.view(torch.uint8) if r.dtype == torch.float8_e4m3fn else r), name
    # SR: the in-kernel FP8 encodes the same draws as the packed codes, and packed=False changes no byte.
    assert torch.equal(u8(b.fp8), u8(to_fp8_ref(MXFP4Tensor(b.codes.cpu(), b.scales.cpu()), "tile128")[0]))
    a2, _ = quantize(x, Side(True, signs, fp8="seg128"), None, rounding="sr", seed=9)
    assert torch.equal(u8(a.fp8), u8(a2.fp8))
    assert torch.equal(u8(a.fp8), u8(to_fp8_ref(MXFP4Tensor(a2.codes.cpu(), a2.scales.cpu()), "seg128")[0]))


SideOut_FIELDS = ("codes", "scales", "fp8", "fp8_scale", "amax")


def test_layer_steps_equal_reference(device):
    # The layer's three quantize steps (RNE): X (seg128 along K, packed along M), W (tile128 both ways).
    x = group_span_input(256, 256, 5, span=8)
    steps = [(Side(True, None, packed=False, fp8="seg128"), Side(True, None)),
             (Side(True, None, packed=False, fp8="tile128"), Side(True, None, packed=False, fp8="tile128"))]
    for kside, mside in steps:
        a, b = quantize(x.to(device), kside, mside)
        assert_side_equals_reference(a, kside, x, "K")
        assert_side_equals_reference(b, mside, x, "M")


def test_fp8_reencode_of_saved_copy_equals_in_kernel_fp8(device):
    # The backward re-encodes the packed copy it saved: the same operand as the quantizer's own FP8.
    x = spread_input(256, 256, 6, torch.bfloat16, binades=2.0).to(device)
    for layout in LAYOUTS:
        out, _ = quantize(x, Side(True, None, fp8=layout), None, rounding="sr", seed=3)
        fp8, scale = fp8_reencode(MXFP4Tensor(out.codes, out.scales), layout)
        assert torch.equal(u8(fp8), u8(out.fp8)) and torch.equal(scale, out.fp8_scale)


def test_results_do_not_depend_on_the_tile_shape(device, monkeypatch):
    x = spread_input(256, 512, 7, torch.bfloat16, binades=3.0).to(device)
    x[1, 1] = 3e38  # the overflow path too
    sides = (Side(True, None, fp8="tile128", amax=True), Side(True, None, fp8="seg128", amax=True))
    a = quantize(x, *sides, rounding="sr", seed=4)
    if device == "cpu":
        monkeypatch.setattr(hq, "_interpreter_blocks", lambda m, k, um, uk: {"BLOCK_M": 128, "BLOCK_K": 128})
    b = quantize(x, *sides, rounding="sr", seed=4)
    for oa, ob in zip(a, b):
        for name in SideOut_FIELDS:
            ga, gb = getattr(oa, name), getattr(ob, name)
            assert torch.equal(ga.view(torch.uint8) if ga.dtype == torch.float8_e4m3fn else ga,
                               gb.view(torch.uint8) if gb.dtype == torch.float8_e4m3fn else gb), name


@NAN_INPUT
def test_amax_is_row_absmax_across_programs(device, monkeypatch):
    # Several programs share each output row (atomic max); NaN rows stay NaN, -0 and negatives count by |x|.
    if device == "cpu":
        monkeypatch.setattr(hq, "_interpreter_blocks", lambda m, k, um, uk: {"BLOCK_M": 64, "BLOCK_K": 64})
    x = spread_input(192, 256, 8, torch.bfloat16)
    x[3, 200] = float("nan")
    x[4, :] = -0.0
    x[5, 255] = -1e30
    a, b = quantize(x.to(device), Side(False, None, packed=False, amax=True), Side(False, None, packed=False, amax=True))
    for out, ref in ((a, x.float().abs().amax(1)), (b, x.float().abs().amax(0))):
        assert torch.equal(out.amax.cpu().nan_to_num(-1.0), ref.nan_to_num(-1.0))
        assert out.codes is None and out.fp8 is None


# ---- seeds ---------------------------------------------------------------------------------------


def test_tensor_seed_equals_int_seed(device):
    x = spread_input(128, 256, 9).to(device)
    sides = (Side(True, None, fp8="seg128"), Side(True, None))
    a = quantize(x, *sides, rounding="sr", seed=12345)
    b = quantize(x, *sides, rounding="sr", seed=torch.tensor([12345], device=device))
    for oa, ob in zip(a, b):
        assert torch.equal(oa.codes, ob.codes) and torch.equal(u8(oa.fp8) if oa.fp8 is not None else oa.scales,
                                                             u8(ob.fp8) if ob.fp8 is not None else ob.scales)
    c = quantize(x, *sides, rounding="sr", seed=torch.tensor([12346], device=device))
    assert not torch.equal(c[0].codes, a[0].codes)
    big = quantize(x, *sides, rounding="sr", seed=2**40 + 7)
    assert torch.equal(big[1].codes, quantize(x, *sides, rounding="sr", seed=torch.tensor([2**40 + 7], device=device))[1].codes)


def test_along_m_stream_is_distinct_from_along_k(device):
    # The same operand quantized along K from x.T and along M from x: same positions, other stream.
    x = spread_input(128, 128, 10).to(device)
    _, m = quantize(x, None, Side(False, None), rounding="sr", seed=5)
    k, _ = quantize(x.t().contiguous(), Side(False, None), None, rounding="sr", seed=5)
    assert torch.equal(m.scales, k.scales) and not torch.equal(m.codes, k.codes)


# ---- sums past the fp32 range --------------------------------------------------------------------


def huge_input(rows, k, seed, dtype, size=32):
    """Small integers times 2^100..2^126 (one exponent a 128-group: every ±1 sum exact), and rows of
    fp32-max, 2^120 and 2^127 blocks: ±1 sums from ~1e37 up overflow fp32 before the 1/√HS factor.
    Row 3's first Hadamard group (``size``) holds two equal values half a group apart: an overflowing
    sum in its first half, exact zeros in its second (for size >= 64, whole MX blocks of them)."""
    g = torch.Generator().manual_seed(seed)
    e = torch.randint(100, 127, (rows, k // 128, 1), generator=g).float()
    x = torch.randint(-8, 9, (rows, k), generator=g).float() * torch.exp2(e).expand(-1, -1, 128).reshape(rows, k)
    x[0, :32] = torch.finfo(torch.float32).max
    x[1, :32] = 2.0**120
    x[2, :32] = 0.0
    x[2, :2] = 2.0**127
    x[3, :size] = 0.0
    x[3, 0] = x[3, size // 2] = 1.5 * 2.0**127
    return x.to(dtype)


@NAN_INPUT
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("size", [16, 32, 64, 128], ids=lambda s: f"H{s}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("transpose", [False, True], ids=["alongK", "alongM"])
def test_huge_blocks_decide_as_the_reference(size, dtype, transpose, device):
    x = huge_input(64, 512, size, dtype, size)
    x = x.t().contiguous() if transpose else x
    q = hadamard_quantize(x.to(device), transpose=transpose, hadamard_size=size)
    r = ops.hadamard_quantize_ref(x.t() if transpose else x, hadamard_size=size)
    assert_same(q, r)
    finite = r.scales != E8M0_NAN
    assert finite.any() and (~finite).any()  # both the reference's overflow and finite huge blocks
    assert (r.scales[finite].int() > 127 + 100).any()


@NAN_INPUT
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_huge_blocks_with_sr_and_fp8(device):
    x = huge_input(128, 256, 1, torch.bfloat16)
    out, _ = quantize(x.to(device), Side(True, None, fp8="tile128"), None, rounding="sr", seed=2)
    r = ops.hadamard_quantize_ref(x, rounding="sr", seed=2)
    assert torch.equal(out.scales.cpu(), r.scales)  # SR's scale decisions, bump included
    assert torch.equal(u8(out.fp8), u8(to_fp8_ref(MXFP4Tensor(out.codes.cpu(), out.scales.cpu()), "tile128")[0]))


@NAN_INPUT
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("cols,fp8", [(416, None), (384, "seg128")], ids=["partial", "fp8"])
def test_bad_blocks_in_edge_squares_are_redone(cols, fp8, dtype, device):
    # The fast kernel marks the 128x128 square of each bad block and the redo kernel redoes it: bad
    # blocks in the partial squares at the bottom edge (160 rows) and, with 416 columns, the right
    # edge, in an inner square, and beside good blocks of the same square, in a dual call, against
    # the reference.
    x = spread_input(160, cols, 7, torch.float32, binades=2.0)
    x[150, cols - 16] = float("nan")  # the bottom-right square
    x[140, 5] = float("inf")  # bottom edge
    x[10, 288:320] = torch.finfo(torch.float32).max  # ±1 sums past the fp32 range
    x[70, 130] = -float("inf")  # an inner square
    x = x.to(dtype)
    kside = Side(True, None, packed=True, fp8=fp8, amax=True)
    mside = Side(True, None, packed=True)
    out_k, out_m = quantize(x.to(device), kside, mside)
    assert_side_equals_reference(out_k, kside, x, "K")
    assert_side_equals_reference(out_m, mside, x, "M")
    assert (out_k.scales.cpu() == E8M0_NAN).any() and (out_k.scales.cpu() != E8M0_NAN).any()


# ---- quantize(): bad requests --------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape,along_k,along_m,kwargs,error,match",
    [
        ((128, 96), Side(False, None, fp8="seg128"), None, {}, ValueError, r"'seg128' needs the quantized dimension \(96\)"),
        ((96, 128), None, Side(False, None, fp8="seg128"), {}, ValueError, r"along M .*'seg128' needs the quantized dimension \(96\)"),
        ((64, 128), Side(False, None, fp8="tile128"), None, {}, ValueError, r"'tile128' needs the rows \(64\)"),
        ((128, 96), None, Side(False, None, fp8="tile128"), {}, ValueError, r"'tile128' needs the rows \(96\)"),
        ((128, 128), Side(False, None, fp8="col"), None, {}, ValueError, "layout must be one of"),
        ((128, 128), Side(False, None, packed=False), None, {}, ValueError, "along_k asks for no output"),
        ((128, 128), None, None, {}, ValueError, "needs along_k, along_m or both"),
        ((128, 128), (False, None), None, {}, TypeError, "along_k must be a Side"),
        ((128, 128), Side(False, None), None, {"rounding": "sr", "seed": torch.tensor([1], dtype=torch.int32)},
         ValueError, "int64 of shape"),
        ((128, 128), Side(False, None), None, {"rounding": "sr", "seed": torch.tensor([1, 2])}, ValueError, "int64 of shape"),
        ((128, 128), Side(False, None), None, {"rounding": "sr", "seed": 1.5}, ValueError, "seed must be an int"),
    ],
    ids=["seg-K96", "seg-M96", "tile-rows64", "tile-rows96", "layout", "no-output", "no-side", "tuple", "seed-i32",
         "seed-shape", "seed-float"],
)
def test_quantize_bad_requests_raise(shape, along_k, along_m, kwargs, error, match, device):
    with pytest.raises(error, match=match):
        quantize(torch.ones(shape, device=device), along_k, along_m, **kwargs)


def test_seed_tensor_on_another_device_raises(device):
    with pytest.raises(ValueError, match="seed tensor is on meta"):
        quantize(torch.ones(32, 32, device=device), Side(False, None), None, rounding="sr",
                 seed=torch.tensor([1], device="meta"))
