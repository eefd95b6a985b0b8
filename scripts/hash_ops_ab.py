"""The layer's counter-hash draws as operators against the same draws traced as PyTorch ops.

Two operators replace int64 PyTorch expressions of the ``lowbias32`` hash: ``adahop::hot_round``
(HOT's stochastic rounding to integers; :func:`adahop.hot.round_int_ref` inline is the ``traced``
variant) and ``adahop::signs_from_seed`` (the random signs of tseng and quartet-style;
:func:`adahop.linear.seeds.signs_from_seed_ref` inline). Traced, each hash is a deep expression
whose every value is read twice per step, which Inductor's lowering expands before CSE folds it.

    python scripts/hash_ops_ab.py --out results/microbench/cpu/hash-ops-ab.json   # CPU: compile time
    python scripts/hash_ops_ab.py --out results/microbench/gpu/hash-ops-ab.json --tokens 16384 --dims 4096,4096

For each recipe (``--recipes``) and variant, a child process with empty Inductor and Triton caches
measures:

* ``first_compiled_step_s``: the wall time of the first ``torch.compile``d optimizer step of the
  project's Llama (``--model``, ``--layers``), strategies fixed after an eager calibration where
  the recipe calibrates (Dynamo, AOT autograd and Inductor's code generation for forward and
  backward), and ``compiled_step_s``, the median of the next three;
* one converted layer ``--dims IN,OUT`` over ``--tokens`` tokens, eager: forward + backward time
  and, on CUDA, its peak memory above the inputs (``torch.cuda.max_memory_allocated``), and the
  digest of its gradients, which must be equal between the variants (the operators and their
  references draw alike, bit for bit).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

import adahop
from adahop import hot, library
from adahop.harness.model import Llama, LlamaConfig
from adahop.harness.provenance import write_results
from adahop.linear import seeds
from adahop.recipes import RECIPES

VARIANTS = ("op", "traced")
VOCAB, BATCH, SEQ = 256, 2, 64


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _calibration(recipe: str, steps: int) -> dict:
    return {"calibration_steps": steps} if RECIPES[recipe].policy else {}


def _compile_time(recipe: str, model_name: str, layers: int, device: torch.device) -> dict:
    torch.manual_seed(0)
    model = Llama(LlamaConfig.from_name(model_name, vocab_size=VOCAB, n_layers=layers)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    adahop.convert(model, recipe, optimizer=opt, **_calibration(recipe, 2))
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(0)).to(device)

    def step(fn) -> float:
        start = time.perf_counter()
        fn(tokens, tokens)[1].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(device)
        return time.perf_counter() - start

    for _ in range(3):  # calibration (eager), then the fix
        step(model)
    compiled = torch.compile(model)
    first = step(compiled)
    return {"first_compiled_step_s": first, "compiled_step_s": statistics.median(step(compiled) for _ in range(3))}


def _layer(recipe: str, dims: tuple[int, int], tokens: int, device: torch.device) -> dict:
    torch.manual_seed(0)
    layer = nn.Sequential(nn.Linear(*dims, bias=False)).to(device, torch.bfloat16)
    adahop.convert(layer, recipe, skip=(), **_calibration(recipe, 1))
    x = torch.randn(tokens, dims[0], device=device, dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(tokens, dims[1], device=device, dtype=torch.bfloat16)

    def fwd_bwd() -> None:
        x.grad = None
        layer.zero_grad(set_to_none=True)
        layer(x).backward(g)

    fwd_bwd()
    adahop.on_optimizer_step(layer)  # calibration done: the strategies are fixed
    fwd_bwd()
    _sync(device)
    peak = None
    if device.type == "cuda":
        x.grad = None
        layer.zero_grad(set_to_none=True)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        layer(x).backward(g)
        _sync(device)
        peak = torch.cuda.max_memory_allocated(device) - before
    times = []
    for _ in range(5):
        start = time.perf_counter()
        fwd_bwd()
        _sync(device)
        times.append(time.perf_counter() - start)
    digest = hashlib.sha256()
    for t in (x.grad, layer[0].weight.grad):
        digest.update(t.float().cpu().numpy().tobytes())
    return {"layer_fwd_bwd_s": statistics.median(times), "layer_peak_bytes": peak,
            "grad_digest": digest.hexdigest()[:16], "strategies": adahop.export_strategies(layer)["0"]["strategies"]}


def parse_dims(text: str) -> tuple[int, int]:
    """``IN,OUT`` of the one-layer measurement: positive multiples of 16 (HOT's dgrad block)."""
    parts = text.split(",")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"--dims must be IN,OUT (two ints), got {text!r}")
    dims = int(parts[0]), int(parts[1])
    if any(d <= 0 or d % hot.DGRAD_BLOCK for d in dims):
        raise argparse.ArgumentTypeError(f"--dims must be positive multiples of {hot.DGRAD_BLOCK}, got {text!r}")
    return dims


