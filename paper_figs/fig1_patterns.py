"""Figure 1: outlier pattern of every layer's operands (x, w, grad_output) over training.

Reads results/patterns/<profile>/patterns.json.gz (experiments/patterns.py): its ``operand`` records
carry ``source`` (``train`` or ``pretrained``), ``model``, ``recipe``, ``step`` (the capture
point: the optimizer step of a training run, the batch of a pretrained model), ``layer`` and the
detector's ``label`` (``row``, ``col`` or ``none``) of ``operand`` (``x``, ``w``, ``g``).

One row of panels per captured run, one column per operand; in each panel a layer per row and a
capture point per column, coloured by its label. Rows are layers in model order (block, then the
layer's name inside the block).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

import common

LABELS = ("row", "col", "none")
OPERANDS = {"x": "x (activation)", "w": "w (weight)", "g": "grad_output"}


def label_grid(part: pd.DataFrame) -> pd.DataFrame:
    """Layers × capture points of label codes (0 row, 1 col, 2 none) in model order."""
    order = part.drop_duplicates("layer").sort_values(["block", "layer_kind"], na_position="first")["layer"]
    grid = part.pivot_table(index="layer", columns="step", values="code", aggfunc="first")
    return grid.reindex(list(order))


def short(layer: str, block, kind: str) -> str:
    return kind if pd.isna(block) else f"{int(block)}.{kind}"


def main(argv: list[str] | None = None) -> None:
    args = common.parse_args(__doc__, argv)
    docs = common.load(args.results)
    ops = common.records(docs, ["source", "model", "recipe", "step", "layer", "operand", "label"], kind="operand")
    ops["code"] = ops["label"].map({lab: i for i, lab in enumerate(LABELS)})
    ops["step"] = ops["step"].astype(int)
    runs = list(dict.fromkeys(zip(ops["source"], ops["model"], ops["recipe"])))
    colours = sns.color_palette("colorblind", 3)
    cmap = ListedColormap([colours[1], colours[0], (0.9, 0.9, 0.9)])
    n_layers = ops.groupby(["source", "model", "recipe"], sort=False)["layer"].nunique()
    # Inches per layer row: big models (84 linears at 125m) get thinner rows and smaller labels.
    heights = [0.9 + (0.2 if n_layers[run] <= 30 else 0.13) * n_layers[run] for run in runs]

    common.style()
    fig, axes = plt.subplots(len(runs), 3, figsize=(12, 0.9 + sum(heights)), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for row, (source, model, recipe) in zip(axes, runs):
        part = ops[(ops["source"] == source) & (ops["model"] == model) & (ops["recipe"] == recipe)]
        names = part.drop_duplicates("layer").set_index("layer")
        for ax, (operand, title) in zip(row, OPERANDS.items()):
            grid = label_grid(part[part["operand"] == operand])
            sns.heatmap(grid, ax=ax, cmap=cmap, vmin=-0.5, vmax=2.5, cbar=False, linewidths=0.5, linecolor="white",
                        mask=grid.isna(), yticklabels=[short(n, names.at[n, "block"], names.at[n, "layer_kind"]) for n in grid.index])
            run = f"{model} / {recipe} (training run)" if source == "train" else f"{model} (pretrained weights)"
            ax.set_title(f"{run}: {title}", fontsize="small")
            ax.set_xlabel("optimizer step captured" if source == "train" else "batch captured")
            ax.set_ylabel("layer (block.name)" if ax is row[0] else "")
            ax.tick_params(axis="y", labelsize=5 if len(grid) > 30 else 6 if len(grid) > 20 else 8)
            if ax is not row[0]:
                ax.set_yticklabels([])
    counts = ops.groupby("label").size().reindex(list(LABELS), fill_value=0)
    fig.legend(handles=[Patch(color=cmap(i), label=f"{lab} ({counts[lab]} of {len(ops)})") for i, lab in enumerate(LABELS)],
               title="detected outlier pattern", loc="outside lower center", ncols=3)
    fig.suptitle(f"Outlier patterns per layer and operand over training — {common.device_label(docs)}")
    common.save(fig, args, docs)


if __name__ == "__main__":
    main()
