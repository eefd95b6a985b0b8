"""Every results file committed under results/ keeps the convention: ``provenance`` + ``records``.

GPU results reach the repo only as committed files (CI has no GPU), so a file that lost its
provenance, names a commit the history does not have, or was written from a tree with uncommitted
changes (``git_dirty``), could not be traced to the code that made it.
"""

import subprocess

import pytest

from adahop.harness.provenance import REPO_ROOT, read_results


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout


try:
    FILES = [f for f in git("ls-files", "results").split()
             if f.endswith((".json", ".json.gz")) and not f.startswith("results/logs/")]
except (OSError, subprocess.CalledProcessError):  # not a git checkout (an sdist): nothing committed to check
    FILES = []


# Committed files written from a dirty tree, each with why it stays (GPU files, which cannot be
# remade here). Every other file must come from a clean one.
STALE_GIT_1A4F9A9 = ("the GPU machine's copy of the tree at 1a4f9a9 carried the git metadata of its parent commit: git "
                     "listed as changed exactly the four files 1a4f9a9 commits")
DIRTY_EXEMPT: dict[str, str] = {
    "results/throughput/gpu/ab/125m_compile_loss_f_cross_entropy.json":
        "the compiled-loss A/B's baseline: the tree at its commit with adahop/harness/model.py as at "
        "c80e46f (F.cross_entropy), the one difference the A/B measures (DESIGN §6)",
    "results/layer_bench/gpu/host/host-cost-triton-op.json":
        "the GPU machine's copy of the tree at d1be70f reported a tracked file changed that we could not "
        "find (every change was committed before the run); the operators it times are d1be70f's",
    "results/layer_bench/gpu/layers-iht-launches-h100.json":
        STALE_GIT_1A4F9A9,
    "results/layer_bench/gpu/layers-iht-operators-h100.json":
        STALE_GIT_1A4F9A9,
    "results/layer_bench/gpu/host/host-cost-launches-h100.json":
        STALE_GIT_1A4F9A9,
    "results/layer_bench/gpu/host/host-cost-operators-h100.json":
        STALE_GIT_1A4F9A9,
}


@pytest.mark.parametrize("path", FILES)
def test_committed_results_file_comes_from_a_clean_tree(path):
    dirty = read_results(REPO_ROOT / path)["provenance"].get("git_dirty")
    if path in DIRTY_EXEMPT:
        assert dirty is True, f"{path} is exempt as dirty ({DIRTY_EXEMPT[path]}) but is not: drop the exemption"
        return
    assert dirty is False, f"{path}: written with git_dirty={dirty!r}; commit the code, rerun its stage, commit the file"


def test_dirty_exemptions_name_committed_gpu_files():
    for path, why in DIRTY_EXEMPT.items():
        assert path in FILES and "/gpu/" in path and why.strip(), path


@pytest.mark.parametrize("path", FILES)
def test_committed_results_file_has_provenance_and_records(path):
    doc = read_results(REPO_ROOT / path)
    prov = doc["provenance"]
    missing = [k for k in ("git_commit", "git_dirty", "date", "device", "versions") if k not in prov]
    assert not missing, f"{path}: provenance lacks {missing}"
    assert isinstance(doc["records"], list) and doc["records"], f"{path}: no records"
    commit = prov["git_commit"]
    assert isinstance(commit, str) and len(commit) >= 7, f"{path}: git_commit {commit!r}"
    if git("rev-parse", "--is-shallow-repository").strip() == "true":
        pytest.skip("a shallow clone lacks the history the commits are looked up in")
    found = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=REPO_ROOT, capture_output=True)
    assert found.returncode == 0, f"{path}: made at commit {commit}, which this repository's history does not have"
