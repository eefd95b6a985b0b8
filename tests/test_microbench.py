"""experiments/microbench.py: pytest-benchmark JSON -> results/microbench records, and one real run."""

import importlib.util
import json
from pathlib import Path

import pytest

from adahop.harness.provenance import read_results

SCRIPT = Path(__file__).resolve().parent.parent / "experiments" / "microbench.py"
# The commit the tests' results files are written at (a copy without git history is told it).
COMMIT = "a" * 40


def load_script(path: Path):
    """The experiments script at ``path`` as a module (``experiments/`` is no package)."""
    spec = importlib.util.spec_from_file_location(f"{path.stem}_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


microbench = load_script(SCRIPT)


def bench_entry(name, **extra_info):
    return {"name": name, "extra_info": extra_info, "stats": {"median": 2e-3, "iqr": 1e-4, "rounds": 5}}


def test_records_carry_figure_ceiling_ratio_path_and_timings():
    timing = {"median_s": 1e-3, "iqr_s": 1e-5}
    doc = {"benchmarks": [
        bench_entry("test_mxfp4_mm[square-4096]", op="mxfp4_mm", shape=[4096, 4096, 4096], dtype="mxfp4 -> bf16",
                    figure=1300.0, unit="TFLOP/s", ceiling_name="cublas-fp8-rowwise",
                    ceiling={"value": 1250.0, **timing}, ratio_to_ceiling=1.04,
                    peers={"cublas-bf16": {"value": 700.0, **timing}}, ratio_to_peers={"cublas-bf16": 1.857},
                    gemm_path="fp8-rowwise", backend="triton", median_s=1.06e-4, iqr_s=2e-6, n_timings=900,
                    timer="triton.testing.do_bench"),
        bench_entry("test_without_the_record"),
    ]}
    (rec,) = microbench.records_from_benchmark_json(doc)
    assert rec["op"] == "mxfp4_mm" and rec["shape"] == [4096, 4096, 4096] and rec["gemm_path"] == "fp8-rowwise"
    assert (rec["figure"], rec["unit"], rec["ceiling"], rec["ratio"]) == (1300.0, "TFLOP/s", 1250.0, 1.04)
    assert rec["peers"] == {"cublas-bf16": 700.0} and rec["ratio_to_peers"] == {"cublas-bf16": 1.857}
    assert (rec["median_s"], rec["iqr_s"]) == (1.06e-4, 2e-6)
    assert rec["pytest_benchmark"] == {"median_s": 2e-3, "iqr_s": 1e-4, "rounds": 5}


def test_device_slug_is_a_file_name():
    slug = microbench.device_slug()
    assert slug and all(c.isalnum() or c == "-" for c in slug)


def test_rejects_unknown_config_keys(tmp_path):
    cfg = tmp_path / "p.yaml"
    cfg.write_text("profile: smoke\nmicrobench: {shapes: [1]}\n")
    with pytest.raises(SystemExit, match="unknown keys"):
        microbench.main(["--config", str(cfg), "--out", str(tmp_path / "r.json")])


# The two extract-outliers benchmarks at the smallest shape: the real run the tests below share.
WHOLE_SELECT = "test_extract_outliers and 256x512"


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Path:
    """One real run of :data:`WHOLE_SELECT` at a fixed commit, started with ``--resume`` and no
    file, so it measures everything: pytest --benchmark-only in a subprocess, the results file.
    Tests that change the file change a copy."""
    out = tmp_path_factory.mktemp("microbench") / "microbench.json"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ADAHOP_GIT_COMMIT", COMMIT)
        mp.setenv("ADAHOP_GIT_DIRTY", "0")
        assert microbench.main(["--profile", "smoke", "--select", WHOLE_SELECT, "--out", str(out), "--resume"]) == 0
    return out


def test_smoke_run_writes_results(whole):
    """The whole chain on CPU: one benchmark's record, its ceiling, peers and timings."""
    doc = read_results(whole)
    assert doc["provenance"]["config"] == {"bench_profile": "smoke", "select": WHOLE_SELECT}
    assert len(doc["records"]) == 2
    (rec,) = [r for r in doc["records"] if r["op"] == "extract_outliers (rows)"]
    assert rec["shape"] == [256, 512] and rec["unit"] == "GB/s"
    assert rec["ceiling_name"] == "copy" and rec["figure"] > 0 and rec["ceiling"] > 0
    assert rec["ratio"] == pytest.approx(rec["figure"] / rec["ceiling"])
    assert set(rec["peers"]) == {"torch-vector-norm", "reference"}
    assert rec["backend"] == "reference" and rec["n_timings"] >= 3 and rec["iqr_s"] >= 0
    assert doc["provenance"]["pytest_exit_code"] == 0
    # The GPUs' state around the run: None on a machine without nvidia-smi, as this one.
    assert doc["provenance"]["gpu_state"] == {"before": None, "after": None}


@pytest.mark.parametrize(
    "rc,n_records,expected",
    [(0, 5, 0), (1, 5, 0), (1, 0, 1), (0, 0, 1), (2, 0, 2)],
    ids=["all-passed", "some-failed-records-kept", "all-failed", "nothing-measured", "usage-error"],
)
def test_exit_status_keeps_measured_records(rc, n_records, expected):
    assert microbench.exit_status("microbench", rc, n_records) == expected


@pytest.mark.parametrize("budget", ["0", "-5", "nan"])
def test_a_budget_must_be_a_positive_number_of_seconds(budget, capsys):
    with pytest.raises(SystemExit):
        microbench.parse_args(["--budget-s", budget])
    assert "argument --budget-s: must be a positive number of seconds" in capsys.readouterr().err


def test_an_interruption_is_told_apart_in_the_provenance():
    assert microbench.interruption(None, 30.0) == {"pytest_interrupted_by": None, "pytest_interrupted_after_s": None}
    assert microbench.interruption("budget", 30.0)["pytest_interrupted_after_s"] == 30.0
    assert microbench.interruption("SIGTERM", 30.0) == {"pytest_interrupted_by": "SIGTERM", "pytest_interrupted_after_s": None}


@pytest.mark.parametrize("section,flag,expected", [
    ("{budget_s: 600}", [], 600.0), ("{budget_s: null}", [], None), ("{}", [], None),
    ("{budget_s: 600}", ["--budget-s", "30"], 30.0),
], ids=["from-the-profile", "null", "absent", "the-flag-wins"])
def test_the_budget_comes_from_the_flag_else_the_profile(tmp_path, section, flag, expected):
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"profile: smoke\nmicrobench: {section}\n")
    args = microbench.parse_args(["--config", str(cfg), *flag])
    assert microbench.bench_settings(args, "microbench").budget_s == expected


