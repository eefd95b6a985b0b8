"""Microbenchmark fixtures: one timer, the same-run ceilings, and the record every figure carries.

Run ``pytest tests/bench --benchmark-only`` (plain ``pytest`` skips benchmarks: pyproject's addopts
hold ``--benchmark-skip``, which ``--benchmark-only`` overrides). ``experiments/microbench.py``
runs exactly that and turns the JSON into ``results/microbench/``.

Sizes: ``ADAHOP_BENCH_PROFILE=smoke`` (small shapes, for a CPU) or ``gpu`` (4096³, 8192³ and
Llama-3 1B/8B layer shapes at 8k-16k tokens); default ``gpu`` where CUDA is available, else
``smoke``.

Timer: on a GPU ``triton.testing.do_bench`` (CUDA events, L2 flushed before each call, synchronised),
on a CPU ``time.perf_counter`` around each call. The op and its ceilings are timed the same way in
the same process; a figure is work over the median time, its spread the IQR. pytest-benchmark's
own statistics (host clock around a synchronising wrapper, a few rounds) stay in its JSON as a
cross-check.

Ceilings and peers (measured once per session, GEMMs once per shape):

* ``copy``: a device-to-device copy, bytes read + written over time (GB/s): memory-bound ops.
* ``cublas-bf16``: ``a @ b.t()`` in bf16 (TFLOP/s), the speed peer of every MXFP4 GEMM.
* ``cublas-fp8-rowwise``: ``torch._scaled_mm`` with fp32 row scales (TFLOP/s), the ceiling of the
  exact FP8 path on Hopper.
* CPU: ``copy`` and ``torch-fp32-matmul``, so a CPU run reports its own honest peers.

Resuming: ``$ADAHOP_BENCH_DONE`` names a file of benchmark names to deselect, the ones a cut run
already measured (``experiments/microbench.py --resume``).

Backends: GPU benchmarks time compiled Triton kernels and are skipped when ``TRITON_INTERPRET``
is set (tests/kernels/conftest.py sets it: run ``pytest tests/bench``, not the whole tree, on a
GPU); CPU benchmarks time the reference backend.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import pytest
import torch

from adahop.backend import Backend, triton_interpreted

CUDA = torch.cuda.is_available()
PROFILE = os.environ.get("ADAHOP_BENCH_PROFILE") or ("gpu" if CUDA else "smoke")
if PROFILE not in ("smoke", "gpu"):
    raise pytest.UsageError(f"ADAHOP_BENCH_PROFILE must be 'smoke' or 'gpu', got {PROFILE!r}")
if PROFILE == "gpu" and not CUDA:
    raise pytest.UsageError("ADAHOP_BENCH_PROFILE=gpu needs a CUDA GPU (its shapes take hours on a CPU)")


def _llama_gemms(name: str, hidden: int, mlp: int, kv: int, tokens: int) -> list[tuple[str, tuple[int, int, int]]]:
    """Forward GEMMs (M=tokens, N=out, K=in) of one Llama-3 layer."""
    t = f"{tokens // 1024}k"
    return [
        (f"{name}-q/o-{t}", (tokens, hidden, hidden)),
        (f"{name}-k/v-{t}", (tokens, kv, hidden)),
        (f"{name}-gate/up-{t}", (tokens, mlp, hidden)),
        (f"{name}-down-{t}", (tokens, hidden, mlp)),
    ]


# (name, (M, N, K)) of A (M, K) · Bᵀ (N, K).
GEMM_SHAPES = {
    "smoke": [("square-256", (256, 256, 256)), ("square-512", (512, 512, 512)), ("mlp-like-256", (256, 1024, 256))],
    "gpu": [
        ("square-4096", (4096, 4096, 4096)),
        ("square-8192", (8192, 8192, 8192)),
        *_llama_gemms("llama3-8b", 4096, 14336, 1024, 8192),
        *_llama_gemms("llama3-8b", 4096, 14336, 1024, 16384),
        ("llama3-8b-gate/up-wgrad-16k", (14336, 4096, 16384)),
        ("llama3.2-1b-gate/up-16k", (16384, 8192, 2048)),
        ("llama3.2-1b-down-16k", (16384, 2048, 8192)),
    ],
}[PROFILE]
# GEMMs for the forced (non-default) paths: fewer, they only place the default path among its peers.
GEMM_SHAPES_FORCED = GEMM_SHAPES[:2]
# (name, (rows, cols)) of activations and gradients, for memory-bound ops (tokens x features).
ACTIVATION_SHAPES = {
    "smoke": [("256x512", (256, 512)), ("512x1024", (512, 1024))],
    "gpu": [
        ("8192x8192", (8192, 8192)),
        ("llama3-8b-hidden-16k", (16384, 4096)),
        ("llama3-8b-mlp-16k", (16384, 14336)),
        ("llama3.2-1b-hidden-16k", (16384, 2048)),
        ("llama3.2-1b-mlp-16k", (16384, 8192)),
        # The 125m model of our pretraining runs (32 x 2048 tokens a step): narrow rows, where the
        # quantize kernels measured their worst fraction of copy bandwidth.
        ("ours-125m-hidden-64k", (65536, 768)),
        ("ours-125m-mlp-64k", (65536, 2048)),
    ],
}[PROFILE]
# Cross-check rounds of pytest-benchmark (the figure comes from measure()).
PEDANTIC_ROUNDS = 5 if CUDA else 2
CPU_BUDGET_S, CPU_MIN_REPS, CPU_MAX_REPS = 0.5, 3, 50


SHAPE_FIXTURES = {"gemm_shape": GEMM_SHAPES, "forced_gemm_shape": GEMM_SHAPES_FORCED, "activation_shape": ACTIVATION_SHAPES}


DONE_ENV = "ADAHOP_BENCH_DONE"  # a file of benchmark names (one a line) that a resumed run already has


def pytest_collection_modifyitems(config, items):
    """Deselect the benchmarks named in ``$ADAHOP_BENCH_DONE`` (experiments/microbench.py --resume)."""
    path = os.environ.get(DONE_ENV)
    if not path:
        return
    with open(path) as f:
        done = set(f.read().splitlines())
    deselected = [item for item in items if item.name in done]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item.name not in done]


def pytest_generate_tests(metafunc):
    """A test asking for ``gemm_shape``, ``forced_gemm_shape`` or ``activation_shape`` runs once per
    shape of the profile, with the shape's name as its id."""
    for fixture, cases in SHAPE_FIXTURES.items():
        if fixture in metafunc.fixturenames:
            metafunc.parametrize(fixture, [shape for _, shape in cases], ids=[name for name, _ in cases])


