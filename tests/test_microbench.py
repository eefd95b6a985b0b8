"""experiments/microbench.py: pytest-benchmark JSON -> results/microbench records, and one real run."""

import importlib.util
import json
from pathlib import Path

import pytest

from adahop.harness.provenance import read_results

SCRIPT = Path(__file__).resolve().parent.parent / "experiments" / "microbench.py"
spec = importlib.util.spec_from_file_location("microbench_script", SCRIPT)
microbench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(microbench)


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


def test_smoke_run_writes_results(tmp_path):
    """The whole chain on CPU: pytest --benchmark-only in a subprocess, one benchmark, the results file."""
    out = tmp_path / "microbench.json"
    rc = microbench.main(["--profile", "smoke", "--select", "test_extract_outliers and 256x512 and rows",
                          "--out", str(out)])
    assert rc == 0
    doc = read_results(out)
    assert doc["provenance"]["config"] == {"bench_profile": "smoke", "select": "test_extract_outliers and 256x512 and rows"}
    (rec,) = doc["records"]
    assert rec["op"] == "extract_outliers (rows)" and rec["shape"] == [256, 512] and rec["unit"] == "GB/s"
    assert rec["ceiling_name"] == "copy" and rec["figure"] > 0 and rec["ceiling"] > 0
    assert rec["ratio"] == pytest.approx(rec["figure"] / rec["ceiling"])
    assert set(rec["peers"]) == {"torch-vector-norm", "reference"}
    assert rec["backend"] == "reference" and rec["n_timings"] >= 3 and rec["iqr_s"] >= 0
    assert json.loads(out.read_text())["provenance"]["pytest_exit_code"] == 0
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