@pytest.mark.parametrize("value", ["0", "-1", "'ten'", "true"])
def test_a_profiles_budget_must_be_positive_seconds(tmp_path, value):
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"profile: smoke\nmicrobench: {{budget_s: {value}}}\n")
    with pytest.raises(SystemExit, match="microbench: budget_s must be a positive number of seconds"):
        microbench.bench_settings(microbench.parse_args(["--config", str(cfg)]), "microbench")


@pytest.fixture
def at_commit(monkeypatch):
    """The code's commit as a copy without git history is told it (the tree here may have edits)."""
    monkeypatch.setenv("ADAHOP_GIT_COMMIT", COMMIT)
    monkeypatch.setenv("ADAHOP_GIT_DIRTY", "0")


def test_resume_runs_only_the_benchmarks_the_file_lacks(tmp_path, at_commit, whole):
    out = tmp_path / "microbench.json"
    run = ["--profile", "smoke", "--select", WHOLE_SELECT, "--out", str(out)]
    full = read_results(whole)
    names = sorted(r["test"] for r in full["records"])
    assert len(names) == 2
    cut = {**full, "records": full["records"][:1]}  # as a run stopped after its first benchmark left it
    out.write_text(json.dumps(cut))
    assert microbench.main([*run, "--resume"]) == 0
    resumed = read_results(out)
    assert sorted(r["test"] for r in resumed["records"]) == names
    assert resumed["records"][0] == cut["records"][0]  # kept as it was, not measured again
    assert resumed["provenance"]["resumed_from"]["records"] == 1
    assert resumed["provenance"]["resumed_from"]["date"] == full["provenance"]["date"]
    # Nothing left: the file stays as it is.
    assert microbench.main([*run, "--resume"]) == 0
    assert read_results(out)["records"] == resumed["records"]


def test_resume_refuses_a_file_of_another_commit_or_configuration(tmp_path, at_commit, monkeypatch, whole):
    out = tmp_path / "microbench.json"
    out.write_text(whole.read_text())
    run = ["--profile", "smoke", "--select", WHOLE_SELECT, "--out", str(out)]
    with pytest.raises(SystemExit, match="holds the configuration"):
        microbench.main([*run[:3], "test_extract_outliers", *run[4:], "--resume"])
    monkeypatch.setenv("ADAHOP_GIT_COMMIT", "b" * 40)
    with pytest.raises(SystemExit, match=f"was made at {'a' * 40}; this tree is at {'b' * 40}"):
        microbench.main([*run, "--resume"])


def test_resume_without_a_file_runs_everything(whole):
    doc = read_results(whole)  # made by a run with --resume and no file
    assert len(doc["records"]) == 2 and doc["provenance"]["resumed_from"] is None


def test_layer_bench_resumes_too(tmp_path, at_commit, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # layer_bench imports microbench, as when run as a script
    layer_bench = load_script(SCRIPT.with_name("layer_bench.py"))
    out = tmp_path / "layers.json"
    run = ["--profile", "smoke", "--select", "(mxfp4 or iht) and not cached and 128-128", "--out", str(out)]
    assert layer_bench.main(run) == 0
    full = read_results(out)
    assert len(full["records"]) == 2
    assert all(r["replayed"] is None for r in full["records"])  # a CPU has no CUDA graphs to replay
    out.write_text(json.dumps({**full, "records": full["records"][:1]}))
    capsys.readouterr()
    assert layer_bench.main([*run, "--resume"]) == 0
    stdout = capsys.readouterr().out
    assert "1 records added to 1" in stdout, stdout[-2000:]
    resumed = read_results(out)
    assert sorted(r["test"] for r in resumed["records"]) == sorted(r["test"] for r in full["records"])
    assert resumed["records"][0] == full["records"][0]
