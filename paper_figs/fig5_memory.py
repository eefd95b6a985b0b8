"""Figure 5: memory per recipe — activations saved for backward, and peak memory.

Reads results/memory/<profile>/memory.json (experiments/memory.py): records with ``what``
(``layer``: one linear layer of ``shape`` [tokens, in, out]; ``model``: a training step of the
``model`` preset), ``recipe``, ``phase`` (``calibrating`` or ``fixed``, for policy recipes),
``saved_activation_bytes`` (what autograd keeps beyond the parameters), ``peak_bytes`` (CUDA only,
else null) and ``bf16_over_saved_activation_bytes`` (the compression against BF16).

Panels: saved activations of each layer shape; their compression against BF16 (layers and the
model); each layer's peak memory against BF16 (``bf16_over_peak_bytes``: below 1, the recipe's
transient copies make its peak higher than BF16's); the model's saved activations and peak memory.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

import common

MIB = 2**20


def below(ax, title: str) -> None:
    """The panel's legend under its x label, where it cannot cover a bar."""
    ax.legend(title=title or None, fontsize="small", title_fontsize="small", ncols=2, loc="upper center",
              bbox_to_anchor=(0.5, -0.14))


def label(r) -> str:
    return r.recipe if r.phase == "fixed" else f"{r.recipe} ({r.phase})"


def main(argv: list[str] | None = None) -> None:
    args = common.parse_args(__doc__, argv)
    docs = common.load(args.results)
    recs = common.records(docs, ["what", "recipe", "phase", "saved_activation_bytes", "peak_bytes",
                                         "bf16_over_saved_activation_bytes", "bf16_over_peak_bytes"])
    recs["label"] = [label(r) for r in recs.itertuples()]
    order = [lab for recipe in common.recipe_order(recs["recipe"]) for lab in dict.fromkeys(recs.loc[recs["recipe"] == recipe, "label"])]
    layers = recs[recs["what"] == "layer"].copy()
    model = recs[recs["what"] == "model"].copy()
    if layers.empty and model.empty:
        raise ValueError(f"no layer or model records in {[str(p) for p in args.results]}")
    layers["where"] = [f"layer {t}×{i}→{o}" for t, i, o in layers["shape"]]
    model["where"] = [f"model {m} ({int(t)} tokens)" for m, t in zip(model["model"], model["tokens"])]

    common.style()
    fig, axes = plt.subplots(1, 4, figsize=(22, 0.9 + 0.42 * len(order) * 1.6), sharey=True)
    ax = axes[0]
    sns.barplot(data=layers.assign(mib=layers["saved_activation_bytes"] / MIB), y="label", x="mib", hue="where",
                order=order, ax=ax)
    ax.set_xlabel("saved activations (MiB)")
    ax.set_ylabel("recipe")
    ax.set_title("one linear layer: saved for backward")
    below(ax, "shape: tokens×in→out")

    ax = axes[1]
    both = pd.concat([layers, model])
    sns.barplot(data=both, y="label", x="bf16_over_saved_activation_bytes", hue="where", order=order, ax=ax)
    ax.axvline(1, color="black", linewidth=0.8, linestyle="--")
    ax.set_xlabel("compression of saved activations (bf16 bytes / recipe bytes, ×)")
    ax.set_ylabel("")
    ax.set_title("against BF16 (dashed: no compression)")
    below(ax, "layer shape or model")

    ax = axes[2]
    peaks = layers.dropna(subset=["bf16_over_peak_bytes"])
    if peaks.empty:
        ax.text(0.5, 0.5, "peak not measured (CUDA only)", ha="center", va="center", transform=ax.transAxes)
    else:
        sns.barplot(data=peaks, y="label", x="bf16_over_peak_bytes", hue="where", order=order, ax=ax)
        ax.axvline(1, color="black", linewidth=0.8, linestyle="--")
        below(ax, "layer shape")
    ax.set_xlabel("bf16 peak / recipe peak (×; below 1: higher peak than bf16)")
    ax.set_ylabel("")
    ax.set_title("one linear layer: peak memory of fwd + bwd against BF16")

    ax = axes[3]
    melted = model.melt(id_vars=["label"], value_vars=["saved_activation_bytes", "peak_bytes"], var_name="kind", value_name="bytes")
    melted = melted.dropna(subset=["bytes"]).assign(mib=lambda d: d["bytes"].astype(float) / MIB)
    melted["kind"] = melted["kind"].map({"saved_activation_bytes": "saved activations", "peak_bytes": "peak (fwd + bwd)"})
    if melted.empty:
        ax.text(0.5, 0.5, "no model records", ha="center", va="center", transform=ax.transAxes)
    else:
        sns.barplot(data=melted, y="label", x="mib", hue="kind", order=order, ax=ax)
        below(ax, "")
    no_peak = model["peak_bytes"].isna().all()
    where = model["where"].iloc[0] if not model.empty else "model"
    ax.set_title(f"{where}" + (": peak not measured (CUDA only)" if no_peak else ""))
    ax.set_xlabel("memory (MiB)")
    ax.set_ylabel("")
    fig.suptitle(f"Memory per recipe — {common.device_label(docs)}")
    common.save(fig, args, docs)


if __name__ == "__main__":
    main()
