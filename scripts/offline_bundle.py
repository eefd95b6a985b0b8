"""Carry the suite to a GPU machine without network, and its results back.

    python scripts/offline_bundle.py pack --config config/gpu.yaml --out bundle/     # where there is network
    python3 bundle/offline_bundle.py unpack bundle/ --into adahop/ --install          # on the GPU machine
    python scripts/offline_bundle.py pack-results --profile gpu --out results.tar.gz  # on the GPU machine
    python scripts/offline_bundle.py unpack-results results.tar.gz                    # back home

``pack`` writes a folder: a copy of this script (``unpack`` needs only Python), ``source.tar`` (the committed tree, ``git archive HEAD``), ``wheels/``
(every package of this environment at its installed version, for the target Python and platform,
except the ones the GPU machine brings itself: torch, triton and the CUDA libraries), ``data/``
(the profile's corpus bundle: xz token shards, tokenizer, checksums) and ``MANIFEST.json`` (the
commit and each file's sha256). ``unpack`` checks every checksum, unpacks the tree, rebuilds
``data/<corpus>/`` from the bundle, writes ``bundle.env`` (the commit the results will name: the
unpacked tree has no git history) and, with ``--install``, runs ``setup.sh`` against the wheels
alone. ``pack-results`` packs a profile's ``results/`` and figures; ``unpack-results`` puts them in
place, refusing a file of a different configuration and keeping a replaced file's predecessor in
``history/`` (``adahop.harness.provenance``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# What a GPU machine's own Python brings (a CUDA build of torch and what it depends on): packing
# them would carry gigabytes of a build that may not match the machine's driver.
EXCLUDED = ("torch", "triton", "nvidia-", "adahop")
# The build tools an install from wheels alone needs (setup.sh upgrades pip, the editable install
# builds with setuptools).
BUILD_TOOLS = ("pip", "setuptools", "wheel")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def installed(python: str = sys.executable) -> list[str]:
    """``name==version`` of every package of ``python``'s environment, less :data:`EXCLUDED`."""
    out = subprocess.run([python, "-m", "pip", "list", "--format=json", "--exclude-editable"], check=True,
                         capture_output=True, text=True).stdout
    pins = [f"{p['name']}=={p['version']}" for p in json.loads(out)]
    return sorted(p for p in pins if not p.lower().startswith(EXCLUDED))


