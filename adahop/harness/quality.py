"""The quality gap of each recipe to bf16, from pretraining and lm-eval results.

One row per (model, recipe): the seeds found, the final held-out loss (mean, spread, each seed),
corpus bits per byte, the mean 0-shot accuracy over the benchmark tasks, and each one's gap to the
bf16 runs of the same model. A gap is given with the bf16 seeds' own spread beside it: with three
seeds a gap of a few such spreads is as far as the runs can tell recipes apart.

Accuracy per task is ``acc_norm`` where lm-eval reports it, else ``acc`` (as figure 6 shows them
when the paper reports nothing); a recipe's mean accuracy counts only the tasks all of its seeds
and bf16's were evaluated on, so a missing task cannot move it. Evaluations on the full task sets
are used where a model has any; else those of its most used document limit (``eval_limit``).

Runs of one seed share their initial weights and their data order across recipes (``adahop.harness.train``
seeds both from the run's seed; a DDP run draws the same global batches), and the seed's own effect
on the loss is larger than most recipe gaps. So each row also carries ``paired``: per baseline, the
per-seed differences on the seeds both recipes have, their mean and sd, the 95% confidence
interval of the mean (Student's t over the seeds: with two or three seeds it is wide, and a
difference of the same sign on every seed can still be chance), and on how many seeds the recipe
is lower. Every recipe is paired with bf16, the method (adahop) with every other recipe, and the
pairs of :data:`CONTRAST_PAIRS` (what one ingredient alone buys: uniform-iht against mxfp4, HOT
without its low-rank wgrad against HOT).

Each row also carries ``gap_curve``: at every held-out evaluation, the recipe's held-out loss minus
the reference's on the same seed and step (:func:`paired_gap_points`), its mean, min and max over
the seeds both have: when the gap opens (figure 3 draws the same points).

Given the runs the profile plans (``planned``), :func:`progress` says which of them the table
stands on so far, which are trained but not evaluated and which are missing, so a campaign under
way cannot read as complete.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from typing import Any, Iterable, Mapping

CORPUS_TASK, BPB = "corpus_ppl", "bits_per_byte"
REFERENCE = "bf16"
METHOD = "adahop"
PAIRED_METRICS = ("final_val_loss", "bits_per_byte")  # lower is better in both
# (recipe, baseline) pairs beyond bf16 and the method: rotation alone, against no rotation; HOT's
# full-rank wgrad, against its low-rank one.
CONTRAST_PAIRS = frozenset({("uniform-iht", "mxfp4"), ("hot-no-lowrank", "hot")})


def _accuracy_metric(metrics: set[str]) -> str | None:
    return "acc_norm" if "acc_norm" in metrics else "acc" if "acc" in metrics else None


def _spread(values: list[float]) -> float | None:
    return statistics.stdev(values) if len(values) > 1 else None


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def run_seed(record: Mapping[str, Any]) -> int:
    """The seed of a pretraining record, from its ``name`` ``<model>_<recipe>_s<seed>``."""
    return split_run_name(str(record["name"]))[2]


def paired_gap_points(pretrain: Iterable[Mapping[str, Any]], reference: str = REFERENCE) -> list[dict[str, Any]]:
    """For every recipe but ``reference`` and every held-out evaluation of a run (``val_curve``):
    its loss minus the ``reference`` run's of the same model and seed at the same step (a seed fixes
    initial weights and data order for every recipe). Rows ``{model, recipe, seed, tokens, gap}``;
    points the reference run lacks are left out."""
    val: dict[tuple[str, str, int], dict[int, float]] = {}
    for r in pretrain:
        curve = r.get("val_curve")
        for p in curve if isinstance(curve, list) else []:  # (a frame's row may hold NaN for none)
            if p.get("val_loss") is not None:
                val.setdefault((r["model"], r["recipe"], run_seed(r)), {})[int(p["step"]) * int(r["tokens_per_step"])] = \
                    float(p["val_loss"])
    rows = []
    for (model, recipe, seed), points in sorted(val.items()):
        ref = val.get((model, reference, seed), {})
        if recipe != reference:
            rows += [{"model": model, "recipe": recipe, "seed": seed, "tokens": t, "gap": v - ref[t]}
                     for t, v in sorted(points.items()) if t in ref]
    return rows


def _gap_curve(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per token count: mean, min and max of the gap over the seeds that have it."""
    by_tokens: dict[int, list[float]] = defaultdict(list)
    for p in points:
        by_tokens[p["tokens"]].append(p["gap"])
    return [{"tokens": t, "seeds": len(g), "mean": statistics.fmean(g), "min": min(g), "max": max(g)}
            for t, g in sorted(by_tokens.items())]


