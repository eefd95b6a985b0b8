"""The layer's quantize steps once each, the measured launch inside an NVTX range: for a profiler.

    ncu --clock-control none --nvtx --nvtx-include "quantize/" --set full -o quantize \\
        python scripts/quantize_steps.py --shape 16384x8192 --steps X,W,dY

Each step of ``tests/bench/test_bench_quantize.py`` (X in the forward, W, dY in the backward with
SR) runs twice on the same bf16 input: first outside any range (the autotuner's timing launches,
compilation), then inside the NVTX push/pop range ``quantize`` with the config it picked, which
is printed: the profiled kernels are the steps in order. Nothing is timed here: the profiler's
counters (memory and issue throughput, stall reasons, occupancy) are the point;
``scripts/kernel_ab.py`` and the benchmarks time.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "bench"))
from test_bench_quantize import LAYER_STEPS  # noqa: E402

import adahop_kernels.hadamard_quantize as hq  # noqa: E402

STEPS = {"X": "X-forward", "W": "W", "dY": "dY-backward-sr"}


def parse_shape(text: str) -> tuple[int, int]:
    try:
        rows, cols = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape must be ROWSxCOLS (e.g. 16384x8192), got {text!r}") from None
    if rows <= 0 or cols <= 0 or rows % 128 or cols % 128:
        raise argparse.ArgumentTypeError(f"--shape {text}: rows and columns must be positive multiples of 128")
    return rows, cols


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", type=parse_shape, default=(16384, 8192), help="ROWSxCOLS of the bf16 operand")
    p.add_argument("--steps", default="X,W,dY", help=f"comma-separated, of {list(STEPS)}")
    args = p.parse_args(argv)
    steps = args.steps.split(",")
    unknown = sorted(set(steps) - set(STEPS))
    if unknown:
        p.error(f"--steps: unknown {unknown}; known: {list(STEPS)}")
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU: a profiler reads the compiled kernels")
    by_name = {s[0]: s[1:] for s in LAYER_STEPS}
    x = torch.randn(*args.shape, device="cuda", dtype=torch.bfloat16)
    seed = torch.zeros(1, dtype=torch.int64, device="cuda")
    for step in steps:
        along_k, along_m, rounding, _ = by_name[STEPS[step]]
        hq.quantize(x, along_k, along_m, rounding=rounding, seed=seed)
        torch.cuda.synchronize()
        with torch.cuda.nvtx.range("quantize"):
            hq.quantize(x, along_k, along_m, rounding=rounding, seed=seed)
            torch.cuda.synchronize()
        print(f"{step}: {tuple(x.shape)}, {hq._tuned_kernel.best_config}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