@dataclass(frozen=True)
class Timing:
    median_s: float
    iqr_s: float
    n: int
    timer: str


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(fn: Callable[[], object], device: torch.device) -> Timing:
    """Median and IQR of ``fn``'s time: do_bench on a GPU, a synchronised perf_counter on a CPU."""
    if device.type == "cuda":
        import triton.testing

        times = [t / 1e3 for t in triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="all")]
        timer = "triton.testing.do_bench"
    else:
        fn()  # warm-up: first-call allocations and caches
        times, stop = [], time.perf_counter() + CPU_BUDGET_S
        while len(times) < CPU_MIN_REPS or (len(times) < CPU_MAX_REPS and time.perf_counter() < stop):
            t0 = time.perf_counter()
            fn()
            _sync(device)
            times.append(time.perf_counter() - t0)
        timer = "time.perf_counter"
    return _timing(times, timer)


def _timing(times: list[float], timer: str) -> Timing:
    """The median and IQR of ``times`` (seconds)."""
    q1, _, q3 = statistics.quantiles(times, n=4) if len(times) > 1 else (times[0],) * 3
    return Timing(statistics.median(times), q3 - q1, len(times), timer)


def measure_replayed(fn: Callable[[], object], device: torch.device) -> Timing | None:
    """Median and IQR of ``fn``'s time replayed from a CUDA graph: the device's time alone, as a
    training step under CUDA graphs (``torch.compile(mode="reduce-overhead")``) spends it, with no
    host launches. None on a device without CUDA graphs."""
    if device.type != "cuda":
        return None
    import triton.testing

    times = [t / 1e3 for t in triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="all")]
    return _timing(times, "triton.testing.do_bench_cudagraph")