def download_wheels(pins: list[str], dest: Path, python_version: str | None, platforms: list[str]) -> None:
    """``pip download`` each pin without its dependencies (the pins are the whole environment)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(dest)]
    if python_version:
        cmd += ["--python-version", python_version, "--implementation", "cp"]
    for platform in platforms:
        cmd += ["--platform", platform]
    subprocess.run([*cmd, *pins], check=True)


def pack(args: argparse.Namespace) -> None:
    out: Path = args.out
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"--out {out}: the folder is not empty")
    import yaml

    out.mkdir(parents=True, exist_ok=True)
    shutil.copy2(__file__, out / "offline_bundle.py")  # unpack needs only Python: run this copy there
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, check=True,
                                capture_output=True, text=True).stdout.strip())
    subprocess.run(["git", "archive", "--format=tar", "-o", str(out / "source.tar"), "HEAD"], cwd=ROOT, check=True)
    profile = yaml.safe_load(Path(args.config).read_text())
    corpus = profile["corpus"]["name"]
    if args.corpus_bundle:
        shutil.copytree(args.corpus_bundle, out / "data" / corpus)
    elif not args.no_corpus:
        subprocess.run([sys.executable, str(ROOT / "experiments" / "build_corpus.py"), "--config", str(args.config),
                        "--out", str(ROOT / "data" / corpus), "--bundle", str(out / "data" / corpus)], check=True)
    if not args.no_wheels:
        (out / "wheels").mkdir()
        download_wheels([*installed(), *BUILD_TOOLS], out / "wheels", args.python_version, args.platform)
    files = sorted(p for p in out.rglob("*") if p.is_file())
    manifest = {"git_commit": commit, "git_dirty": dirty, "profile": profile["profile"], "corpus": corpus,
                "files": {str(p.relative_to(out)): sha256(p) for p in files}}
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"packed {len(files)} files into {out} (commit {commit}{', dirty' if dirty else ''})")


def verify(bundle: Path) -> dict:
    manifest = json.loads((bundle / "MANIFEST.json").read_text())
    bad = [name for name, digest in manifest["files"].items()
           if not (bundle / name).is_file() or sha256(bundle / name) != digest]
    if bad:
        raise ValueError(f"{bundle}: {len(bad)} file(s) missing or corrupted in transit: {bad[:10]}")
    return manifest


def unpack(args: argparse.Namespace) -> None:
    bundle: Path = args.bundle
    manifest = verify(bundle)
    into: Path = args.into
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(bundle / "source.tar") as tar:
        tar.extractall(into, filter="data")
    (into / "bundle.env").write_text(f"export ADAHOP_GIT_COMMIT={manifest['git_commit']}\n"
                                     f"export ADAHOP_GIT_DIRTY={int(manifest['git_dirty'])}\n")
    data = bundle / "data" / manifest["corpus"]
    if data.is_dir():
        subprocess.run([sys.executable, str(into / "experiments" / "build_corpus.py"), "--from-bundle", str(data),
                        "--out", str(into / "data" / manifest["corpus"])], check=True, cwd=into)
    if args.install:
        env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str((bundle / "wheels").resolve())}
        subprocess.run(["bash", "setup.sh"], cwd=into, env=env, check=True)
    print(f"unpacked commit {manifest['git_commit']} into {into}; run `. bundle.env` there before the workflow, "
          "so that the results name that commit")


def pack_results(args: argparse.Namespace) -> None:
    root: Path = args.root
    folders = [p for p in (root / "results").glob(f"*/{args.profile}") if p.is_dir()]
    folders += [p for p in (root / "paper_figs" / "out" / args.profile,) if p.is_dir()]
    reports = [p for p in (root / "docs").glob("RESULTS*.md")]
    if not folders:
        raise ValueError(f"no results of profile {args.profile!r} under {root / 'results'}")
    with tarfile.open(args.out, "w:gz") as tar:
        for p in [*folders, *reports]:
            tar.add(p, arcname=str(p.relative_to(root)))
    print(f"packed {len(folders)} folder(s) of profile {args.profile} into {args.out}")


def unpack_results(args: argparse.Namespace) -> None:
    from adahop.harness.provenance import ResultsConflict, check_replaceable, keep_predecessor, read_results

    root: Path = args.root
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(args.archive) as tar:
        tar.extractall(tmp, filter="data")
        files = sorted(p for p in Path(tmp).rglob("*") if p.is_file())
        conflicts, placed = [], 0
        for src in files:
            rel = src.relative_to(tmp)
            dst = root / rel
            if rel.parts[0] == "results" and src.name.endswith((".json", ".json.gz")):
                new = read_results(src)
                try:
                    check_replaceable(dst, new["provenance"].get("config"))
                except ResultsConflict as e:
                    conflicts.append(str(e))
                    continue
                keep_predecessor(dst, new["provenance"].get("git_commit"), new["provenance"].get("date"))
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
            placed += 1
    print(f"placed {placed} file(s) under {root}")
    if conflicts:
        raise ResultsConflict("refused (move the old file away to take the new one):\n" + "\n".join(conflicts))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("pack", help="source, wheels and corpus for a machine without network")
    a.add_argument("--config", type=Path, required=True, help="profile YAML (its corpus is packed)")
    a.add_argument("--out", type=Path, required=True, help="an empty or new folder")
    a.add_argument("--python-version", help="the target machine's Python, e.g. 3.12 (default: this one's)")
    a.add_argument("--platform", action="append", default=[],
                   help="wheel platform tags of the target, e.g. manylinux_2_28_x86_64 (repeatable; default: this one's)")
    a.add_argument("--corpus-bundle", type=Path, help="a corpus bundle already built (build_corpus.py --bundle)")
    a.add_argument("--no-corpus", action="store_true", help="pack no corpus")
    a.add_argument("--no-wheels", action="store_true", help="pack no wheels (the target has the packages)")
    a.set_defaults(run=pack)
    a = sub.add_parser("unpack", help="verify a bundle, unpack the tree and rebuild its corpus")
    a.add_argument("bundle", type=Path)
    a.add_argument("--into", type=Path, default=Path("."), help="where the tree goes (default: here)")
    a.add_argument("--install", action="store_true", help="then run setup.sh against the bundle's wheels alone")
    a.set_defaults(run=unpack)
    a = sub.add_parser("pack-results", help="a profile's results and figures as one archive")
    a.add_argument("--profile", required=True)
    a.add_argument("--out", type=Path, required=True, help="archive (.tar.gz)")
    a.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    a.set_defaults(run=pack_results)
    a = sub.add_parser("unpack-results", help="put an archive's results in place, never over another configuration's")
    a.add_argument("archive", type=Path)
    a.add_argument("--root", type=Path, default=ROOT, help="the checkout to put them in (default: this one)")
    a.set_defaults(run=unpack_results)
    args = p.parse_args(argv)
    args.run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
