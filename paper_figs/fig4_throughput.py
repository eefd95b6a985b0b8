"""Figure 4: kernel and layer throughput against the ceilings measured in the same run.

Reads results/microbench/<profile>/kernels.json (experiments/microbench.py) and
results/layer_bench/<profile>/layers.json (experiments/layer_bench.py), then any other layer file of
the stage (a variant measured later, another GPU): a variant that layers.json lacks is drawn from the
first such file that has it, labelled with that run's GPU where it differs. Every record holds its
``figure`` in ``unit`` (GB/s for memory-bound ops: bytes read + written; TFLOP/s for GEMMs and
layers), the ``ceiling`` measured in the same process (``ceiling_name``: ``copy``,
``cublas-fp8-rowwise`` on the H200, ``torch-fp32-matmul`` on a CPU) and ``peers`` (e.g.
``cublas-bf16``, ``nn.Linear-bf16``, ``torchao-float8-rowwise``) measured beside it.

Panels: memory-bound kernels against the copy bandwidth; GEMMs against their peer and ceiling per
shape; each layer variant's forward + backward speed-up over ``nn.Linear`` in bf16 (and torchao's).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

import common


def shape_label(shape) -> str:
    return "×".join(str(s) for s in shape)


def gemm_frame(gemms: pd.DataFrame) -> pd.DataFrame:
    """Long frame (shape, series, TFLOP/s): each GEMM op, and per shape its peers and ceiling."""
    rows = []
    for r in gemms.itertuples():
        shape = shape_label(r.shape)
        path = f" [{r.gemm_path}]" if isinstance(r.gemm_path, str) else ""
        rows.append({"shape": shape, "series": f"{r.op}{path}", "value": r.figure})
        rows.append({"shape": shape, "series": f"{r.ceiling_name} (ceiling)", "value": r.ceiling})
        rows.extend({"shape": shape, "series": f"{name} (peer)", "value": v} for name, v in r.peers.items())
    # Peers and ceilings are measured once per shape: one bar each.
    return pd.DataFrame(rows).drop_duplicates(["shape", "series"])


def tokens_label(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def first_file_per_variant(layers: pd.DataFrame, devices: dict[str, str]) -> pd.DataFrame:
    """Each variant's records from one file only: the first (in the frame's order) that has it; a
    variant from a file measured on another GPU than the first file's is named with that GPU. Every
    ratio stays one run's: a variant and the bf16 layer it is divided by were measured together."""
    first = layers["path"].iloc[0]
    owner = layers.drop_duplicates("variant").set_index("variant")["path"]
    keep = layers[[owner[v] == p for v, p in zip(layers["variant"], layers["path"])]]
    label = [v if devices.get(p) == devices.get(first) else f"{v} ({devices.get(p)})"
             for v, p in zip(keep["variant"], keep["path"])]
    return keep.assign(variant=label)


def layer_frame(layers: pd.DataFrame) -> pd.DataFrame:
    """Long frame (layer, series, speed-up over nn.Linear bf16) of every variant and peer."""
    rows = []
    several = layers["tokens"].nunique() > 1
    for r in layers.itertuples():
        # in and out on lines of their own: eight side-by-side "14336→4096" labels overlap at this width
        layer = f"{int(r.in_features)}\n→{int(r.out_features)}" + (f"\n×{tokens_label(int(r.tokens))}" if several else "")
        base = r.peers["nn.Linear-bf16"]
        rows.append({"layer": layer, "series": r.variant, "value": r.figure / base})
        rows.extend({"layer": layer, "series": f"{name} (peer)", "value": v / base}
                    for name, v in r.peers.items() if name != "nn.Linear-bf16")
    return pd.DataFrame(rows).drop_duplicates(["layer", "series"])


SCALE_NOTE = {"log": "; log scale", "linear": ""}


def scale(ax, axis: str, values) -> None:
    """Log scale where the values span more than 30x (CPU smoke runs), linear otherwise."""
    values = [v for v in values if v and v > 0]
    if values and max(values) / min(values) > 30:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log")


def below(ax, title: str, y: float) -> None:
    """The panel's legend under it, where it cannot cover a bar."""
    ax.legend(title=title, fontsize="small", title_fontsize="small", ncols=3, loc="upper center",
              bbox_to_anchor=(0.5, y))


