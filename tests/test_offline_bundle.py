"""scripts/offline_bundle.py: a bundle for a machine without network, and results brought back."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from adahop.harness.provenance import ResultsConflict, read_results, write_results

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("offline_bundle", ROOT / "scripts" / "offline_bundle.py")
bundle_tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bundle_tool)


def git_checkout() -> bool:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True).returncode == 0


needs_git = pytest.mark.skipif(not git_checkout(), reason="pack archives the committed tree: needs a git checkout")


@pytest.fixture
def corpus_bundle(tmp_path):
    """A stand-in corpus bundle: pack copies it, unpack hands it to build_corpus.py --from-bundle."""
    folder = tmp_path / "carry"
    folder.mkdir()
    (folder / "train.bin.xz").write_bytes(b"not really xz")
    return folder


@needs_git
def test_pack_then_unpack_gives_the_committed_tree_and_its_commit(tmp_path, corpus_bundle, monkeypatch):
    out = tmp_path / "bundle"
    bundle_tool.main(["pack", "--config", str(ROOT / "config" / "smoke.yaml"), "--out", str(out), "--no-wheels",
                      "--corpus-bundle", str(corpus_bundle)])
    manifest = json.loads((out / "MANIFEST.json").read_text())
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert manifest["git_commit"] == head and manifest["corpus"] == "smoke"
    assert {"source.tar", "offline_bundle.py", "data/smoke/train.bin.xz"} <= set(manifest["files"])

    rebuilt = []
    monkeypatch.setattr(bundle_tool.subprocess, "run", lambda cmd, **kw: rebuilt.append(cmd))
    into = tmp_path / "tree"
    bundle_tool.main(["unpack", str(out), "--into", str(into)])
    assert (into / "Snakefile").read_text() == (ROOT / "Snakefile").read_text()
    assert f"ADAHOP_GIT_COMMIT={head}" in (into / "bundle.env").read_text()
    assert rebuilt and "--from-bundle" in rebuilt[0] and str(out / "data" / "smoke") in rebuilt[0]


@needs_git
def test_a_file_changed_in_transit_is_refused(tmp_path):
    out = tmp_path / "bundle"
    bundle_tool.main(["pack", "--config", str(ROOT / "config" / "smoke.yaml"), "--out", str(out), "--no-wheels",
                      "--no-corpus"])
    with open(out / "source.tar", "ab") as f:
        f.write(b"x")
    with pytest.raises(ValueError, match="missing or corrupted in transit.*source.tar"):
        bundle_tool.main(["unpack", str(out), "--into", str(tmp_path / "tree")])


def test_pack_refuses_a_folder_that_is_not_empty(tmp_path):
    (tmp_path / "bundle").mkdir()
    (tmp_path / "bundle" / "old").write_text("x")
    with pytest.raises(ValueError, match="not empty"):
        bundle_tool.main(["pack", "--config", str(ROOT / "config" / "smoke.yaml"), "--out", str(tmp_path / "bundle")])


def test_the_gpu_machines_own_torch_is_not_packed():
    pins = bundle_tool.installed()
    assert pins and all("==" in p for p in pins)
    assert not [p for p in pins if p.lower().startswith(("torch==", "triton==", "nvidia-"))]


def results_tree(root: Path, config: dict, records: list) -> Path:
    write_results(root / "results" / "memory" / "mygpu" / "memory.json", records, config=config)
    (root / "paper_figs" / "out" / "mygpu").mkdir(parents=True)
    (root / "paper_figs" / "out" / "mygpu" / "fig5_memory.png").write_bytes(b"png")
    return root


def test_results_come_back_and_a_predecessor_is_kept(tmp_path, monkeypatch):
    away = results_tree(tmp_path / "away", {"a": 1}, [{"v": 2}])
    archive = tmp_path / "results.tar.gz"
    bundle_tool.main(["pack-results", "--profile", "mygpu", "--out", str(archive), "--root", str(away)])
    with tarfile.open(archive) as tar:
        assert "results/memory/mygpu/memory.json" in tar.getnames()

    home = tmp_path / "home"
    monkeypatch.setenv("ADAHOP_GIT_COMMIT", "e" * 40)
    write_results(home / "results" / "memory" / "mygpu" / "memory.json", [{"v": 1}], config={"a": 1})
    monkeypatch.delenv("ADAHOP_GIT_COMMIT")
    bundle_tool.main(["unpack-results", str(archive), "--root", str(home)])
    assert read_results(home / "results" / "memory" / "mygpu" / "memory.json")["records"] == [{"v": 2}]
    kept = list((home / "results" / "memory" / "mygpu" / "history").iterdir())
    assert len(kept) == 1 and read_results(kept[0])["records"] == [{"v": 1}]
    assert (home / "paper_figs" / "out" / "mygpu" / "fig5_memory.png").read_bytes() == b"png"


def test_results_of_another_configuration_are_refused(tmp_path):
    away = results_tree(tmp_path / "away", {"a": 2}, [{"v": 2}])
    archive = tmp_path / "results.tar.gz"
    bundle_tool.main(["pack-results", "--profile", "mygpu", "--out", str(archive), "--root", str(away)])
    home = tmp_path / "home"
    write_results(home / "results" / "memory" / "mygpu" / "memory.json", [{"v": 1}], config={"a": 1})
    with pytest.raises(ResultsConflict, match="different configuration"):
        bundle_tool.main(["unpack-results", str(archive), "--root", str(home)])
    assert read_results(home / "results" / "memory" / "mygpu" / "memory.json")["records"] == [{"v": 1}]


def test_pack_results_of_a_profile_with_none_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no results of profile 'nope'"):
        bundle_tool.main(["pack-results", "--profile", "nope", "--out", str(tmp_path / "r.tar.gz"), "--root", str(tmp_path)])
