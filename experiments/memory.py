"""Memory per recipe: bytes saved for backward and peak memory, for one layer and for a small model.

    python experiments/memory.py --config config/gpu.yaml --out results/memory/gpu/memory.json
    python experiments/memory.py --size smoke --out /tmp/memory.json

Records (one per recipe × what × phase):

* ``what: layer`` — one linear layer of each ``layer_shapes`` entry ``[tokens, in, out]``, bf16
  parameters, forward + backward on random data.
* ``what: model`` — the ``model`` preset of :mod:`adahop.harness.model` (fp32 parameters, bf16 autocast as
  in training, LM head kept in BF16), one training step on random tokens.

Each record has ``saved_bytes`` (every tensor autograd saved, unique storages, through
``torch.autograd.graph.saved_tensors_hooks``: :class:`adahop.linear.SavedTensorMeter`),
``saved_param_bytes`` (of those, parameters kept alive anyway), ``saved_activation_bytes`` (the
rest: what the recipe adds), their ratios to the bf16 record of the same shape, and on CUDA
``peak_bytes`` (``torch.cuda.max_memory_allocated`` over forward + backward, minus what was
allocated before: parameters, inputs). Policy recipes are measured twice: ``phase: calibrating``
(plain MXFP4; the measured policy also keeps a BF16 sample of X) and ``phase: fixed`` after
``calibration_steps`` steps on the same random data. Random data is not what a trained run
calibrates on: on it the table picks no BF16 wgrad, where the 125m runs pick it for 10–12 of 84
layers. So with ``strategy_map`` (a results file of ``experiments/strategies.py``: the map a
pretraining run fixed), the model is measured once more, ``phase: run map``, with its layers fixed
to that map (:func:`adahop.fix_strategies`), for every policy recipe whose policy and table are the
map's recipe's (adahop's map: adahop, adahop-recal, adahop-exact-bf16). The model preset must be
the run's (the map names its layers).

Settings: SIZES[size] < the profile's ``memory`` section < flags; ``size`` defaults to the
profile's top-level ``profile`` (smoke or gpu). ``overrides`` (recipe fields, e.g.
``{weight_for_backward: param}``) apply to every quantized recipe.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

import torch
import yaml
from torch import nn

import adahop
from adahop.linear import SavedTensorMeter
from adahop.harness.model import Llama, LlamaConfig
from adahop.harness.provenance import check_replaceable, read_results, write_results
from adahop.recipes import RECIPES

SIZES: dict[str, dict[str, Any]] = {
    "smoke": {"layer_shapes": [[256, 256, 256], [256, 256, 1024]], "model": "tiny", "batch_size": 2,
              "seq_len": 128, "vocab_size": 512},
    "gpu": {"layer_shapes": [[16384, 4096, 4096], [16384, 4096, 1024], [16384, 4096, 14336], [16384, 14336, 4096]],
            "model": "125m", "batch_size": 8, "seq_len": 2048, "vocab_size": 32768},
}
# overrides: recipe fields for every quantized recipe, e.g. {weight_for_backward: param}.
COMMON = {"recipes": list(RECIPES), "calibration_steps": 1, "seed": 0, "device": None, "overrides": {},
          "strategy_map": None}


Step = Callable[[], tuple[torch.Tensor, torch.Tensor | None]]  # forward: (output, its gradient)


def report(r: dict[str, Any]) -> None:
    """One line per record as it is made (a long GPU run shows where it is)."""
    where = r.get("shape") or r.get("model")
    peak = f", peak {r['peak_bytes'] / 2**20:.1f} MiB" if r["peak_bytes"] is not None else ""
    ratios = ""
    if r.get("bf16_over_saved_bytes") is not None:
        act = r["bf16_over_saved_activation_bytes"]
        ratios = f"; bf16/this {r['bf16_over_saved_bytes']:.2f}x saved, {act or float('nan'):.2f}x activations"
    print(f"{r['what']:>5} {str(where):>22} {r['recipe']:>15} {r['phase']:>11}: saved "
          f"{r['saved_bytes'] / 2**20:.2f} MiB ({r['saved_activation_bytes'] / 2**20:.2f} MiB activations)"
          f"{ratios}{peak}", flush=True)


def measure(module: nn.Module, forward: Step, device: torch.device) -> dict[str, Any]:
    """Saved bytes of one forward and, on CUDA, the peak memory of forward + backward."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    with SavedTensorMeter(module) as meter:
        out, grad = forward()
    out.backward(grad)
    out = {"saved_bytes": meter.total_bytes, "saved_param_bytes": meter.param_bytes,
           "saved_activation_bytes": meter.activation_bytes, "peak_bytes": None}
    if cuda:
        torch.cuda.synchronize(device)
        out["peak_bytes"] = torch.cuda.max_memory_allocated(device) - before
    module.zero_grad(set_to_none=True)
    return out