def main(argv: list[str] | None = None) -> None:
    args = common.parse_args(__doc__, argv)
    docs = common.load(args.results)
    recs = common.records(docs, ["test", "op", "shape", "unit", "figure", "ceiling", "ceiling_name", "peers"])
    is_layer = recs["test"].str.startswith("test_layer_fwd_bwd")
    kernels, layers = recs[~is_layer], recs[is_layer]
    if not layers.empty:
        layers = first_file_per_variant(layers, {d["path"]: common.device_label([d]) for d in docs})
    memory = kernels[kernels["unit"] == "GB/s"]
    gemms = kernels[kernels["unit"] == "TFLOP/s"]

    common.style()
    n_gemm_bars = len(gemm_frame(gemms)) if not gemms.empty else 1
    fig, axes = plt.subplot_mosaic([["memory", "layer"], ["gemm", "gemm"]], figsize=(20, 9 + 0.12 * n_gemm_bars),
                                   gridspec_kw={"width_ratios": [1.4, 1], "height_ratios": [1, 0.3 + 0.03 * n_gemm_bars]})
    ax = axes["memory"]
    if memory.empty:
        ax.text(0.5, 0.5, "no memory-bound kernel records", ha="center", va="center", transform=ax.transAxes)
    else:
        memory = memory.assign(shape=memory["shape"].map(shape_label))
        sns.barplot(data=memory, y="op", x="figure", hue="shape", ax=ax)
        for i, copy in enumerate(sorted(set(memory["ceiling"]))):
            ax.axvline(copy, color="black", linestyle="--", linewidth=1,
                       label="copy ceiling (same run)" if i == 0 else None)
        below(ax, "shape (rows×cols)", -0.1)
        scale(ax, "x", [*memory["figure"], *memory["ceiling"]])
    ax.set_xlabel(f"throughput (GB/s, bytes read + written{SCALE_NOTE[ax.get_xscale()]})")
    ax.set_ylabel("")
    ax.tick_params(axis="y", labelsize="small")
    ax.set_title("memory-bound kernels vs copy bandwidth")

    ax = axes["gemm"]
    if gemms.empty:
        ax.text(0.5, 0.5, "no GEMM records", ha="center", va="center", transform=ax.transAxes)
    else:
        frame = gemm_frame(gemms)
        sns.barplot(data=frame, y="shape", x="value", hue="series", ax=ax)
        ax.legend(title="kernel [GEMM path] /\npeer / ceiling", fontsize="small", title_fontsize="small",
                  loc="center left", bbox_to_anchor=(1.01, 0.5))
        scale(ax, "x", frame["value"])
    ax.set_ylabel("GEMM shape (M×N×K)")
    ax.set_xlabel(f"throughput (TFLOP/s{SCALE_NOTE[ax.get_xscale()]})")
    ax.set_title("MXFP4 GEMMs vs peers and ceiling")

    ax = axes["layer"]
    ax.set_title("linear layer fwd+bwd")
    if layers.empty:
        ax.text(0.5, 0.5, "no layer records", ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks([])
    else:
        frame = layer_frame(layers)
        sns.barplot(data=frame, x="layer", y="value", hue="series", ax=ax)
        ax.axhline(1, color="black", linestyle="--", linewidth=1, label="nn.Linear bf16")
        below(ax, "layer variant", -0.27 if layers["tokens"].nunique() > 1 else -0.2)  # under 2 or 3 label lines
        scale(ax, "y", [*frame["value"], 1.0])
        tokens = sorted({int(t) for t in layers["tokens"]})
        ax.set_title(f"linear layer fwd+bwd, {', '.join(map(tokens_label, tokens))} tokens")
    ax.set_xlabel("layer (in→out features" + (", × tokens)" if not layers.empty and layers["tokens"].nunique() > 1 else ")"))
    ax.set_ylabel(f"speed-up over nn.Linear bf16 (×{SCALE_NOTE[ax.get_yscale()]})")
    fig.suptitle(f"Throughput against same-run ceilings — {common.device_label(docs)}")
    common.save(fig, args, docs)


if __name__ == "__main__":
    main()
