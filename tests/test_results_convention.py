"""Every results file committed under results/ keeps the convention: ``provenance`` + ``records``.

GPU results reach the repo only as committed files (CI has no GPU), so a file that lost its
provenance, or names a commit the history does not have, could not be traced to the code that
made it.
"""

import subprocess

import pytest

from adahop.provenance import REPO_ROOT, read_results


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout


try:
    FILES = [f for f in git("ls-files", "results").split()
             if f.endswith((".json", ".json.gz")) and not f.startswith("results/logs/")]
except (OSError, subprocess.CalledProcessError):  # not a git checkout (an sdist): nothing committed to check
    FILES = []


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
