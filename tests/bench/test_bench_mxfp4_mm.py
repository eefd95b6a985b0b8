"""mxfp4_mm TFLOP/s beside cuBLAS bf16 and cuBLAS FP8 rowwise measured in the same run.

Targets on an H200 (issue 2): >= 1.6x cuBLAS bf16 excluding quantization, >= 1.4x including the
quantization of both operands. No timing asserts here: the figures and ratios go to the JSON
(``experiments/microbench.py`` collects them); the closing note of a run says what was met.
"""

import pytest
import torch

from adahop import ops
from adahop.ops import GemmPath


def gemm_record_args(bench, shape):
    ceiling, peers = bench.ceilings.names_for_gemm()
    m, n, k = shape
    return dict(shape=shape, work=2 * m * n * k, unit="TFLOP/s", ceiling=ceiling, ceiling_shape=shape,
                peers={p: shape for p in peers})


def quantized_operands(bench, shape, emit_fp8):
    m, n, k = shape
    xa, xb = bench.randn(m, k, seed=1), bench.randn(n, k, seed=2)
    quant = dict(emit_fp8=emit_fp8, backend=bench.backend)
    return xa, xb, quant


def test_mxfp4_mm(benchmark, bench, gemm_shape):
    shape = gemm_shape
    path = ops.gemm_path(bench.device, bench.backend)
    xa, xb, quant = quantized_operands(bench, shape, path is GemmPath.FP8_ROWWISE)
    a, b = ops.hadamard_quantize(xa, **quant), ops.hadamard_quantize(xb, **quant)
    del xa, xb
    bench.run(benchmark, lambda: ops.mxfp4_mm(a, b, torch.bfloat16, backend=bench.backend),
              op="mxfp4_mm", dtype="mxfp4 x mxfp4 -> bf16", gemm_path=path.value, **gemm_record_args(bench, shape))


def test_mxfp4_mm_with_quantization(benchmark, bench, gemm_shape):
    shape = gemm_shape
    path = ops.gemm_path(bench.device, bench.backend)
    xa, xb, quant = quantized_operands(bench, shape, path is GemmPath.FP8_ROWWISE)

    def quantize_and_multiply():
        return ops.mxfp4_mm(ops.hadamard_quantize(xa, **quant), ops.hadamard_quantize(xb, **quant),
                            torch.bfloat16, backend=bench.backend)

    bench.run(benchmark, quantize_and_multiply, op="hadamard_quantize x2 + mxfp4_mm",
              dtype="bf16 -> mxfp4 x mxfp4 -> bf16", gemm_path=path.value, **gemm_record_args(bench, shape))


FORCED = [GemmPath.DOT_SCALED, GemmPath.DEQUANT_MATMUL] if torch.cuda.is_available() else [GemmPath.DEQUANT_MATMUL]


@pytest.mark.parametrize("path", FORCED, ids=lambda p: p.value)
def test_mxfp4_mm_forced_path(benchmark, bench, path, forced_gemm_shape):
    """The paths the device does not take by default, to place the default among them."""
    shape = forced_gemm_shape
    xa, xb, quant = quantized_operands(bench, shape, emit_fp8=False)
    a, b = ops.hadamard_quantize(xa, **quant), ops.hadamard_quantize(xb, **quant)
    del xa, xb
    bench.run(benchmark, lambda: ops.mxfp4_mm(a, b, torch.bfloat16, path=path, backend=bench.backend),
              op="mxfp4_mm", dtype="mxfp4 x mxfp4 -> bf16", gemm_path=path.value, **gemm_record_args(bench, shape))


def test_fp8_reencode(benchmark, bench, activation_shape):
    """The extra pass of the FP8 path when an operand comes without ``fp8`` (memory-bound)."""
    m, k = activation_shape
    t = ops.hadamard_quantize(bench.randn(m, k), backend=bench.backend)
    # Bytes: codes K/2 and scales K/32 read, scales read again (pass 1 finds the row exponent),
    # FP8 K and one fp32 row scale written, per row.
    work = m * (k // 2 + 2 * (k // 32) + k + 4)
    bench.run(benchmark, lambda: ops.to_fp8_rowwise(t, backend=bench.backend), op="to_fp8_rowwise",
              shape=(m, k), dtype="mxfp4 -> e4m3 + fp32 row scale", work=work, unit="GB/s", ceiling="copy")