def parse_recipes(text: str) -> list[str]:
    """Comma-separated recipes whose layers draw through the hash operators."""
    names = text.split(",")
    unknown = [n for n in names if n not in RECIPES or not RECIPES[n].swaps_linear]
    if unknown:
        raise argparse.ArgumentTypeError(f"--recipes: {unknown} are not quantized recipes of the registry")
    return names


def parse_tokens(text: str) -> int:
    """Tokens of the one-layer measurement: a positive multiple of HOT's token block."""
    if not text.isdigit() or int(text) <= 0 or int(text) % hot.TOKEN_BLOCK:
        raise argparse.ArgumentTypeError(f"--tokens must be a positive multiple of {hot.TOKEN_BLOCK}, got {text!r}")
    return int(text)


def child(args: argparse.Namespace) -> None:
    if args.child == "traced":
        # The draws as inline PyTorch ops: traced by Dynamo, generated by Inductor, run eagerly op by op.
        library.hot_round = lambda t, scale, seed, qmax, backend: hot.round_int_ref(t, scale, qmax, seed)
        library.signs_from_seed = lambda n, seed, dtype, backend: seeds.signs_from_seed_ref(n, seed, dtype)
    device = torch.device(args.device)
    recipe = args.recipes[0]
    out = {"recipe": recipe, "variant": args.child, "model": args.model, "layers": args.layers,
           **_compile_time(recipe, args.model, args.layers, device)}
    out.update({"layer_dims": list(args.dims), "tokens": args.tokens, **_layer(recipe, args.dims, args.tokens, device)})
    print(json.dumps(out))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="results file (required unless --child)")
    parser.add_argument("--recipes", type=parse_recipes, default=["hot", "tseng"],
                        help="comma-separated recipes (default hot,tseng)")
    parser.add_argument("--model", default="tiny", help="model size of adahop.harness.model (default tiny)")
    parser.add_argument("--layers", type=int, default=1, help="its transformer blocks (default 1)")
    parser.add_argument("--dims", type=parse_dims, default=(1024, 1024), help="IN,OUT of the one-layer measurement")
    parser.add_argument("--tokens", type=parse_tokens, default=4096, help="tokens of the one-layer measurement")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0
    if args.out is None:
        parser.error("--out is required")
    records = []
    for recipe in args.recipes:
        pair = []
        for variant in VARIANTS:
            with tempfile.TemporaryDirectory() as cache:
                env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{cache}/inductor", "TRITON_CACHE_DIR": f"{cache}/triton"}
                cmd = [sys.executable, __file__, "--child", variant, "--recipes", recipe, "--model", args.model,
                       "--layers", str(args.layers), "--dims", ",".join(map(str, args.dims)), "--tokens",
                       str(args.tokens), "--device", args.device]
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode:
                sys.stderr.write(proc.stderr[-4000:])
                raise SystemExit(f"hash_ops_ab: {recipe}, the {variant} variant failed (exit {proc.returncode})")
            rec = json.loads(proc.stdout.strip().splitlines()[-1])
            pair.append(rec)
            peak = "" if rec["layer_peak_bytes"] is None else f", layer peak {rec['layer_peak_bytes'] / 2**20:.1f} MiB"
            print(f"{recipe:14s} {variant:6s} first compiled step {rec['first_compiled_step_s']:.1f} s, then "
                  f"{rec['compiled_step_s']:.3f} s; layer fwd+bwd {rec['layer_fwd_bwd_s'] * 1e3:.1f} ms{peak}, "
                  f"grads {rec['grad_digest']}", flush=True)
        op, traced = pair
        if op["grad_digest"] != traced["grad_digest"]:
            raise SystemExit(f"hash_ops_ab: {recipe}'s gradients differ between the variants: an operator does not "
                             "draw as its reference")
        print(f"{recipe}: first compiled step op / traced = "
              f"{op['first_compiled_step_s'] / traced['first_compiled_step_s']:.2f}", flush=True)
        records += pair
    config = {k: v for k, v in vars(args).items() if k not in ("out", "child")}
    write_results(args.out, records, config=config, device=args.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
