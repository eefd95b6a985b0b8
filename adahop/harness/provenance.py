"""Results files: one convention for every stage.

Every result is a JSON object ``{"provenance": {...}, "records": [...]}``. The provenance holds
the git commit and dirty flag (of the code: machine-written results and figures do not count),
library versions, the device, the resolved config, the seed and
the date. Writes are atomic (temp file + rename), and a rerun never silently replaces a file
written for a different configuration: that needs ``overwrite=True``. A file made at another commit
or on another day is not lost when it is replaced: it is kept first as
``history/<name>-<YYYY-MM-DD>.json`` beside it (its own date), so a results file's name says what
it holds and its predecessors stay beside it.

A path ending in ``.json.gz`` holds the same JSON text gzip-compressed (for stages whose results
are large); the gzip header's mtime is 0, so rewriting the same document gives the same bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import gzip
import importlib.metadata
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _version(module: str) -> str | None:
    """The version of ``module``: its ``__version__`` where this process imported it, else its
    installed distribution's (importing transformers, lm_eval and torchao only to read it cost every
    results file seconds); None where neither is there."""
    loaded = sys.modules.get(module)
    if loaded is not None and isinstance(getattr(loaded, "__version__", None), str):
        return loaded.__version__
    try:
        return importlib.metadata.version(module)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None


def _env_flag(name: str) -> bool | None:
    value = os.environ.get(name)
    return None if value is None else value.lower() in ("1", "true", "yes")


def device_description(device: torch.device | str | None = None) -> dict[str, Any]:
    """Name and capability of the device results were measured on."""
    device = torch.device(device) if device is not None else (
        torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    )
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {
            "type": "cuda",
            "name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "count": torch.cuda.device_count(),
            "memory_gib": round(props.total_memory / 2**30, 1),
        }
    return {"type": device.type, "name": platform.processor() or platform.machine(), "cores": os.cpu_count()}


# Machine-written outputs: not the code a result depends on. Snakemake deletes a job's tracked
# outputs before it runs (and parallel jobs' outputs are absent or half-written meanwhile), so
# counting them would mark every regenerated table dirty; the inputs a table reads carry their own
# provenance (e.g. ``source_commits``).
GENERATED_PATHS = ("results", "paper_figs/out")


# What nvidia-smi reports of a GPU's state, in its own field names. The throttle reasons are asked
# separately: drivers have renamed them (clocks_throttle_reasons -> clocks_event_reasons).
GPU_STATE_FIELDS = ("index", "clocks.sm", "clocks.max.sm", "clocks.mem", "temperature.gpu", "power.draw",
                    "utilization.gpu", "memory.used")
_GPU_REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")


def _nvidia_smi(*args: str) -> list[list[str]] | None:
    try:
        out = subprocess.run(["nvidia-smi", *args, "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=15, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    return [[v.strip() for v in line.split(",")] for line in out.strip().splitlines() if line.strip()]


def gpu_state() -> dict[str, Any] | None:
    """Every GPU's clocks, temperature, power, utilisation and memory now, its clock-limiting reasons,
    and the compute processes on the machine (``nvidia-smi``); None without nvidia-smi.

    Benchmarks record it before and after their run: a run whose short kernels time with a wide
    spread (``iqr_s``) can then be told apart as sharing its GPU, throttled, or neither. Values are
    nvidia-smi's strings (MHz, C, W, %, MiB; ``[N/A]`` where a GPU has none).
    """
    if shutil.which("nvidia-smi") is None:
        return None
    rows = _nvidia_smi(f"--query-gpu={','.join(GPU_STATE_FIELDS)}")
    if rows is None or any(len(r) != len(GPU_STATE_FIELDS) for r in rows):
        return None
    gpus = [dict(zip(GPU_STATE_FIELDS, r)) for r in rows]
    for field in _GPU_REASON_FIELDS:
        reasons = _nvidia_smi(f"--query-gpu={field}")
        if reasons is not None and len(reasons) == len(gpus):
            for g, (r, *_) in zip(gpus, reasons):
                g["clock_reasons"] = r
            break
    apps = _nvidia_smi("--query-compute-apps=pid,used_memory")
    return {"gpus": gpus, "compute_processes": None if apps is None else len(apps)}


def compile_seconds() -> dict[str, float]:
    """Seconds each phase of ``torch.compile`` has taken in this process so far, by torch's own
    phase names (``torch._dynamo.utils.compilation_time_metrics``: Dynamo's bytecode tracing, the
    backend's compile, waits on kernel compiles...; which phases exist depends on torch's
    version, and they nest: a phase's seconds include those of the phases it calls, so they do not
    add up); {} where torch keeps none. :func:`compile_seconds_since` gives an interval's."""
    try:
        from torch._dynamo.utils import compilation_time_metrics
    except ImportError:
        return {}
    return {name: float(sum(times)) for name, times in compilation_time_metrics.items()}


