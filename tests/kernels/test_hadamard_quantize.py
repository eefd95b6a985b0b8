"""Fused block-Hadamard + MXFP4 quantize kernel against the reference (adahop.formats / adahop.ops).

Tiers: bit-exact for every decision the quantizer makes (no transform, so no rounding before it);
the Hadamard path bit-exact where its fp32 transform is exact, and within a stated mismatch rate
of the fp64 path where it is not; stochastic rounding by its support and its mean over many draws;
FP8 emission, the transposing and dual variants, and the launcher's errors.
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
    dequantize_mxfp4_ref,
    quantize_mxfp4_ref,
    to_fp8_rowwise_ref,
    unpack_e2m1,
)
from adahop.hadamard import block_hadamard_ref, random_signs
from adahop_kernels.hadamard_quantize import hadamard_quantize, hadamard_quantize_dual

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
    # 32-row tiles, two a program (the prefetching loop): 200 rows end in a partial tile of a
    # program's first half, 224 rows leave the last program one whole tile and no second one.
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
