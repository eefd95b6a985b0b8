"""The per-layer strategy map a calibrating run (adahop, adahop-measured) fixes: its calibration, replayed.

    python experiments/strategies.py --config config/<profile>.yaml --data data/<corpus> \\
        --model 125m --recipe adahop --seed 0 --out results/strategies/<profile>/<run>.json [--device cuda]

Builds the pretrain run of that model, recipe and seed (the profile's pretrain settings, one
process, eager) and runs its first ``calibration_steps`` optimizer steps, the schedule, data and
seeds of the full run unchanged: the same computation as the run's own first steps, so the same
votes, labels and strategies as the run's ``strategies.json`` (tested on a CPU, bit for bit).
Where it can differ, and the results say so: on a GPU, nondeterministic kernels (attention's
backward) may tip a vote that sits on the detector's threshold; a run trained under DDP votes over
every rank's batches, a replay over this process's only. A compiled run calibrates eagerly too
(QuantLinear is never compiled), so compilation does not change the map.

Records, one per layer and GEMM slot (``fwd``, ``dgrad``, ``wgrad``): the run's ``model``,
``recipe`` and ``seed``, then ``layer``, ``block``, ``layer_kind``, ``slot``, ``strategy``, ``pair``
and the layer's labels ``label_x``, ``label_w``, ``label_g`` (majority votes over the calibration).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch
import yaml

import adahop
from adahop.harness.capture import block_and_kind
from adahop.policy import SLOTS
from adahop.harness.provenance import write_results
from adahop.recipes import get_recipe
from adahop.harness.train import DistInfo, TrainConfig, Trainer, corpus_batches


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="profile YAML (its 'pretrain' section)")
    p.add_argument("--data", required=True, help="corpus directory (train.bin, val.bin, meta.json)")
    p.add_argument("--model", required=True)
    p.add_argument("--recipe", required=True, help="a calibrating recipe (adahop, adahop-measured)")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--out", required=True, help="results JSON")
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when there is a GPU")
    return p.parse_args(argv)


def replay(cfg: TrainConfig, data: str | Path, device: torch.device) -> dict[str, dict]:
    """``adahop.export_strategies`` of the model after the run's calibration steps."""
    recipe = get_recipe(cfg.recipe, **cfg.recipe_overrides)
    if recipe.policy is None:
        raise ValueError(f"recipe {cfg.recipe!r} fixes its strategies in advance: it has no calibration to replay")
    vocab_size, batches, _ = corpus_batches(data, cfg, DistInfo())
    trainer = Trainer(cfg, vocab_size, batches, device=device, progress=False)
    if trainer.total_steps < recipe.calibration_steps:
        raise ValueError(f"the run has {trainer.total_steps} steps, fewer than its {recipe.calibration_steps} "
                         "calibration steps: it never fixes its strategies")
    trainer.run(until=recipe.calibration_steps)
    exported = adahop.export_strategies(trainer.model)
    unfixed = [name for name, e in exported.items() if e["phase"] != "fixed"]
    if unfixed:
        raise RuntimeError(f"layers still calibrating after {recipe.calibration_steps} steps: {unfixed[:3]}")
    return exported


def records(exported: dict[str, dict], cfg: TrainConfig) -> list[dict]:
    run = {"model": cfg.model, "recipe": cfg.recipe, "seed": cfg.seed}
    out = []
    for name, e in exported.items():
        block, kind = block_and_kind(name)
        labels = {f"label_{op}": e["labels"][op] for op in ("x", "w", "g")}
        out.extend({**run, "layer": name, "block": block, "layer_kind": kind, "slot": slot, "strategy": e["strategies"][slot],
                    "pair": e["pairs"][slot], **labels} for slot in SLOTS)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    section = (yaml.safe_load(Path(args.config).read_text()) or {}).get("pretrain") or {}
    # Eager (as a quantized run calibrates anyway), no evaluation and no files: only the steps matter.
    cfg = TrainConfig.from_section(section, model=args.model, recipe=args.recipe, seed=args.seed, compile=False,
                                   eval_interval=0, checkpoint_interval=0)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    recs = records(replay(cfg, args.data, device), cfg)
    write_results(args.out, recs, config={**dataclasses.asdict(cfg), "data": str(args.data),
                                          "replay": "calibration steps of the run, one process"},
                  seed=cfg.seed, device=device)
    counts = {s: sum(r["strategy"] == s for r in recs) for s in dict.fromkeys(r["strategy"] for r in recs)}
    print(f"strategies: {args.model} {args.recipe} seed {args.seed}: {len(recs) // len(SLOTS)} layers, {counts} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
