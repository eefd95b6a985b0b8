"""mxfp4_mm on every path, the FP8 re-encoding kernel, and the path report.

Error bound (every path): the products of two dequantized MXFP4 elements are exact in fp32 (two
significant bits each), so a path that accumulates in fp32 in any order satisfies, per element,
``|C - C64| <= (K - 1) * 2^-24 * (|A| |B|ᵀ)`` before the output rounding (half an ulp of the output
dtype on top). C64 is the fp64 product of the dequantized operands (``mxfp4_mm_ref``). Hopper's FP8
tensor cores add their documented reduced-precision accumulation between fp32 promotions
(GPU runs only, :data:`TENSOR_CORE_ALLOWANCE`).

Tests take the ``device`` fixture of tests/kernels/conftest.py: CPU through Triton's interpreter
here, compiled kernels on a GPU machine.
"""

import logging
from types import SimpleNamespace

import pytest
import torch

from adahop import ops
from adahop.formats import MXFP4Tensor, dequantize_mxfp4_ref, quantize_mxfp4_ref, to_fp8_rowwise_ref
from adahop.ops import GemmPath
from adahop_kernels.fp8_reencode import fp8_reencode
from adahop_kernels.mxfp4_mm import mxfp4_mm_dot_scaled

U32 = 2.0**-24
HALF_ULP = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
HALF_SUBNORMAL = {torch.float32: 2.0**-150, torch.bfloat16: 2.0**-134, torch.float16: 2.0**-25}
# FP8 wgmma accumulates with ~14 mantissa bits before cuBLAS promotes to fp32 (DeepSeek-V3 report,
# §3.3.2): allow 2^-11 of sum |a||b| on top of the fp32 bound on GPUs.
TENSOR_CORE_ALLOWANCE = 2.0**-11
CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")

# (M, N, K): boundary rows, N not a multiple of 16 (the FP8 path pads), K not a multiple of the
# kernel's K tile, a single block, and a Llama-3.2 1B k_proj (2048 -> 512) at 32 tokens.
SHAPES = [(129, 48, 256), (127, 17, 96), (1, 1, 32), (32, 512, 2048)]
SHAPE_IDS = ["129x48x256", "127x17x96", "1x1x32", "llama1b-kproj-32tok"]
# Every path runs on CPU (FP8 through PyTorch's CPU _scaled_mm, dot_scaled through the interpreter) and,
# through the `device` fixture of tests/kernels/conftest.py, compiled on a GPU.
PATHS = [GemmPath.REFERENCE, GemmPath.DEQUANT_MATMUL, GemmPath.FP8_ROWWISE, GemmPath.DOT_SCALED]


