"""Each launch config of the quantize kernel timed alone at the layer's quantize steps.

    python scripts/quantize_sweep.py --out results/microbench/gpu/quantize-sweep.json   # on a CUDA GPU

For choosing the autotuner's candidates (``_GPU_CONFIGS`` in ``kernels/hadamard_quantize.py``): the
steps of ``tests/bench/test_bench_quantize.py`` (X in the forward, W, dY in the backward with SR),
each with every config of :data:`CANDIDATES` that fits it, one at a time (tile, warps, register
cap). A record per step, shape and config: GB/s (minimal bytes over the median of
``triton.testing.do_bench``), its ratio to the copy bandwidth measured in the same run, and
whether it wrote the same bytes as the first config (it must: the results do not depend on the
config). Shapes and timing are ``scripts/kernel_ab.py``'s.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton

from adahop.harness.provenance import write_results

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_ab import LAYER_STEPS, SHAPES, copy_bandwidth, gbps, layer_step_bytes, outputs  # noqa: E402

import adahop_kernels.hadamard_quantize as hq  # noqa: E402

# (BLOCK_M, BLOCK_K, warps, register cap or None)
CANDIDATES = [
    (32, 128, 4, None), (32, 128, 4, 128), (32, 128, 4, 96), (32, 128, 4, 80), (32, 128, 4, 64),
    (32, 128, 8, None), (32, 256, 8, None), (64, 128, 4, None), (64, 128, 4, 96), (64, 128, 8, None),
    (128, 128, 16, None), (128, 128, 16, 64), (128, 128, 8, None), (128, 128, 8, 128), (128, 128, 8, 96),
    (128, 128, 32, None),
]


def tile_flags(along_k, along_m) -> dict:
    """The launch flags :func:`adahop_kernels.hadamard_quantize._tile_units` reads, for a step."""
    return {"ALONG_K": True, "ALONG_M": True, "HADAMARD": along_k.hadamard, "HADAMARD_T": along_m.hadamard,
            "HS": 32, "FP8": hq.FP8_IN_KERNEL[along_k.fp8], "FP8_T": hq.FP8_IN_KERNEL[along_m.fp8]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="results JSON")
    p.add_argument("--shapes", default="llama3.2-1b-mlp-16k,ours-125m-hidden-64k",
                   help=f"comma-separated, of {list(SHAPES)}")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU: the kernels are timed compiled")
    shapes = args.shapes.split(",")
    unknown = sorted(set(shapes) - set(SHAPES))
    if unknown:
        p.error(f"--shapes: unknown {unknown}; known: {list(SHAPES)}")
    copy = copy_bandwidth()
    tuner = hq._tuned_kernel
    records = []
    for shape_name in shapes:
        rows, cols = SHAPES[shape_name]
        x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
        seed = torch.zeros(1, dtype=torch.int64, device="cuda")
        for step, along_k, along_m, rounding, _ in LAYER_STEPS:
            work = layer_step_bytes(rows, cols, x.element_size(), (along_k, along_m))
            first = None
            for bm, bk, warps, maxnreg in CANDIDATES:
                config = triton.Config({"BLOCK_M": bm, "BLOCK_K": bk}, num_warps=warps, maxnreg=maxnreg)
                if not hq._config_fits(config, tile_flags(along_k, along_m)):
                    continue
                tuner.configs, tuner.cache = [config], {}
                fn = lambda: hq.quantize(x, along_k, along_m, rounding=rounding, seed=seed)  # noqa: E731
                got = outputs(fn())
                first = got if first is None else first
                rate, seconds = gbps(fn, work)
                record = {
                    "test": f"{step}[{shape_name}]", "op": f"quantize step {step} rounding={rounding}",
                    "shape": [rows, cols], "figure": rate, "unit": "GB/s", "ceiling_name": "copy", "ceiling": copy,
                    "ratio": rate / copy, "median_s": seconds,
                    "config": {"BLOCK_M": bm, "BLOCK_K": bk, "num_warps": warps, "maxnreg": maxnreg},
                    "same_bytes": all(torch.equal(a, b) for a, b in zip(got, first)),
                    "timer": "triton.testing.do_bench",
                }
                records.append(record)
                print(f"{record['test']:36s} {bm:3d}x{bk:3d} w{warps:2d} reg {maxnreg}: "
                      f"{rate:6.0f} GB/s ({record['ratio']:.2f} of copy) same {record['same_bytes']}", flush=True)
            write_results(args.out, records, config={"shapes": shapes, "candidates": CANDIDATES}, device=x.device)
    for test in dict.fromkeys(r["test"] for r in records):
        best = max((r for r in records if r["test"] == test), key=lambda r: r["figure"])
        print(f"best {test}: {best['figure']:.0f} GB/s ({best['ratio']:.2f} of copy) {best['config']}")
    return 0 if all(r["same_bytes"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