def compile_seconds_since(before: dict[str, float], floor_s: float = 0.01) -> dict[str, float]:
    """The :func:`compile_seconds` spent since ``before`` (an earlier call's), phases of at least
    ``floor_s``, longest first: where a recipe's startup went, against the untimed steps' wall time
    (what is not here ran outside the compiler's phases: eager steps, kernel autotuning at a first
    launch, CUDA-graph recording)."""
    now = compile_seconds()
    spent = {name: t - before.get(name, 0.0) for name, t in now.items()}
    return dict(sorted(((n, t) for n, t in spent.items() if t > 0 and t >= floor_s), key=lambda kv: -kv[1]))


def compile_cache_files() -> dict[str, int | None]:
    """Files now in Triton's kernel cache and in Inductor's cache (None where a compiler or its
    folder is missing). A run's startup time (compiling its model and kernels) is comparable
    with another's only where both began with caches alike, empty or warm: recorded beside it."""
    dirs: dict[str, str | None] = {}
    try:
        import triton

        dirs["triton"] = triton.knobs.cache.dir
    except (ImportError, AttributeError):  # no Triton, or one older than its knobs
        dirs["triton"] = None
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        # as Inductor's cache_dir() finds it, without its side effects (it creates the folder)
        dirs["inductor"] = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir()
    except (ImportError, AttributeError):
        dirs["inductor"] = None
    return {name: sum(len(files) for _, _, files in os.walk(d)) if d and os.path.isdir(d) else None
            for name, d in dirs.items()}


def git_state() -> tuple[str | None, bool | None]:
    """``(commit, dirty)`` of the code running: dirty when a tracked file outside
    :data:`GENERATED_PATHS` differs from the commit. A copy of the tree without its history (one
    unpacked from an offline bundle, ``scripts/offline_bundle.py``) is told them through the
    environment (ADAHOP_GIT_COMMIT, ADAHOP_GIT_DIRTY), and that wins over git: such a copy can carry
    a stale .git, or none."""
    told = os.environ.get("ADAHOP_GIT_COMMIT")
    if told and not re.fullmatch(r"[0-9a-f]{40}", told):
        # A short or typed hash cannot be checked where the copy runs (it has no history), and a
        # typo would name a commit that does not exist: only a full hash is accepted.
        raise ValueError(f"ADAHOP_GIT_COMMIT must be a full 40-hex commit (git rev-parse HEAD), got {told!r}")
    commit = told or _git("rev-parse", "HEAD")
    dirty = _env_flag("ADAHOP_GIT_DIRTY")
    if dirty is None:
        status = _git("status", "--porcelain", "--untracked-files=no", "--", ".",
                      *(f":(exclude){p}" for p in GENERATED_PATHS))
        dirty = bool(status) if status is not None else None
    return commit, dirty


def provenance(
    config: dict[str, Any] | None = None,
    seed: int | None = None,
    device: torch.device | str | None = None,
) -> dict[str, Any]:
    """The provenance object stamped on every results file."""
    commit, dirty = git_state()
    return {
        "git_commit": commit,
        "git_dirty": dirty,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "versions": {
            "torch": torch.__version__,
            "triton": _version("triton"),
            "cuda": torch.version.cuda,
            "transformers": _version("transformers"),
            "lm_eval": _version("lm_eval"),
            # The float8 peers' numbers depend on it as adahop's depend on triton.
            "torchao": _version("torchao"),
        },
        "device": device_description(device),
        # ADAHOP_RUNS_PER_GPU: set it where several runs share one GPU, so that their rates are not
        # read as one GPU's (adahop.harness.quality leaves such runs out of the timing table).
        "backend_env": {k: os.environ[k] for k in ("ADAHOP_BACKEND", "TRITON_INTERPRET", "ADAHOP_RUNS_PER_GPU",
                                                         "ADAHOP_INDUCTOR_LAUNCHES",
                                                         "TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS")
                        if k in os.environ},
        "config": config or {},
        "seed": seed,
    }


