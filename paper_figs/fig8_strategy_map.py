"""Figure 8: the strategy each layer's GEMMs run after AdaHOP's calibration, per seed.

Reads results/strategies/<profile>/<run>.json (experiments/strategies.py, one per calibrating run):
records with ``model``, ``recipe``, ``seed``, ``layer``, ``block``, ``layer_kind``, ``slot``
(``fwd``, ``dgrad``, ``wgrad``) and ``strategy``.

One row of panels per model and recipe: a map of layers (rows, in model order) by GEMM and seed
(columns), coloured by strategy, and the share of each strategy per GEMM over all seeds. The title
gives how often the seeds agree on a layer's GEMM.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

import common
from fig1_patterns import short

SLOTS = ("fwd", "dgrad", "wgrad")
STRATEGIES = ("mxfp4", "iht", "iht+oe-left", "iht+oe-right", "bf16")


def main(argv: list[str] | None = None) -> None:
    args = common.parse_args(__doc__, argv)
    docs = common.load(args.results)
    recs = common.records(docs, ["model", "recipe", "seed", "layer", "block", "layer_kind", "slot", "strategy"])
    present = [s for s in STRATEGIES if s in set(recs["strategy"])] + sorted(set(recs["strategy"]) - set(STRATEGIES))
    colours = dict(zip(STRATEGIES, sns.color_palette("colorblind", len(STRATEGIES))))
    cmap = ListedColormap([colours.get(s, (0.5, 0.5, 0.5)) for s in present])
    recs["code"] = recs["strategy"].map({s: i for i, s in enumerate(present)})
    runs = list(dict.fromkeys(zip(recs["model"], recs["recipe"])))
    n_layers = {run: recs[(recs["model"] == run[0]) & (recs["recipe"] == run[1])]["layer"].nunique() for run in runs}
    heights = [1.2 + (0.2 if n_layers[run] <= 30 else 0.12) * n_layers[run] for run in runs]

    common.style()
    fig, axes = plt.subplots(len(runs), 2, figsize=(11, 1.0 + sum(heights)), squeeze=False,
                             gridspec_kw={"height_ratios": heights, "width_ratios": [3, 2]})
    agreement = []
    for (ax_map, ax_bar), (model, recipe) in zip(axes, runs):
        part = recs[(recs["model"] == model) & (recs["recipe"] == recipe)].copy()
        seeds = sorted(part["seed"].unique())
        order = part.drop_duplicates("layer").sort_values(["block", "layer_kind"], na_position="first")
        grid = part.pivot_table(index="layer", columns=["slot", "seed"], values="code", aggfunc="first")
        grid = grid.reindex(index=list(order["layer"]), columns=pd.MultiIndex.from_product([SLOTS, seeds]))
        sns.heatmap(grid, ax=ax_map, cmap=cmap, vmin=-0.5, vmax=len(present) - 0.5, cbar=False, linewidths=0.4,
                    linecolor="white", mask=grid.isna(),
                    yticklabels=[short(r.layer, r.block, r.layer_kind) for r in order.itertuples()],
                    xticklabels=[f"{slot} s{seed}" for slot, seed in grid.columns])
        for i in range(1, len(SLOTS)):  # a heavier line between GEMMs
            ax_map.axvline(i * len(seeds), color="black", linewidth=1.2)
        ax_map.set_xlabel("GEMM, seed")
        ax_map.set_ylabel("layer (block.name)")
        ax_map.tick_params(axis="y", labelsize=5 if len(grid) > 30 else 7)
        ax_map.tick_params(axis="x", labelsize=7, rotation=90)
        same = part.groupby(["layer", "slot"])["strategy"].nunique()
        agree = float((same == 1).mean())
        agreement.append(agree)
        ax_map.set_title(f"{model} / {recipe}: {len(seeds)} seed(s); all seeds pick the same strategy for "
                         f"{agree:.0%} of layer GEMMs", fontsize="small")
        share = (part.groupby(["slot", "strategy"]).size() / part.groupby("slot").size()).rename("share").reset_index()
        sns.barplot(data=share, y="slot", x="share", hue="strategy", order=list(SLOTS), hue_order=present,
                    palette=[colours.get(s, (0.5, 0.5, 0.5)) for s in present], saturation=1, ax=ax_bar, legend=False)
        ax_bar.set_xlim(0, 1)
        ax_bar.set_xlabel("share of layers (all seeds)")
        ax_bar.set_ylabel("GEMM")
        ax_bar.set_title("strategy per GEMM", fontsize="small")
    counts = recs.groupby("strategy").size()
    fig.legend(handles=[Patch(color=cmap(i), label=f"{s} ({counts[s]} of {len(recs)})") for i, s in enumerate(present)],
               title="strategy after calibration", loc="outside lower center", ncols=len(present))
    fig.suptitle(f"Per-layer strategies after calibration — {common.device_label(docs)}")
    common.save(fig, args, docs)


if __name__ == "__main__":
    main()