def operand(rows: int, k: int, seed: int, device="cpu", spread: float = 6.0) -> MXFP4Tensor:
    """An MXFP4 operand whose blocks span 2^±spread (fp32 sums really round; within the FP8 path's 14 binades)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g) * torch.exp2(torch.empty(rows, k // 32, 1).uniform_(-spread, spread, generator=g)).expand(-1, -1, 32).reshape(rows, k)
    q = quantize_mxfp4_ref(x)
    return MXFP4Tensor(q.codes.to(device), q.scales.to(device))


def assert_within_accumulation_bound(c, a, b, out_dtype, allowance=0.0):
    da, db = dequantize_mxfp4_ref(a, torch.float64).cpu(), dequantize_mxfp4_ref(b, torch.float64).cpu()
    exact = da @ db.t()
    bound = ((a.shape[1] - 1) * U32 + allowance) * (da.abs() @ db.abs().t())
    tol = bound * (1 + HALF_ULP[out_dtype]) + HALF_ULP[out_dtype] * exact.abs() + HALF_SUBNORMAL[out_dtype]
    err = (c.double().cpu() - exact).abs()
    assert c.dtype == out_dtype and c.shape == exact.shape
    assert torch.isfinite(c).all()
    worst = (err - tol).argmax()
    assert (err <= tol).all(), f"error {err.flatten()[worst]:.3e} > bound {tol.flatten()[worst]:.3e}"


def allowance(path: GemmPath, device: str) -> float:
    return TENSOR_CORE_ALLOWANCE if device == "cuda" and path in (GemmPath.FP8_ROWWISE, GemmPath.DOT_SCALED) else 0.0


def dequant_backend(path: GemmPath, device: str) -> str | None:
    # On CPU the dequant path's sub-step runs the reference: this file tests the GEMM, not dequantize.
    return "reference" if path is GemmPath.DEQUANT_MATMUL and device == "cpu" else None


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.value)
def test_path_within_fp32_accumulation_bound(path, shape, device):
    m, n, k = shape
    a, b = operand(m, k, 1, device), operand(n, k, 2, device)
    c = ops.mxfp4_mm(a, b, torch.float32, path=path, backend=dequant_backend(path, device))
    assert_within_accumulation_bound(c, a, b, torch.float32, allowance(path, device))


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.value)
def test_path_rounds_output_once(path, out_dtype, device):
    a, b = operand(129, 256, 3, device, spread=2.0), operand(48, 256, 4, device, spread=2.0)
    c = ops.mxfp4_mm(a, b, out_dtype, path=path, backend=dequant_backend(path, device))
    assert_within_accumulation_bound(c, a, b, out_dtype, allowance(path, device))


def test_dot_scaled_kernel_is_exact_when_sums_are_exact(device):
    # Small integers times powers of two: every partial sum is exact in fp32, so the kernel must
    # equal the fp64 reference bit for bit (catches scale or nibble order mistakes the bound might hide).
    a, b = operand(64, 512, 5, device, spread=0.0), operand(64, 512, 6, device, spread=0.0)
    c = mxfp4_mm_dot_scaled(a, b, torch.float32).double()
    assert torch.equal(c, ops.mxfp4_mm_ref(a, b, torch.float64))


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.value)
def test_nan_block_poisons_its_output_row_only(path, device):
    x = torch.randn(64, 128)
    x[3, 40] = float("nan")
    q = quantize_mxfp4_ref(x)
    a, b = MXFP4Tensor(q.codes.to(device), q.scales.to(device)), operand(32, 128, 7, device)
    c = ops.mxfp4_mm(a, b, torch.float32, path=path, backend=dequant_backend(path, device))
    assert c[3].isnan().all()
    assert torch.isfinite(torch.cat((c[:3], c[4:]))).all()


def test_fp8_path_uses_the_emitted_fp8_operand(device):
    a, b = operand(32, 64, 8, device), operand(16, 64, 9, device)
    # Deliberately wrong FP8 payloads: if mxfp4_mm re-encoded instead of using them, C would be nonzero.
    a = MXFP4Tensor(a.codes, a.scales, torch.zeros(32, 64, dtype=torch.float8_e4m3fn, device=device),
                    torch.ones(32, 1, device=device))
    b = MXFP4Tensor(b.codes, b.scales, *to_fp8_rowwise_ref(b))
    assert ops.mxfp4_mm(a, b, torch.float32, path=GemmPath.FP8_ROWWISE).eq(0).all()


# ---- FP8 re-encoding (the kernel behind the FP8 path when the quantizer did not emit fp8) ----


def random_bytes_operand(rows: int, k: int, seed: int, device="cpu") -> MXFP4Tensor:
    """Every code (-0 included) and every scale byte (0, 254 and the NaN byte 255 included)."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8, generator=g)
    scales = torch.randint(0, 256, (rows, k // 32), dtype=torch.uint8, generator=g)
    scales[0], scales[1], scales[2] = 0, 254, 255
    return MXFP4Tensor(codes.to(device), scales.to(device))


@pytest.mark.parametrize("rows,k", [(127, 256), (128, 1024), (129, 96), (3, 32)], ids=lambda v: str(v))
def test_fp8_reencode_kernel_matches_reference_bytes(rows, k, device):
    t = random_bytes_operand(rows, k, rows + k, device)
    fp8, scale = fp8_reencode(t)
    ref_fp8, ref_scale = to_fp8_rowwise_ref(t)
    assert torch.equal(fp8.view(torch.uint8), ref_fp8.view(torch.uint8))
    assert torch.equal(scale, ref_scale)


@pytest.mark.parametrize("rows,k", [(129, 1024), (3, 96)], ids=lambda v: str(v))
def test_fp8_reencode_byte_wise_path_matches_reference_bytes(rows, k, device):
    # Rows whose nonzero blocks lie within 11 binades of R take the kernel's byte-wise encoding:
    # every code byte, all-zero blocks with scale 0, NaN blocks, R at both ends of the range.
    g = torch.Generator().manual_seed(rows + k)
    codes = torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8, generator=g)
    top = torch.randint(11, 255, (rows, 1), generator=g)
    top[0], top[1] = 11, 254
    scales = (top - torch.randint(0, 12, (rows, k // 32), generator=g)).to(torch.uint8)
    scales[:, 0] = top[:, 0].to(torch.uint8)
    zero = torch.rand(rows, k // 32, generator=g) < 0.1
    zero[:, 0] = False
    scales[zero] = 0
    codes.view(rows, k // 32, 16)[zero] = torch.randint(0, 2, (int(zero.sum()), 16), generator=g).to(torch.uint8) * 0x88
    scales[2, 1 % (k // 32)] = 255
    t = MXFP4Tensor(codes.to(device), scales.to(device))
    fp8, scale = fp8_reencode(t)
    ref_fp8, ref_scale = to_fp8_rowwise_ref(t)
    assert torch.equal(fp8.view(torch.uint8), ref_fp8.view(torch.uint8))
    assert torch.equal(scale, ref_scale)


def test_fp8_reencode_is_exact_within_14_binades(device):
    t = operand(129, 512, 10, device)  # block exponents of a row span at most 14 binades (checked)
    span = (t.scales.int().amax(1) - t.scales.int().amin(1)).max().item()
    assert span <= 14
    fp8, scale = fp8_reencode(t)
    assert torch.equal(fp8.double() * scale.double(), dequantize_mxfp4_ref(t, torch.float64))


def test_fp8_path_arithmetic_is_the_exact_mxfp4_product(device):
    # What cuBLAS computes on sm_90, simulated in fp64: (fp8_a * s_a)(fp8_b * s_b)ᵀ.
    a, b = operand(64, 256, 11, device), operand(48, 256, 12, device)
    (fa, sa), (fb, sb) = fp8_reencode(a), fp8_reencode(b)
    simulated = (fa.double() * sa.double()) @ (fb.double() * sb.double()).t()
    assert torch.equal(simulated, ops.mxfp4_mm_ref(a, b, torch.float64))


def test_fp8_reencode_beyond_14_binades_loses_only_tiny_blocks(device):
    codes = torch.full((1, 32), 0x77, dtype=torch.uint8, device=device)
    t = MXFP4Tensor(codes, torch.tensor([[127 + 10, 127 - 10]], dtype=torch.uint8, device=device))
    fp8, scale = fp8_reencode(t)  # second block 20 binades down: 6 * 2^-20 * 2^6 is below E4M3's range
    back = fp8.double() * scale.double()
    assert torch.equal(back[0, :32], dequantize_mxfp4_ref(t, torch.float64)[0, :32])
    assert back[0, 32:].eq(0).all()


# ---- dispatch and the path report ----


def test_cpu_default_path_is_the_reference():
    assert ops.gemm_path("cpu") is GemmPath.REFERENCE
    a, b = operand(8, 64, 13), operand(8, 64, 14)
    assert torch.equal(ops.mxfp4_mm(a, b, torch.float32), ops.mxfp4_mm_ref(a, b, torch.float32))


def test_gemm_path_is_logged_once_per_device(caplog):
    ops._gemm_path_logged.cache_clear()
    with caplog.at_level(logging.INFO, logger="adahop.ops"):
        ops.gemm_path("cpu")
        ops.gemm_path(torch.device("cpu"))
    msgs = [r.getMessage() for r in caplog.records if "takes the" in r.getMessage()]
    assert len(msgs) == 1 and "reference" in msgs[0]


def test_reference_backend_forces_the_reference_path():
    assert ops.gemm_path("cpu", backend="reference") is GemmPath.REFERENCE


@pytest.mark.parametrize(
    "props,hip,expected",
    [
        (SimpleNamespace(name="NVIDIA H200", major=9, minor=0), None, GemmPath.FP8_ROWWISE),
        (SimpleNamespace(name="NVIDIA L40S", major=8, minor=9), None, GemmPath.FP8_ROWWISE),
        (SimpleNamespace(name="NVIDIA B200", major=10, minor=0), None, GemmPath.DOT_SCALED),
        (SimpleNamespace(name="NVIDIA A100", major=8, minor=0), None, GemmPath.DEQUANT_MATMUL),
        (SimpleNamespace(name="MI355X", major=9, minor=5, gcnArchName="gfx950:sramecc+:xnack-"), "7.0", GemmPath.DOT_SCALED),
        (SimpleNamespace(name="MI300X", major=9, minor=4, gcnArchName="gfx942"), "6.4", GemmPath.DEQUANT_MATMUL),
    ],
    ids=["h200", "l40s", "b200", "a100", "mi355x", "mi300x"],
)
def test_hardware_path_table(monkeypatch, props, hip, expected):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    monkeypatch.setattr(torch.version, "hip", hip)
    path, why = ops._hardware_gemm_path(torch.device("cuda", 0))
    assert path is expected and props.name in why


# ---- bad inputs ----


def test_rejects_mismatched_k():
    with pytest.raises(ValueError, match="inner dimensions differ"):
        ops.mxfp4_mm(operand(4, 64, 0), operand(4, 96, 0))


def test_rejects_a_plain_tensor():
    with pytest.raises(TypeError, match="must be an MXFP4Tensor"):
        ops.mxfp4_mm(torch.zeros(4, 64), operand(4, 64, 0))


def test_rejects_wrong_rank():
    t = operand(4, 64, 0)
    with pytest.raises(ValueError, match="2-D"):
        ops.mxfp4_mm(MXFP4Tensor(t.codes[None], t.scales[None]), t)


def test_rejects_wrong_code_dtype():
    t = operand(4, 64, 0)
    with pytest.raises(ValueError, match="uint8"):
        ops.mxfp4_mm(MXFP4Tensor(t.codes.int(), t.scales), t)


def test_rejects_scales_of_the_wrong_shape():
    t = operand(4, 64, 0)
    with pytest.raises(ValueError, match="scales of shape"):
        ops.mxfp4_mm(MXFP4Tensor(t.codes, t.scales[:, :1].contiguous()), t)


def test_rejects_operands_on_different_devices():
    t = operand(4, 64, 0)
    with pytest.raises(ValueError, match="is on cpu but b is on meta"):
        ops.mxfp4_mm(t, MXFP4Tensor(t.codes.to("meta"), t.scales.to("meta")))


def test_rejects_unsupported_out_dtype():
    with pytest.raises(ValueError, match="out_dtype"):
        ops.mxfp4_mm(operand(4, 64, 0), operand(4, 64, 0), torch.int32)


def test_rejects_fp8_payload_of_the_wrong_shape():
    t = operand(4, 64, 0)
    bad = MXFP4Tensor(t.codes, t.scales, torch.zeros(4, 32, dtype=torch.float8_e4m3fn), torch.ones(4, 1))
    with pytest.raises(ValueError, match="fp8 must be float8_e4m3fn"):
        ops.mxfp4_mm(bad, t, path=GemmPath.FP8_ROWWISE)


def test_rejects_unknown_path():
    with pytest.raises(ValueError, match="GemmPath"):
        ops.mxfp4_mm(operand(4, 64, 0), operand(4, 64, 0), path="fp4-magic")


def test_rejects_non_contiguous_codes():
    t = operand(8, 64, 0)
    strided = MXFP4Tensor(t.codes[::2], t.scales[::2])
    with pytest.raises(ValueError, match="contiguous"):
        fp8_reencode(strided)


# ---- GPU ----


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_gpu_default_path_within_bound(out_dtype):
    device = torch.device("cuda")
    a, b = operand(1000, 1024, 1, device), operand(1040, 1024, 2, device)
    c = ops.mxfp4_mm(a, b, out_dtype)  # the device's own path, as gemm_path reports it
    assert_within_accumulation_bound(c, a, b, out_dtype, allowance(ops.gemm_path(device), "cuda"))
