"""HOT's integer rounding as one operator (``adahop::hot_round``) against the same rounding traced
as PyTorch ops (:func:`adahop.hot.round_int_ref` called inline, which is what the layer ran before
the operator existed).

    python scripts/hot_ab.py --out results/microbench/cpu/hot-ab.json      # CPU: compile time only
    python scripts/hot_ab.py --out results/microbench/gpu/hot-ab.json --model 125m --tokens 16384

Each variant runs in a child process with empty Inductor and Triton caches:

* ``first_compiled_step_s``: the wall time of the first ``torch.compile``d optimizer step of the
  project's Llama (``--model``, ``--layers``) under the ``hot`` recipe, strategies fixed after an
  eager calibration (Dynamo, AOT autograd and Inductor's code generation for forward and
  backward), and ``compiled_step_s``, the median of the next three;
* one HOT layer ``--dims IN,OUT`` over ``--tokens`` tokens, eager, fixed: forward + backward
  time and, on CUDA, its peak memory above the inputs (``torch.cuda.max_memory_allocated``), and
  the digest of its gradients, which must be equal between the variants (the operator and the
  reference round alike, bit for bit).
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

VARIANTS = ("op", "traced")
VOCAB, BATCH, SEQ = 256, 2, 64


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _compile_time(model_name: str, layers: int, device: torch.device) -> dict:
    torch.manual_seed(0)
    model = Llama(LlamaConfig.from_name(model_name, vocab_size=VOCAB, n_layers=layers)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    adahop.convert(model, "hot", optimizer=opt, calibration_steps=2)
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


def _layer(dims: tuple[int, int], tokens: int, device: torch.device) -> dict:
    torch.manual_seed(0)
    layer = nn.Sequential(nn.Linear(*dims, bias=False)).to(device, torch.bfloat16)
    adahop.convert(layer, "hot", calibration_steps=1, skip=())
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


def parse_tokens(text: str) -> int:
    """Tokens of the one-layer measurement: a positive multiple of HOT's token block."""
    if not text.isdigit() or int(text) <= 0 or int(text) % hot.TOKEN_BLOCK:
        raise argparse.ArgumentTypeError(f"--tokens must be a positive multiple of {hot.TOKEN_BLOCK}, got {text!r}")
    return int(text)


def child(args: argparse.Namespace) -> None:
    if args.child == "traced":
        # The rounding as inline PyTorch ops: traced by Dynamo, generated by Inductor, run eagerly op by op.
        library.hot_round = lambda t, scale, seed, qmax, backend: hot.round_int_ref(t, scale, qmax, seed)
    device = torch.device(args.device)
    out = {"variant": args.child, "model": args.model, "layers": args.layers,
           **_compile_time(args.model, args.layers, device)}
    out.update({"layer_dims": list(args.dims), "tokens": args.tokens, **_layer(args.dims, args.tokens, device)})
    print(json.dumps(out))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="results file (required unless --child)")
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
    for variant in VARIANTS:
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{cache}/inductor", "TRITON_CACHE_DIR": f"{cache}/triton"}
            cmd = [sys.executable, __file__, "--child", variant, "--model", args.model, "--layers", str(args.layers),
                   "--dims", ",".join(map(str, args.dims)), "--tokens", str(args.tokens), "--device", args.device]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode:
            sys.stderr.write(proc.stderr[-4000:])
            raise SystemExit(f"hot_ab: the {variant} variant failed (exit {proc.returncode})")
        rec = json.loads(proc.stdout.strip().splitlines()[-1])
        records.append(rec)
        peak = "" if rec["layer_peak_bytes"] is None else f", layer peak {rec['layer_peak_bytes'] / 2**20:.1f} MiB"
        print(f"{variant:6s} first compiled step {rec['first_compiled_step_s']:.1f} s, then {rec['compiled_step_s']:.3f} s;"
              f" layer fwd+bwd {rec['layer_fwd_bwd_s'] * 1e3:.1f} ms{peak}, grads {rec['grad_digest']}", flush=True)
    if len({r["grad_digest"] for r in records}) != 1:
        raise SystemExit("hot_ab: the variants' gradients differ; the operator does not round as the reference")
    op, traced = records
    print(f"first compiled step: op / traced = {op['first_compiled_step_s'] / traced['first_compiled_step_s']:.2f}")
    config = {k: v for k, v in vars(args).items() if k not in ("out", "child")}
    write_results(args.out, records, config=config, device=args.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
