"""Bit-exact tier of the MXFP4 reference (adahop.formats): one behaviour per test."""

import math

import pytest
import torch

from adahop.formats import (
    BLOCK_SIZE,
    E2M1_VALUES,
    E8M0_NAN,
    MXFP4Tensor,
    dequantize_mxfp4_ref,
    e2m1_to_float,
    fp8_group_scale,
    pack_e2m1,
    quantize_mxfp4_ref,
    to_fp8_ref,
    to_fp8_rowwise_ref,
    unpack_e2m1,
)


def brute_force_rne(x: torch.Tensor) -> torch.Tensor:
    """Independent fp64 oracle: nearest grid value by search, ties to the even code, per block."""
    blocks = x.double().reshape(-1, BLOCK_SIZE)
    out = torch.empty_like(blocks)
    for r, block in enumerate(blocks):
        amax = block.abs().max().item()
        e = max(math.floor(math.log2(amax)) - 2, -127) if amax > 0 else -127
        for c, v in enumerate(block.tolist()):
            s = abs(v) / 2.0**e
            dists = [abs(s - g) for g in E2M1_VALUES]
            best = min(dists)
            cands = [i for i, d in enumerate(dists) if d == best]
            i = cands[0] if len(cands) == 1 else next(i for i in cands if i % 2 == 0)
            if s > 6:
                i = 7
            out[r, c] = math.copysign(E2M1_VALUES[i], v) * 2.0**e
    return out.reshape(x.shape)


def test_scale_is_floor_log2_amax_minus_2():
    x = torch.zeros(4, 32)
    x[0, 3], x[1, 0], x[2, 7], x[3, 31] = 1.0, 7.99, -0.3, 2.0**-100
    q = quantize_mxfp4_ref(x)
    assert q.scales.flatten().tolist() == [127 - 2, 127 + 2 - 2, 127 - 2 - 2, 127 - 100 - 2]


def test_codes_match_brute_force_oracle():
    torch.manual_seed(0)
    x = torch.randn(16, 128) * torch.logspace(-3, 3, 128)
    assert torch.equal(dequantize_mxfp4_ref(quantize_mxfp4_ref(x), torch.float64), brute_force_rne(x))


@pytest.mark.parametrize(
    "scaled,expected",
    [(0.25, 0.0), (0.75, 1.0), (1.25, 1.0), (1.75, 2.0), (2.5, 2.0), (3.5, 4.0), (5.0, 4.0)],
    ids=lambda v: str(v),
)
def test_ties_to_even(scaled, expected):
    x = torch.zeros(1, 32)
    x[0, 0] = 4.0  # fixes the scale at 2^0
    x[0, 1], x[0, 2] = scaled, -scaled
    deq = dequantize_mxfp4_ref(quantize_mxfp4_ref(x))
    assert deq[0, 1].item() == expected and deq[0, 2].item() == -expected


def test_saturates_at_six():
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1] = 7.9, -7.0  # scale 2^0: 7.9 and 7 exceed the grid
    deq = dequantize_mxfp4_ref(quantize_mxfp4_ref(x))
    assert deq[0, :2].tolist() == [6.0, -6.0]


def test_zero_block_has_scale_byte_zero_and_zero_codes():
    q = quantize_mxfp4_ref(torch.zeros(3, 64))
    assert q.scales.eq(0).all() and q.codes.eq(0).all()
    assert dequantize_mxfp4_ref(q).eq(0).all()


def test_negative_zero_is_code_zero():
    x = torch.full((1, 32), -0.0)
    x[0, 0] = 1.0
    x[0, 1] = -0.01  # rounds to zero
    q = quantize_mxfp4_ref(x)
    assert unpack_e2m1(q.codes)[0, 1:].eq(0).all()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
def test_nonfinite_block_gets_nan_scale_and_only_that_block(bad):
    x = torch.ones(2, 64)
    x[1, 40] = bad
    q = quantize_mxfp4_ref(x)
    assert q.scales.tolist() == [[125, 125], [125, E8M0_NAN]]
    deq = dequantize_mxfp4_ref(q)
    assert deq[1, 32:].isnan().all() and deq[1, :32].eq(1).all() and deq[0].eq(1).all()


def test_nan_policy_raise_names_the_problem():
    x = torch.ones(1, 32)
    x[0, 5] = float("nan")
    with pytest.raises(ValueError, match="NaN or Inf"):
        quantize_mxfp4_ref(x, nan_policy="raise")


def test_tiny_values_clamp_to_smallest_scale():
    x = torch.zeros(1, 32)
    x[0, 0] = 2.0**-130  # subnormal amax: scale byte 0 = 2^-127, value rounds to 0
    x[0, 1] = torch.finfo(torch.float32).tiny  # 2^-126 = 2 * 2^-127 exactly
    q = quantize_mxfp4_ref(x)
    assert q.scales.item() == 0
    assert dequantize_mxfp4_ref(q)[0, :2].tolist() == [0.0, 2.0**-126]