def phases(recipe: str, steps: int) -> list[tuple[str, int]]:
    """(phase, optimizer steps to take before measuring) for ``recipe``."""
    return [("calibrating", 0), ("fixed", steps)] if RECIPES[recipe].policy else [("fixed", 0)]


def run_steps(module: nn.Module, forward: Step, steps: int) -> None:
    for _ in range(steps):
        out, grad = forward()
        out.backward(grad)
        module.zero_grad(set_to_none=True)
        adahop.on_optimizer_step(module)


def convert(module: nn.Module, recipe: str, s: dict[str, Any]) -> nn.Module:
    extra = {"calibration_steps": s["calibration_steps"]} if RECIPES[recipe].policy else {}
    return adahop.convert(module, recipe, seed=s["seed"], **{**s["overrides"], **extra})


def strategies(module: nn.Module) -> dict[str, Any]:
    """Distinct strategy maps over the module's layers, with their counts."""
    counts: dict[str, int] = {}
    for e in adahop.export_strategies(module).values():
        key = str(e["strategies"] or "calibrating")
        counts[key] = counts.get(key, 0) + 1
    return counts


Add = Callable[[dict[str, Any]], None]  # takes each record as it is measured


def read_strategy_map(path: str | Path) -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
    """The run (model, recipe, seed) and its map ``{layer: {slot: strategy}}`` from a results file
    of ``experiments/strategies.py``."""
    recs = read_results(path)["records"]
    runs = {(r["model"], r["recipe"], r["seed"]) for r in recs}
    if len(runs) != 1:
        raise SystemExit(f"memory: strategy_map {path} must hold one run's map, it holds {sorted(runs)}")
    model, recipe, seed = runs.pop()
    if RECIPES.get(recipe) is None or RECIPES[recipe].policy is None:
        raise SystemExit(f"memory: strategy_map {path} is a map of {recipe!r}, not of a policy recipe")
    layers: dict[str, dict[str, str]] = {}
    for r in recs:
        layers.setdefault(r["layer"], {})[r["slot"]] = r["strategy"]
    return {"model": model, "recipe": recipe, "seed": seed}, layers


def takes_map(recipe: str, map_recipe: str) -> bool:
    """Whether a map fixed under ``map_recipe`` is one ``recipe`` could have fixed: same policy, same table."""
    a, b = RECIPES[recipe], RECIPES[map_recipe]
    return a.policy is not None and (a.policy, a.table) == (b.policy, b.table)


def layer_records(s: dict[str, Any], device: torch.device, add: Add) -> None:
    for tokens, fin, fout in s["layer_shapes"]:
        gen = torch.Generator(device=device).manual_seed(s["seed"])
        x = torch.randn(tokens, fin, generator=gen, device=device).to(torch.bfloat16).requires_grad_()
        gy = torch.randn(tokens, fout, generator=gen, device=device).to(torch.bfloat16)
        for recipe in s["recipes"]:
            torch.manual_seed(s["seed"])
            layer = convert(nn.Linear(fin, fout, bias=False).to(device, torch.bfloat16), recipe, s)

            def forward():
                return layer(x), gy  # only the layer's own saved tensors: no loss on top

            for phase, steps in phases(recipe, s["calibration_steps"]):
                run_steps(layer, forward, steps)
                add({"what": "layer", "recipe": recipe, "phase": phase, "shape": [tokens, fin, fout],
                     "strategies": strategies(nn.Sequential(layer)), **measure(layer, forward, device)})
            x.grad = None


def model_records(s: dict[str, Any], device: torch.device, add: Add) -> None:
    run, layer_map = read_strategy_map(s["strategy_map"]) if s["strategy_map"] else (None, None)
    if run is not None and run["model"] != s["model"]:
        raise SystemExit(f"memory: strategy_map is a map of a {run['model']} run; the model measured is {s['model']}")
    cfg = LlamaConfig.from_name(s["model"], s["vocab_size"], max_seq_len=max(s["seq_len"], 8))
    gen = torch.Generator(device=device).manual_seed(s["seed"])
    ids = torch.randint(0, s["vocab_size"], (s["batch_size"], s["seq_len"]), generator=gen, device=device)
    for recipe in s["recipes"]:
        torch.manual_seed(s["seed"])
        # One model at a time: each recipe's model is freed (it goes out of scope) before the next.
        recipe_model_records(convert(Llama(cfg).to(device), recipe, s), recipe, ids, s, device, add,
                             run if run is not None and takes_map(recipe, run["recipe"]) else None, layer_map)


