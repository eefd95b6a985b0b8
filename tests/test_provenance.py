"""Results files: provenance, atomic writes, no silent overwrite of another configuration."""

import json

import pytest

from adahop.provenance import ResultsConflict, read_results, write_results


def test_write_results_carries_provenance(tmp_path):
    path = tmp_path / "stage" / "r.json"
    write_results(path, [{"op": "x", "value": 1.5}], config={"size": 8}, seed=3)
    doc = read_results(path)
    prov = doc["provenance"]
    assert doc["records"] == [{"op": "x", "value": 1.5}]
    assert prov["config"] == {"size": 8} and prov["seed"] == 3
    for key in ("git_commit", "git_dirty", "date", "versions", "device"):
        assert key in prov
    assert prov["versions"]["torch"]


def test_rerun_with_same_config_replaces(tmp_path):
    path = tmp_path / "r.json"
    write_results(path, [{"v": 1}], config={"a": 1})
    write_results(path, [{"v": 2}], config={"a": 1})
    assert read_results(path)["records"] == [{"v": 2}]


def test_different_config_is_refused_and_file_kept(tmp_path):
    path = tmp_path / "r.json"
    write_results(path, [{"v": 1}], config={"a": 1})
    with pytest.raises(ResultsConflict, match="different configuration"):
        write_results(path, [{"v": 2}], config={"a": 2})
    assert read_results(path)["records"] == [{"v": 1}]
    write_results(path, [{"v": 2}], config={"a": 2}, overwrite=True)
    assert read_results(path)["records"] == [{"v": 2}]


def test_failed_write_leaves_old_file_and_no_temp(tmp_path):
    path = tmp_path / "r.json"
    write_results(path, [{"v": 1}], config={})

    class Unserialisable:
        def __repr__(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        write_results(path, [{"v": Unserialisable()}], config={})
    assert read_results(path)["records"] == [{"v": 1}]
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_non_results_file_is_rejected(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"records": []}))
    with pytest.raises(ValueError, match="not a results file"):
        read_results(path)


def test_commit_from_environment_wins_over_git(tmp_path, monkeypatch):
    # A GPU machine's copy of the tree can hold a stale .git; the commit it was told is the truth.
    monkeypatch.setenv("ADAHOP_GIT_COMMIT", "0" * 40)
    monkeypatch.setenv("ADAHOP_GIT_DIRTY", "0")
    prov = write_results(tmp_path / "r.json", [{"a": 1}])["provenance"]
    assert prov["git_commit"] == "0" * 40 and prov["git_dirty"] is False
