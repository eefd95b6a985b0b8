"""Figure 9: where each recipe's pretraining time went — plain steps, compilation, calibration.

Reads results/pretrain/<profile>/<model>_<recipe>_s<seed>.json (experiments/pretrain.py): each
record's ``steps``, ``train_s``, ``step_s``, ``first_s`` and ``calibration``
(``adahop.harness.train.step_times``, from the run's per-step throughput; held-out evaluation and
checkpoints are not in it). Per model, one stacked bar per recipe, the mean over its one-GPU runs
(``adahop.harness.quality.train_time``, the numbers of the quality table's last section; runs on several
GPUs or sharing one are left out and named): every step at the median step's time, the first
step's time above it (compilation, autotuning), the calibration steps' time above it, the first
step after each calibration (the kernels of the newly fixed strategies compile then), and the
rest (resumed processes' first steps, jitter). The median tokens/s of the records, and figure 7,
leave out everything but the first segment.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import seaborn as sns

import common
from adahop.harness.quality import train_time, with_gpu_sharing

SEGMENTS = (  # (label, what it adds up, its colour index in the palette)
    ("every step at the median step", "plain_s", 7),
    ("first step (compilation)", "first_s", 1),
    ("calibration steps", "calibration_s", 3),
    ("first step after calibration", "after_s", 4),
    ("rest (resumes, jitter)", "rest_s", 8),
)


def segments(t: dict) -> dict[str, float]:
    """The seconds of each segment of one recipe's mean ``train_time``."""
    parts = {"plain_s": t["step_s"] * t["steps"], "first_s": t["first_s"] or 0.0,
             "calibration_s": t["calibration_s"] or 0.0, "after_s": t["after_s"] or 0.0}
    parts["rest_s"] = max(0.0, t["train_s"] - sum(parts.values()))
    return parts


def main(argv: list[str] | None = None) -> None:
    args = common.parse_args(__doc__, argv)
    docs = common.load(args.results)
    common.records(docs, ["model", "recipe", "steps"])  # pretraining results, or a clear error
    runs = [{**with_gpu_sharing(r, d["provenance"]), "compiled": bool((d["provenance"].get("config") or {}).get("compile"))}
            for d in docs for r in d["records"]]
    if not any(r.get("train_s") is not None for r in runs):
        raise ValueError(f"no record of {[d['path'] for d in docs]} has train_s (the per-step timings "
                         "adahop.harness.train.step_times gives): are these pretraining results?")
    models = list(dict.fromkeys(r["model"] for r in runs))
    colours = dict(zip((key for _, key, _ in SEGMENTS), (sns.color_palette("colorblind")[i] for *_, i in SEGMENTS)))

    common.style()
    fig, axes = plt.subplots(len(models), 1, figsize=(13, 1.2 + 0.55 * len({r["recipe"] for r in runs}) * len(models)),
                             squeeze=False)
    for ax, model in zip(axes[:, 0], models):
        mine = [r for r in runs if r["model"] == model]
        rows = []
        for recipe in common.recipe_order(r["recipe"] for r in mine):
            theirs = [r for r in mine if r["recipe"] == recipe]
            t = train_time(theirs)
            note = "".join(f"; s{s} left out: {why}" for s, why in t["left_out"].items())
            mode = ", compiled" if all(r["compiled"] for r in theirs) else ""
            rows.append((f"{recipe} ({common.seeds_label(len(t['per_seed']))}{mode}{note})", t))
        for y, (label, t) in enumerate(rows):
            if not t["per_seed"]:
                ax.text(0.01, y, "no single-device run", transform=ax.get_yaxis_transform(), va="center",
                        fontsize="small", color="dimgray", style="italic")
                continue
            left, parts = 0.0, segments(t)
            for name, key, _ in SEGMENTS:
                width = parts[key]
                ax.barh(y, width, left=left, height=0.7, color=colours[key], label=name)
                left += width
            ax.text(left, y, f"  {t['train_s']:.0f} s · median step {t['step_s']:.3g} s", va="center", fontsize="small")
        ax.set_yticks(range(len(rows)), [label for label, _ in rows])
        ax.set_ylim(len(rows) - 0.5, -0.5)
        longest = max((t["train_s"] for _, t in rows if t["per_seed"]), default=1.0)
        ax.set_xlim(0, 1.3 * longest)
        ax.set_xlabel("seconds of training steps (mean over single-device runs; held-out evaluation and checkpoints left out)")
        ax.set_title(f"{model}")
        ax.grid(axis="y", visible=False)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    fig.legend(unique.values(), unique.keys(), loc="outside lower center", ncol=len(unique), frameon=True)
    fig.suptitle(f"Where the pretraining time went — {common.device_label(docs)}")
    common.save(fig, args, docs)


if __name__ == "__main__":
    main()
