"""The quantize kernel of this tree against another version of it, at the layer's quantize steps.

    python scripts/kernel_ab.py --baseline OTHER/kernels/hadamard_quantize.py \\
        --out results/microbench/gpu/quantize-ab.json        # on a CUDA GPU

For a kernel change: ``--baseline`` is the module file of the version it replaces (e.g.
``git show HEAD~1:kernels/hadamard_quantize.py > /tmp/hq_base.py``); it must import what this
tree's ``adahop_kernels`` offers. Each of the steps of ``tests/bench/test_bench_quantize.py``
(X in the forward, W, dY in the backward with SR) runs through both versions on the same bf16
input, autotuned alike. A record per step and shape: this version's GB/s (minimal bytes over the
median of ``triton.testing.do_bench``), its ratio to the copy bandwidth measured in the same run,
the baseline's GB/s and the ratio between them, and whether both wrote the same bytes (they
should: the draws of SR are a function of seed and position only). ``--rare`` adds to each input
a block whose ±1 sums pass the fp32 range and a 128-group spanning 13 binades, so that the rare
paths run too.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch

from adahop.harness.provenance import write_results

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "bench"))
from test_bench_quantize import LAYER_STEPS, layer_step_bytes  # noqa: E402

import adahop_kernels.hadamard_quantize as current  # noqa: E402

SHAPES = {"llama3.2-1b-hidden-16k": (16384, 2048), "llama3.2-1b-mlp-16k": (16384, 8192),
          "llama3-8b-hidden-16k": (16384, 4096), "ours-125m-hidden-64k": (65536, 768)}


def load_baseline(path: Path):
    spec = importlib.util.spec_from_file_location("adahop_kernels._ab_baseline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def outputs(result) -> list[torch.Tensor]:
    return [t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t
            for side in result if side is not None for t in side if t is not None]


def gbps(fn, nbytes: int) -> tuple[float, float]:
    import triton.testing

    ms = triton.testing.do_bench(fn, warmup=25, rep=100)
    return nbytes / (ms * 1e-3) / 1e9, ms * 1e-3


def copy_bandwidth() -> float:
    """GB/s of a device-to-device copy (bytes read plus written), the ceiling the steps are read against."""
    n = 1 << 28
    src, dst = torch.empty(n, dtype=torch.uint8, device="cuda"), torch.empty(n, dtype=torch.uint8, device="cuda")
    return gbps(lambda: dst.copy_(src), 2 * n)[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", type=Path, required=True, help="the other version's hadamard_quantize.py")
    p.add_argument("--out", type=Path, required=True, help="results JSON")
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {list(SHAPES)}")
    p.add_argument("--rare", action="store_true", help="put rare blocks into every input")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU: the kernels are timed compiled")
    if not args.baseline.is_file():
        p.error(f"--baseline {args.baseline}: no such file")
    shapes = args.shapes.split(",")
    unknown = sorted(set(shapes) - set(SHAPES))
    if unknown:
        p.error(f"--shapes: unknown {unknown}; known: {list(SHAPES)}")
    baseline = load_baseline(args.baseline)
    copy = copy_bandwidth()
    records = []
    for shape_name in shapes:
        rows, cols = SHAPES[shape_name]
        x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
        if args.rare:
            x[5, :32] = 2.0**123  # ±1 sums of 2^128
            x[130:132, 256:288] *= 2.0**13
        seed = torch.zeros(1, dtype=torch.int64, device="cuda")
        for step, along_k, along_m, rounding, _ in LAYER_STEPS:
            work = layer_step_bytes(rows, cols, x.element_size(), (along_k, along_m))
            figures = {}
            results = {}
            for name, module in (("this", current), ("baseline", baseline)):
                def fn(module=module):
                    return module.quantize(x, module.Side(*along_k), module.Side(*along_m), rounding=rounding, seed=seed)

                results[name] = outputs(fn())
                figures[name] = gbps(fn, work)
            same = all(torch.equal(a, b) for a, b in zip(results["this"], results["baseline"]))
            record = {
                "test": f"{step}[{shape_name}]", "op": f"quantize step {step} rounding={rounding}",
                "shape": [rows, cols], "rare_blocks": args.rare, "figure": figures["this"][0], "unit": "GB/s",
                "ceiling_name": "copy", "ceiling": copy, "ratio": figures["this"][0] / copy,
                "peers": {"baseline": figures["baseline"][0]},
                "ratio_to_peers": {"baseline": figures["this"][0] / figures["baseline"][0]},
                "median_s": figures["this"][1], "baseline_median_s": figures["baseline"][1],
                "same_bytes": same, "config": str(current._tuned_kernel.best_config),
                "timer": "triton.testing.do_bench",
            }
            records.append(record)
            print(f"{record['test']:40s} {record['figure']:7.0f} GB/s ({record['ratio']:.2f} of copy), "
                  f"baseline {figures['baseline'][0]:7.0f} ({record['ratio_to_peers']['baseline']:.2f}x), "
                  f"same bytes: {same}, {record['config']}", flush=True)
            write_results(args.out, records, config={"baseline": args.baseline.name, "shapes": shapes, "rare": args.rare},
                          device=x.device)
    return 0 if all(r["same_bytes"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
