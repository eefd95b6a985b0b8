"""Figure 7: end-to-end training throughput per recipe — speed against BF16, MFU, GPU-busy share, memory.

Reads results/throughput/<profile>/<run>.json (experiments/pretrain.py --throughput-only, one file
per run of the profile's ``throughput`` sections, and the folder's other files: a recipe measured
later, another GPU). Each record is one recipe measured in that run's
process: ``model``, ``world_size``, ``batch_size`` (per rank), ``seq_len``, ``compile``,
``timed_steps``, ``tokens_per_s`` (all ranks), ``mfu`` (null on a CPU: no peak FLOP/s) and
``peak_mem_gib`` (CUDA: ``max_memory_allocated`` of rank 0, ``max_memory_reserved`` under CUDA graphs,
``compile_mode`` reduce-overhead: the graphs' pools; CPU: the process's peak resident set);
where the file has them, ``peer`` (``torchao`` for torchao's float8 training, the peers of adahop's
recipes), ``fsdp`` (FSDP2 instead of DDP) and ``gpu_busy`` (its ``busy_fraction``: the share of
wall time the GPU had work; files without these fields draw as adahop recipes, DDP, and "n/a").
A record with an ``error`` (a recipe that ran out of memory, or that a signal stopped) has no figures
and no bar.

Panels, one group of bars per run (file; runs ordered by model size, then GPUs), one bar per
recipe (bf16 first, then the torchao peers, hatched, then adahop's recipes in the registry's
order): tokens/s as a ratio to the bf16 record of the same file (timed in the same process; a run
without bf16 gets no ratio, and says so), MFU, the GPU-busy share of wall time (well under 100%:
the GPU waits for the host), and peak memory ("≤" where, under CUDA graphs, a file written before
the throughput stage reset compilation between recipes kept an earlier recipe's pool reserved:
an upper bound, :func:`adahop.harness.train.peak_is_shared`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

import common
from adahop.harness.train import compile_label, measured, peak_is_shared

# torchao's float8 peers: their own colours (the registry's palette is adahop's recipes') and hatching.
PEER_COLOURS = {"float8-tensorwise": (0.35, 0.45, 0.75), "float8-rowwise": (0.15, 0.25, 0.55)}
PEER_HATCH = "//"
REQUIRED = ("model", "recipe", "world_size", "batch_size", "seq_len", "compile", "timed_steps", "tokens_per_s",
            "mfu", "peak_mem_gib")
HEADER_ROWS = 1.4  # a run's two-line heading takes this many bar rows
GAP_ROWS = 0.5  # blank rows between runs


class Row(NamedTuple):
    y: float
    label: str
    record: Any  # a record (itertuples row), or None for a run's heading
    bf16_tokens_per_s: float | None  # the same run's bf16 tokens/s


def short(value: float) -> str:
    """493253 -> '493k', 1.2e6 -> '1.2M'."""
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def is_peer(record: Any) -> bool:
    """A torchao float8 peer: said by the record (``peer``), or by its name in a file without that field."""
    peer = getattr(record, "peer", None)
    return (isinstance(peer, str) and bool(peer)) or record.recipe in PEER_COLOURS


def order(recipes: pd.Series) -> list[str]:
    """bf16, then the float8 peers, then adahop's recipes in the registry's order."""
    present = list(recipes)
    peers = [r for r in PEER_COLOURS if r in present]
    rest = common.recipe_order([r for r in present if r not in peers and r != "bf16"])
    return (["bf16"] if "bf16" in present else []) + peers + rest


def busy(record: Any) -> float | None:
    """The record's GPU-busy share of wall time, or None (a CPU, or a file without the field)."""
    split = getattr(record, "gpu_busy", None)
    return split.get("busy_fraction") if isinstance(split, dict) else None


def heading(doc: dict[str, Any], recs: pd.DataFrame) -> str:
    """Run name, commit and GPU, then model, mode, where (with DDP or FSDP2), tokens per rank and the steps timed."""
    prov = doc["provenance"]
    commit = str(prov.get("git_commit") or "unknown commit")[:7] + (" dirty" if prov.get("git_dirty") else "")
    first = recs.iloc[0]
    n = int(first["world_size"])
    cuda = (prov.get("device") or {}).get("type") == "cuda"
    where = f"{n} GPU{'s' if n > 1 else ''}" if cuda else f"CPU, {n} process{'es' if n > 1 else ''}"
    if n > 1:
        fsdp = first.get("fsdp")  # absent (NaN) in a file without the field: DDP
        where += ", FSDP2" if isinstance(fsdp, (bool, np.bool_)) and fsdp else ", DDP"
    untimed = (prov.get("config") or {}).get("untimed_steps", "?")
    gpu = (prov.get("device") or {}).get("name") if cuda else None
    return (f"{Path(doc['path']).name.removesuffix('.json')} ({commit}{', ' + gpu if gpu else ''})\n"
            f"{first['model']}, {compile_label(first['compile'], first.get('compile_mode'))}, {where}, "
            f"{int(first['batch_size'])}×{int(first['seq_len'])} tokens/rank, "
            f"{int(first['timed_steps'])} steps timed after {untimed}")


