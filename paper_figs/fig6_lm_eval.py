"""Figure 6: lm-eval accuracies per recipe, beside the numbers the AdaHOP paper reports.

Reads results/eval/<profile>/<model>_<recipe>_s<seed>.json (experiments/evaluate.py): one record
per (task, metric) with ``value``, ``recipe``, ``model``, ``seed``, ``forward`` and ``limit``.
The paper's numbers come from adahop/harness/paper_reference.yaml (each cites its table); where that file
holds none, the right-hand panel says so instead of showing bars.

Metric per task: the paper's where it reports the task, else ``acc_norm`` where lm-eval has it,
else ``acc``. Bars: mean over seeds; whiskers: min to max over seeds. The corpus held-out
perplexity (``corpus_ppl``, bits per byte) gets its own panel, its axis fitted to the recipes near
one another (one far off the rest, ``common.far_out``, is written at the edge with its mean).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

import common

CORPUS_TASK, CORPUS_METRIC = "corpus_ppl", "bits_per_byte"


def pick_metrics(ours: pd.DataFrame, paper: pd.DataFrame) -> dict[str, str]:
    """The accuracy metric shown for each task (see the module docstring)."""
    chosen = {}
    for task, metrics in ours.groupby("task")["metric"]:
        reported = paper.loc[paper["task"] == task, "metric"]
        available = set(metrics)
        if not reported.empty and reported.iloc[0] in available:
            chosen[task] = reported.iloc[0]
        elif "acc_norm" in available:
            chosen[task] = "acc_norm"
        elif "acc" in available:
            chosen[task] = "acc"
    return chosen


def shown_metric(frame: pd.DataFrame, metrics: dict[str, str]) -> pd.Series:
    """Rows whose metric is the one shown for their task."""
    return pd.Series([metrics.get(t) == m for t, m in zip(frame["task"], frame["metric"])], index=frame.index, dtype=bool)


def label_runs(frame: pd.DataFrame) -> pd.Series:
    """The legend label of a record: its recipe, with the eval forward when runs differ in it."""
    if frame.groupby("recipe")["forward"].nunique().max() > 1:
        return frame["recipe"] + " (" + frame["forward"].astype(str) + " forward)"
    return frame["recipe"]


def main(argv: list[str] | None = None) -> None:
    from adahop.harness.eval import load_paper_reference

    args = common.parse_args(__doc__, argv)
    docs = common.load(args.results)
    ours = common.records(docs, ["task", "metric", "value", "recipe", "model", "forward", "limit"])
    paper = pd.DataFrame(load_paper_reference(), columns=["model", "recipe", "task", "metric", "value", "where"])
    paper = paper.dropna(subset=["value"])
    metrics = pick_metrics(ours[ours["task"] != CORPUS_TASK], paper)
    acc = ours[shown_metric(ours, metrics)].copy()
    if acc.empty:
        raise ValueError(f"no accuracy records (acc / acc_norm) in {[str(p) for p in args.results]}")
    acc["run"] = label_runs(acc)
    tasks = sorted(metrics)
    tick = {t: f"{t}\n({metrics[t]})" for t in tasks}
    recipes = common.recipe_order(acc["recipe"])
    runs = [r for recipe in recipes for r in dict.fromkeys(acc.loc[acc["recipe"] == recipe, "run"])]
    palette = common.recipe_palette()
    colours = {r: palette.get(r.split(" ")[0]) for r in runs}
    seeds = acc.groupby("run")["seed"].nunique()
    limits = sorted({int(x) for x in acc["limit"].dropna()})
    model = ", ".join(dict.fromkeys(acc["model"]))

    shown = paper[paper["task"].isin(tasks) & shown_metric(paper, metrics)]

    common.style()
    fig, axes = plt.subplots(1, 3, figsize=(18, 5.8), gridspec_kw={"width_ratios": [3, 2 if len(shown) else 0.8, 1]})
    ax = axes[0]
    sns.barplot(data=acc.assign(task=acc["task"].map(tick)), x="task", y="value", hue="run", order=[tick[t] for t in tasks],
                hue_order=runs, palette=colours, errorbar=("pi", 100), capsize=0.15, err_kws={"linewidth": 1}, ax=ax)
    ax.set_xlabel("")
    ax.set_ylabel("accuracy (fraction correct)")
    ax.set_ylim(0, 1)
    ax.tick_params(axis="x", labelsize="small")
    sub = f"first {limits[0]} documents per task" if len(limits) == 1 else "full validation sets" if not limits else f"limits {limits}"
    ax.set_title(f"ours: {model}, {sub}")
    handles, _ = ax.get_legend_handles_labels()
    ax.legend(handles, [f"{r} ({common.seeds_label(seeds[r])})" for r in runs], title="training recipe (whiskers: min–max over seeds)",
              fontsize="small", title_fontsize="small", ncols=min(len(runs), 4), loc="upper center",
              bbox_to_anchor=(0.5, -0.16))

    ax = axes[1]
    if shown.empty:
        ax.text(0.5, 0.5, "no paper numbers\nfor these tasks:\nadahop/\npaper_reference.yaml\nholds none yet",
                ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
    else:
        shown = shown.assign(run=shown["model"] + " / " + shown["recipe"], task=shown["task"].map(tick))
        paper_runs = list(dict.fromkeys(shown["run"]))
        sns.barplot(data=shown, x="task", y="value", hue="run", order=[tick[t] for t in tasks if tick[t] in set(shown["task"])],
                    hue_order=paper_runs, palette={r: palette.get(r.split(" / ")[1], "grey") for r in paper_runs},
                    hatch="//", ax=ax)
        ax.set_ylim(0, 1)
        ax.set_ylabel("accuracy (fraction correct)")
        ax.tick_params(axis="x", labelsize="small")
        ax.legend(title="paper: model / recipe", fontsize="small", title_fontsize="small", loc="upper center",
                  bbox_to_anchor=(0.5, -0.16))
    ax.set_xlabel("")
    ax.set_title("paper (arXiv:2604.02525)")

    ax = axes[2]
    ppl = ours[(ours["task"] == CORPUS_TASK) & (ours["metric"] == CORPUS_METRIC)].copy()
    if ppl.empty:
        ax.text(0.5, 0.5, f"no {CORPUS_TASK} results", ha="center", va="center", transform=ax.transAxes)
    else:
        ppl["run"] = label_runs(ppl)
        order = [r for r in runs if r in set(ppl["run"])]
        # Dots per seed and a bar at the mean on a zoomed axis: recipes differ in the second decimal.
        sns.pointplot(data=ppl, y="run", x="value", order=order, hue="run", palette=colours, errorbar=None,
                      markers="|", markersize=14, linestyle="none", legend=False, ax=ax)
        sns.stripplot(data=ppl, y="run", x="value", order=order, hue="run", palette=colours, size=5, alpha=0.8,
                      jitter=False, legend=False, ax=ax)
        means = ppl.groupby("run")["value"].mean()
        off = common.far_out(means.to_dict())
        common.fit_axis(ax, "x", ppl[~ppl["run"].isin(off)]["value"])
        common.mark_off_scale(ax, [("", means[r], order.index(r), colours[r]) for r in order if r in off], fmt="{:.2f}")
    ax.set_ylabel("")
    ax.set_xlabel("bits per byte (lower is better)")
    ax.set_title("held-out corpus (corpus_ppl; dots: seeds, bar: mean)")
    fig.suptitle(f"lm-eval, 0-shot — {common.device_label(docs)}")
    common.save(fig, args, docs)


if __name__ == "__main__":
    main()
