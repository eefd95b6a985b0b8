"""Figure 3: training and held-out loss per recipe, mean and spread over seeds.

Reads results/pretrain/<profile>/<model>_<recipe>_s<seed>.json (experiments/pretrain.py): each
record's ``loss_curve`` (training loss at ~20 evenly spaced steps), ``val_curve`` (held-out loss
at every evaluation) and ``tokens_per_step``. One row of panels per model size: training loss and
held-out loss against training tokens (line: mean over seeds; band: min to max over seeds), each
recipe's held-out loss minus bf16's on the same seed at the same step (when the gap opens), and
the final held-out loss of every seed per recipe, one marker shape per seed (one seed
fixes the initial weights and the data order for every recipe, so same-seed markers pair up).
The last two panels fit their axis to the recipes near one another: one far off the rest
(``common.far_out``, e.g. a recipe that failed to train) is written at the edge with its value.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

import common
from adahop.harness.quality import paired_gap_points


def curves(runs: pd.DataFrame, column: str, value: str) -> pd.DataFrame:
    """One row per (run, logged step) of the curve ``column`` (a list of {step, value} dicts)."""
    rows = [
        {"model": r.model, "recipe": r.recipe, "seed": r.seed, "tokens": p["step"] * r.tokens_per_step, value: p[value]}
        for r in runs.itertuples()
        for p in (getattr(r, column) or [])
        if p.get(value) is not None
    ]
    return pd.DataFrame(rows, columns=["model", "recipe", "seed", "tokens", value])


def main(argv: list[str] | None = None) -> None:
    args = common.parse_args(__doc__, argv)
    docs = common.load(args.results)
    runs = common.records(docs, ["model", "recipe", "loss_curve", "val_curve", "tokens_per_step", "final_val_loss"])
    train, val = curves(runs, "loss_curve", "loss"), curves(runs, "val_curve", "val_loss")
    if train.empty:
        raise ValueError(f"no training-loss points in {[str(p) for p in args.results]}")
    models = list(dict.fromkeys(runs["model"]))
    order = common.recipe_order(runs["recipe"])
    palette = common.recipe_palette()
    seeds = runs.groupby(["model", "recipe"])["seed"].nunique()
    scale, unit = (1e6, "M") if train["tokens"].max() >= 1e6 else (1e3, "k")

    common.style()
    # held-out loss minus bf16's on the same seed and step: the points of results/quality's gap_curve
    gaps = pd.DataFrame(paired_gap_points(runs.to_dict("records")), columns=["model", "recipe", "seed", "tokens", "gap"])
    fig, axes = plt.subplots(len(models), 4, figsize=(17, 3.8 * len(models)), squeeze=False,
                             gridspec_kw={"width_ratios": [1.2, 1.2, 1.2, 1]})
    for row, model in zip(axes, models):
        for ax, frame, value, title in (
            (row[0], train, "loss", "training loss"),
            (row[1], val, "val_loss", "held-out loss"),
        ):
            part = frame[frame["model"] == model].assign(tokens=lambda d: d["tokens"] / scale)
            if part.empty:
                ax.text(0.5, 0.5, "no held-out evaluations in these runs", ha="center", va="center", transform=ax.transAxes)
            else:
                sns.lineplot(data=part, x="tokens", y=value, hue="recipe", hue_order=[r for r in order if r in set(part["recipe"])],
                             palette=palette, errorbar=("pi", 100), marker="o" if value == "val_loss" else None,
                             markersize=4, ax=ax, legend=ax is row[0])
            ax.set_xlabel(f"training tokens ({unit})")
            ax.set_ylabel(f"{title} (nats/token)")
            ax.set_title(f"{model}: {title}")
        final = runs[runs["model"] == model].dropna(subset=["final_val_loss"])
        # a recipe that trained far worse than the rest would squash the others' gaps and losses
        off = common.far_out(final.groupby("recipe")["final_val_loss"].mean().to_dict())
        ax = row[2]
        part = gaps[gaps["model"] == model].assign(tokens=lambda d: d["tokens"] / scale)
        if part.empty:
            ax.text(0.5, 0.5, "no bf16 run of the same seed to pair with", ha="center", va="center", transform=ax.transAxes)
        else:
            sns.lineplot(data=part, x="tokens", y="gap", hue="recipe", hue_order=[r for r in order if r in set(part["recipe"])],
                         palette=palette, errorbar=("pi", 100), marker="o", markersize=4, ax=ax, legend=False)
            ax.axhline(0, color="0.3", linewidth=0.8)
            # the first evaluations' gaps dwarf the later ones: show from the second on
            later = part[(part["tokens"] > part["tokens"].min()) & ~part["recipe"].isin(off)]["gap"]
            common.fit_axis(ax, "y", [0.0, *later], pad=0.1)
            last = part[part["tokens"] == part["tokens"].max()].groupby("recipe")["gap"].mean()
            common.mark_off_scale(ax, [(r, last[r], None, palette[r]) for r in order if r in off and r in last], axis="y")
        ax.set_xlabel(f"training tokens ({unit})")
        ax.set_ylabel("held-out loss − bf16, same seed")
        ax.set_title(f"{model}: gap to bf16 (line: mean over shared seeds)")
        ax = row[3]
        if final.empty:
            ax.text(0.5, 0.5, "no final held-out loss", ha="center", va="center", transform=ax.transAxes)
        else:
            present = [r for r in order if r in set(final["recipe"])]
            sns.pointplot(data=final, y="recipe", x="final_val_loss", order=present, hue="recipe", palette=palette,
                          errorbar=None, markers="|", markersize=14, linestyle="none", legend=False, ax=ax)
            # A seed fixes initial weights and data order for every recipe: one marker per seed pairs the dots.
            seed_order = sorted(set(final["seed"]))
            markers = dict(zip(seed_order, "osD^vP*X"))
            for r in final.itertuples():
                ax.plot(r.final_val_loss, present.index(r.recipe), linestyle="none", marker=markers.get(r.seed, "o"),
                        markersize=6, alpha=0.85, color=palette[r.recipe], markeredgecolor="0.2", markeredgewidth=0.5)
            ax.legend([plt.Line2D([], [], linestyle="none", marker=markers.get(seed, "o"), color="0.5") for seed in seed_order],
                      [f"seed {seed}" for seed in seed_order], fontsize=7, loc="best", framealpha=0.8)
            ax.set_yticks(range(len(present)), [f"{r} ({common.seeds_label(seeds[(model, r)])})" for r in present])
            common.fit_axis(ax, "x", final[~final["recipe"].isin(off)]["final_val_loss"])
            means = final.groupby("recipe")["final_val_loss"].mean()
            common.mark_off_scale(ax, [("", means[r], present.index(r), palette[r]) for r in present if r in off],
                                  fmt="{:.2f}")
        ax.set_xlabel("final held-out loss (nats/token)")
        ax.set_ylabel("")
        ax.set_title(f"{model}: final held-out loss (markers: seeds, bar: mean)")
        if row[0].get_legend() is not None:
            row[0].get_legend().remove()
    handles = [plt.Line2D([], [], color=palette[r]) for r in order]
    fig.legend(handles, order, title="recipe (line: mean over seeds; band: min–max over seeds)", loc="outside lower center",
               ncols=len(order))
    fig.suptitle(f"Pretraining loss per recipe — {common.device_label(docs)}, {len(docs)} runs")
    common.save(fig, args, docs)


if __name__ == "__main__":
    main()