@dataclass(frozen=True)
class Figure:
    """A measured rate: ``value`` in ``unit`` with the timing it came from."""

    value: float
    unit: str
    timing: Timing

    def as_dict(self) -> dict:
        return {"value": self.value, "unit": self.unit, "median_s": self.timing.median_s, "iqr_s": self.timing.iqr_s}


UNITS = {"TFLOP/s": 1e12, "GB/s": 1e9}


def rate(fn: Callable[[], object], device: torch.device, work: float, unit: str) -> Figure:
    """``work`` (flop for TFLOP/s, bytes for GB/s) over the median time of ``fn``."""
    timing = measure(fn, device)
    return Figure(work / timing.median_s / UNITS[unit], unit, timing)


class Ceilings:
    """The same-run ceilings and peers, measured on first use and kept for the session."""

    def __init__(self, device: torch.device):
        self.device = device
        self._cache: dict[tuple, Figure] = {}

    def names_for_gemm(self) -> tuple[str, list[str]]:
        """(ceiling, peers) of a GEMM on this device."""
        if self.device.type == "cuda":
            return "cublas-fp8-rowwise", ["cublas-bf16"]
        return "torch-fp32-matmul", []

    def get(self, name: str, shape: tuple[int, ...] = ()) -> Figure:
        key = (name, tuple(shape))
        if key not in self._cache:
            self._cache[key] = getattr(self, "_" + name.replace("-", "_"))(*shape)
        return self._cache[key]

    def _copy(self) -> Figure:
        n = (1 << 30) if self.device.type == "cuda" else (1 << 26)
        src = torch.empty(n, dtype=torch.uint8, device=self.device).random_()
        dst = torch.empty_like(src)
        return rate(lambda: dst.copy_(src), self.device, 2 * n, "GB/s")

    def _randn(self, *shape: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.randn(*shape, device=self.device).to(dtype)

    def _cublas_bf16(self, m: int, n: int, k: int) -> Figure:
        a, b = self._randn(m, k, dtype=torch.bfloat16), self._randn(n, k, dtype=torch.bfloat16)
        return rate(lambda: a @ b.t(), self.device, 2 * m * n * k, "TFLOP/s")

    def _cublas_fp8_rowwise(self, m: int, n: int, k: int) -> Figure:
        a, b = self._randn(m, k, dtype=torch.float8_e4m3fn), self._randn(n, k, dtype=torch.float8_e4m3fn)
        sa = torch.ones(m, 1, device=self.device)
        sb = torch.ones(1, n, device=self.device)
        return rate(lambda: torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16),
                    self.device, 2 * m * n * k, "TFLOP/s")

    def _torch_fp32_matmul(self, m: int, n: int, k: int) -> Figure:
        a, b = self._randn(m, k, dtype=torch.float32), self._randn(n, k, dtype=torch.float32)
        return rate(lambda: a @ b.t(), self.device, 2 * m * n * k, "TFLOP/s")


@pytest.fixture(scope="session")
def bench_device() -> torch.device:
    return torch.device("cuda" if CUDA else "cpu")


GPU_WARMUP_S = 2.0


@pytest.fixture(scope="session", autouse=True)
def clocks_up(bench_device) -> None:
    """Keep the GPU busy for GPU_WARMUP_S before the first benchmark: an idle H200 sits at ~345 MHz
    and ramps up under load, and Triton's autotuner, which times its configs once at a kernel's
    first call and keeps the pick for the process, would otherwise rank them on a moving clock."""
    if bench_device.type != "cuda":
        return
    a = torch.randn(4096, 4096, device=bench_device, dtype=torch.bfloat16)
    stop = time.perf_counter() + GPU_WARMUP_S
    while time.perf_counter() < stop:
        for _ in range(8):
            a @ a
        torch.cuda.synchronize(bench_device)


@pytest.fixture(scope="session")
def ceilings(bench_device) -> Ceilings:
    return Ceilings(bench_device)


