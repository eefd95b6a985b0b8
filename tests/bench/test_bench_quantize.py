"""Quantize kernels' effective GB/s against the copy bandwidth measured in the same run.

Targets on an H200 (not asserted): >= 0.85 of copy bandwidth for round-to-nearest, >= 0.7 for
stochastic rounding. Bytes of a call are the minimal ones: the input read once, each output written
once (formulas in :func:`quantize_bytes` and :func:`layer_step_bytes`); for ``emit_fp8`` the
rowwise re-encoding pass re-reads the codes and (twice) the scales, counted as its own traffic.

``test_layer_quantize_step`` times the quantize steps of a linear layer in one pass each, with the
FP8 GEMM operands written by the quantizer itself (blockwise scales): X in the forward (A along K
in seg128 FP8, the copy saved for wgrad along M packed), W (Bᵀ along K and along M, both tile128
FP8), dY in the backward (both A operands, seg128 FP8, SR), and the re-encoding of a saved packed
copy to tile128. Its peer ``two-pass`` is the same operands by the rowwise route (packed MXFP4 plus
the rowwise re-encoding), timed in the same run.

GPU: ``pytest tests/bench/test_bench_quantize.py --benchmark-only`` (compiled Triton kernels);
CPU: the reference backend at the smoke shapes, for a run that checks the harness.
"""

import pytest
import torch

from adahop import ops
from adahop.formats import FP8_GROUP, MXFP4Tensor, to_fp8_ref
from adahop_kernels.hadamard_quantize import Side, quantize

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


def layer_step_bytes(rows: int, cols: int, in_bytes: int, sides: tuple[Side | None, Side | None]) -> int:
    """Minimal bytes of one :func:`quantize` call on ``(rows, cols)``: x read once, each output written once."""
    total = rows * cols * in_bytes
    for side, (r, n) in zip(sides, ((rows, cols), (cols, rows))):
        if side is None:
            continue
        if side.packed:
            total += r * n * MX_BYTES_PER_VALUE
        if side.fp8:
            groups = {"row": r, "seg128": r * (n // FP8_GROUP), "tile128": (r // FP8_GROUP) * (n // FP8_GROUP)}
            total += r * n + 4 * groups[side.fp8]
        if side.amax:
            total += 4 * r
    return int(total)


def reference_quantize(x, along_k, along_m, rounding="rne", seed=None):
    """What :func:`quantize` returns, from the references: the CPU timing of a step."""
    outs = []
    for side, xo in ((along_k, x), (along_m, x.t())):
        if side is None:
            outs.append(None)
            continue
        q = ops.hadamard_quantize_ref(xo, side.hadamard, rounding=rounding, seed=seed)
        outs.append((q, to_fp8_ref(q, side.fp8) if side.fp8 else None, xo.abs().amax(1) if side.amax else None))
    return outs


# (id, along K, along M, rounding, the rowwise route's emit_fp8 / emit_fp8_t)
LAYER_STEPS = [
    ("X-forward", Side(True, None, packed=False, fp8="seg128"), Side(True, None), "rne", (True, False)),
    ("W", Side(True, None, packed=False, fp8="tile128"), Side(True, None, packed=False, fp8="tile128"), "rne",
     (True, True)),
    ("dY-backward-sr", Side(True, None, packed=False, fp8="seg128"), Side(True, None, packed=False, fp8="seg128"),
     "sr", (True, True)),
]


@pytest.mark.parametrize("step", [s[1:] for s in LAYER_STEPS], ids=[s[0] for s in LAYER_STEPS])
def test_layer_quantize_step(benchmark, bench, activation_shape, step):
    along_k, along_m, rounding, (fp8_k, fp8_m) = step
    rows, cols = activation_shape
    x = bench.randn(rows, cols)
    work = layer_step_bytes(rows, cols, x.element_size(), (along_k, along_m))
    if bench.backend is None:  # the GPU: the kernel, its SR seed a device tensor as in training
        seed = torch.zeros(1, dtype=torch.int64, device=x.device)

        def step_fn():
            return quantize(x, along_k, along_m, rounding=rounding, seed=seed)
    else:
        def step_fn():
            return reference_quantize(x, along_k, along_m, rounding, seed=0)

    def two_pass():
        return ops.hadamard_quantize_dual(x, rounding=rounding, seed=0, emit_fp8=fp8_k, emit_fp8_t=fp8_m,
                                          backend=bench.backend)

    what = " / ".join(f"{d} {s.fp8 or ''}{' packed' if s.packed else ''}".strip() for d, s in (("K", along_k), ("M", along_m)))
    bench.run(benchmark, step_fn, op=f"quantize step {what} rounding={rounding}", shape=(rows, cols),
              dtype="bf16 -> e4m3 / mxfp4", work=work, unit="GB/s", ceiling="copy", peers={"two-pass": two_pass})


def test_reencode_saved_copy_to_tile128(benchmark, bench, activation_shape):
    """The backward's operand from the packed copy the forward saved: MXFP4 in, tile128 FP8 out."""
    rows, cols = activation_shape
    t = ops.hadamard_quantize(bench.randn(rows, cols), backend=bench.backend)
    work = int(rows * cols * (MX_BYTES_PER_VALUE + 1) + 4 * (rows // FP8_GROUP) * (cols // FP8_GROUP))
    if bench.backend is None:
        from adahop_kernels.fp8_reencode import fp8_reencode

        def fn():
            return fp8_reencode(t, "tile128")
    else:
        def fn():
            return to_fp8_ref(MXFP4Tensor(t.codes, t.scales), "tile128")
    bench.run(benchmark, fn, op="fp8_reencode layout=tile128", shape=(rows, cols), dtype="mxfp4 -> e4m3 + tile128 scales",
              work=work, unit="GB/s", ceiling="copy", peers={"rowwise": lambda: ops.to_fp8_rowwise(t, backend=bench.backend)})
