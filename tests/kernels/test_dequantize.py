"""Dequantize kernel (packed MXFP4 → fp32/bf16/fp16) against adahop.formats.dequantize_mxfp4_ref, bit for bit."""

import pytest
import torch

from adahop import ops
from adahop.formats import MXFP4Tensor, dequantize_mxfp4_ref, quantize_mxfp4_ref
from adahop_kernels.dequantize import dequantize

# 6 * 2^127 (scale byte 254) overflows fp32, and fp16 overflows far earlier: inf, as in the reference.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def random_bytes(lead: tuple, k: int, seed: int, device: str) -> MXFP4Tensor:
    """Every code (-0 included) and every scale byte: 0 (subnormal 2^-127), 254 and NaN (255) in row 0."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (*lead, k // 2), dtype=torch.uint8, generator=g)
    scales = torch.randint(0, 256, (*lead, k // 32), dtype=torch.uint8, generator=g)
    scales.view(-1, k // 32)[0, :3] = torch.tensor([0, 254, 255], dtype=torch.uint8)[: k // 32]
    return MXFP4Tensor(codes.to(device), scales.to(device))


def assert_bits_equal(a: torch.Tensor, b: torch.Tensor) -> None:
    """Bit-identical (-0.0 included) and NaN at the same places (NaN sign and payload carry no meaning)."""
    assert a.dtype == b.dtype and a.shape == b.shape
    a, b = a.cpu(), b.cpu()
    assert torch.equal(a.isnan(), b.isnan())
    keep = ~a.isnan()
    assert torch.equal(a.view(BITS[a.dtype])[keep], b.view(BITS[b.dtype])[keep])


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("rows", [127, 128, 129], ids=lambda r: f"rows{r}")
def test_every_code_and_scale_byte(rows, dtype, device):
    # fp16 overflows to ±inf and rounds to its subnormals here, bf16 keeps every value: both as the reference.
    t = random_bytes((rows,), 256, rows, device)
    assert_bits_equal(dequantize(t, dtype), dequantize_mxfp4_ref(t, dtype))


@pytest.mark.parametrize("k", [32, 96, 14336], ids=lambda k: f"K{k}")
def test_lengths_that_are_not_a_tile_multiple(k, device):
    t = random_bytes((3,), k, k, device)
    assert_bits_equal(dequantize(t, torch.bfloat16), dequantize_mxfp4_ref(t, torch.bfloat16))


def test_leading_dimensions_are_kept(device):
    t = random_bytes((2, 3, 5), 64, 1, device)
    out = dequantize(t, torch.float32)
    assert out.shape == (2, 3, 5, 64)
    assert_bits_equal(out, dequantize_mxfp4_ref(t, torch.float32))


def test_nan_scale_block_is_nan_and_only_that_block(device):
    x = torch.ones(2, 64)
    x[1, 40] = float("nan")
    q = quantize_mxfp4_ref(x)
    out = dequantize(MXFP4Tensor(q.codes.to(device), q.scales.to(device)), torch.float32).cpu()
    assert out[1, 32:].isnan().all() and out[1, :32].eq(1).all() and out[0].eq(1).all()


def test_subnormal_scale_in_bf16(device):
    # Scale byte 0 is 2^-127: 0.5 * 2^-127 is a bf16 subnormal and must survive exactly.
    t = MXFP4Tensor(torch.tensor([[0x21] + [0] * 15], dtype=torch.uint8, device=device),
                    torch.zeros(1, 1, dtype=torch.uint8, device=device))
    out = dequantize(t, torch.bfloat16).float().cpu()
    assert out[0, :2].tolist() == [2.0**-128, 2.0**-127]


def test_roundtrip_of_quantized_values_is_exact(device):
    torch.manual_seed(0)
    x = torch.randn(64, 512) * torch.logspace(-4, 4, 512)
    q = quantize_mxfp4_ref(x)
    out = dequantize(MXFP4Tensor(q.codes.to(device), q.scales.to(device)), torch.float32)
    assert torch.equal(out.cpu(), dequantize_mxfp4_ref(q))


def test_ops_dequantize_triton_equals_reference(device):
    t = random_bytes((16,), 128, 2, device)
    assert_bits_equal(ops.dequantize(t, torch.bfloat16, backend="triton"), ops.dequantize(t, torch.bfloat16, backend="reference"))


def test_empty_tensor(device):
    t = MXFP4Tensor(torch.zeros(0, 16, dtype=torch.uint8, device=device), torch.zeros(0, 1, dtype=torch.uint8, device=device))
    assert dequantize(t, torch.float32).shape == (0, 32)


# ---- bad inputs ----------------------------------------------------------------------------------


def test_not_an_mxfp4_tensor_raises():
    with pytest.raises(TypeError, match="MXFP4Tensor"):
        dequantize(torch.zeros(4, 16, dtype=torch.uint8))


@pytest.mark.parametrize(
    "codes,scales,match",
    [
        (torch.zeros(4, 16, dtype=torch.int8), torch.zeros(4, 1, dtype=torch.uint8), "must be uint8"),
        (torch.zeros(4, 16, dtype=torch.uint8), torch.zeros(4, 2, dtype=torch.uint8), "do not describe one"),
        (torch.zeros(4, 16, dtype=torch.uint8), torch.zeros(3, 1, dtype=torch.uint8), "do not describe one"),
        (torch.zeros(16, 4, dtype=torch.uint8).t(), torch.zeros(4, 1, dtype=torch.uint8), "contiguous"),
    ],
    ids=["code-dtype", "scale-count", "row-count", "non-contiguous"],
)
def test_bad_buffers_raise(codes, scales, match, device):
    with pytest.raises(ValueError, match=match):
        dequantize(MXFP4Tensor(codes.to(device), scales.to(device)))


def test_unsupported_output_dtype_raises(device):
    t = random_bytes((2,), 32, 3, device)
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        dequantize(t, torch.float64)
