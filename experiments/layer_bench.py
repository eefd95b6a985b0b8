"""Layer benchmarks: forward + backward of one linear layer per recipe, write ``results/layer_bench/``.

    python experiments/layer_bench.py --config config/gpu.yaml --out results/layer_bench/gpu/layers.json
    python experiments/layer_bench.py --profile smoke --out /tmp/layers.json

Runs ``tests/bench/test_bench_layer.py`` through pytest-benchmark (as ``experiments/microbench.py``
does for the kernels, with ``ADAHOP_BENCH_PROFILE``: ``smoke`` = 128 tokens and small layers on a
CPU, ``gpu`` = Llama-3 8B projections at 16k tokens) and writes one record per (variant, shape): the
layer's TFLOP/s of fwd+bwd work, nn.Linear bf16 and torchao float8 rowwise (where importable)
measured in the same run, the ratios to them (``speedup_vs_bf16``), the GEMM path and the strategies.

Profile file, section ``layer_bench`` (every key optional):
    bench_profile: smoke | gpu     sizes (default: the file's top-level ``profile``)
    select: <pytest -k expression> a subset, e.g. "iht and q/o" (default: all)
    budget_s: <seconds> as --budget-s (default: none)

Interruption (``--budget-s N``, SIGTERM, SIGINT), ``--resume`` and exit status: as
experiments/microbench.py (the benchmarks that finished are kept, and a resumed run adds the rest; 0
once any record was written; pytest's code in the provenance).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


import microbench  # experiments/ is on sys.path when this script runs
from adahop.harness.provenance import write_results

TEST = "test_layer_fwd_bwd"


def records(doc: dict) -> list[dict]:
    """microbench's record of each layer benchmark, with the layer's own fields added."""
    layer_info = {b["name"]: b.get("extra_info", {}).get("layer") for b in doc.get("benchmarks", [])}
    out = []
    for rec in microbench.records_from_benchmark_json(doc):
        if rec["test"].startswith(TEST) and layer_info.get(rec["test"]):
            out.append({**rec, **layer_info[rec["test"]]})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", type=Path, help="profile YAML (its `profile` and `layer_bench` section)")
    p.add_argument("--profile", choices=microbench.PROFILES, help="benchmark sizes; overrides the config file")
    p.add_argument("--select", help="pytest -k expression; overrides the config file")
    p.add_argument("--out", type=Path, required=True, help="results file")
    p.add_argument("--overwrite", action="store_true", help="replace a results file of another configuration")
    microbench.add_budget_argument(p, "benchmarks")
    microbench.add_resume_argument(p)
    args = p.parse_args(argv)
    settings = microbench.bench_settings(args, "layer_bench")
    config = {"bench_profile": settings.bench_profile, "select": settings.select}
    kept, earlier = microbench.resumed(args.out, config, "layer_bench") if args.resume else ([], None)
    expr = f"{TEST} and ({settings.select})" if settings.select else TEST
    m = microbench.measure("layer_bench", settings, expr, kept, earlier, args.out, records)
    if isinstance(m, int):
        return m
    recs = m.records
    write_results(args.out, kept + recs, config=config, overwrite=args.overwrite, extra_provenance=m.provenance)
    for r in recs:
        peers = ", ".join(f"{k} {v:.2f}x" for k, v in r["ratio_to_peers"].items())
        print(f"{r['variant']:>14} {r['in_features']}->{r['out_features']} x{r['tokens']}: "
              f"{r['figure']:.3g} {r['unit']} (vs {peers}; path {r['gemm_path']})")
    print(f"layer_bench: {len(recs)} records{f' added to {len(kept)}' if kept else ''} -> {args.out} "
          f"({microbench.how_pytest_ended(m.rc, m.interrupted)})")
    return microbench.exit_status("layer_bench", m.rc, len(kept) + len(recs), m.interrupted)


if __name__ == "__main__":
    sys.exit(main())
