"""fp8_reencode in its three layouts against adahop.formats.to_fp8_ref, bit for bit.

The rowwise layout's own tests (and its GEMM arithmetic) are in test_mxfp4_mm.py; here every layout
gets every code byte and scale byte, the byte-wise fast path, boundary shapes, the exact case and
the layout errors.
"""

import pytest
import torch

from adahop import ops
from adahop.formats import MXFP4Tensor, dequantize_mxfp4_ref, fp8_group_scale, quantize_mxfp4_ref, to_fp8_ref
from adahop_kernels.fp8_reencode import fp8_reencode

LAYOUTS = ("row", "seg128", "tile128")


def random_bytes(rows, k, seed, device):
    """Every code (-0 included) and every scale byte (0, 254 and the NaN byte 255 included)."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8, generator=g)
    scales = torch.randint(0, 256, (rows, k // 32), dtype=torch.uint8, generator=g)
    scales[0:1], scales[1:2], scales[2:3] = 0, 254, 255  # rows that exist
    return MXFP4Tensor(codes.to(device), scales.to(device))


def narrow_groups(rows, k, seed, device):
    """Blocks within 11 binades of their group's largest (the byte-wise path), all-zero blocks with
    scale 0 (some holding ±0 codes), a NaN block, group maxima at both ends of the range."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8, generator=g)
    top = torch.randint(11, 255, (rows, 1), generator=g)
    top[0], top[1] = 11, 254
    scales = (top - torch.randint(0, 12, (rows, k // 32), generator=g)).to(torch.uint8)
    zero = torch.rand(rows, k // 32, generator=g) < 0.1
    scales[zero] = 0
    codes.view(rows, k // 32, 16)[zero] = torch.randint(0, 2, (int(zero.sum()), 16), generator=g).to(torch.uint8) * 0x88
    scales[2, 1] = 255
    return MXFP4Tensor(codes.to(device), scales.to(device))


def assert_reference_bytes(t, layout):
    fp8, scale = fp8_reencode(t, layout)
    ref_fp8, ref_scale = to_fp8_ref(MXFP4Tensor(t.codes.cpu(), t.scales.cpu()), layout)
    assert torch.equal(fp8.view(torch.uint8).cpu(), ref_fp8.view(torch.uint8)), "fp8 bytes differ"
    assert torch.equal(scale.cpu(), ref_scale) and scale.shape == ref_scale.shape and scale.stride() == ref_scale.stride()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rows,k", [(128, 128), (256, 384), (384, 1152)], ids=lambda v: str(v))
def test_every_byte_matches_reference(layout, rows, k, device):
    assert_reference_bytes(random_bytes(rows, k, rows + k, device), layout)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rows,k", [(128, 1024), (256, 256)], ids=lambda v: str(v))
def test_byte_wise_path_matches_reference(layout, rows, k, device):
    assert_reference_bytes(narrow_groups(rows, k, rows + k, device), layout)


@pytest.mark.parametrize("rows,k", [(1, 128), (127, 256), (129, 640)], ids=lambda v: str(v))
def test_seg128_any_row_count(rows, k, device):
    assert_reference_bytes(random_bytes(rows, k, rows, device), "seg128")


@pytest.mark.parametrize("layout", ["seg128", "tile128"])
def test_exact_when_groups_span_14_binades(layout, device):
    # Row spans of 30 binades; within each 128-group at most 14: fp8 x group scale is the MXFP4 value.
    g = torch.Generator().manual_seed(1)
    x = torch.rand(256, 512, generator=g) * 8 - 4
    x[:, ::32] = 4.0  # block amax 4 * 2^e: scale exponent exactly e
    e = torch.randint(-7, 8, (256, 16), generator=g).float() + torch.arange(4).repeat_interleave(4) * 8.0 - 12
    x = x * torch.exp2(e).repeat_interleave(32, 1)
    q = quantize_mxfp4_ref(x)
    fp8, scale = fp8_reencode(MXFP4Tensor(q.codes.to(device), q.scales.to(device)), layout)
    back = fp8.cpu().double() * fp8_group_scale(scale.cpu(), layout, (256, 512)).double()
    assert torch.equal(back, dequantize_mxfp4_ref(q, torch.float64))


def test_empty_operand(device):
    t = MXFP4Tensor(torch.zeros(0, 64, dtype=torch.uint8, device=device), torch.zeros(0, 4, dtype=torch.uint8, device=device))
    fp8, scale = fp8_reencode(t, "seg128")
    assert fp8.shape == (0, 128) and scale.shape == (0, 1)


@pytest.mark.parametrize(
    "shape,layout,match",
    [((128, 96), "seg128", r"'seg128' needs the quantized dimension \(96\)"),
     ((64, 128), "tile128", r"'tile128' needs the rows \(64\)"),
     ((128, 128), "tile", "layout must be one of")],
    ids=["seg-K96", "tile-rows64", "name"],
)
def test_layout_errors(shape, layout, match, device):
    rows, k = shape
    t = MXFP4Tensor(torch.zeros(rows, k // 2, dtype=torch.uint8, device=device),
                    torch.zeros(rows, k // 32, dtype=torch.uint8, device=device))
    with pytest.raises(ValueError, match=match):
        fp8_reencode(t, layout)


@pytest.mark.parametrize("layout", ["seg128", "tile128"])
def test_blockwise_gemm_arithmetic_is_the_exact_mxfp4_product(layout, device):
    # What cuBLAS's blockwise FP8 GEMM computes, simulated in fp64: A in seg128, Bᵀ in either layout.
    g = torch.Generator().manual_seed(2)
    a = quantize_mxfp4_ref(torch.randn(128, 256, generator=g) * 4)
    b = quantize_mxfp4_ref(torch.randn(256, 256, generator=g))
    (fa, sa), (fb, sb) = (fp8_reencode(MXFP4Tensor(t.codes.to(device), t.scales.to(device)), lay)
                          for t, lay in ((a, "seg128"), (b, layout)))
    da = fa.cpu().double() * fp8_group_scale(sa.cpu(), "seg128", (128, 256)).double()
    db = fb.cpu().double() * fp8_group_scale(sb.cpu(), layout, (256, 256)).double()
    assert torch.equal(da @ db.t(), ops.mxfp4_mm_ref(a, b, torch.float64))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_scaled_mm_takes_the_blockwise_layouts():
    # torch._scaled_mm on Hopper: A (M, K) with seg128 scales, B as Bᵀ (N, K) with tile128 scales
    # (passed transposed); within fp32 accumulation of the exact product.
    g = torch.Generator().manual_seed(3)
    a = quantize_mxfp4_ref(torch.randn(256, 1024, generator=g))
    b = quantize_mxfp4_ref(torch.randn(384, 1024, generator=g))
    fa, sa = fp8_reencode(MXFP4Tensor(a.codes.cuda(), a.scales.cuda()), "seg128")
    fb, sb = fp8_reencode(MXFP4Tensor(b.codes.cuda(), b.scales.cuda()), "tile128")
    c = torch._scaled_mm(fa, fb.t(), scale_a=sa, scale_b=sb.t(), out_dtype=torch.float32).cpu().double()
    da, db = dequantize_mxfp4_ref(a, torch.float64), dequantize_mxfp4_ref(b, torch.float64)
    bound = 1024 * 2.0**-23 * (da.abs() @ db.abs().t())
    assert ((c - da @ db.t()).abs() <= bound).all()
