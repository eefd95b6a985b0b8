"""The pretraining runs a profile still lacks, spread over GPUs as scripts/h200_queue.sh arguments.

    python scripts/plan_queue.py [--config config/gpu.yaml] [--gpus 2] [--seconds 1600] [--stages memory,...]

Reads the profile's plan (models × recipes × seeds, plus ``pretrain.ablations``) and the committed
results under ``results/{pretrain,eval}/<profile>/``; a run lacking either is to be run again from
the start (a device session keeps no checkpoint for the next). Each run's time is estimated from
the committed runs of its recipe: the training tokens over their median tokens/s, times
``--overhead`` (start-up, held-out evaluations, checkpoints: 1.25 measured on the H200), plus
``--eval-s`` for lm-eval; a recipe without runs takes the median over the quantized recipes. A
policy recipe adds its calibrating steps (``Recipe.calibration_windows`` under the profile's
``recipe_overrides``) times what a calibrating step cost above a plain one in the committed runs
(their ``calibration``, at the newest commit that has any: on the H200 at 125m 2.4-2.5 s at
1773913 and 86d04bf, 1.0 s at 5779bdd, 0.34-0.36 s at 27d18ee): the median tokens/s leave it out. Main
runs go first, then ablations, each to the GPU with the least work so far (stages first, at
``--stage-s`` each). Prints one queue string per GPU (the h200_queue.sh arguments), its estimated
seconds, and the runs that would not fit ``--seconds`` per GPU (the next session's).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import yaml

from adahop.provenance import REPO_ROOT, read_results
from adahop.quality import progress, run_name, shared_device, split_run_name, with_gpu_sharing
from adahop.recipes import get_recipe

# What each stage took on the H200 (results/logs/h200-*: memory 370 s at f36af21, before the run-map
# records added three 125m models, about 40 s more; microbench 180 and 186 s and layers 226 s in
# session 10, h200-2026-12-01-s10*, with the pattern-detection benchmark and its peers).
STAGE_S = {"tests": 200, "microbench": 190, "layers": 230, "memory": 410, "patterns": 420, "strategies": 360}
# A throughput-RUN stage (a one-GPU run of the profile's throughput section): not yet timed whole;
# h200_queue.sh's guess less its margin.
THROUGHPUT_STAGE_S = 400


def planned(pretrain: dict) -> list[tuple[str, bool]]:
    """``(run, is_ablation)`` for every run of the profile's plan, main runs first; within each,
    seed by seed (every recipe's seed 0, then seed 1, ...): a session cut short leaves whole seeds,
    which pair, rather than all seeds of a few recipes."""
    ablations = pretrain.get("ablations") or {"recipes": [], "seeds": []}
    main = [run_name(m, r, s) for m in pretrain["models"] for s in pretrain["seeds"] for r in pretrain["recipes"]]
    extra = [run_name(m, r, s) for m in pretrain["models"] for s in ablations["seeds"] for r in ablations["recipes"]]
    return [(r, False) for r in main] + [(r, True) for r in extra]


def load(folder: Path) -> list[dict]:
    """The records of every results file in ``folder``, each with ``runs_per_gpu`` (:func:`with_gpu_sharing`)
    and ``made_at``, its file's provenance ``(date, git_commit)``."""
    return [{**with_gpu_sharing(rec, doc["provenance"]),
             "made_at": (doc["provenance"].get("date") or "", doc["provenance"].get("git_commit") or "")}
            for path in sorted(folder.glob("*.json")) for doc in [read_results(path)] for rec in doc["records"]]


def run_seconds(pretrain_records: list[dict], tokens: int, overhead: float, eval_s: float) -> dict[str, float]:
    """Estimated seconds of one run (train and lm-eval) per recipe with committed runs, and ``*``
    for the others (the median over the quantized recipes)."""
    rates: dict[str, list[float]] = {}
    for r in pretrain_records:
        if r.get("tokens_per_s"):
            rates.setdefault(r["recipe"], []).append(float(r["tokens_per_s"]))
    out = {recipe: tokens / statistics.median(v) * overhead + eval_s for recipe, v in rates.items()}
    quantized = [s for recipe, s in out.items() if recipe != "bf16"]
    out["*"] = statistics.median(quantized) if quantized else tokens / 2e5 * overhead + eval_s
    return out


def calibration_step_s(pretrain_records: list[dict], default: float = 2.5) -> float:
    """What a calibrating step costs above a plain one: the median over the committed runs that
    calibrate on a device of their own (their ``calibration``, ``adahop.train.step_times``; the
    quality table's rule, ``shared_device``) made at the newest commit among them (``made_at``: the
    detector's code changes the cost, 2.4-2.5 s at 1773913 and 86d04bf, 1.0 s at 5779bdd, 0.34-0.36 s
    at 27d18ee with the detector's kernels);
    ``default`` without any."""
    eligible = [r for r in pretrain_records
                if r.get("calibration") and r["calibration"]["steps"] and shared_device(r) is None]
    if not eligible:
        return default
    newest = max(r.get("made_at", ("", "")) for r in eligible)[1]
    return statistics.median(r["calibration"]["s"] / r["calibration"]["steps"] for r in eligible
                             if r.get("made_at", ("", ""))[1] == newest)


def calibrating_steps(recipe: str, pretrain: dict) -> int:
    """How many steps of the profile's runs of ``recipe`` calibrate (0 for a fixed recipe)."""
    windows = get_recipe(recipe, **(pretrain.get("recipe_overrides") or {})).calibration_windows(pretrain["steps"])
    return sum(b - a + 1 for a, b in windows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=REPO_ROOT / "config" / "gpu.yaml")
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--seconds", type=float, default=1600, help="GPU seconds per GPU this session (default 1600: "
                   "three 550 s calls less the machine's start)")
    p.add_argument("--stages", default="", help="comma-separated h200_queue.sh stages to run first")
    p.add_argument("--overhead", type=float, default=1.25)
    p.add_argument("--eval-s", type=float, default=150)
    p.add_argument("--stage-s", type=float, default=None, help="seconds per stage (default: measured, per stage)")
    args = p.parse_args(argv)
    if args.gpus < 1:
        p.error("--gpus must be >= 1")
    profile = yaml.safe_load(args.config.read_text())
    pretrain, name = profile["pretrain"], profile.get("profile", args.config.stem)
    stage_s = {**STAGE_S, **{f"throughput-{run['name']}": THROUGHPUT_STAGE_S
                             for run in profile.get("throughput") or [] if run["world_size"] == 1}}
    stages = [s for s in args.stages.split(",") if s]
    unknown = sorted(set(stages) - set(stage_s))
    if unknown:
        p.error(f"unknown stages {unknown}; known: {sorted(stage_s)}")
    records = {stage: load(REPO_ROOT / "results" / stage / name) for stage in ("pretrain", "eval")}
    plan = planned(pretrain)
    state = progress([r for r, _ in plan], records["pretrain"], records["eval"])
    todo = [(run, ablation) for run, ablation in plan if run not in state["evaluated"]]
    tokens = pretrain["steps"] * pretrain["batch_size"] * pretrain["seq_len"]
    seconds = run_seconds(records["pretrain"], tokens, args.overhead, args.eval_s)
    per_cal_step = calibration_step_s(records["pretrain"])

    queues: list[list[str]] = [[] for _ in range(args.gpus)]
    load_s = [0.0] * args.gpus
    later: list[str] = []
    for stage in stages:
        i = load_s.index(min(load_s))
        queues[i].append(f"stage:{stage}")
        load_s[i] += args.stage_s if args.stage_s is not None else stage_s[stage]
    for run, _ in todo:
        _, recipe, seed = split_run_name(run)
        need = seconds.get(recipe, seconds["*"]) + calibrating_steps(recipe, pretrain) * per_cal_step
        i = load_s.index(min(load_s))
        if load_s[i] + need > args.seconds:
            later.append(run)
            continue
        queues[i].append(f"{recipe}:{seed}")
        load_s[i] += need
    print(f"{len(state['evaluated'])} of {len(plan)} planned runs are evaluated; {len(todo)} to run "
          f"({sum(a for _, a in todo)} ablations)")
    for i, (q, s) in enumerate(zip(queues, load_s)):
        print(f"gpu {i}: ~{s:.0f} s: \"{' '.join(q)}\"")
    print("bash scripts/h200_queue.sh " + " ".join(f'"{" ".join(q)}"' for q in queues))
    if later:
        print(f"do not fit {args.seconds:.0f} s per GPU ({len(later)}): {' '.join(later)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