def check_same_data(pretrain: Iterable[Mapping[str, Any]]) -> None:
    """Refuse to compare runs of one model trained on different data: their held-out losses are
    on different text. Runs are told apart by ``data_sha256`` (the shards' and tokenizer's
    digests; runs from before it was recorded carry none and are not checked)."""
    seen: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for r in pretrain:
        if r.get("data_sha256"):
            digest = ",".join(f"{k}={v[:12]}" for k, v in sorted(r["data_sha256"].items()))
            seen[r["model"]][digest].append(r.get("name", "?"))
    for model, runs in seen.items():
        if len(runs) > 1:
            raise ValueError(f"runs of model {model} were trained on different data (data_sha256), "
                             f"so their losses cannot be compared: {dict(runs)}")


def quality_rows(pretrain: Iterable[Mapping[str, Any]], evals: Iterable[Mapping[str, Any]],
                 reference: str = REFERENCE) -> list[dict[str, Any]]:
    """Rows of the gap table from pretraining records (``experiments/pretrain.py``: model, recipe,
    final_val_loss and ``name`` ``<model>_<recipe>_s<seed>``) and lm-eval records
    (``experiments/evaluate.py``: task, metric, value, model, recipe, seed; training-forward runs only)."""
    pretrain = list(pretrain)
    check_same_data(pretrain)
    loss: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    world: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)  # processes (GPUs) of each run
    for r in pretrain:
        if r.get("final_val_loss") is None:
            continue
        seed = run_seed(r)
        loss[(r["model"], r["recipe"])][seed] = float(r["final_val_loss"])
        world[(r["model"], r["recipe"])][str(seed)] = int(r.get("world_size") or 1)
    # (model, recipe) -> task -> metric -> seed -> value
    scores: dict[tuple[str, str], dict[str, dict[str, dict[int, float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(dict)))
    evals = [r for r in evals if r.get("value") is not None]
    # One document limit per model: the full sets where any run has them, else the most used limit.
    limit_of: dict[str, int | None] = {}
    for model in {r["model"] for r in evals}:
        used = Counter(r.get("limit") for r in evals if r["model"] == model)
        limit_of[model] = None if None in used else used.most_common(1)[0][0]
    for r in evals:
        if r.get("limit") == limit_of[r["model"]]:
            scores[(r["model"], r["recipe"])][r["task"]][r["metric"]][int(r["seed"])] = float(r["value"])

    def bpb(key) -> dict[int, float]:
        return dict(scores[key][CORPUS_TASK][BPB]) if key in scores else {}

    def accuracies(key, tasks: set[str]) -> dict[int, float]:
        """Per seed, the mean accuracy over ``tasks`` (seeds evaluated on all of them only)."""
        per_seed: dict[int, list[float]] = defaultdict(list)
        for task in sorted(tasks):
            metric = _accuracy_metric(set(scores[key][task]))
            for seed, v in scores[key][task][metric].items():
                per_seed[seed].append(v)
        return {s: statistics.fmean(v) for s, v in per_seed.items() if len(v) == len(tasks)}

    def tasks_of(key) -> set[str]:
        return {t for t, ms in scores.get(key, {}).items() if t != CORPUS_TASK and _accuracy_metric(set(ms))}

    gap_points: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for p in paired_gap_points(pretrain, reference):
        gap_points[(p["model"], p["recipe"])].append(p)
    rows = []
    keys = sorted(set(loss) | set(scores), key=lambda k: (k[0], k[1] != reference, k[1]))
    for model, recipe in keys:
        key, ref = (model, recipe), (model, reference)
        common = tasks_of(key) & tasks_of(ref)
        row: dict[str, Any] = {"model": model, "recipe": recipe,
                               "seeds": sorted(set(loss.get(key, {})) | set(bpb(key))), "tasks": sorted(common),
                               "eval_limit": limit_of.get(model), "world_size": dict(sorted(world[key].items()))}
        for name, mine, theirs in (
            ("final_val_loss", loss.get(key, {}), loss.get(ref, {})),
            ("bits_per_byte", bpb(key), bpb(ref)),
            ("mean_accuracy", accuracies(key, common) if common else {}, accuracies(ref, common) if common else {}),
        ):
            m, r = _mean(list(mine.values())), _mean(list(theirs.values()))
            row[name] = {
                "per_seed": {str(s): v for s, v in sorted(mine.items())},
                "mean": m,
                "sd": _spread(list(mine.values())),
                "gap_to_" + reference: (m - r) if m is not None and r is not None and recipe != reference else None,
                reference + "_sd": _spread(list(theirs.values())),
            }
        row["gap_curve"] = _gap_curve(gap_points[key])
        row["train_time"] = train_time([r for r in pretrain if (r["model"], r["recipe"]) == key])
        rows.append(row)
    _add_paired(rows, reference)
    return rows


def with_gpu_sharing(record: Mapping[str, Any], provenance: Mapping[str, Any]) -> dict[str, Any]:
    """A pretraining record with ``runs_per_gpu`` from its file's provenance: runs that shared their
    GPU with others (``ADAHOP_RUNS_PER_GPU`` in their provenance's ``backend_env``)
    have step times that are not one GPU's."""
    shared = (provenance.get("backend_env") or {}).get("ADAHOP_RUNS_PER_GPU")
    return {**record, "runs_per_gpu": int(shared or 1)}


def split_records(docs: Iterable[tuple[str, Mapping[str, Any]]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pretraining records (with :func:`with_gpu_sharing`) and the lm-eval records of results
    documents ``(path, doc)``, in any order and number; a record that is neither raises ValueError
    naming its file."""
    pretrain, evals = [], []
    for path, doc in docs:
        for r in doc["records"]:
            if "task" in r:
                evals.append(r)
            elif "final_val_loss" in r:
                pretrain.append(with_gpu_sharing(r, doc["provenance"]))
            else:
                raise ValueError(f"{path}: a record that is neither pretraining nor lm-eval: {sorted(r)[:8]}")
    return pretrain, evals


def shared_device(record: Mapping[str, Any]) -> str | None:
    """Why a pretraining record's step times are not one device's (it ran on several GPUs, or shared
    its GPU with another run: :func:`with_gpu_sharing`), or None."""
    if int(record.get("world_size") or 1) > 1:
        return f"{record['world_size']} GPUs"
    if int(record.get("runs_per_gpu") or 1) > 1:
        return f"{record['runs_per_gpu']} runs on one GPU"
    return None


def train_time(records: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Where the training time of one recipe's one-GPU runs went (their ``train_s``, ``step_s`` and
    ``calibration``, ``adahop.harness.train.step_times``): per seed, and the mean over seeds of each;
    ``left_out``: seed → why its run is not counted (it ran on several GPUs, ``world_size``, or shared
    its GPU with another run, ``runs_per_gpu``: a step's time is then another set-up's)."""
    per_seed: dict[str, dict[str, float | None]] = {}
    left_out = {}
    for r in records:
        if r.get("train_s") is None:
            continue
        why = shared_device(r)
        if why:
            left_out[str(run_seed(r))] = why
            continue
        cal = r.get("calibration") or {}
        per_seed[str(run_seed(r))] = {"steps": r.get("steps"), "train_s": r["train_s"], "step_s": r["step_s"],
                                      "first_s": r.get("first_s"),
                                      "calibration_steps": cal.get("steps"),
                                      "calibration_s": cal.get("s"), "calibration_share": cal.get("share"),
                                      "after_s": cal.get("after_s")}
    mean = {k: _mean([v[k] for v in per_seed.values() if v[k] is not None])
            for k in ("steps", "train_s", "step_s", "first_s", "calibration_steps", "calibration_s", "calibration_share",
                      "after_s")}
    return {"per_seed": dict(sorted(per_seed.items())), **mean, "left_out": dict(sorted(left_out.items()))}


def _add_paired(rows: list[dict[str, Any]], reference: str) -> None:
    """Give each row ``paired``: ``{baseline: {metric: {"seeds", "per_seed", "mean", "sd", "ci95",
    "lower"}, "world_size_differs": [seed, ...]}}`` (recipe − baseline on the seeds both have;
    ``lower``: how many of those differences are < 0)."""
    by_key = {(r["model"], r["recipe"]): r for r in rows}
    for row in rows:
        recipe = row["recipe"]
        others = [k[1] for k in by_key if k[0] == row["model"] and k[1] != recipe]
        baselines = [b for b in others if b == reference or recipe == METHOD or (recipe, b) in CONTRAST_PAIRS]
        baselines.sort(key=lambda b: (b != reference, b))
        row["paired"] = {}
        for base in baselines:
            other = by_key[(row["model"], base)]
            pairs = {}
            for name in PAIRED_METRICS:
                mine, theirs = row[name]["per_seed"], other[name]["per_seed"]
                diffs = {s: mine[s] - theirs[s] for s in sorted(set(mine) & set(theirs), key=int)}
                if diffs:
                    values = list(diffs.values())
                    pairs[name] = {"seeds": [int(s) for s in diffs], "per_seed": diffs, "mean": _mean(values),
                                   "sd": _spread(values), "ci95": _ci95(values), "lower": sum(v < 0 for v in values)}
            if pairs:
                # Seeds whose two runs split the batch over a different number of processes: the
                # same global batches, but not the same arithmetic (a confound to name).
                mine_ws, theirs_ws = row["world_size"], other["world_size"]
                pairs["world_size_differs"] = sorted(
                    (int(s) for s in set(mine_ws) & set(theirs_ws) if mine_ws[s] != theirs_ws[s]))
                row["paired"][base] = pairs


def _ci95(values: list[float]) -> list[float] | None:
    """The 95% confidence interval of the mean of ``values`` (Student's t), None for fewer than 2."""
    if len(values) < 2:
        return None
    from scipy.stats import t

    mean, half = statistics.fmean(values), t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5
    return [mean - half, mean + half]


def _num(x: float | None, digits: int = 3, signed: bool = False) -> str:
    if x is None:
        return "—"
    return f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"


def run_name(model: str, recipe: str, seed: int | str) -> str:
    """A run's name as the workflow and ``experiments/pretrain.py`` spell it."""
    return f"{model}_{recipe}_s{seed}"


def split_run_name(name: str) -> tuple[str, str, int]:
    """``(model, recipe, seed)`` of a :func:`run_name` (model names hold no ``_``, recipes no ``_s``)."""
    model, rest = name.split("_", 1)
    recipe, seed = rest.rsplit("_s", 1)
    return model, recipe, int(seed)


def progress(planned: Iterable[str], pretrain: Iterable[Mapping[str, Any]],
             evals: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Of the ``planned`` run names: ``evaluated`` (a pretraining and an lm-eval record),
    ``trained_only`` (no lm-eval yet), ``evaluated_only`` (lm-eval without its pretraining record)
    and ``missing`` (neither); ``unplanned``: runs in the records the plan does not list."""
    planned = list(dict.fromkeys(planned))
    trained = {str(r["name"]) for r in pretrain if r.get("final_val_loss") is not None}
    evaluated = {run_name(r["model"], r["recipe"], r["seed"]) for r in evals if r.get("value") is not None}
    out: dict[str, list[str]] = {"evaluated": [], "trained_only": [], "evaluated_only": [], "missing": []}
    for run in planned:
        key = {(True, True): "evaluated", (True, False): "trained_only",
               (False, True): "evaluated_only", (False, False): "missing"}[(run in trained, run in evaluated)]
        out[key].append(run)
    out["unplanned"] = sorted((trained | evaluated) - set(planned))
    return out


def _gap_curve_markdown(rows: list[dict[str, Any]], reference: str) -> list[str]:
    """One table per model: held-out loss − reference at each evaluation (mean over shared seeds)."""
    lines = []
    for model in dict.fromkeys(r["model"] for r in rows):
        curves = {r["recipe"]: {p["tokens"]: p for p in r.get("gap_curve", [])} for r in rows
                  if r["model"] == model and r.get("gap_curve")}
        if not curves:
            continue
        tokens = sorted({t for c in curves.values() for t in c})
        most = {recipe: max(p["seeds"] for p in c.values()) for recipe, c in curves.items()}
        lines += ["", f"## {model}: held-out loss − {reference} over training", "",
                  f"Each cell: the mean over the seeds both runs have of the recipe's held-out loss minus {reference}'s",
                  "on the same seed at the same step (figure 3, third panel). The header gives each recipe's number",
                  "of paired seeds; a cell with fewer says how many in brackets.", "",
                  "| tokens | " + " | ".join(f"{r} ({most[r]})" for r in curves) + " |", "|---|" + "---|" * len(curves)]
        for t in tokens:
            cells = []
            for recipe, c in curves.items():
                p = c.get(t)
                cells.append("" if p is None else _num(p["mean"], 3, signed=True)
                             + (f" ({p['seeds']})" if p["seeds"] < most[recipe] else ""))
            lines.append(f"| {_tokens(t)} | " + " | ".join(cells) + " |")
    return lines


def _tokens(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e3 else str(n)


def _progress_markdown(state: dict[str, list[str]]) -> list[str]:
    n = sum(len(state[k]) for k in ("evaluated", "trained_only", "evaluated_only", "missing"))
    lines = ["", "## Progress against the profile's plan", "",
             f"{len(state['evaluated'])} of the {n} planned runs are trained and evaluated."]
    for key, what in (("trained_only", "Trained, no lm-eval yet"), ("evaluated_only", "lm-eval without a pretraining record"),
                      ("missing", "Not run yet"), ("unplanned", "In the results but not in the plan")):
        if state[key]:
            lines.append(f"{what} ({len(state[key])}): " + ", ".join(f"`{r}`" for r in state[key]) + ".")
    return lines


def markdown(rows: list[dict[str, Any]], sources: Iterable[str], reference: str = REFERENCE,
             progress_state: dict[str, list[str]] | None = None, commits: Mapping[str, str | None] | None = None) -> str:
    """The rows as a Markdown table, with what each column means (and the plan's progress, if given).
    ``commits``: each source's ``git_commit``, listed beside it."""
    gap, ref_sd = "gap_to_" + reference, reference + "_sd"
    lines = [
        "# Quality gap to bf16",
        "",
        "Regenerated by `adahop.harness.quality` from the pretraining and lm-eval results below; do not edit.",
        f"Each cell: mean over seeds (± sd over seeds); gap: recipe mean − {reference} mean (in brackets, the",
        f"sd of the {reference} seeds, the scale of seed noise). Accuracy: mean over the tasks listed (acc_norm",
        "where lm-eval has it, else acc), near 0.25–0.5 (chance) for small models.",
        "",
        "| model | recipe | seeds | final held-out loss | gap | bits per byte | gap | mean accuracy | gap | tasks |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = []
        for name, digits in (("final_val_loss", 3), ("bits_per_byte", 4), ("mean_accuracy", 4)):
            m = r[name]
            cells.append(_num(m["mean"], digits) + (f" ± {_num(m['sd'], digits)}" if m["sd"] is not None else ""))
            cells.append(_num(m[gap], digits, signed=True)
                         + (f" [{_num(m[ref_sd], digits)}]" if m[gap] is not None and m[ref_sd] is not None else ""))
        seeds = ", ".join(map(str, r["seeds"])) or "—"
        evaluated = sorted(int(s) for s in r["bits_per_byte"]["per_seed"])
        if evaluated and evaluated != r["seeds"]:
            seeds += f" (lm-eval: {', '.join(map(str, evaluated))})"
        tasks = f"{len(r['tasks'])}" + (f" (first {r['eval_limit']} documents)" if r.get("eval_limit") is not None else "")
        lines.append(f"| {r['model']} | {r['recipe']} | {seeds} | " + " | ".join(cells) + f" | {tasks} |")
    lines += _paired_markdown(rows, reference)
    lines += _gap_curve_markdown(rows, reference)
    lines += _train_time_markdown(rows)
    if progress_state is not None:
        lines += _progress_markdown(progress_state)
    lines += ["", *_sources_markdown(list(sources), commits or {}), ""]
    return "\n".join(lines)


def _train_time_markdown(rows: list[dict[str, Any]]) -> list[str]:
    timed = [r for r in rows if r["train_time"]["per_seed"] or r["train_time"]["left_out"]]
    if not timed:
        return []
    lines = ["", "## Where the training time went", "",
             "Each cell: mean over the recipe's one-GPU runs (`adahop.harness.train.step_times`, from each run's per-step",
             "throughput; held-out evaluation and checkpoints left out). Median step: over the steps after the",
             "first outside calibration. First step: its time above the median step (compilation, autotuning).",
             "Calibration: the steps in which the layers observe their operands (`calibration_steps`, again every",
             "`recalibration_interval`), their time above the median step (the first step left out), and its",
             "share of the training time; step after: the time above the median step of the first step with",
             "newly fixed strategies (their kernels compile, or load from the machine's cache, then).", "",
             "| model | recipe | seeds | training (s) | median step (s) | first step (s) | calibration steps | calibration (s) | share | step after (s) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in timed:
        t = r["train_time"]
        seeds = (", ".join(t["per_seed"]) or "none") + "".join(f" (s{seed} left out: {why})"
                                                              for seed, why in t["left_out"].items())
        steps = "—" if t["calibration_steps"] is None else f"{t['calibration_steps']:.0f}"
        share = "—" if t["calibration_share"] is None else f"{100 * t['calibration_share']:.1f}%"
        lines.append(f"| {r['model']} | {r['recipe']} | {seeds} | {_num(t['train_s'], 0)} | {_num(t['step_s'], 3)} | "
                     f"{_num(t['first_s'], 1)} | "
                     f"{steps} | {_num(t['calibration_s'], 1)} | {share} | {_num(t['after_s'], 1)} |")
    return lines


def _sources_markdown(sources: list[str], commits: Mapping[str, str | None]) -> list[str]:
    if not commits:
        return ["Sources:", *[f"- `{s}`" for s in sources]]
    made_at = sorted({c[:7] for s in sources if (c := commits.get(s))})
    lines = ["Sources, with the commit each was made at" + (
        f": {len(made_at)} commits. Commits between them may change a recipe's arithmetic, so a "
        "difference between runs of two commits may also hold the code's (and no GPU run repeats "
        "bit for bit: its kernels are not all deterministic)." if len(made_at) > 1 else ":")]
    return lines + [f"- `{s}`" + (f" ({commits[s][:7]})" if commits.get(s) else "") for s in sources]


def _paired_markdown(rows: list[dict[str, Any]], reference: str) -> list[str]:
    table, mixed = [], False
    for r in rows:
        for base, pairs in r.get("paired", {}).items():
            cells, differs = [], {str(s) for s in pairs["world_size_differs"]}
            mixed |= bool(differs)
            for name, digits in (("final_val_loss", 3), ("bits_per_byte", 4)):
                p = pairs.get(name)
                if p is None:
                    cells += ["—", "—"]
                    continue
                each = ", ".join(f"s{s}{'†' if s in differs else ''} {_num(v, digits, signed=True)}"
                                 for s, v in p["per_seed"].items())
                ci = (f", 95% CI [{_num(p['ci95'][0], digits, signed=True)}, {_num(p['ci95'][1], digits, signed=True)}]"
                      if p.get("ci95") else "")
                cells += [_num(p["mean"], digits, signed=True) + (f" ± {_num(p['sd'], digits)}" if p["sd"] is not None
                                                                  else "") + f" ({each}{ci})",
                          f"{p['lower']} of {len(p['seeds'])}"]
            table.append(f"| {r['model']} | {r['recipe']} | {base} | " + " | ".join(cells) + " |")
    if not table:
        return []
    return [
        "",
        "## Paired by seed",
        "",
        "A seed fixes the initial weights and the data order for every recipe, so the difference on one",
        "seed leaves that seed's own luck out. Each cell: mean over the shared seeds of recipe − baseline",
        "(± sd of those differences; then each seed's difference and the 95% confidence interval of the",
        "mean, Student's t over the seeds), and on how many seeds the recipe is lower. With two or three",
        "seeds an interval that holds 0 means the runs cannot tell the two recipes apart.",
        f"Every recipe against {reference}; {METHOD} against every other recipe; "
        + "; ".join(f"{a} against {b}" for a, b in sorted(CONTRAST_PAIRS)) + ".",
        "",
        "| model | recipe | baseline | held-out loss: recipe − baseline | lower on | bits per byte: recipe − baseline | lower on |",
        "|---|---|---|---|---|---|---|",
        *table,
        *(["", "† The two runs of this seed ran on different numbers of GPUs (DDP): the same global batches,",
           "but not the same arithmetic, so that seed's difference also holds the set-up's."] if mixed else []),
    ]
