"""Where one linear layer's forward + backward spends its device time, by kernel and by kind of
kernel, beside ``nn.Linear`` bf16 and torchao float8 tensorwise: what is left between the
layer's speed and its peers'.

    python scripts/profile_layer.py --shape 16384x4096x4096 --out results/layer_bench/gpu/profiles/llama3-8b-q-o.json
    python scripts/profile_layer.py --shape 256x256x512 --out /tmp/profile.json      # a CPU: operators, not kernels

Each layer is built and compiled as ``tests/bench/test_bench_layer.py`` builds it (the quantized
layer and torchao's compiled from empty caches; ``nn.Linear`` eager), runs ``--warmup``
forward + backward passes (compilation, autotuning), then ``--steps`` under ``torch.profiler``.
One record per (layer, kind): ``gemm`` (cuBLAS and CUTLASS GEMMs, the Triton GEMM), ``quantize``
(the Hadamard + quantize kernel and its redo of rare blocks), ``re-encode`` (packed MXFP4 to FP8),
``copy`` (dtype and layout copies), ``other``; its microseconds a step, its share of the layer's
device time, and its kernels with their calls and microseconds a step. Each also holds the
layer's wall time a step, its passes launched back to back without the profiler: where it
exceeds the device time, the host bounds the layer, and on a GPU a ``host`` record lists the
host's operators by their own CPU time. On a GPU the times are the kernels' device times; on a
CPU, where there are no kernels, the operators' own CPU times, which show the same passes at a
small scale.

Cut by ``--budget-s``, SIGTERM (a job's time limit) or SIGINT, it writes the layers it finished
(``adahop.harness.provenance.write_measured``: beside an existing ``--out``, never over it) and exits
with status 2.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "bench"))
from test_bench_layer import torchao_float8  # noqa: E402

import adahop  # noqa: E402
from adahop.harness.provenance import Interrupted, interruptible, write_measured  # noqa: E402

# First match wins: the order keeps the quantize kernels out of "copy" (their Inductor neighbours
# are named after every op they fuse).
KINDS = (
    ("quantize", re.compile(r"^_hadamard_quantize|^_redo_kernel|adahop::quantize")),
    ("re-encode", re.compile(r"^_fp8_group|adahop::.*fp8")),
    ("gemm", re.compile(r"nvjet|gemm|cutlass|xmma|_mm_kernel|aten::(mm|addmm|_scaled_mm|_int_mm)$|adahop::.*mm$")),
    ("copy", re.compile(r"to_copy|Memcpy|copy_kernel|aten::(copy_|_to_copy|clone|contiguous)$")),
)
OTHER = "other"


def kind(name: str) -> str:
    return next((k for k, pattern in KINDS if pattern.search(name)), OTHER)


def parse_shape(text: str) -> tuple[int, int, int]:
    try:
        tokens, fin, fout = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape must be TOKENSxINxOUT (e.g. 16384x4096x4096), got {text!r}") from None
    if min(tokens, fin, fout) <= 0 or tokens % 128 or fin % 128 or fout % 128:
        raise argparse.ArgumentTypeError(f"--shape {text}: tokens, in and out must be positive multiples of 128")
    return tokens, fin, fout


def layers(recipe: str, fin: int, fout: int, device: torch.device) -> dict[str, tuple[nn.Module, nn.Parameter]]:
    """name -> (callable layer, its weight): the recipe's quantized layer, nn.Linear bf16 and, on
    CUDA where torchao imports, torchao float8 tensorwise (as the layer benchmark builds it)."""
    linear = nn.Linear(fin, fout, bias=False).to(device, torch.bfloat16)
    quantized = adahop.convert(nn.Linear(fin, fout, bias=False).to(device, torch.bfloat16), recipe)
    out = {recipe: (torch.compile(quantized) if device.type == "cuda" else quantized, quantized.weight),
           "nn.Linear-bf16": (linear, linear.weight)}
    ao = torchao_float8(fin, fout, device, "tensorwise") if device.type == "cuda" else None
    if ao is not None:
        out["torchao-float8-tensorwise"] = ao
    return out


HOST_OPS = 15  # the host record lists this many operators, by own CPU time


def own_times(prof: profile, device: bool) -> dict[str, tuple[int, float]]:
    """Name -> (calls, own microseconds in all): the CUDA kernels (``device``) or the host's
    operators and Python-level ranges."""
    out = {}
    for evt in prof.key_averages():
        if device:
            if evt.device_type != torch.autograd.DeviceType.CUDA:
                continue
            us = getattr(evt, "self_device_time_total", None)
            us = evt.self_cuda_time_total if us is None else us
        else:
            if evt.device_type != torch.autograd.DeviceType.CPU:
                continue
            us = evt.self_cpu_time_total
        if us > 0:
            out[evt.key] = (evt.count, float(us))
    return out


def sync(on_cuda: bool) -> None:
    if on_cuda:
        torch.cuda.synchronize()


def profile_layer(run, steps: int, warmup: int, on_cuda: bool) -> tuple[float, profile]:
    """Wall microseconds a step over ``steps`` unprofiled passes (launched back to back, one
    synchronisation at the end: where it exceeds the device's time, the host bounds the layer),
    then the profile of ``steps`` more."""
    for _ in range(warmup):
        run()
    sync(on_cuda)
    start = time.perf_counter()
    for _ in range(steps):
        run()
    sync(on_cuda)
    wall_us = (time.perf_counter() - start) / steps * 1e6
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if on_cuda else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        for _ in range(steps):
            run()
        sync(on_cuda)
    return wall_us, prof


def per_step(times: dict[str, tuple[int, float]], steps: int) -> list[dict]:
    rows = [{"name": name, "calls_per_step": calls / steps, "us_per_step": us / steps}
            for name, (calls, us) in times.items()]
    return sorted(rows, key=lambda r: -r["us_per_step"])


def records_of(layer: str, times: dict[str, tuple[int, float]], steps: int, wall_us: float) -> list[dict]:
    """One record per kind of kernel, largest first: its time a step, its share of the layer's
    device time, and the layer's device and wall time a step."""
    total = sum(us for _, us in times.values()) / steps
    by_kind: dict[str, list[dict]] = defaultdict(list)
    for row in per_step(times, steps):
        by_kind[kind(row["name"])].append(row)
    records = [{"layer": layer, "kind": k, "us_per_step": sum(r["us_per_step"] for r in kernels),
                "share": sum(r["us_per_step"] for r in kernels) / total, "layer_us_per_step": total,
                "wall_us_per_step": wall_us, "kernels": kernels} for k, kernels in by_kind.items()]
    return sorted(records, key=lambda r: -r["us_per_step"])


def host_record(layer: str, times: dict[str, tuple[int, float]], steps: int, wall_us: float) -> dict:
    """The host's side of a GPU layer: its operators' own CPU time a step (the largest listed)."""
    ops = per_step(times, steps)
    return {"layer": layer, "kind": "host", "us_per_step": sum(r["us_per_step"] for r in ops),
            "wall_us_per_step": wall_us, "ops": ops[:HOST_OPS]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", type=parse_shape, required=True, help="TOKENSxINxOUT of the layer")
    p.add_argument("--recipe", default="uniform-iht", help="the quantized layer's recipe (default uniform-iht: fixed IHT)")
    p.add_argument("--steps", type=int, default=10, help="profiled forward + backward passes")
    p.add_argument("--warmup", type=int, default=5, help="untimed passes before (compilation, autotuning)")
    p.add_argument("--out", type=Path, required=True, help="results file")
    p.add_argument("--overwrite", action="store_true", help="replace a results file of another configuration")
    p.add_argument("--budget-s", type=float, help="stop after this many seconds, keeping the layers profiled")
    args = p.parse_args(argv)
    if args.recipe not in adahop.RECIPES:
        p.error(f"--recipe: unknown {args.recipe!r}; known: {sorted(adahop.RECIPES)}")
    if args.steps < 1 or args.warmup < 1:
        p.error(f"--steps and --warmup must be at least 1, got {args.steps} and {args.warmup}")
    on_cuda = torch.cuda.is_available()
    device = torch.device("cuda" if on_cuda else "cpu")
    tokens, fin, fout = args.shape
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(tokens, fin, device=device, generator=gen).to(torch.bfloat16).requires_grad_()
    gy = torch.randn(tokens, fout, device=device, generator=gen).to(torch.bfloat16)
    records, names, interrupted = [], [], None
    with interruptible(args.budget_s) as budget:
        try:
            todo = layers(args.recipe, fin, fout, device)
            names = list(todo)
            for name, (layer, weight) in todo.items():
                budget.check()
                torch._dynamo.reset()  # each layer compiled from empty caches, as tests/bench/test_bench_layer.py does
                wall_us, prof = profile_layer(lambda: torch.autograd.grad(layer(x), (x, weight), gy), args.steps,
                                              args.warmup, on_cuda)
                mine = records_of(name, own_times(prof, device=on_cuda), args.steps, wall_us)
                if on_cuda:
                    mine.append(host_record(name, own_times(prof, device=False), args.steps, wall_us))
                records += mine
        except Interrupted as e:
            interrupted = str(e)
    config = {"shape": list(args.shape), "recipe": args.recipe, "steps": args.steps, "warmup": args.warmup,
              "times": "kernel device time" if on_cuda else "operator self CPU time"}
    out = write_measured(args.out, records, interrupted, names, "layer", config=config, device=device,
                         overwrite=args.overwrite)
    for name in dict.fromkeys(r["layer"] for r in records):
        mine = [r for r in records if r["layer"] == name and r["kind"] != "host"]
        host = [r for r in records if r["layer"] == name and r["kind"] == "host"]
        print(f"{name}: wall {mine[0]['wall_us_per_step']:.0f} us a step, device {mine[0]['layer_us_per_step']:.0f}"
              + (f", host operators {host[0]['us_per_step']:.0f}" if host else "") + ": "
              + ", ".join(f"{r['kind']} {r['us_per_step']:.0f} ({r['share']:.0%})" for r in mine))
    if interrupted:
        print(f"profile_layer: interrupted ({interrupted}) after {len(records)} records -> {out or 'nothing written'}")
        return 2
    print(f"profile_layer: {len(records)} records -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