class ResultsConflict(RuntimeError):
    """A results file exists for a different configuration."""


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file in the same folder and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def table_script_args(doc: str, results_help: str, argv: list[str] | None = None,
                      add_arguments: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    """The command line of a script that derives a table from results files, as the workflow calls
    it: ``--out STEM`` (it writes ``STEM.md`` and ``STEM.json``), ``--config`` (accepted, unused)
    and the results files. ``doc``: the script's docstring (its first paragraph is the description);
    ``add_arguments`` adds the script's own options."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="output stem: writes <out>.md and <out>.json")
    p.add_argument("--config", help="profile YAML (unused: accepted as every stage script is called)")
    if add_arguments is not None:
        add_arguments(p)
    p.add_argument("results", type=Path, nargs="+", help=results_help)
    return p.parse_args(argv)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through a temp file in the same folder and a rename."""
    atomic_write_bytes(path, text.encode())


def is_compressed(path: str | os.PathLike) -> bool:
    """Whether ``path`` names a gzip-compressed results file (``*.json.gz``)."""
    return Path(path).name.endswith(".json.gz")


def _load(path: Path) -> Any:
    """The JSON document in ``path``, decompressed when it is a ``.json.gz`` file."""
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if is_compressed(path) else data)


def check_replaceable(path: str | os.PathLike, config: dict[str, Any] | None) -> None:
    """Raise :class:`ResultsConflict` unless ``path`` is absent or holds results of ``config``.

    What :func:`write_results` checks before writing; a long experiment calls it first, so it
    fails before measuring rather than after.
    """
    path = Path(path)
    if not path.exists():
        return
    config = json.loads(json.dumps(config or {}, default=str))
    try:
        old = _load(path).get("provenance", {}).get("config")
    except (ValueError, AttributeError, gzip.BadGzipFile, EOFError, zlib.error):  # not JSON / gzip, cut short
        raise ResultsConflict(f"{path} exists and is not a results file; refusing to replace it") from None
    if old != config:
        raise ResultsConflict(f"{path} holds results of a different configuration; move it away or pass overwrite")


HISTORY_DIR = "history"
_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")


def _stem_and_suffix(path: Path) -> tuple[str, str]:
    """A results file's name split before its suffix, ``.json.gz`` counted as one."""
    suffix = ".json.gz" if is_compressed(path) else path.suffix
    return path.name[: len(path.name) - len(suffix)], suffix


def history_path(path: str | os.PathLike, date: str) -> Path:
    """Where the predecessor of results file ``path``, made on ``date`` (ISO, ``YYYY-MM-DD...``),
    is kept: ``<folder>/history/<name>-<YYYY-MM-DD><suffix>``, with ``-2``, ``-3``... after the
    date when that day already has one."""
    path = Path(path)
    day = str(date)[:10]
    if not _DAY.fullmatch(day):
        raise ValueError(f"date must start with YYYY-MM-DD, got {date!r}")
    stem, suffix = _stem_and_suffix(path)
    folder = path.parent / HISTORY_DIR
    candidate, n = folder / f"{stem}-{day}{suffix}", 2
    while candidate.exists():
        candidate, n = folder / f"{stem}-{day}-{n}{suffix}", n + 1
    return candidate


def _made(path: Path) -> tuple[str | None, str]:
    """``(commit, date)`` of an existing file from its provenance; a file without one (not a
    results file, or no date) is dated by its modification time."""
    prov: dict[str, Any] = {}
    try:
        doc = _load(path)
        prov = doc.get("provenance") or {} if isinstance(doc, dict) else {}
    except (ValueError, gzip.BadGzipFile, EOFError, zlib.error):
        pass
    date = prov.get("date") if isinstance(prov, dict) else None
    if not date:
        date = _dt.datetime.fromtimestamp(path.stat().st_mtime, _dt.timezone.utc).isoformat(timespec="seconds")
    return (prov.get("git_commit") if isinstance(prov, dict) else None), str(date)


