"""First-launch time of the layer's quantize steps, their autotune configs compiled one by one
against compiled in parallel (``$ADAHOP_COMPILE_THREADS``), each from an empty Triton cache.

    python scripts/compile_ab.py --out results/microbench/gpu/compile-ab.json   # on a CUDA GPU

A first launch of a new autotune key compiles every config that fits and times each; a run's
first steps pay that for every kernel variant it uses (the ``untimed_s`` of a throughput record).
For each thread count a child process with its own empty ``TRITON_CACHE_DIR`` launches each step
of ``tests/bench/test_bench_quantize.py`` (X in the forward, W, dY in the backward with SR) plus
the packed-only step of the rowwise FP8 path, twice: the first launch's wall time (compile and
timing) and the second's (neither) are recorded, with the configs timed and the bytes' digest,
which must agree between thread counts (the config picked may differ, the bytes may not).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from adahop.harness.provenance import write_results

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "bench"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from quantize_steps import parse_shape  # noqa: E402
from test_bench_quantize import LAYER_STEPS  # noqa: E402

import adahop_kernels.hadamard_quantize as hq  # noqa: E402
from adahop_kernels._common import KERNEL_CONFIG_ENV, PARALLEL_COMPILE_ENV, compile_threads  # noqa: E402

STEPS = [*LAYER_STEPS, ("packed-dual", hq.Side(True, None), hq.Side(True, None), "rne", (False, False))]


def child(rows: int, cols: int) -> list[dict]:
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16, generator=torch.Generator("cuda").manual_seed(0))
    seed = torch.zeros(1, dtype=torch.int64, device="cuda")
    records = []
    for step, along_k, along_m, rounding, _ in STEPS:
        times, outs = [], None
        for _ in range(2):
            torch.cuda.synchronize()
            t = time.perf_counter()
            outs = hq.quantize(x, along_k, along_m, rounding=rounding, seed=seed)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        digest = hashlib.sha256()
        for side in outs:
            for t in side or ():
                if isinstance(t, torch.Tensor):
                    digest.update(t.contiguous().view(torch.uint8).cpu().numpy().tobytes())
        records.append({"step": step, "first_launch_s": times[0], "second_launch_s": times[1],
                        "configs_timed": len(hq._tuned_kernel.configs_timings),
                        "config": str(hq._tuned_kernel.best_config), "digest": digest.hexdigest()})
    return records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="results JSON")
    p.add_argument("--shape", type=parse_shape, default=(16384, 2048), help="ROWSxCOLS of the bf16 operand")
    p.add_argument("--threads", default=f"1,{compile_threads()}", help="comma-separated thread counts to compare")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        counts = [int(v) for v in args.threads.split(",")]
    except ValueError:
        p.error(f"--threads must be comma-separated ints, got {args.threads!r}")
    if not counts or min(counts) < 0:
        p.error(f"--threads must be non-negative, got {args.threads!r}")
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU: the kernels are compiled for it")
    rows, cols = args.shape
    shape = f"{rows}x{cols}"
    if args.child:
        print(json.dumps(child(rows, cols)))
        return 0
    if args.out is None:
        p.error("--out is required")
    runs = {}
    for n in counts:
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "TRITON_CACHE_DIR": cache, PARALLEL_COMPILE_ENV: str(n)}
            env.pop(KERNEL_CONFIG_ENV, None)  # every fitting config, as training tunes
            out = subprocess.run([sys.executable, __file__, "--child", "--shape", shape], env=env,
                                 capture_output=True, text=True, check=True).stdout
            runs[n] = json.loads(out.strip().splitlines()[-1])
    base = counts[0]
    records = []
    for i, (step, *_rest) in enumerate(STEPS):
        for n in counts:
            r = runs[n][i]
            record = {"test": f"{step}[{shape}]", "op": f"first launch of quantize step {step}", "threads": n,
                      "figure": r["first_launch_s"], "unit": "s", "second_launch_s": r["second_launch_s"],
                      "configs_timed": r["configs_timed"], "config": r["config"],
                      "ratio_to_peers": {f"threads={base}": runs[base][i]["first_launch_s"] / r["first_launch_s"]},
                      "same_bytes": r["digest"] == runs[base][i]["digest"]}
            records.append(record)
            print(f"{record['test']:32s} threads={n:2d}: first launch {r['first_launch_s']:6.2f} s "
                  f"({r['configs_timed']} configs; {record['ratio_to_peers'][f'threads={base}']:.2f}x threads={base}), "
                  f"second {r['second_launch_s'] * 1e3:.2f} ms, same bytes: {record['same_bytes']}", flush=True)
    total = {n: sum(r["first_launch_s"] for r in runs[n]) for n in counts}
    print("total first launches: " + ", ".join(f"threads={n}: {s:.1f} s" for n, s in total.items()))
    write_results(args.out, records, config={"shape": [rows, cols], "threads": counts}, device=torch.device("cuda"))
    return 0 if all(r["same_bytes"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