def recipe_model_records(model: nn.Module, recipe: str, ids: torch.Tensor, s: dict[str, Any], device: torch.device,
                         add: Add, run: dict[str, Any] | None, layer_map: dict[str, dict[str, str]] | None) -> None:
    def forward():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            return model(ids, ids)[1], None

    def record(phase: str, **extra: Any) -> None:
        add({"what": "model", "recipe": recipe, "phase": phase, "model": s["model"],
             "tokens": ids.numel(), "strategies": strategies(model), **extra, **measure(model, forward, device)})

    for phase, steps in phases(recipe, s["calibration_steps"]):
        run_steps(model, forward, steps)
        record(phase)
    if run is not None:
        adahop.fix_strategies(model, layer_map)
        record("run map", strategy_map=f"{run['model']}_{run['recipe']}_s{run['seed']}")


def add_ratios(recs: list[dict[str, Any]]) -> None:
    """Each record's bytes as a ratio of the bf16 record of the same layer shape or model: bf16 / recipe."""
    def key(r):
        return r["what"], str(r.get("shape") or r.get("model"))

    base = {key(r): r for r in recs if r["recipe"] == "bf16"}
    for r in recs:
        b = base.get(key(r))
        for field in ("saved_bytes", "saved_activation_bytes", "peak_bytes"):
            ok = b is not None and r[field] and b[field] is not None
            r[f"bf16_over_{field}"] = b[field] / r[field] if ok else None


def settings(args: argparse.Namespace) -> dict[str, Any]:
    cfg = yaml.safe_load(args.config.read_text()) if args.config else {}
    section = cfg.get("memory") or {}
    size = args.size or section.get("size") or cfg.get("profile") or ("gpu" if torch.cuda.is_available() else "smoke")
    if size not in SIZES:
        raise SystemExit(f"memory: size must be one of {sorted(SIZES)}, got {size!r}")
    s = {**COMMON, **SIZES[size], "size": size}
    unknown = set(section) - set(s)
    if unknown:
        raise SystemExit(f"memory: unknown keys in the profile's memory section: {sorted(unknown)}")
    s.update(section)
    if args.recipes:
        s["recipes"] = args.recipes.split(",")
    if args.strategy_map:
        s["strategy_map"] = str(args.strategy_map)
    if args.only:
        s["only"] = args.only
    bad = [r for r in s["recipes"] if r not in RECIPES]
    if bad:
        raise SystemExit(f"memory: unknown recipes {bad}; registered: {sorted(RECIPES)}")
    if "bf16" not in s["recipes"]:
        s["recipes"] = ["bf16", *s["recipes"]]  # the baseline every ratio needs
    return s


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", type=Path, help="profile YAML (its `profile` and `memory` section)")
    p.add_argument("--size", choices=sorted(SIZES), help="shapes and model; overrides the config file")
    p.add_argument("--recipes", help="comma-separated recipes (bf16 is always added)")
    p.add_argument("--strategy-map", type=Path, help="a run's map (results of experiments/strategies.py): "
                   "measure the model fixed to it too; overrides the config file")
    p.add_argument("--only", choices=["layer", "model"], help="measure only the layers or only the model")
    p.add_argument("--out", type=Path, required=True, help="results file")
    p.add_argument("--overwrite", action="store_true", help="replace a results file of another configuration")
    args = p.parse_args(argv)
    s = settings(args)
    device = torch.device(s["device"] or ("cuda" if torch.cuda.is_available() else "cpu"))
    if not args.overwrite:
        check_replaceable(args.out, s)  # before measuring

    recs: list[dict[str, Any]] = []

    def add(record: dict[str, Any]) -> None:
        # Written after every record, so a run stopped at its time limit keeps what it measured;
        # the same config each time, so each write replaces the last.
        recs.append(record)
        add_ratios(recs)
        report(record)
        write_results(args.out, recs, config=s, seed=s["seed"], device=device, overwrite=True)

    if s.get("only") != "model":
        layer_records(s, device, add)
    if s.get("only") != "layer":
        model_records(s, device, add)
    print(f"memory: {len(recs)} records -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
