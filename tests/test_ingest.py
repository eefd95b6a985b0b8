"""scripts/ingest_runs.py: device run files into results/ without losing or silently replacing any."""

import gzip
import importlib.util
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from adahop.provenance import read_results

REPO = Path(__file__).resolve().parent.parent
RUN = "125m_bf16_s0"  # a committed run: its files stand for what a device call brings back


def load_script():
    spec = importlib.util.spec_from_file_location("ingest_runs", REPO / "scripts" / "ingest_runs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def device_files(tmp_path) -> Path:
    """What scripts/h200_pretrain.sh leaves for one run."""
    folder = tmp_path / "device"
    folder.mkdir()
    shutil.copy(REPO / "results" / "pretrain" / "gpu" / f"{RUN}.json", folder / f"{RUN}.pretrain.json")
    shutil.copy(REPO / "results" / "eval" / "gpu" / f"{RUN}.json", folder / f"{RUN}.eval.json")
    (folder / f"{RUN}.log").write_text("=== the run's log\n")
    (folder / f"{RUN}.metrics.jsonl").write_text('{"step": 1, "loss": 10.5}\n')
    return folder


def ingest(tmp_path: Path, source: Path, *extra: str) -> int:
    return load_script().main([str(source), "--logs", str(tmp_path / "logs"), "--results-root",
                               str(tmp_path / "results"), *extra])


def test_files_land_under_results_and_logs_and_the_table_is_written(tmp_path, device_files, capsys):
    assert ingest(tmp_path, device_files) == 0
    results = tmp_path / "results"
    assert (results / "pretrain" / "gpu" / f"{RUN}.json").read_bytes() == (device_files / f"{RUN}.pretrain.json").read_bytes()
    assert read_results(results / "eval" / "gpu" / f"{RUN}.json")["records"]
    assert (results / "eval" / "gpu" / "table.md").exists() and (results / "eval" / "gpu" / "table.csv").exists()
    assert (tmp_path / "logs" / f"{RUN}.log").read_text() == "=== the run's log\n"
    assert gzip.decompress((tmp_path / "logs" / f"{RUN}.metrics.jsonl.gz").read_bytes()) == b'{"step": 1, "loss": 10.5}\n'
    # the same files again: nothing to do
    assert ingest(tmp_path, device_files) == 0
    assert capsys.readouterr().out.count("same") == 2


def test_a_different_result_is_refused_unless_replace_names_the_run(tmp_path, device_files, capsys):
    assert ingest(tmp_path, device_files) == 0
    dest = tmp_path / "results" / "pretrain" / "gpu" / f"{RUN}.json"
    kept = dest.read_bytes()
    doc = json.loads((device_files / f"{RUN}.pretrain.json").read_text())
    doc["records"][0]["final_val_loss"] = 9.9  # a rerun that came out differently
    (device_files / f"{RUN}.pretrain.json").write_text(json.dumps(doc))
    assert ingest(tmp_path, device_files) == 1
    assert dest.read_bytes() == kept and f"--replace {RUN}" in capsys.readouterr().out
    assert ingest(tmp_path, device_files, "--replace", RUN) == 0
    assert read_results(dest)["records"][0]["final_val_loss"] == 9.9
    # The replaced file is kept out of the folder the tables glob, under its commit.
    commit = read_results(dest)["provenance"]["git_commit"][:7]
    assert (dest.parent / "superseded" / f"{RUN}-{commit}.json").read_bytes() == kept
    assert sorted(p.name for p in dest.parent.glob("*.json")) == [f"{RUN}.json"]


def test_a_result_of_a_dirty_tree_is_refused(tmp_path, device_files, capsys):
    doc = json.loads((device_files / f"{RUN}.eval.json").read_text())
    doc["provenance"]["git_dirty"] = True
    (device_files / f"{RUN}.eval.json").write_text(json.dumps(doc))
    assert ingest(tmp_path, device_files) == 1
    assert not (tmp_path / "results" / "eval" / "gpu" / f"{RUN}.json").exists()
    assert "must name a clean commit" in capsys.readouterr().out


def test_a_queue_archive_with_its_logs(tmp_path, device_files):
    (device_files / "queue.log").write_text("=== queue start\n")
    archive = tmp_path / "queue.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for path in device_files.iterdir():
            tar.add(path, arcname=path.name if path.name == "queue.log" else f"out/{path.name}")
    assert ingest(tmp_path, archive) == 0
    assert (tmp_path / "results" / "pretrain" / "gpu" / f"{RUN}.json").exists()
    assert (tmp_path / "logs" / "queue.log").read_text() == "=== queue start\n"


def test_no_run_files_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    assert ingest(tmp_path, tmp_path / "empty") == 1


def test_stage_results_of_an_archive_keep_the_file_they_replace(tmp_path, capsys):
    stages = tmp_path / "archive" / "stages"
    stages.mkdir(parents=True)
    new = REPO / "results" / "layer_bench" / "gpu" / "layers.json"
    old = REPO / "results" / "layer_bench" / "gpu" / "layers-69dc9c0.json"
    shutil.copy(new, stages / "layers.json")
    archive = tmp_path / "queue.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(stages, arcname="stages")
    dest = tmp_path / "results" / "layer_bench" / "gpu" / "layers.json"
    dest.parent.mkdir(parents=True)
    shutil.copy(old, dest)  # an earlier run's file is there
    assert ingest(tmp_path, archive) == 1  # refused without --replace-stages
    assert dest.read_bytes() == old.read_bytes() and "--replace-stages" in capsys.readouterr().out
    assert ingest(tmp_path, archive, "--replace-stages") == 0
    assert dest.read_bytes() == new.read_bytes()
    assert (dest.parent / "layers-69dc9c0.json").read_bytes() == old.read_bytes()
    assert ingest(tmp_path, archive) == 0 and "same" in capsys.readouterr().out


def test_strategy_maps_of_an_archive_land_per_run(tmp_path):
    stages = tmp_path / "archive" / "stages"
    stages.mkdir(parents=True)
    doc = {"provenance": {"git_commit": "0123456789abcdef0123456789abcdef01234567", "git_dirty": False},
           "records": [{"model": "125m", "recipe": "adahop", "seed": 1, "layer": "l", "slot": "fwd", "strategy": "iht"}]}
    (stages / "125m_adahop_s1.strategies.json").write_text(json.dumps(doc))
    (stages / "strategies.done").touch()  # the queue's marker: not a results file
    archive = tmp_path / "queue.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(stages, arcname="stages")
    assert ingest(tmp_path, archive) == 0
    dest = tmp_path / "results" / "strategies" / "gpu" / "125m_adahop_s1.json"
    assert read_results(dest)["records"] == doc["records"]
    assert sorted(p.name for p in dest.parent.iterdir()) == ["125m_adahop_s1.json"]


def test_a_campaign_folder_of_stage_results_and_its_log(tmp_path):
    """scripts/h200_campaign.sh leaves stage files and campaign.log in $OUT: no run, no 'campaign' run."""
    folder = tmp_path / "campaign"
    folder.mkdir()
    shutil.copy(REPO / "results" / "layer_bench" / "gpu" / "layers.json", folder / "layers.json")
    # the tests stage's file (any results file of a clean commit stands for it here)
    shutil.copy(REPO / "results" / "layer_bench" / "gpu" / "layers.json", folder / "tests.json")
    (folder / "campaign.log").write_text("=== layers 23:18:26\n")
    assert ingest(tmp_path, folder) == 0
    assert (tmp_path / "results" / "layer_bench" / "gpu" / "layers.json").exists()
    assert (tmp_path / "results" / "kernel_tests" / "gpu" / "tests.json").exists()
    assert not (tmp_path / "results" / "pretrain").exists()
    assert (tmp_path / "logs" / "campaign.log").read_text() == "=== layers 23:18:26\n"


def test_a_throughput_run_of_the_profile_lands_under_throughput(tmp_path):
    stages = tmp_path / "archive" / "stages"
    stages.mkdir(parents=True)
    shutil.copy(REPO / "results" / "throughput" / "gpu" / "125m_eager.json", stages / "125m_eager.json")
    shutil.copy(REPO / "results" / "throughput" / "gpu" / "125m_eager.json", stages / "not_a_run.json")
    archive = tmp_path / "queue.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(stages, arcname="stages")
    assert ingest(tmp_path, archive) == 0
    assert [p.name for p in (tmp_path / "results").rglob("*.json")] == ["125m_eager.json"]
    assert (tmp_path / "results" / "throughput" / "gpu" / "125m_eager.json").read_bytes() == (
        stages / "125m_eager.json").read_bytes()


def test_a_log_replaces_one_it_extends_and_files_beside_any_other(tmp_path):
    logs, src = tmp_path / "logs", tmp_path / "campaign.log"
    logs.mkdir()
    (logs / "campaign.log").write_text("=== patterns\n")
    src.write_text("=== patterns\n=== layers\n")  # the same machine's log, grown: it supersedes
    load_script().copy_log(src, logs)
    assert (logs / "campaign.log").read_text() == "=== patterns\n=== layers\n"
    src.write_text("=== microbench\n")  # another call's: both kept
    load_script().copy_log(src, logs)
    assert (logs / "campaign.log").read_text() == "=== patterns\n=== layers\n"
    assert (logs / "campaign-2.log").read_text() == "=== microbench\n"
    load_script().copy_log(src, logs)  # the same again: nothing new
    assert sorted(p.name for p in logs.iterdir()) == ["campaign-2.log", "campaign.log"]
