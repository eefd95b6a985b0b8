"""The outlier-pattern study: capture every linear layer's operands, label them, score each strategy.

    experiments/patterns.py --config config/<profile>.yaml --data data/<corpus> \\
        --out results/patterns/<profile>/patterns.json.gz \\
        [--models tiny,30m] [--recipes bf16,mxfp4] [--capture-steps 1,10,20,30] [--steps N] \\
        [--max-tokens 256] [--pretrained all-minilm-l6-v2|none] [--pretrained-batches N] \\
        [--pretrained-batch-size B] [--seed S] [--outlier-k K | --outlier-fraction F] [--overwrite]

For each model × recipe: a short training run (:class:`adahop.harness.train.Trainer`, the pretrain stage's
loop and settings) whose forward + backward at each capture step is copied by hooks that leave the
run unchanged (:mod:`adahop.harness.capture`); for each pretrained model: the shipped weights, forward +
backward of a contrastive loss on pairs of adjacent passages of the corpus's held-out text
(:func:`adahop.harness.study.pair_contrastive_loss`), one capture point per batch. Every captured layer is
analysed by :func:`adahop.harness.study.layer_records` (labels, pattern pairs, per-strategy GEMM error,
table and measured picks). The results file holds those records and the summaries of
:func:`adahop.harness.study.summarize`, with :func:`adahop.harness.study.calibration_drift` from the step an AdaHOP
run of the profile calibrates to (``--out`` ending in ``.json.gz``: gzip-compressed, as the workflow
writes it; they run to megabytes); the log prints them as Markdown tables, and
``experiments/pattern_tables.py`` recomputes them from the records into a Markdown report.

Settings: DEFAULTS below < the profile's ``patterns`` section < flags. ``train`` holds
:class:`adahop.harness.train.TrainConfig` fields over the profile's ``pretrain`` section (``steps`` defaults
to the last capture step). ``policy_recipe`` + ``recipe_overrides`` give the detector, the strategy
table, ``outlier_k`` and the rounding the study judges (``adahop``: the reference table).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import torch
import yaml

from adahop.harness import study
from adahop.harness.provenance import write_results
from adahop.recipes import get_recipe
from adahop.harness.train import DistInfo, TrainConfig, Trainer, corpus_batches

DEFAULTS: dict[str, Any] = {
    "models": ["tiny"],  # adahop.harness.model preset names, each trained once per recipe
    "recipes": ["bf16", "mxfp4"],  # the training recipes whose runs are captured
    "seed": 0,
    "capture_steps": [1, 10, 20, 30],  # 1-based optimizer steps whose forward + backward is copied
    "max_tokens": 256,  # token rows kept per layer and point (multiple of 32)
    "train": {},  # TrainConfig fields over the pretrain section (steps: last capture step)
    "policy_recipe": "adahop",  # detector, table, outlier_k, rounding of the study
    "recipe_overrides": {},  # e.g. {outlier_k: 16, detector: {threshold: 3}}
    "outlier_fraction": None,  # OE rows as a share of the operand's rows instead of outlier_k
    "pretrained": ["all-minilm-l6-v2"],  # package-shipped models (adahop.harness.study.PRETRAINED)
    "pretrained_batches": 2,  # capture points of a pretrained model (one batch each)
    "pretrained_batch_size": 4,  # passage pairs per batch
    "pretrained_seq_len": 128,  # tokens per passage, [CLS] and [SEP] included
    "device": None,  # null: cuda when available, else cpu
}
LIST_FLAGS = {"models": str, "recipes": str, "capture_steps": int, "pretrained": str}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="profile YAML (its 'patterns' and 'pretrain' sections)")
    p.add_argument("--data", required=True, help="corpus directory (train.bin, val.bin, meta.json, text/val.jsonl)")
    p.add_argument("--out", required=True, help="results file (.json.gz: gzip-compressed JSON, or .json)")
    p.add_argument("--models", help="comma-separated model sizes")
    p.add_argument("--recipes", help="comma-separated training recipes")
    p.add_argument("--capture-steps", help="comma-separated 1-based steps")
    p.add_argument("--pretrained", help="comma-separated pretrained models, or 'none'")
    p.add_argument("--steps", type=int, help="training steps (default: the last capture step)")
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--pretrained-batches", type=int, help="capture points (batches) of each pretrained model")
    p.add_argument("--pretrained-batch-size", type=int, help="passage pairs per batch")
    p.add_argument("--seed", type=int)
    p.add_argument("--outlier-k", type=int, help="OE rows (the policy recipe's outlier_k)")
    p.add_argument("--outlier-fraction", type=float, help="OE rows as a share of the operand's rows")
    p.add_argument("--device")
    p.add_argument("--overwrite", action="store_true", help="replace a results file of another configuration")
    return p.parse_args(argv)


def settings(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """(resolved study settings, the profile's pretrain section): DEFAULTS < profile < flags."""
    profile = yaml.safe_load(Path(args.config).read_text()) or {}
    section = profile.get("patterns") or {}
    unknown = sorted(set(section) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown keys {unknown} in the patterns section of {args.config}; known: {sorted(DEFAULTS)}")
    s = {**DEFAULTS, **section}
    for key, cast in LIST_FLAGS.items():
        value = getattr(args, key)
        if value is not None:
            s[key] = [] if value == "none" else [cast(v) for v in value.split(",") if v]
    for key in ("max_tokens", "seed", "device", "outlier_fraction", "pretrained_batches", "pretrained_batch_size"):
        if getattr(args, key) is not None:
            s[key] = getattr(args, key)
    s["train"] = dict(s["train"])
    if args.steps is not None:
        s["train"]["steps"] = args.steps
    s["recipe_overrides"] = dict(s["recipe_overrides"])
    if args.outlier_k is not None:
        s["recipe_overrides"]["outlier_k"] = args.outlier_k
    if s["models"] and not s["capture_steps"]:
        raise ValueError("capture_steps is empty: nothing of the training runs would be captured")
    return s, profile.get("pretrain") or {}


def train_config(s: dict[str, Any], pretrain: dict[str, Any], model: str, recipe: str) -> TrainConfig:
    """The pretrain section's TrainConfig fields, the study's ``train`` overrides, this run."""
    # Hooks need the eager model; nothing is written by the study's runs.
    return TrainConfig.from_section(pretrain, **{"steps": max(s["capture_steps"]), **s["train"], "model": model,
                                                 "recipe": recipe, "seed": s["seed"], "compile": False,
                                                 "max_tokens": None})


def documents(data_dir: Path) -> Iterator[str]:
    """Held-out documents of the corpus, then training ones (``text/{val,train}.jsonl[.xz]``)."""
    from adahop.harness.data import iter_documents

    files = [data_dir / "text" / f"{split}.jsonl{ext}" for split in ("val", "train") for ext in ("", ".xz")]
    found = [f for f in files if f.exists()]
    if not found:
        raise FileNotFoundError(f"no text/val.jsonl or text/train.jsonl under {data_dir}: the pretrained model "
                                "needs the corpus text (experiments/build_corpus.py writes it)")
    return itertools.chain.from_iterable(iter_documents(f) for f in found)


def analyse(records: list, policy, meta: dict[str, Any], seed: int, outlier_fraction: float | None):
    """``on_point`` callback: records of the point's complete layers, then free its tensors."""
    def on_point(point: int, cap) -> None:
        t0 = time.perf_counter()
        new = study.point_records(cap.complete(point), policy, study.layer_ids(cap), {**meta, "step": point}, seed,
                                  outlier_fraction)
        cap.drop(point)
        records.extend(new)
        print(f"patterns: {meta['model']} {meta['recipe']} point {point}: {len(new)} records "
              f"in {time.perf_counter() - t0:.1f}s", flush=True)
    return on_point


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    s, pretrain = settings(args)
    device = torch.device(s["device"] or ("cuda" if torch.cuda.is_available() else "cpu"))
    policy = get_recipe(s["policy_recipe"], **s["recipe_overrides"])
    data_dir = Path(args.data)
    for name in s["pretrained"]:
        study.pretrained_dir(name)  # a missing package fails here, not after the training runs
    if s["pretrained"]:
        next(documents(data_dir))
    records: list[dict[str, Any]] = []
    runs: dict[str, Any] = {}
    for model, recipe in itertools.product(s["models"], s["recipes"]):
        cfg = train_config(s, pretrain, model, recipe)
        vocab, batches, _ = corpus_batches(data_dir, cfg, DistInfo())
        trainer = Trainer(cfg, vocab, batches, device=device, progress=False)
        meta = {"source": "train", "model": model, "recipe": recipe, "seed": cfg.seed}
        t0 = time.perf_counter()
        losses = study.capture_training(trainer, s["capture_steps"], analyse(records, policy, meta, cfg.seed, s["outlier_fraction"]),
                                        max_tokens=s["max_tokens"], seed=cfg.seed)
        runs[f"{model}/{recipe}"] = {"train": dataclasses.asdict(cfg), "losses": losses}
        print(f"patterns: {model} {recipe}: {cfg.steps} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f} "
              f"({time.perf_counter() - t0:.0f}s)", flush=True)
    for name in s["pretrained"]:
        model, tokenizer = study.load_pretrained(name, device)
        batches = study.passage_pairs(documents(data_dir), tokenizer, s["pretrained_seq_len"], s["pretrained_batch_size"])
        meta = {"source": "pretrained", "model": name, "recipe": "pretrained", "seed": s["seed"]}
        losses = study.capture_pretrained(model, batches, s["pretrained_batches"],
                                          analyse(records, policy, meta, s["seed"], s["outlier_fraction"]),
                                          max_tokens=s["max_tokens"], skip=study.PRETRAINED[name].skip,
                                          seed=s["seed"])
        runs[f"{name}/pretrained"] = {"losses": losses, "package": study.PRETRAINED[name].module}
        print(f"patterns: {name}: contrastive loss per batch {[round(v, 3) for v in losses]}", flush=True)
    if not records:
        raise ValueError("no layer was captured: check models, recipes, capture_steps and pretrained")
    summary = study.summarize(records, study.calibration_step(runs, policy.to_dict()))
    print(study.markdown_tables(summary))
    config = {"patterns": s, "policy_recipe": policy.to_dict(), "data": str(data_dir), "device": str(device)}
    write_results(args.out, [*records, *summary], config=config, seed=s["seed"], device=device,
                  overwrite=args.overwrite, extra_provenance={"runs": runs})
    print(f"patterns: {len(records)} records + {len(summary)} summaries -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
