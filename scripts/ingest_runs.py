"""Put the pretraining runs (and stage results) that came back from a GPU machine into results/, losing none.

    python scripts/ingest_runs.py /work/.device/7/queue.tar.gz --logs results/logs/<session> [--profile gpu]
    python scripts/ingest_runs.py /work/.device/3 --logs results/logs/<session>      # a folder of files

Reads what scripts/h200_queue.sh (an archive with ``out/<run>.*`` and ``stages/``),
scripts/h200_pretrain.sh (a folder with ``<run>.*``) or scripts/h200_campaign.sh (a folder of stage
results) leave, and for every run:

* ``<run>.pretrain.json`` -> ``results/pretrain/<profile>/<run>.json``,
  ``<run>.eval.json`` -> ``results/eval/<profile>/<run>.json``;
* ``<run>.log`` and ``<run>.metrics.jsonl`` (gzip-compressed) -> the ``--logs`` folder, with the
  queue's ``queue.log`` and ``gpu<i>.txt`` from an archive.

A results file already there with other contents is never replaced unless ``--replace`` names the
run; then the old file moves to ``superseded/<run>-<its commit>.json`` in its folder (out of the
tables' and figures' way, not lost); an identical one is left as it is.

Stage results (an archive's ``stages/``, from its ``stage:NAME`` items, or a folder's own files) go
to their stage's folder: ``tests.json`` -> ``results/kernel_tests/<profile>/``, ``kernels.json`` ->
``results/microbench/<profile>/``, ``layers.json`` -> ``results/layer_bench/<profile>/``,
``memory.json`` -> ``results/memory/<profile>/``, ``patterns.json.gz`` -> ``results/patterns/<profile>/``,
``<run>.strategies.json`` -> ``results/strategies/<profile>/<run>.json``, ``<RUN>.json`` of a run
of ``config/<profile>.yaml``'s throughput section -> ``results/throughput/<profile>/``.
A different file already there is kept as ``<name>-<its commit>`` beside the new one, with
``--replace-stages`` only. Every results
file must carry a provenance with a clean commit (``git_dirty`` false), else it is refused. Then
``results/eval/<profile>/table.md`` and ``.csv`` are regenerated. Logs (``queue.log``,
``gpu<i>.txt``, ``campaign.log``) replace a log of that name only when they extend it (the queue's
grow over a session's calls); another is filed beside it as ``<stem>-2`` (``-3``, ...). Prints one
line per file.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

import yaml

from adahop.eval import write_table
from adahop.provenance import REPO_ROOT, read_results

KINDS = {".pretrain.json": "pretrain", ".eval.json": "eval"}
NOT_RUNS = {"campaign", "queue"}  # <name>.log files of the queue and the campaign, not of a run
STAGE_FILES = {"tests.json": "kernel_tests", "kernels.json": "microbench", "layers.json": "layer_bench", "memory.json": "memory",
               "patterns.json.gz": "patterns"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", type=Path, help="queue.tar.gz from scripts/h200_queue.sh, or a folder of run or stage files")
    p.add_argument("--logs", type=Path, required=True, help="folder for the runs' logs and metrics (e.g. results/logs/<session>)")
    p.add_argument("--profile", default="gpu", help="results/<stage>/<profile>/ (default gpu)")
    p.add_argument("--results-root", type=Path, default=REPO_ROOT / "results", help=argparse.SUPPRESS)
    p.add_argument("--replace", nargs="*", default=[], metavar="RUN", help="runs whose differing results may be replaced (the old ones move to superseded/)")
    p.add_argument("--replace-stages", action="store_true",
                   help="file a stage's new results, keeping the one there as <name>-<its commit>")
    return p.parse_args(argv)


def run_files(folder: Path) -> dict[str, dict[str, Path]]:
    """``{run: {suffix: path}}`` of the files in ``folder`` (``<run>.pretrain.json`` and the rest)."""
    runs: dict[str, dict[str, Path]] = {}
    for path in sorted(folder.iterdir()):
        for suffix in (*KINDS, ".log", ".metrics.jsonl"):
            if path.name.endswith(suffix) and path.name[: -len(suffix)] not in NOT_RUNS:
                runs.setdefault(path.name[: -len(suffix)], {})[suffix] = path
    return runs


def throughput_runs(profile: str) -> list[str]:
    """The names of ``config/<profile>.yaml``'s throughput runs (none without that file)."""
    config = REPO_ROOT / "config" / f"{profile}.yaml"
    if not config.exists():
        return []
    return [run["name"] for run in yaml.safe_load(config.read_text()).get("throughput") or []]


def stage_files(folder: Path, args: argparse.Namespace) -> list[tuple[Path, Path]]:
    """``(source, destination)`` of the stage results in ``folder``."""
    names = {**STAGE_FILES, **{f"{run}.json": "throughput" for run in throughput_runs(args.profile)}}
    files = [(folder / name, args.results_root / stage / args.profile / name)
             for name, stage in names.items() if (folder / name).exists()]
    return files + [(path, args.results_root / "strategies" / args.profile / path.name.replace(".strategies", ""))
                    for path in sorted(folder.glob("*.strategies.json"))]


