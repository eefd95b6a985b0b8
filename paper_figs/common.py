"""What every figure script shares: its command line, reading results files, one style, saving.

Each figure script is called as::

    python paper_figs/<figure>.py [--config config/<profile>.yaml] --out paper_figs/out/<profile>/<figure> \\
        results/<stage>/<profile>/*.json[.gz]

and writes ``<out>.png`` and ``<out>.pdf``. It reads only the results files it is given (plus,
for figure 6, the paper's numbers that ``adahop/harness/paper_reference.yaml`` cites); the PNG carries
the list of those files and their git commits in its metadata.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any, Hashable, Iterable, Mapping

import matplotlib

matplotlib.use("Agg")  # no display: figures are files

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
import yaml  # noqa: E402

from adahop.harness.provenance import read_results  # noqa: E402

DEFAULT_DPI = 150


def parse_args(doc: str, argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=doc.strip().split("\n\n")[0])
    p.add_argument("--config", help="profile YAML; its figures section sets the PNG resolution")
    p.add_argument("--out", required=True, type=Path, help="output path without suffix: writes <out>.png and <out>.pdf")
    p.add_argument("results", nargs="+", type=Path, help="results files (results/<stage>/<profile>/*.json or *.json.gz)")
    args = p.parse_args(argv)
    args.dpi = DEFAULT_DPI
    if args.config:
        args.dpi = (yaml.safe_load(Path(args.config).read_text()) or {}).get("figures", {}).get("dpi", DEFAULT_DPI)
    return args


def load(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """The results documents, each with its path under ``"path"``; a file that is not a results
    file (adahop.harness.provenance convention) raises ValueError naming it."""
    docs = []
    for path in paths:
        doc = read_results(path)
        doc["path"] = str(path)
        docs.append(doc)
    return docs


def records(docs: Iterable[dict[str, Any]], required: Iterable[str] = (), kind: str | None = None) -> pd.DataFrame:
    """Every record of every document as one frame (only those of ``kind`` when given), with the
    document's ``seed`` (when the record has none) and ``path``. No records, or records without a
    ``required`` field (results of another stage?), raise ValueError naming the files: a figure of
    nothing is a bug."""
    docs = list(docs)
    paths = [d["path"] for d in docs]
    rows = [{"seed": d["provenance"].get("seed"), **rec, "path": d["path"]} for d in docs for rec in d["records"]
            if kind is None or rec.get("kind") == kind]
    if not rows:
        raise ValueError(f"no {kind + ' ' if kind else ''}records in {paths}")
    frame = pd.DataFrame(rows)
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise ValueError(f"the records of {paths} lack {missing}: are these results of the stage this figure reads?")
    return frame


def device_label(docs: Iterable[dict[str, Any]]) -> str:
    """Where the results were measured, for the title: GPU name(s), or "CPU"."""
    names = set()
    for doc in docs:
        dev = doc["provenance"].get("device") or {}
        names.add(dev.get("name") if dev.get("type") == "cuda" else "CPU")
    return " + ".join(sorted(n for n in names if n)) or "unknown device"


def style() -> None:
    """One look for every figure: white grid, paper context, a colour-blind-safe palette."""
    sns.set_theme(style="whitegrid", context="paper", palette="colorblind", font_scale=1.1)
    plt.rcParams.update({"figure.constrained_layout.use": True, "savefig.bbox": "tight", "pdf.fonttype": 42})


def save(fig: plt.Figure, args: argparse.Namespace, docs: Iterable[dict[str, Any]]) -> None:
    """``<out>.png`` and ``<out>.pdf``; the PNG's metadata names the results files and commits."""
    docs = list(docs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    commits = sorted({str(d["provenance"].get("git_commit")) for d in docs})
    meta = {"Source": ", ".join(d["path"] for d in docs), "Comment": f"results commits: {', '.join(commits)}"}
    fig.savefig(args.out.with_suffix(".png"), dpi=args.dpi, metadata=meta)
    fig.savefig(args.out.with_suffix(".pdf"),  # no CreationDate: the same results redraw the same bytes
                metadata={"Subject": meta["Source"], "Keywords": meta["Comment"], "CreationDate": None})
    plt.close(fig)
    print(f"wrote {args.out}.png and {args.out}.pdf from {len(docs)} results file(s)")


def recipe_order(present: Iterable[str]) -> list[str]:
    """The recipes present, in the registry's order (bf16 first, AdaHOP last); others after."""
    from adahop.recipes import RECIPES

    present = set(present)
    return [r for r in RECIPES if r in present] + sorted(present - set(RECIPES))


# Colour-blind palette entries by recipe: AdaHOP the strongest (vermillion), far from mxfp4's
# orange (registry order gave it the tan next to that orange); its variants in the light colours.
# The palette's ten are taken; the eleventh is near-black, the twelfth and thirteenth dark blue-grey
# and olive, the fourteenth (hot's ablation) a lighter blue-grey, the fifteenth (adahop with its
# weights cached) a light vermillion. A new recipe draws mid grey until it is given one (a test wants
# them distinct).
_RECIPE_COLOURS = {"bf16": 0, "mxfp4": 1, "uniform-iht": 2, "tseng": 7, "quartet-style": 4, "adahop": 3,
                   "adahop-measured": 6, "adahop-no-oe": 9, "adahop-no-bf16": 8, "adahop-recal": 5,
                   "adahop-exact-bf16": 10, "hot": 11, "adahop-bf16-cal": 12, "hot-no-lowrank": 13,
                   "adahop-cached-w": 14}


def recipe_palette() -> dict[str, Any]:
    """One colour per registry recipe, the same in every figure."""
    from adahop.recipes import RECIPES

    colours = [*sns.color_palette("colorblind", 10), (0.15, 0.15, 0.15), (0.2, 0.3, 0.45), (0.5, 0.5, 0.1),
               (0.55, 0.65, 0.8), (0.95, 0.6, 0.45)]
    return {r: colours[_RECIPE_COLOURS[r]] if r in _RECIPE_COLOURS else "0.4" for r in RECIPES}


def seeds_label(n: int) -> str:
    return f"{n} seed" if n == 1 else f"{n} seeds"


def far_out(values: Mapping[Hashable, float], k: float = 3.0) -> set[Hashable]:
    """The keys whose value lies beyond Tukey's far-out fences (lower quartile − ``k``·IQR, upper
    quartile + ``k``·IQR) of all the finite values; none with fewer than four or no spread.

    A recipe that trained far worse than every other would set a shared axis on its own and squash
    the differences among the rest into one line: the figures fit their axis to the others and
    write such an entry's value at the edge (:func:`mark_off_scale`)."""
    finite = {key: float(v) for key, v in values.items() if v is not None and math.isfinite(v)}
    if len(finite) < 4:
        return set()
    q1, q3 = np.percentile(list(finite.values()), [25, 75])
    if q3 <= q1:
        return set()
    return {key for key, v in finite.items() if not q1 - k * (q3 - q1) <= v <= q3 + k * (q3 - q1)}


def fit_axis(ax: plt.Axes, axis: str, shown: Iterable[float], pad: float = 0.08) -> None:
    """Limit ``axis`` ("x" or "y") of ``ax`` to the span of ``shown`` (the values kept on scale), padded."""
    shown = [float(v) for v in shown if v is not None and math.isfinite(v)]
    if not shown:
        return
    lo, hi = min(shown), max(shown)
    margin = pad * (hi - lo or abs(hi) or 1.0)
    (ax.set_xlim if axis == "x" else ax.set_ylim)(lo - margin, hi + margin)


def mark_off_scale(ax: plt.Axes, entries: Iterable[tuple[str, float, Any, Any]], axis: str = "x",
                   fmt: str = "{:+.2f}") -> None:
    """Write each ``(label, value, position, colour)`` whose value lies off ``ax``'s ``axis`` limits
    at the edge it passes, with its value. ``axis`` "x": ``position`` is the entry's place on the
    y axis (a row, which names the entry: ``label`` may be empty); "y": ``position`` is ignored
    and the notes stack down from the top left. ``fmt`` formats the value."""
    row = 0
    for label, value, position, colour in entries:
        lo, hi = ax.get_xlim() if axis == "x" else ax.get_ylim()
        if lo <= value <= hi:
            continue
        high = value > hi
        number = fmt.format(value)
        text = " ".join(filter(None, [label, number, "→"] if high else ["←", label, number]))
        if axis == "x":
            ax.text(0.995 if high else 0.005, position, text, transform=ax.get_yaxis_transform(), color=colour,
                    ha="right" if high else "left", va="center", fontsize="small", fontweight="bold")
        else:
            ax.text(0.02, 0.97 - 0.07 * row, f"{label}: off scale ({'above' if high else 'below'}), last {number}",
                    transform=ax.transAxes, color=colour, ha="left", va="top", fontsize="small", fontweight="bold")
            row += 1