def test_largest_finite_input():
    x = torch.full((1, 32), torch.finfo(torch.float32).max)
    q = quantize_mxfp4_ref(x)
    assert q.scales.item() == 254 - 2
    assert dequantize_mxfp4_ref(q, torch.float64)[0, 0].item() == 6.0 * 2.0**125


def test_packing_low_nibble_first():
    codes = torch.tensor([[1, 2, 15, 0]], dtype=torch.uint8)
    packed = pack_e2m1(codes)
    assert packed.tolist() == [[0x21, 0x0F]]
    assert torch.equal(unpack_e2m1(packed), codes)


def test_e2m1_code_values():
    assert e2m1_to_float(torch.arange(16, dtype=torch.uint8)).tolist() == list(E2M1_VALUES) + [
        -v for v in E2M1_VALUES
    ]


@pytest.mark.parametrize("k", [31, 48, 100], ids=lambda k: f"K{k}")
def test_last_dim_not_multiple_of_32_raises(k):
    with pytest.raises(ValueError, match="not a multiple of the MX block size 32"):
        quantize_mxfp4_ref(torch.randn(4, k))


def test_integer_dtype_raises():
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        quantize_mxfp4_ref(torch.ones(2, 32, dtype=torch.int32))


@pytest.mark.parametrize("rows", [127, 128, 129], ids=lambda r: f"rows{r}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_roundtrip_error_bound(rows, dtype):
    torch.manual_seed(rows)
    x = torch.randn(rows, 256).to(dtype)
    deq = dequantize_mxfp4_ref(quantize_mxfp4_ref(x), torch.float64)
    xd = x.double().reshape(rows, -1, 32)
    # Per block: error <= half the grid spacing at the top (1.0 * 2^e) = amax / 4 at worst.
    bound = xd.abs().amax(-1, keepdim=True) / 4
    assert ((deq.reshape_as(xd) - xd).abs() <= bound).all()


def test_stochastic_rounding_is_unbiased():
    torch.manual_seed(0)
    x = torch.randn(4, 64).repeat(4096, 1)  # 4096 draws of each of 256 values
    gen = torch.Generator().manual_seed(1)
    deq = dequantize_mxfp4_ref(quantize_mxfp4_ref(x, "sr", gen), torch.float64)
    mean = deq.reshape(4096, 4, 64).mean(0)
    spacing = (x[:4].double().reshape(4, 2, 32).abs().amax(-1, keepdim=True) / 2).expand(4, 2, 32).reshape(4, 64)
    # The mean of n draws has std <= spacing / (2 sqrt(n)); 5 sigma over 256 values.
    tol = 5 * spacing / (2 * math.sqrt(4096))
    assert ((mean - x[:4].double()).abs() <= tol).all()


def test_stochastic_rounding_picks_a_neighbour_and_never_saturates():
    torch.manual_seed(0)
    x = torch.randn(64, 64)
    x[:, 0] = 7.9  # at scale 2^0 this saturates; SR takes scale 2^1, where 7.9 lies between 6 and 8
    q = quantize_mxfp4_ref(x, "sr", torch.Generator().manual_seed(0))
    deq = dequantize_mxfp4_ref(q, torch.float64)
    assert set(deq[:, 0].tolist()) == {6.0, 8.0}
    # Every element lands on one of its two neighbouring grid points: error < one grid step.
    step = x.double().reshape(64, 2, 32).abs().amax(-1, keepdim=True).repeat_interleave(32, -1) / 2
    assert ((deq - x.double()).abs() < step.reshape(64, 64)).all()


def blocks_with_exponents(rows: int, exponents: list[int]) -> torch.Tensor:
    """Random blocks whose MX scale exponents are exactly ``exponents`` (amax = 4 * 2^e)."""
    x = torch.rand(rows, 32 * len(exponents)) * 8 - 4
    x[:, ::32] = 4.0
    return x * (2.0 ** torch.tensor(exponents, dtype=torch.float32)).repeat_interleave(32)


def test_fp8_reencoding_is_exact_within_14_binades():
    torch.manual_seed(0)
    x = blocks_with_exponents(8, list(range(-7, 8)))  # block exponents span 14 binades
    q = quantize_mxfp4_ref(x)
    fp8, scale = to_fp8_rowwise_ref(q)
    assert torch.equal(fp8.double() * scale.double(), dequantize_mxfp4_ref(q, torch.float64))


def test_fp8_reencoding_loses_only_tiny_blocks_beyond_14_binades():
    torch.manual_seed(0)
    x = blocks_with_exponents(8, list(range(-12, 8)))  # 19 binades
    q = quantize_mxfp4_ref(x)
    fp8, scale = to_fp8_rowwise_ref(q)
    deq = dequantize_mxfp4_ref(q, torch.float64)
    err = (fp8.double() * scale.double() - deq).abs()
    assert torch.equal(err[:, 32 * 5:], torch.zeros_like(err[:, 32 * 5:]))  # top 15 binades exact
    assert err.max() <= 2.0**-10 * deq.abs().max()  # lost bits sit below E4M3's subnormal step


def test_fp8_reencoding_nan_block_is_nan():
    x = torch.ones(2, 64)
    x[0, 0] = float("nan")
    fp8, scale = to_fp8_rowwise_ref(quantize_mxfp4_ref(x))
    assert fp8[0, :32].float().isnan().all() and not fp8[0, 32:].float().isnan().any()
    assert torch.equal(fp8[1].float() * scale[1], torch.ones(64))


def test_nbytes_is_4_25_bits_per_value():
    q = quantize_mxfp4_ref(torch.randn(64, 256))
    assert q.nbytes() * 8 / (64 * 256) == 4.25
    assert isinstance(q, MXFP4Tensor) and q.shape == (64, 256)


# ---- FP8 scale groups: to_fp8_ref ----------------------------------------------------------------


def test_to_fp8_ref_row_is_the_rowwise_encoding():
    q = quantize_mxfp4_ref(blocks_with_exponents(4, list(range(-12, 8))))
    fp8, scale = to_fp8_ref(q, "row")
    ref_fp8, ref_scale = to_fp8_rowwise_ref(q)
    assert torch.equal(fp8.view(torch.uint8), ref_fp8.view(torch.uint8)) and torch.equal(scale, ref_scale)


@pytest.mark.parametrize("layout,shape,stride", [("seg128", (256, 4), (1, 256)), ("tile128", (2, 4), (4, 1))])
def test_to_fp8_ref_scale_layout(layout, shape, stride):
    _, scale = to_fp8_ref(quantize_mxfp4_ref(torch.randn(256, 512)), layout)
    assert scale.shape == shape and scale.stride() == stride and scale.dtype == torch.float32


@pytest.mark.parametrize("layout", ["seg128", "tile128"])
def test_to_fp8_ref_exact_when_each_group_spans_14_binades(layout):
    # A row spans 14 + 3·10 binades, each 128-group at most 14: exact per group, not per row.
    torch.manual_seed(0)
    exps = [e + 10 * (i // 4) - 20 for i, e in enumerate([-7, 7, 0, 3] * 4)]
    q = quantize_mxfp4_ref(blocks_with_exponents(128, exps))
    fp8, scale = to_fp8_ref(q, layout)
    deq = dequantize_mxfp4_ref(q, torch.float64)
    assert torch.equal(fp8.double() * fp8_group_scale(scale, layout, q.shape).double(), deq)
    fp8_row, scale_row = to_fp8_rowwise_ref(q)
    assert not torch.equal(fp8_row.double() * scale_row.double(), deq)


def test_to_fp8_ref_groups_are_independent():
    # Changing one 128-group's blocks leaves every other group's bytes and scales unchanged.
    torch.manual_seed(1)
    x = torch.randn(128, 256)
    y = x.clone()
    y[:, :128] *= 2.0**20
    for layout in ("seg128", "tile128"):
        (fx, sx), (fy, sy) = to_fp8_ref(quantize_mxfp4_ref(x), layout), to_fp8_ref(quantize_mxfp4_ref(y), layout)
        assert torch.equal(fx[:, 128:].view(torch.uint8), fy[:, 128:].view(torch.uint8))
        assert torch.equal(sx[:, 1:], sy[:, 1:]) and not torch.equal(sx[:, :1], sy[:, :1])


def test_to_fp8_ref_beyond_14_binades_loses_only_tiny_blocks_of_the_group():
    torch.manual_seed(2)
    q = quantize_mxfp4_ref(blocks_with_exponents(128, [7, -13, 0, 1]))  # one segment spans 20 binades
    fp8, scale = to_fp8_ref(q, "seg128")
    err = (fp8.double() * fp8_group_scale(scale, "seg128", q.shape).double() - dequantize_mxfp4_ref(q, torch.float64)).abs()
    assert err[:, 32:64].max() > 0 and err[:, :32].eq(0).all() and err[:, 64:].eq(0).all()
    assert err.max() <= 2.0**-10 * dequantize_mxfp4_ref(q, torch.float64).abs().max()


def test_to_fp8_ref_nan_block_is_nan_and_sets_no_scale():
    x = torch.ones(128, 256)
    x[0, 0] = float("nan")
    x[:, 32:64] = 2.0**10  # the second block sets R of the first segment, also in row 0
    for layout in ("seg128", "tile128"):
        fp8, scale = to_fp8_ref(quantize_mxfp4_ref(x), layout)
        assert fp8[0, :32].float().isnan().all() and not fp8[1:].float().isnan().any()
        assert scale[0, 0].item() == 2.0 ** (10 - 2 - 6)


@pytest.mark.parametrize(
    "shape,layout,match",
    [((128, 96), "seg128", r"quantized dimension \(96\)"), ((64, 128), "tile128", r"rows \(64\)"),
     ((128, 128), "col", "layout must be one of")],
    ids=["seg-K96", "tile-rows64", "name"],
)
def test_to_fp8_ref_layout_errors(shape, layout, match):
    with pytest.raises(ValueError, match=match):
        to_fp8_ref(quantize_mxfp4_ref(torch.ones(shape)), layout)
