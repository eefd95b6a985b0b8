"""Kernel microbenchmarks: run the pytest-benchmark suite, write ``results/microbench/``.

    python experiments/microbench.py --config config/gpu.yaml --out results/microbench/gpu/kernels.json
    python experiments/microbench.py --profile smoke            # no profile file; --out defaults to
                                                                 # results/microbench/<device-slug>.json

Runs ``pytest tests/bench --benchmark-only --benchmark-json=<tmp>`` in a subprocess with
``ADAHOP_BENCH_PROFILE`` set (tests/bench/conftest.py reads it: ``smoke`` = small CPU shapes,
``gpu`` = 4096³, 8192³ and Llama-3 layer shapes), then writes one record per benchmark through
:func:`adahop.harness.provenance.write_results`: op, shape, dtype, figure and unit, the same-run ceiling and
the ratio to it, the peers and the ratios to them, the GEMM path, the backend, median and IQR
seconds of the timer, and pytest-benchmark's own statistics as a cross-check.

Profile file, section ``microbench`` (every key optional):
    bench_profile: smoke | gpu     sizes (default: the file's top-level ``profile``)
    select: <pytest -k expression> a subset of the benchmarks (default: all)
    budget_s: <seconds> as --budget-s (default: none)

``--budget-s N``, SIGTERM or SIGINT: pytest stops at the benchmark it is in and the file keeps
those that finished; the provenance says what stopped it (``pytest_interrupted_by``: ``budget``,
``SIGTERM``, ``SIGINT``). ``--resume`` then runs only what the file lacks and writes both (the
file must hold this configuration and be made at this commit; its run's provenance goes under
``resumed_from``): a campaign that no one job's time limit holds is done in several.

Exit status: 0 once any record was written (benchmarks that failed have no record, and pytest's
exit code goes into the provenance, so the figures that were measured are kept); else pytest's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, NamedTuple

import torch
import yaml

from adahop.harness.provenance import REPO_ROOT, git_state, gpu_state, read_results, write_results

BENCH_DIR = "tests/bench"
PROFILES = ("smoke", "gpu")


def device_slug() -> str:
    """``nvidia-h200`` for an NVIDIA H200, ``cpu-x86_64`` on a CPU machine."""
    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu-{platform.machine()}"
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def records_from_benchmark_json(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One record per benchmark that carries the tests/bench record (``extra_info['figure']``)."""
    records = []
    for b in doc.get("benchmarks", []):
        info, stats = b.get("extra_info", {}), b.get("stats", {})
        if "figure" not in info:
            continue
        records.append({
            "test": b["name"],
            "op": info["op"],
            "shape": info["shape"],
            "dtype": info["dtype"],
            "figure": info["figure"],
            "unit": info["unit"],
            "ceiling_name": info["ceiling_name"],
            "ceiling": info["ceiling"]["value"],
            "ratio": info["ratio_to_ceiling"],
            "peers": {name: p["value"] for name, p in info["peers"].items()},
            "ratio_to_peers": info["ratio_to_peers"],
            "gemm_path": info["gemm_path"],
            "backend": info["backend"],
            "median_s": info["median_s"],
            "iqr_s": info["iqr_s"],
            "n_timings": info["n_timings"],
            "timer": info["timer"],
            "ceiling_timing": {k: info["ceiling"][k] for k in ("median_s", "iqr_s")},
            "peer_timings": {name: {k: p[k] for k in ("median_s", "iqr_s")} for name, p in info["peers"].items()},
            "pytest_benchmark": {"median_s": stats.get("median"), "iqr_s": stats.get("iqr"), "rounds": stats.get("rounds")},
        })
    return records