def copy_log(src: Path, logs: Path) -> None:
    """Copy ``src`` into ``logs``, replacing a same-named log only where ``src`` extends it."""
    dest, n, text = logs / src.name, 1, src.read_bytes()
    while dest.exists() and not text.startswith(dest.read_bytes()):
        n += 1
        stem, _, ext = src.name.partition(".")
        dest = logs / f"{stem}-{n}.{ext}"
    shutil.copyfile(src, dest)
    print(f"logs     {src.name} -> {dest}")


def file_result(src: Path, dest: Path, replace: bool, allow: str, keep_dir: Path | None = None) -> bool:
    """File the results file ``src`` at ``dest``; False where it is refused (the reason printed).

    Refused: a provenance without a clean commit, or a different file at ``dest`` unless ``replace``;
    then the old file is kept as ``<stem>-<its commit>.<ext>`` beside it (or in ``keep_dir``) first,
    refused if that name is taken. ``allow``: the flag that permits a replacement.
    """
    prov = read_results(src)["provenance"]  # raises on a file outside the convention
    if prov.get("git_dirty") is not False or not prov.get("git_commit"):
        print(f"refused  {src.name}: provenance has commit {prov.get('git_commit')!r}, dirty "
              f"{prov.get('git_dirty')!r} (results must name a clean commit)")
        return False
    verb = "wrote   "
    if dest.exists():
        if dest.read_bytes() == src.read_bytes():
            print(f"same     {dest}")
            return True
        old = read_results(dest)["provenance"]
        commit = str(old.get("git_commit") or "unknown")[:7]
        stem, ext = dest.name.split(".", 1)
        keep = (keep_dir or dest.parent) / f"{stem}-{commit}.{ext}"
        if not replace or keep.exists():
            why = f"{keep} exists too" if replace else f"{allow} to file it"
            print(f"refused  {dest}: a different file is there (commit {commit}, {old.get('date')}); {why}")
            return False
        keep.parent.mkdir(parents=True, exist_ok=True)
        dest.rename(keep)
        print(f"kept     {keep} (the file it replaces)")
        verb = "replaced"
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    print(f"{verb} {dest} (commit {prov['git_commit'][:7]})")
    return True


def ingest_stages(files: list[tuple[Path, Path]], args: argparse.Namespace) -> int:
    """File the stage results ``files``; the number refused."""
    return sum(not file_result(src, dest, args.replace_stages, "--replace-stages") for src, dest in files)


def ingest(runs: dict[str, dict[str, Path]], args: argparse.Namespace) -> int:
    """File the runs' results and logs (``runs``: :func:`run_files`); 1 if anything was refused."""
    refused = 0
    args.logs.mkdir(parents=True, exist_ok=True)
    for run, files in runs.items():
        for suffix, stage in KINDS.items():
            if suffix not in files:
                continue
            dest = args.results_root / stage / args.profile / f"{run}.json"
            refused += not file_result(files[suffix], dest, run in args.replace, f"--replace {run}",
                                       dest.parent / "superseded")
        if ".log" in files:
            shutil.copyfile(files[".log"], args.logs / f"{run}.log")
        if ".metrics.jsonl" in files:
            with open(files[".metrics.jsonl"], "rb") as src, gzip.open(args.logs / f"{run}.metrics.jsonl.gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
        print(f"logs     {run} -> {args.logs}")
    eval_dir = args.results_root / "eval" / args.profile
    if any(eval_dir.glob("*.json")):
        md, csv = write_table(eval_dir)
        print(f"table    {md}, {csv}")
    return 1 if refused else 0


def ingest_tree(root: Path, args: argparse.Namespace) -> int:
    """File the runs (``root/out`` or ``root``), the stage results (``root/stages`` or ``root``) and
    the logs of a folder or an unpacked archive; 1 if anything was refused or nothing was there."""
    runs_dir = root / "out" if (root / "out").is_dir() else root
    stages_dir = root / "stages" if (root / "stages").is_dir() else root
    runs, stages = run_files(runs_dir), stage_files(stages_dir, args)
    if not runs and not stages:
        print(f"ingest: no run or stage results files in {args.source}", file=sys.stderr)
        return 1
    status = ingest(runs, args) if runs else 0
    if stages:
        status = max(status, 1 if ingest_stages(stages, args) else 0)
    args.logs.mkdir(parents=True, exist_ok=True)
    for path in sorted({*root.glob("queue.log"), *root.glob("gpu*.txt"), *stages_dir.glob("campaign.log")}):
        copy_log(path, args.logs)
    return status


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.source.is_dir():
        return ingest_tree(args.source, args)
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(args.source) as tar:
        tar.extractall(tmp, filter="data")
        return ingest_tree(Path(tmp), args)


if __name__ == "__main__":
    sys.exit(main())
