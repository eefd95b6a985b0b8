"""experiments/memory.py: results written as they are measured, never over another configuration."""

import importlib.util

import pytest

from adahop.provenance import REPO_ROOT, ResultsConflict, read_results


def load_script():
    spec = importlib.util.spec_from_file_location("memory_script", REPO_ROOT / "experiments" / "memory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_run_cut_short_keeps_its_records_and_another_config_is_refused_first(tmp_path, monkeypatch):
    script, out = load_script(), tmp_path / "memory.json"
    real, calls = script.measure, []

    def cut_after_three(*a, **k):
        calls.append(1)
        if len(calls) > 3:
            raise KeyboardInterrupt  # a time limit
        return real(*a, **k)

    monkeypatch.setattr(script, "measure", cut_after_three)
    args = ["--size", "smoke", "--recipes", "mxfp4", "--out", str(out)]
    with pytest.raises(KeyboardInterrupt):
        script.main(args)
    recs = read_results(out)["records"]
    # smoke layers 256x256x256 (bf16, mxfp4), then the first record of the second shape.
    assert [(r["what"], r["recipe"]) for r in recs] == [("layer", "bf16"), ("layer", "mxfp4"), ("layer", "bf16")]
    assert recs[1]["bf16_over_saved_bytes"] > 3.6  # ratios written with the partial records
    # Another configuration is refused before anything is measured.
    calls.clear()
    with pytest.raises(ResultsConflict):
        script.main(["--size", "smoke", "--recipes", "tseng", "--out", str(out)])
    assert calls == []