def run_pytest(stage: str, args: list[str], env: dict[str, str] | None = None,
               interrupt_after_s: float | None = None) -> tuple[int, list[str], dict, str | None]:
    """``pytest ARGS`` in a subprocess from the repo root (tests/conftest.py then decides interpreter
    or compiler before Triton is imported), with ``env`` added to the environment; returns pytest's
    exit code, the command, the GPUs' state before and after (:func:`adahop.harness.provenance.gpu_state`,
    None without nvidia-smi) for the provenance, and what interrupted it: ``"budget"``, the name of
    the signal this process got (``SIGTERM``, ``SIGINT``), or None.

    An interruption reaches pytest as one SIGINT, which it handles like Ctrl-C: it stops at the test
    it is in and still writes its reports (``--junitxml``, ``--benchmark-json``) of the tests done,
    exit code 2. It comes after ``interrupt_after_s``, or when this process gets SIGTERM (a job's
    time limit, ``timeout``) or SIGINT: pytest runs in its own session, so such a signal reaches it
    only through here, once. A pytest still running 60 s later, or a second signal, kills it."""
    cmd = [sys.executable, "-m", "pytest", *args]
    print(f"{stage}:", " ".join(cmd), *(f"({k}={v})" for k, v in (env or {}).items()), flush=True)
    before = gpu_state()
    # SIGINT back to its default in the child: a background job of a non-interactive shell (a batch
    # scheduler's) starts with it ignored, and pytest would then never see the interrupt.
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env={**os.environ, **(env or {})}, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    interrupted: list[tuple[str, float]] = []  # (what, when)

    def interrupt(reason: str) -> None:
        if interrupted:
            proc.kill()
            return
        interrupted.append((reason, time.monotonic()))
        print(f"{stage}: {reason}: interrupting pytest, which reports the tests done so far", flush=True)
        proc.send_signal(signal.SIGINT)

    handlers = {sig: signal.signal(sig, lambda signum, _: interrupt(signal.Signals(signum).name))
                for sig in (signal.SIGTERM, signal.SIGINT)}
    deadline = None if interrupt_after_s is None else time.monotonic() + interrupt_after_s
    try:
        while (rc := proc.poll()) is None:
            if interrupted and time.monotonic() > interrupted[0][1] + 60:
                proc.kill()
            elif not interrupted and deadline is not None and time.monotonic() > deadline:
                interrupt("budget")
            time.sleep(0.2)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return rc, cmd, {"before": before, "after": gpu_state()}, (interrupted[0][0] if interrupted else None)


def run_benchmarks(stage: str, bench_profile: str, select: str | None, json_path: Path,
                   budget_s: float | None = None, done: Iterable[str] = ()) -> tuple[int, list[str], dict, str | None]:
    """Run the suite in a subprocess (:func:`run_pytest`), interrupted after ``budget_s``, without
    the benchmarks named in ``done``."""
    args = [BENCH_DIR, "--benchmark-only", f"--benchmark-json={json_path}", "-q", "-rfEs"]
    if select:
        args += ["-k", select]
    env = {"ADAHOP_BENCH_PROFILE": bench_profile}
    done = sorted(done)
    if done:
        done_path = json_path.with_name("done.txt")
        done_path.write_text("\n".join(done) + "\n")
        env["ADAHOP_BENCH_DONE"] = str(done_path)
    return run_pytest(stage, args, env, interrupt_after_s=budget_s)


NO_TESTS_COLLECTED = 5  # pytest's exit code when every test was deselected


class Measured(NamedTuple):
    """One stage's benchmark run (:func:`measure`): the new records, pytest's exit code and what
    interrupted it, and the provenance the results file gets."""

    records: list[dict[str, Any]]
    rc: int
    interrupted: str | None
    provenance: dict[str, Any]


def measure(stage: str, settings: BenchSettings, select: str | None, kept: list[dict[str, Any]],
            earlier: dict[str, Any] | None, out: Path, to_records) -> Measured | int:
    """Run the benchmarks ``select`` names that ``kept`` lacks (:func:`run_benchmarks`) and turn
    pytest-benchmark's JSON into records with ``to_records``; or the exit status when nothing is to
    be written: 0 where a resumed run found every benchmark in ``out`` already, else pytest's."""
    with tempfile.TemporaryDirectory() as tmp:
        json_path = Path(tmp) / "benchmark.json"
        rc, cmd, gpu, interrupted = run_benchmarks(stage, settings.bench_profile, select, json_path,
                                                   settings.budget_s, done=(r["test"] for r in kept))
        if not json_path.exists():
            if kept and rc == NO_TESTS_COLLECTED:
                print(f"{stage}: every selected benchmark is in {out} already; nothing run, nothing written")
                return 0
            print(f"{stage}: pytest exited {rc} without benchmark JSON; nothing written", file=sys.stderr)
            return rc or 1
        doc = json.loads(json_path.read_text())
    return Measured(to_records(doc), rc, interrupted, {
        "pytest_command": cmd[1:],
        "pytest_exit_code": rc,
        "pytest_benchmark_version": doc.get("version"),
        "gpu_state": gpu,
        **interruption(interrupted, settings.budget_s),
        "resumed_from": earlier,
    })


def add_resume_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--resume", action="store_true",
                   help="where --out holds this configuration's results made at this commit (a run cut by a time "
                        "limit), run only the benchmarks it lacks and keep both")


