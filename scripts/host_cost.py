"""Host time a call of each step on the quantized layer's path, at a size where the device's work is
negligible: what bounds a layer whose wall time exceeds its device time (``scripts/profile_layer.py``).

    python scripts/host_cost.py --out results/layer_bench/mygpu/host/host-cost.json

Each record times ``--calls`` back-to-back calls of one callable (one synchronisation at the end),
best of ``--repeats``: microseconds a call. The callables go from the whole compiled layer's forward
+ backward down to one kernel launch, so that the differences say where the host time goes: the
operator's dispatch, its Python (checks, allocations), Triton's launcher, or the allocations alone;
the peers' compiled layers (``nn.Linear`` bf16, torchao float8 tensorwise on a GPU) are the host
time to beat. On a CPU only the layers and the operators run: through the interpreter under
``TRITON_INTERPRET=1``, else through the reference. The compiled layer's kernels and GEMMs are
launched by Inductor where ``ADAHOP_INDUCTOR_LAUNCHES=1`` (``adahop.library.inductor_launches``).

Cut by ``--budget-s``, SIGTERM (a job's time limit) or SIGINT, it writes the records it finished
(``adahop.harness.provenance.write_measured``: beside an existing ``--out``, never over it) and exits
with status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "bench"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_layer import parse_shape  # noqa: E402
from test_bench_layer import torchao_float8  # noqa: E402

import adahop  # noqa: E402
from adahop import library  # noqa: E402
from adahop.harness.provenance import Interrupted, interruptible, write_measured  # noqa: E402


def per_call_us(fn, calls: int, repeats: int, on_cuda: bool) -> float:
    """Best of ``repeats`` of the mean wall microseconds over ``calls`` back-to-back calls."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        if on_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if on_cuda:
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def callables(tokens: int, fin: int, fout: int, device: torch.device, backend: str) -> dict:
    """name -> (what it is, callable)."""
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(tokens, fin, device=device, generator=gen).to(torch.bfloat16).requires_grad_()
    gy = torch.randn(tokens, fout, device=device, generator=gen).to(torch.bfloat16)
    layer = adahop.convert(torch.nn.Linear(fin, fout, bias=False).to(device, torch.bfloat16), "uniform-iht")
    compiled = torch.compile(layer)
    xd = x.detach()
    seed = torch.zeros(1, dtype=torch.int64, device=device)
    req_x = library.request(True, packed=False, fp8="seg128")
    req_xt = library.request(True, packed=True)
    out = {
        "layer-compiled": ("the IHT layer's forward + backward, compiled (as the layer benchmark runs it)",
                           lambda: torch.autograd.grad(compiled(x), (x, layer.weight), gy)),
        "layer-eager": ("the same, eager", lambda: torch.autograd.grad(layer(x), (x, layer.weight), gy)),
        "op-quantize": ("torch.ops.adahop.quantize: X along in (FP8 seg128) and along tokens (packed), one read",
                        lambda: torch.ops.adahop.quantize(xd, None, None, seed, req_x, req_xt, 32, "rne", "propagate",
                                                          backend)),
        "eager-quantize": ("adahop.library.quantize, eager: the same, the operator's implementation called "
                           "directly",
                           lambda: library.quantize(xd, None, None, seed, req_x, req_xt, 32, "rne", "propagate", backend)),
    }
    q = library.quantize(xd, None, None, seed, "", req_xt, 32, "rne", "propagate", backend)
    out["op-fp8_encode"] = ("torch.ops.adahop.fp8_encode: a saved packed operand to FP8 tile128",
                            lambda: torch.ops.adahop.fp8_encode(q[5], q[6], "tile128", backend))
    wq = library.quantize(layer.weight.detach(), None, None, seed, "fp8=row", "", 32, "rne", "propagate", backend)
    xq = library.quantize(xd, None, None, seed, "fp8=row", "", 32, "rne", "propagate", backend)
    out["op-fp8_mm"] = ("torch.ops.adahop.fp8_mm: the forward's rowwise FP8 GEMM through its operator",
                        lambda: torch.ops.adahop.fp8_mm(xq[2], xq[3], "row", wq[2], wq[3], "row", torch.bfloat16))
    out.update(peer_callables(fin, fout, device, x, gy))
    if device.type != "cuda":
        return out
    from adahop_kernels import hadamard_quantize as hq

    sk, sm = hq.Side(True, None, packed=False, fp8="seg128"), hq.Side(True, None, packed=True)
    out["kernels-quantize"] = ("adahop_kernels.hadamard_quantize.quantize called directly (no operator)",
                               lambda: hq.quantize(xd, sk, sm, hadamard_size=32))
    launched = {}
    real_tuned, real_redo = hq._tuned_kernel, hq._redo_kernel

    class Capture:
        """Records the launch a kernel handle receives, then makes it."""

        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launched[self.name] = (self.kernel, grid, args, kwargs)
                return self.kernel[grid](*args, **kwargs)
            return launch

    hq._tuned_kernel, hq._redo_kernel = Capture("tuned", real_tuned), Capture("redo", real_redo)
    try:
        hq.quantize(xd, sk, sm, hadamard_size=32)
    finally:
        hq._tuned_kernel, hq._redo_kernel = real_tuned, real_redo
    for name, what in (("tuned", "the Hadamard + quantize kernel's launch alone (autotuned handle, same arguments)"),
                       ("redo", "the redo kernel's launch alone")):
        kernel, grid, args, kwargs = launched[name]
        out[f"launch-{name}"] = (what, lambda kernel=kernel, grid=grid, args=args, kwargs=kwargs:
                                 kernel[grid](*args, **kwargs))
    out["alloc-empty0"] = ("torch.empty(0) on the GPU (an output not asked for)",
                           lambda: torch.empty(0, dtype=torch.uint8, device=device))
    out["alloc-empty"] = ("torch.empty of X's FP8 size", lambda: torch.empty(tokens, fin, dtype=torch.uint8, device=device))
    out["alloc-zeros"] = ("torch.zeros of the redo marks", lambda: torch.zeros(64, dtype=torch.int32, device=device))
    fa = torch.randn(tokens, fin, device=device).to(torch.float8_e4m3fn)
    fb = torch.randn(fout, fin, device=device).to(torch.float8_e4m3fn)
    one = torch.ones((), device=device)
    out["scaled_mm"] = ("torch._scaled_mm tensorwise, no operator around it",
                        lambda: torch._scaled_mm(fa, fb.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
    return out


def peer_callables(fin: int, fout: int, device: torch.device, x: torch.Tensor, gy: torch.Tensor) -> dict:
    """The peers' compiled forward + backward on the same operands: ``nn.Linear`` bf16 and, on a GPU
    where torchao imports, its float8 tensorwise layer (as the layer benchmark builds them)."""
    linear = torch.nn.Linear(fin, fout, bias=False).to(device, torch.bfloat16)
    bf16 = torch.compile(linear)
    out = {"peer-bf16-compiled": ("nn.Linear bf16, compiled, forward + backward",
                                  lambda: torch.autograd.grad(bf16(x), (x, linear.weight), gy))}
    ao = torchao_float8(fin, fout, device, "tensorwise") if device.type == "cuda" else None
    if ao is not None:
        ao_layer, ao_weight = ao
        out["peer-torchao-float8-tensorwise"] = ("torchao float8 tensorwise, compiled, forward + backward",
                                                 lambda: torch.autograd.grad(ao_layer(x), (x, ao_weight), gy))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", type=parse_shape, default="512x1024x1024",
                   help="TOKENSxINxOUT (default small: the device's work negligible)")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--budget-s", type=float, help="stop after this many seconds, keeping the records measured")
    args = p.parse_args(argv)
    tokens, fin, fout = args.shape
    if args.calls < 1 or args.repeats < 1:
        p.error("--calls and --repeats must be at least 1")
    on_cuda = torch.cuda.is_available()
    device = torch.device("cuda" if on_cuda else "cpu")
    backend = "triton" if on_cuda or os.environ.get("TRITON_INTERPRET") == "1" else "reference"
    records, names, interrupted = [], [], None
    with interruptible(args.budget_s) as budget:
        try:
            todo = callables(tokens, fin, fout, device, backend)
            names = list(todo)
            for name, (what, fn) in todo.items():
                budget.check()
                us = per_call_us(fn, args.calls, args.repeats, on_cuda)
                records.append({"name": name, "what": what, "us_per_call": us})
                print(f"{name:18s} {us:9.1f} us  {what}")
        except Interrupted as e:
            interrupted = str(e)
    config = {"shape": [tokens, fin, fout], "calls": args.calls, "repeats": args.repeats, "backend": backend}
    out = write_measured(args.out, records, interrupted, names, "name", config=config, device=device,
                         overwrite=args.overwrite)
    if interrupted:
        print(f"host_cost: interrupted ({interrupted}) after {len(records)} records -> {out or 'nothing written'}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
