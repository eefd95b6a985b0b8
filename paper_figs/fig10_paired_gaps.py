"""Figure 10: the recipes compared seed by seed — each paired difference, its mean and 95% interval.

Reads results/pretrain/<profile>/*.json and results/eval/<profile>/*.json (experiments/pretrain.py,
experiments/evaluate.py), any order. The differences are ``adahop.harness.quality``'s, the quality table's
"Paired by seed" section: a recipe's final held-out loss (left) and corpus bits per byte (right)
minus its baseline's on the same seed, for every recipe against bf16, AdaHOP against every other
recipe, and the contrast pairs (uniform-iht against mxfp4). One row per pair: a marker per seed,
the mean (a bar) and, with two seeds or more, the 95% interval of the mean (Student's t over the
seeds). Below 0 the recipe is the better of the two; an interval that holds 0 has not told them
apart. A pair whose runs of one seed split the batch over a different number of GPUs is marked †.
A pair far off the rest (``common.far_out``) is written at the axis edge with its mean.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

import common
from adahop.harness.quality import METHOD, REFERENCE, quality_rows, split_records

METRICS = (("final_val_loss", "final held-out loss difference (nats/token)"),
           ("bits_per_byte", "corpus bits per byte difference"))
SEED_MARKERS = "osD^v<>p"


def kind(recipe: str, base: str) -> int:
    """A pair's group: 0 against bf16, 1 the method against another recipe, 2 a contrast pair."""
    return 0 if base == REFERENCE else 1 if recipe == METHOD else 2


def pairs(rows: list[dict]) -> list[tuple[str, str, dict]]:
    """``(recipe, baseline, paired)`` in reading order: every recipe against bf16, then the method
    against every other recipe, then the contrast pairs."""
    found = [(row["recipe"], base, p) for row in rows for base, p in row["paired"].items()]
    order = {r: i for i, r in enumerate(common.recipe_order({row["recipe"] for row in rows}))}
    return sorted(found, key=lambda f: (kind(f[0], f[1]), order[f[1]] if kind(f[0], f[1]) == 1 else order[f[0]]))


def main(argv: list[str] | None = None) -> None:
    args = common.parse_args(__doc__, argv)
    docs = common.load(args.results)
    pretrain, evals = split_records((d["path"], d) for d in docs)
    if not pretrain:
        raise ValueError(f"no pretraining records (final_val_loss) in {[d['path'] for d in docs]}")
    rows = quality_rows(pretrain, evals)
    models = list(dict.fromkeys(row["model"] for row in rows))
    palette = common.recipe_palette()

    common.style()
    per_model = {m: pairs([r for r in rows if r["model"] == m]) for m in models}
    height = 2.6 + 0.32 * sum(max(1, len(p)) for p in per_model.values())
    fig, axes = plt.subplots(len(models), len(METRICS), figsize=(14, height), squeeze=False,
                             height_ratios=[max(1, len(per_model[m])) for m in models])
    seeds_seen: set[int] = set()
    for row_axes, model in zip(axes, models):
        found = per_model[model]
        labels = []
        for recipe, base, paired in found:
            seeds = paired.get(METRICS[0][0], {}).get("seeds", [])
            lower = paired.get(METRICS[0][0], {}).get("lower")
            mark = " †" if paired.get("world_size_differs") else ""
            labels.append(f"{recipe} − {base}{mark} ({common.seeds_label(len(seeds))}; loss lower on {lower})")
        for ax, (metric, xlabel) in zip(row_axes, METRICS):
            for y, (recipe, base, paired) in enumerate(found):
                p = paired.get(metric)
                if not p:
                    ax.text(0.01, y, "no pairs", transform=ax.get_yaxis_transform(), va="center",
                            fontsize="small", color="dimgray", style="italic")
                    continue
                colour = palette.get(base if recipe == METHOD and base != REFERENCE else recipe, "0.4")
                if p["ci95"] is not None:
                    ax.hlines(y, *p["ci95"], color=colour, linewidth=2.2, alpha=0.8)
                ax.vlines(p["mean"], y - 0.3, y + 0.3, color=colour, linewidth=2.5)
                for seed, value in p["per_seed"].items():
                    seed = int(seed)
                    seeds_seen.add(seed)
                    ax.scatter(value, y, marker=SEED_MARKERS[seed % len(SEED_MARKERS)], s=28, color=colour,
                               edgecolor="black", linewidth=0.5, zorder=3)
            # a pair far from the rest (a recipe that trained far worse) would squash every other row
            means = {y: paired[metric]["mean"] for y, (_, _, paired) in enumerate(found) if paired.get(metric)}
            off = common.far_out(means)
            common.fit_axis(ax, "x", [0.0, *(v for y, (_, _, paired) in enumerate(found) if y in means and y not in off
                                             for v in (*paired[metric]["per_seed"].values(), *(paired[metric]["ci95"] or ())))])
            common.mark_off_scale(ax, [("", means[y], y, "0.2") for y in sorted(off)])
            ax.axvline(0, color="black", linewidth=0.8)
            for y in range(1, len(found)):  # a rule between the groups
                if kind(*found[y][:2]) != kind(*found[y - 1][:2]):
                    ax.axhline(y - 0.5, color="0.5", linewidth=0.8, linestyle="--")
            ax.set_yticks(range(len(found)), labels if ax is row_axes[0] else [""] * len(found))
            ax.set_ylim(len(found) - 0.5, -0.5)
            ax.set_xlabel(xlabel)
            ax.set_title(f"{model}: {'held-out loss' if metric == 'final_val_loss' else 'bits per byte'}")
            ax.grid(axis="y", visible=False)
    handles = [plt.Line2D([], [], marker=SEED_MARKERS[s % len(SEED_MARKERS)], linestyle="", color="0.6",
                          markeredgecolor="black", label=f"seed {s}") for s in sorted(seeds_seen)]
    handles += [plt.Line2D([], [], color="0.3", marker="|", markersize=14, markeredgewidth=2.5, linestyle="",
                           label="mean"),
                plt.Line2D([], [], color="0.3", linewidth=2.2, alpha=0.8, label="95% interval (2+ seeds)")]
    if any(paired.get("world_size_differs") for found in per_model.values() for *_, paired in found):
        handles.append(plt.Line2D([], [], linestyle="", label="†: one seed's two runs on different numbers of GPUs"))
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), frameon=True)
    fig.suptitle(f"Paired by seed: recipe − baseline (below 0: the recipe is better) — {common.device_label(docs)}")
    common.save(fig, args, docs)


if __name__ == "__main__":
    main()