def resumed(out: Path, config: dict[str, Any], stage: str) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The records of ``out`` that ``--resume`` keeps, and what the provenance says of the run that
    made them; none where ``out`` does not exist. A file of another configuration, or made at another
    commit or from a tree with uncommitted changes, is refused: its records and the new ones would
    not be of one code."""
    if not out.exists():
        return [], None
    doc = read_results(out)
    prov = doc["provenance"]
    commit, dirty = git_state()
    if prov.get("config") != config:
        raise SystemExit(f"{stage}: --resume: {out} holds the configuration {prov.get('config')}, not {config}")
    if prov.get("git_commit") != commit or prov.get("git_dirty") or dirty:
        made = f"{prov.get('git_commit')}{' (uncommitted changes)' if prov.get('git_dirty') else ''}"
        raise SystemExit(f"{stage}: --resume: {out} was made at {made}; this tree is at {commit}"
                         f"{' with uncommitted changes' if dirty else ''}: rerun it whole instead")
    earlier = {k: prov.get(k) for k in ("date", "pytest_exit_code", "pytest_interrupted_by", "gpu_state")}
    return doc["records"], {**earlier, "records": len(doc["records"])}


def positive_seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def add_budget_argument(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--budget-s", type=positive_seconds,
                   help=f"interrupt pytest after this many seconds (a job's time limit less a margin), keeping the {what} it finished")


def how_pytest_ended(rc: int, interrupted: str | None) -> str:
    """``pytest exit code N`` and, where :func:`run_pytest` interrupted it, what did."""
    return f"pytest exit code {rc}" + (f", interrupted: {interrupted}" if interrupted else "")


def interruption(interrupted: str | None, budget_s: float | None) -> dict[str, Any]:
    """The provenance's account of an interrupted pytest (:func:`run_pytest`)."""
    return {"pytest_interrupted_by": interrupted,
            "pytest_interrupted_after_s": budget_s if interrupted == "budget" else None}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", type=Path, help="profile YAML (its `profile` and `microbench` section)")
    p.add_argument("--profile", choices=PROFILES, help="benchmark sizes; overrides the config file")
    p.add_argument("--select", help="pytest -k expression; overrides the config file")
    p.add_argument("--out", type=Path, help="results file (default results/microbench/<device-slug>.json)")
    p.add_argument("--overwrite", action="store_true", help="replace a results file of another configuration")
    add_budget_argument(p, "benchmarks")
    add_resume_argument(p)
    return p.parse_args(argv)


class BenchSettings(NamedTuple):
    bench_profile: str
    select: str | None
    budget_s: float | None


def bench_settings(args: argparse.Namespace, stage: str) -> BenchSettings:
    """Bench profile, pytest -k selection and time budget from the flags, else the profile file's
    ``stage`` section."""
    cfg = yaml.safe_load(args.config.read_text()) if args.config else {}
    section = cfg.get(stage) or {}
    unknown = set(section) - {"bench_profile", "select", "budget_s"}
    if unknown:
        raise SystemExit(f"{stage}: unknown keys in the profile's {stage} section: {sorted(unknown)}")
    bench_profile = args.profile or section.get("bench_profile") or cfg.get("profile") or (
        "gpu" if torch.cuda.is_available() else "smoke")
    if bench_profile not in PROFILES:
        raise SystemExit(f"{stage}: bench profile must be one of {PROFILES}, got {bench_profile!r}")
    budget = args.budget_s if args.budget_s is not None else section.get("budget_s")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0):
        raise SystemExit(f"{stage}: budget_s must be a positive number of seconds or null, got {budget!r}")
    return BenchSettings(bench_profile, args.select if args.select is not None else section.get("select"),
                         None if budget is None else float(budget))


def exit_status(stage: str, rc: int, n_records: int, interrupted: str | None = None) -> int:
    """0 once records were written, even if some benchmarks failed or pytest was interrupted (both
    are in the provenance): a failing job would make Snakemake delete the figures that were measured."""
    if rc and n_records:
        why = f"interrupted ({interrupted})" if interrupted else "some benchmarks failed"
        print(f"{stage}: {why}, pytest exit code {rc}; the {n_records} measured are kept", file=sys.stderr)
        return 0
    return rc if rc else (0 if n_records else 1)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = bench_settings(args, "microbench")
    out = args.out or REPO_ROOT / "results" / "microbench" / f"{device_slug()}.json"
    config = {"bench_profile": settings.bench_profile, "select": settings.select}
    kept, earlier = resumed(out, config, "microbench") if args.resume else ([], None)
    m = measure("microbench", settings, settings.select, kept, earlier, out, records_from_benchmark_json)
    if isinstance(m, int):
        return m
    records = kept + m.records
    write_results(out, records, config=config, overwrite=args.overwrite, extra_provenance=m.provenance)
    print(f"microbench: {len(records)} records -> {out} ({how_pytest_ended(m.rc, m.interrupted)})")
    return exit_status("microbench", m.rc, len(records), m.interrupted)


if __name__ == "__main__":
    sys.exit(main())
