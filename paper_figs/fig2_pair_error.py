"""Figure 2: GEMM output error of each strategy for each pattern pair.

Reads results/patterns/<profile>/patterns.json.gz (experiments/patterns.py): its ``gemm`` records
give, for every captured layer, capture point and GEMM (``fwd``, ``dgrad``, ``wgrad``), the
operands' pattern ``pair`` (A-B), and per ``strategy`` (``mxfp4``, ``iht``, ``iht+oe-left``,
``iht+oe-right``, ``bf16``) the relative Frobenius error of the output against the fp64 product;
``table_pick_effective`` is the strategy AdaHOP's table runs for that pair and GEMM.

One panel per GEMM: the median error over layers and capture points per pair and strategy
(whiskers: interquartile range), on a log scale. Under each pair: how many GEMMs had it and the
table's pick. A strategy the layer cannot run for a GEMM (``available: false``: OE-left on ``wgrad``,
X being stored in MXFP4) is named in that panel's title.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

import common

SLOTS = {"fwd": "fwd: Y = X·Wᵀ", "dgrad": "dgrad: dX = dY·W", "wgrad": "wgrad: dW = dYᵀ·X"}
STRATEGIES = ("mxfp4", "iht", "iht+oe-left", "iht+oe-right", "bf16")


def main(argv: list[str] | None = None) -> None:
    args = common.parse_args(__doc__, argv)
    docs = common.load(args.results)
    gemms = common.records(docs, ["model", "recipe", "gemm", "pair", "strategy", "rel_error", "available"], kind="gemm")
    strategies = [s for s in STRATEGIES if s in set(gemms["strategy"])] + sorted(set(gemms["strategy"]) - set(STRATEGIES))
    palette = dict(zip(strategies, sns.color_palette("colorblind", len(strategies))))
    slots = [s for s in SLOTS if s in set(gemms["gemm"])]
    sources = ", ".join(f"{m} / {r}" for m, r in dict.fromkeys(zip(gemms["model"], gemms["recipe"])))

    common.style()
    fig, axes = plt.subplots(1, len(slots), figsize=(6 * len(slots), 5.5), squeeze=False, sharey=True)
    for ax, slot in zip(axes[0], slots):
        part = gemms[gemms["gemm"] == slot]
        pairs = sorted(set(part["pair"]))
        one = part[part["strategy"] == strategies[0]]
        n = one.groupby("pair").size()
        pick = one.groupby("pair")["table_pick_effective"].agg(lambda s: "/".join(sorted(set(s))))
        sns.pointplot(data=part, x="pair", y="rel_error", hue="strategy", order=pairs, hue_order=strategies,
                      palette=palette, estimator="median", errorbar=("pi", 50), dodge=0.6, linestyle="none",
                      markers="o", markersize=5, err_kws={"linewidth": 1.2}, legend=ax is axes[0][0], ax=ax)
        ax.set_yscale("log")
        ax.set_xticks(range(len(pairs)), [f"{p}\nn={n.get(p, 0)}\ntable: {pick.get(p, '—')}" for p in pairs],
                      fontsize="x-small")
        ax.set_xlabel("pattern pair (A-B)")
        ax.set_ylabel("relative output error ‖out − ref‖_F / ‖ref‖_F" if ax is axes[0][0] else "")
        unavailable = sorted(set(part.loc[~part["available"].astype(bool), "strategy"]))
        ax.set_title(SLOTS[slot] + (f"\n({', '.join(unavailable)}: not runnable here, shown for reference)" if unavailable else ""),
                     fontsize="small")
    handles, labels = axes[0][0].get_legend_handles_labels()
    axes[0][0].get_legend().remove()
    fig.legend(handles, labels, title="strategy (dot: median over layers and capture points; bar: interquartile range)",
               loc="outside lower center", ncols=len(strategies))
    fig.suptitle(f"GEMM output error per strategy and pattern pair — {sources}; {common.device_label(docs)}")
    common.save(fig, args, docs)


if __name__ == "__main__":
    main()