def keep_predecessor(path: str | os.PathLike, commit: str | None, date: str | None) -> Path | None:
    """Copy the results file at ``path`` to :func:`history_path` unless it was made at ``commit``
    on the day of ``date`` (a rerun of the same code the same day replaces it in place); return the
    copy's path, or None when nothing was kept. The copy comes before the new file replaces the
    old one, so a failure between the two loses nothing."""
    path = Path(path)
    if not path.exists():
        return None
    old_commit, old_date = _made(path)
    if old_commit == commit and (not date or old_date[:10] == str(date)[:10]):
        return None
    kept = history_path(path, old_date)
    kept.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(path, kept)
    return kept


def partial_path(path: str | os.PathLike) -> Path:
    """Where a run that may be cut writes beside an existing results file ``path`` until it is
    complete: ``<name>-partial<suffix>``, so that a cut rerun never replaces a complete file."""
    path = Path(path)
    stem, suffix = _stem_and_suffix(path)
    return path.with_name(f"{stem}-partial{suffix}")


def write_results(
    path: str | os.PathLike,
    records: Iterable[dict[str, Any]],
    config: dict[str, Any] | None = None,
    seed: int | None = None,
    device: torch.device | str | None = None,
    overwrite: bool = False,
    extra_provenance: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``{"provenance", "records"}`` to ``path`` atomically and return it.

    ``path`` ending in ``.json.gz``: the JSON text gzip-compressed (mtime 0); else plain JSON.
    An existing file written with a different ``config`` raises :class:`ResultsConflict` unless
    ``overwrite``; one with the same config is replaced (a rerun of the same experiment). A file
    replaced that was made at another commit or on another day is first kept in ``history/``
    beside it (:func:`keep_predecessor`).
    """
    path = Path(path)
    config = json.loads(json.dumps(config or {}, default=str))
    if not overwrite:
        check_replaceable(path, config)
    prov = provenance(config, seed, device)
    if extra_provenance:
        prov.update(extra_provenance)
    doc = {"provenance": prov, "records": list(records)}
    text = (json.dumps(doc, indent=1, default=str) + "\n").encode()
    keep_predecessor(path, prov.get("git_commit"), prov.get("date"))
    atomic_write_bytes(path, gzip.compress(text, mtime=0) if is_compressed(path) else text)
    return doc


def read_results(path: str | os.PathLike) -> dict[str, Any]:
    """Load a results file (``.json`` or ``.json.gz``), checking it follows the convention."""
    doc = _load(Path(path))
    if not isinstance(doc, dict) or "provenance" not in doc or not isinstance(doc.get("records"), list):
        raise ValueError(f"{path} is not a results file (needs 'provenance' and a 'records' list)")
    return doc


class Interrupted(Exception):
    """What stopped a measuring loop before its end: ``"budget"`` or a signal's name."""


class Budget:
    """:func:`interruptible`'s handle: :meth:`check` between measurements."""

    def __init__(self, budget_s: float | None):
        self.deadline = None if budget_s is None else time.monotonic() + budget_s

    def check(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise Interrupted("budget")


@contextlib.contextmanager
def interruptible(budget_s: float | None = None) -> Iterator[Budget]:
    """A measuring loop that a job's time limit may cut: inside, SIGTERM and SIGINT raise
    :class:`Interrupted` where the loop is (a compile or a timing in progress is abandoned), and
    ``check()`` raises it once ``budget_s`` seconds have passed. Catch it, then write what was
    measured with :func:`write_measured`."""
    def stop(signum, _frame):
        raise Interrupted(signal.Signals(signum).name)

    handlers = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield Budget(budget_s)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def write_measured(path: str | os.PathLike, records: list[dict[str, Any]], interrupted: str | None,
                   planned: list[str], key: str, **kwargs) -> Path | None:
    """:func:`write_results` of a loop run under :func:`interruptible` over the names ``planned``
    (each record names its own under ``key``); returns the path written.

    Complete (``interrupted`` None): ``path``. Cut: the provenance adds ``interrupted_by`` and the
    planned names no record has (``not_measured``); nothing is written without a record, and where
    ``path`` exists the partial file goes beside it (``<name>-partial<suffix>``), so that a cut rerun
    never replaces a complete file."""
    path = Path(path)
    if interrupted is None:
        write_results(path, records, **kwargs)
        return path
    if not records:
        return None
    if path.exists():
        path = partial_path(path)
    done = {r[key] for r in records}
    extra = {**(kwargs.pop("extra_provenance", None) or {}), "interrupted_by": interrupted,
             "not_measured": [name for name in planned if name not in done]}
    write_results(path, records, extra_provenance=extra, **kwargs)
    return path
