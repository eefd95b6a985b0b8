"""experiments/compare_bench.py: two benchmark results files matched by test id."""

import importlib.util
from pathlib import Path

import pytest

from adahop.harness.provenance import write_results

REPO = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("compare_bench", REPO / "experiments" / "compare_bench.py")
compare_bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare_bench)


def record(test, figure, ratio, peers=None, unit="GB/s"):
    return {"test": test, "figure": figure, "unit": unit, "ratio": ratio, "ratio_to_peers": peers or {}}


def write(path, records):
    write_results(path, records, overwrite=True)
    return path


def test_rows_quotients_and_shared_peers(tmp_path):
    old = write(tmp_path / "old.json", [record("q[a]", 1000.0, 0.25, {"bf16": 0.5, "torchao": 0.4}),
                                        record("q[b]", 2000.0, 0.5, {"bf16": 1.0}), record("q[gone]", 1.0, 0.1)])
    new = write(tmp_path / "new.json", [record("q[a]", 1500.0, 0.30, {"bf16": 0.6}), record("q[b]", 2000.0, 0.5, {"bf16": 1.1}),
                                        record("q[added]", 3.0, 0.2)])
    text = compare_bench.compare(old, new)
    # torchao is in the old run only: no column for it
    assert "| test | unit | old | new | new/old | old ÷ ceiling | new ÷ ceiling | old ÷ bf16 | new ÷ bf16 |" in text
    assert "| `q[a]` | GB/s | 1000 | 1500 | 1.50 | 0.25 | 0.30 | 0.50 | 0.60 |" in text
    assert "2 tests in both; new/old median 1.25, range 1.00–1.50." in text
    assert "Only in old (1): `q[gone]`." in text and "Only in new (1): `q[added]`." in text


def test_select_filters_rows_and_the_unmatched_lists(tmp_path):
    old = write(tmp_path / "old.json", [record("k[a]", 1.0, 0.1), record("m[b]", 1.0, 0.1), record("m[x]", 1.0, 0.1)])
    new = write(tmp_path / "new.json", [record("k[a]", 2.0, 0.2), record("m[b]", 1.0, 0.1)])
    text = compare_bench.compare(old, new, select=r"^k\[")
    assert "`k[a]`" in text and "`m[b]`" not in text and "m[x]" not in text


def test_bad_inputs_are_named(tmp_path):
    good = write(tmp_path / "good.json", [record("q[a]", 1.0, 0.1)])
    with pytest.raises(ValueError, match=r"lacks \['figure'\]: not a benchmark results file"):
        compare_bench.compare(good, write(tmp_path / "bad.json", [{"test": "q[a]", "unit": "GB/s"}]))
    with pytest.raises(ValueError, match="share no test"):
        compare_bench.compare(good, write(tmp_path / "other.json", [record("z", 1.0, 0.1)]))
    with pytest.raises(ValueError, match="is in GB/s in .* but TFLOP/s in"):
        compare_bench.compare(good, write(tmp_path / "tflops.json", [record("q[a]", 1.0, 0.1, unit="TFLOP/s")]))
    with pytest.raises(ValueError, match="appears twice"):
        compare_bench.compare(good, write(tmp_path / "twice.json", [record("q[a]", 1.0, 0.1)] * 2))


def test_cli_on_the_committed_h200_layer_runs(tmp_path):
    gpu = REPO / "results" / "layer_bench" / "gpu"
    out = tmp_path / "c.md"
    assert compare_bench.main([str(gpu / "history" / "layers-2026-11-30-2.json"), str(gpu / "layers.json"), "--out", str(out)]) == 0
    text = out.read_text()
    assert "old ÷ torchao-float8-rowwise" in text and "`test_layer_fwd_bwd[iht-llama3-8b-down]`" in text
