"""Quantize kernels' effective GB/s against the copy bandwidth measured in the same run.

Target on an H200 (issue 2): >= 85% of copy bandwidth. Bytes of one call (formula in
:func:`quantize_bytes`): X read once; per quantized orientation, codes (1/2 B a value) and E8M0
scales (1/32 B a value) written; with ``emit_fp8``, the re-encoding pass re-reads the codes and
(twice) the scales and writes 1 B a value plus a 4-byte scale a row. The dual kernel's peer is the
same work as two single calls, so its ratio to that peer is the gain of reading X once.

GPU: ``pytest tests/bench/test_bench_quantize.py --benchmark-only`` (compiled Triton kernels);
CPU: the reference backend at the smoke shapes, for a run that checks the harness.
"""

import pytest
import torch

from adahop import ops

MX_BYTES_PER_VALUE = 1 / 2 + 1 / 32  # packed E2M1 codes + one E8M0 byte per 32 values


def quantize_bytes(rows: int, cols: int, in_bytes: int, orientations: int = 1, fp8_rows: int = 0) -> int:
    """Bytes read + written by quantizing X ``(rows, cols)``; ``fp8_rows``: output rows re-encoded to FP8."""
    n = rows * cols
    mx = n * MX_BYTES_PER_VALUE
    total = n * in_bytes + orientations * mx
    if fp8_rows:
        total += mx + n / 32 + n + 4 * fp8_rows
    return int(total)


# (id, keyword arguments of ops.hadamard_quantize, output rows for the FP8 pass given (rows, cols))
SINGLE = [
    ("alongK-rne", dict(), None),
    ("alongK-rne-nohadamard", dict(hadamard=False), None),
    ("alongK-sr", dict(rounding="sr", seed=0), None),
    ("alongM-rne", dict(transpose=True), None),
    ("alongM-sr", dict(transpose=True, rounding="sr", seed=0), None),
    ("alongK-rne-fp8", dict(emit_fp8=True), "rows"),
    ("alongM-rne-fp8", dict(transpose=True, emit_fp8=True), "cols"),
]


@pytest.mark.parametrize("variant", [v[1:] for v in SINGLE], ids=[v[0] for v in SINGLE])
def test_hadamard_quantize(benchmark, bench, activation_shape, variant):
    kwargs, fp8_side = variant
    rows, cols = activation_shape
    x = bench.randn(rows, cols)
    fp8_rows = {"rows": rows, "cols": cols, None: 0}[fp8_side]
    work = quantize_bytes(rows, cols, x.element_size(), fp8_rows=fp8_rows)
    bench.run(benchmark, lambda: ops.hadamard_quantize(x, backend=bench.backend, **kwargs),
              op="hadamard_quantize " + " ".join(f"{k}={v}" for k, v in kwargs.items() if k != "seed"),
              shape=(rows, cols), dtype="bf16 -> mxfp4", work=work, unit="GB/s", ceiling="copy")


@pytest.mark.parametrize("rounding", ["rne", "sr"])
def test_hadamard_quantize_dual(benchmark, bench, activation_shape, rounding):
    rows, cols = activation_shape
    x = bench.randn(rows, cols)
    work = quantize_bytes(rows, cols, x.element_size(), orientations=2)

    def two_single_calls():
        return (ops.hadamard_quantize(x, rounding=rounding, seed=0, backend=bench.backend),
                ops.hadamard_quantize(x, transpose=True, rounding=rounding, seed=0, backend=bench.backend))

    bench.run(benchmark, lambda: ops.hadamard_quantize_dual(x, rounding=rounding, seed=0, backend=bench.backend),
              op=f"hadamard_quantize_dual rounding={rounding}", shape=(rows, cols), dtype="bf16 -> mxfp4 x2",
              work=work, unit="GB/s", ceiling="copy", peers={"two-single-calls": two_single_calls})


def test_dequantize(benchmark, bench, activation_shape):
    rows, cols = activation_shape
    t = ops.hadamard_quantize(bench.randn(rows, cols), hadamard=False, backend=bench.backend)
    work = int(rows * cols * (MX_BYTES_PER_VALUE + 2))  # codes + scales read, bf16 written
    bench.run(benchmark, lambda: ops.dequantize(t, torch.bfloat16, backend=bench.backend), op="dequantize",
              shape=(rows, cols), dtype="mxfp4 -> bf16", work=work, unit="GB/s", ceiling="copy")