class Bench:
    """What a benchmark test calls: ``bench.run(benchmark, fn, op=..., ...)``."""

    def __init__(self, device: torch.device, ceilings: Ceilings):
        self.device = device
        self.ceilings = ceilings
        # The reference on a CPU: Triton's interpreter would be timed otherwise.
        self.backend = None if device.type == "cuda" else Backend.REFERENCE
        if device.type == "cuda" and triton_interpreted():
            pytest.skip("TRITON_INTERPRET is set (tests/kernels/conftest.py sets it): the GPU benchmarks would "
                        "time Triton's interpreter; run `pytest tests/bench --benchmark-only`")

    def randn(self, *shape: int, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> torch.Tensor:
        g = torch.Generator(device=self.device).manual_seed(seed)
        return torch.randn(*shape, generator=g, device=self.device).to(dtype)

    def run(
        self,
        benchmark,
        fn: Callable[[], object],
        *,
        op: str,
        shape: tuple[int, ...],
        dtype: str,
        work: float,
        unit: str,
        ceiling: str,
        ceiling_shape: tuple[int, ...] = (),
        peers: dict[str, Callable[[], object] | tuple[int, ...]] | None = None,
        gemm_path: str | None = None,
    ) -> dict | None:
        """Time ``fn`` and record it in ``benchmark.extra_info``; None under ``--benchmark-disable``.

        ``work``: flop (unit TFLOP/s) or bytes read + written (unit GB/s) of one call. ``ceiling``:
        a :class:`Ceilings` name (at ``ceiling_shape`` for GEMMs). ``peers``: name -> a Ceilings
        shape (a named ceiling) or a callable doing the same work another way (timed here).
        """
        device = self.device

        def synced():
            fn()
            _sync(device)

        benchmark.pedantic(synced, rounds=PEDANTIC_ROUNDS, warmup_rounds=1, iterations=1)
        if benchmark.disabled:
            return None
        figure = rate(fn, device, work, unit)
        ceil = self.ceilings.get(ceiling, ceiling_shape)
        measured_peers = {}
        for name, peer in (peers or {}).items():
            measured_peers[name] = rate(peer, device, work, unit) if callable(peer) else self.ceilings.get(name, peer)
        for name, other in {ceiling: ceil, **measured_peers}.items():
            if other.unit != unit:
                raise ValueError(f"{name} is measured in {other.unit}, the figure of {op} in {unit}")
        info = {
            "op": op,
            "shape": list(shape),
            "dtype": dtype,
            "gemm_path": gemm_path,
            "backend": (self.backend or Backend.TRITON).value,
            "profile": PROFILE,
            "figure": figure.value,
            "unit": unit,
            "median_s": figure.timing.median_s,
            "iqr_s": figure.timing.iqr_s,
            "n_timings": figure.timing.n,
            "timer": figure.timing.timer,
            "ceiling_name": ceiling,
            "ceiling": ceil.as_dict(),
            "ratio_to_ceiling": figure.value / ceil.value,
            "peers": {name: p.as_dict() for name, p in measured_peers.items()},
            "ratio_to_peers": {name: figure.value / p.value for name, p in measured_peers.items()},
        }
        benchmark.extra_info.update(info)
        return info

    def replayed(self, fn: Callable[[], object], peers: dict[str, Callable[[], object]]) -> dict | None:
        """``fn`` and its callable ``peers`` timed again, each replayed from a CUDA graph
        (:func:`measure_replayed`): their speeds without the host's launches. None on a CPU."""
        try:
            mine = measure_replayed(fn, self.device)
            if mine is None:
                return None
            others = {name: measure_replayed(peer, self.device) for name, peer in peers.items()}
        except RuntimeError as err:  # a capture that fails is the finding; the host-bound figure stands
            return {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"}
        return {"timer": mine.timer, "median_s": mine.median_s, "iqr_s": mine.iqr_s, "n_timings": mine.n,
                "peers": {name: {"median_s": t.median_s, "iqr_s": t.iqr_s} for name, t in others.items()},
                "ratio_to_peers": {name: t.median_s / mine.median_s for name, t in others.items()}}


@pytest.fixture
def bench(bench_device, ceilings) -> Bench:
    return Bench(bench_device, ceilings)