def layout(docs: list[dict[str, Any]], recs: pd.DataFrame) -> list[Row]:
    """The rows from top to bottom: each run's heading, then its recipes (:func:`order`); runs by
    model size, then number of ranks (otherwise in the order given)."""
    rows, y = [], 0.0
    runs = [(doc, recs[recs["path"] == doc["path"]]) for doc in docs]
    runs = sorted([r for r in runs if not r[1].empty],
                  key=lambda r: (float(r[1]["params"].iloc[0]) if "params" in r[1] else 0.0, int(r[1]["world_size"].iloc[0])))
    for doc, run in runs:
        run = run.set_index("recipe").loc[order(run["recipe"])].reset_index()
        bf16 = float(run.loc[run["recipe"] == "bf16", "tokens_per_s"].iloc[0]) if (run["recipe"] == "bf16").any() else None
        rows.append(Row(y + (HEADER_ROWS - 1) / 2, heading(doc, run), None, bf16))
        y += HEADER_ROWS
        for rec in run.itertuples():
            rows.append(Row(y, rec.recipe, rec, bf16))
            y += 1
        y += GAP_ROWS
    return rows


def bars(ax, rows: list[Row], value, text, note: str) -> None:
    """One bar per recipe row of ``value(row)``, labelled ``text(row, value)``; ``note`` (its
    ``{tps}``: the row's tokens/s) where the value is None."""
    palette = common.recipe_palette()
    drawn = [(row, value(row)) for row in rows if row.record is not None]
    values = [v for _, v in drawn if v is not None]
    for row, v in drawn:
        if v is None:
            ax.text(0.01, row.y, note.format(tps=short(row.record.tokens_per_s)), transform=ax.get_yaxis_transform(),
                    va="center", fontsize="small", color="dimgray", style="italic")
            continue
        peer = is_peer(row.record)
        ax.barh(row.y, v, height=0.8, color=PEER_COLOURS.get(row.label, palette.get(row.label, "gray")),
                hatch=PEER_HATCH if peer else None, edgecolor="white" if peer else None)
        ax.text(v + 0.01 * max(values), row.y, text(row, v), va="center", fontsize="small",
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1})  # over the bf16 line
    if values:
        ax.set_xlim(0, 1.45 * max(values))  # room for the labels
    else:
        ax.set_xticks([])


def main(argv: list[str] | None = None) -> None:
    args = common.parse_args(__doc__, argv)
    docs = common.load(args.results)
    # A recipe that ran out of memory or was stopped has no figures to draw (the report's table names it).
    recs = common.records([{**doc, "records": measured(doc["records"])} for doc in docs], REQUIRED)
    rows = layout(docs, recs)

    common.style()
    height = rows[-1].y + 1 if rows else 1
    fig, axes = plt.subplots(1, 4, figsize=(21, 1.6 + 0.3 * height), sharey=True,
                             gridspec_kw={"width_ratios": [1.3, 1, 1, 1]})
    ax = axes[0]
    bars(ax, rows, lambda r: r.record.tokens_per_s / r.bf16_tokens_per_s if r.bf16_tokens_per_s else None,
         lambda r, v: f"{v:.2f}× · {short(r.record.tokens_per_s)} tok/s",
         "{tps} tokens/s; no bf16 record in this run: no ratio")
    with_bf16 = [r.y for r in rows if r.record is not None and r.bf16_tokens_per_s]  # bf16 = 1, within those runs
    ax.vlines([1] * len(with_bf16), [y - 0.5 for y in with_bf16], [y + 0.5 for y in with_bf16], color="black",
              linestyle="--", linewidth=0.8)
    ax.set_title("tokens/s against bf16 of the same run (dashed: bf16)")
    ax.set_xlabel("speed-up over bf16 (×; labels: tokens/s over all ranks)")

    ax = axes[1]
    bars(ax, rows, lambda r: None if pd.isna(r.record.mfu) else 100 * r.record.mfu, lambda r, v: f"{v:.1f}%",
         "n/a (no peak FLOP/s: CPU)")
    ax.set_title("model FLOPs utilisation")
    ax.set_xlabel("MFU (% of the device's dense bf16 peak)")

    ax = axes[2]
    bars(ax, rows, lambda r: None if busy(r.record) is None else 100 * busy(r.record), lambda r, v: f"{v:.0f}%",
         "n/a (not measured: CPU, or a file without it)")
    ax.set_title("GPU busy share of wall time")
    ax.set_xlabel("% of wall time, profiled steps")

    ax = axes[3]
    shared = {(doc["path"], r["recipe"]) for doc in docs for i, r in enumerate(doc["records"])
              if peak_is_shared(doc["records"], i)}
    bars(ax, rows, lambda r: r.record.peak_mem_gib,
         lambda r, v: ("≤ " if (r.record.path, r.record.recipe) in shared else "") + f"{v:.3g}", "")
    ax.set_title("peak memory of the timed steps")
    ax.set_xlabel("GiB (rank 0 allocated; CUDA graphs: reserved)\n≤: an earlier recipe's pool still held")

    axes[0].set_yticks([r.y for r in rows],
                       [f"{r.label} (torchao)" if r.record is not None and is_peer(r.record) else r.label for r in rows])
    for tick, row in zip(axes[0].get_yticklabels(), rows):
        if row.record is None:
            tick.set_fontweight("bold")
    axes[0].set_ylim(height - 0.3, -0.9)
    for ax in axes:
        ax.grid(axis="y", visible=False)
    fig.suptitle(f"End-to-end training throughput per recipe — {common.device_label(docs)} "
                 "(random tokens; every run's recipes timed in one process after its untimed steps; "
                 "hatched: torchao float8 peers)")
    common.save(fig, args, docs)


if __name__ == "__main__":
    main()
