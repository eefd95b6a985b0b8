"""experiments/memory.py: results written as they are measured, never over another configuration."""

import importlib.util

import pytest

from adahop.harness.provenance import REPO_ROOT, ResultsConflict, read_results


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


def write_map(path, model="tiny", wgrad="bf16"):
    """A strategies results file: every linear layer of ``model`` with wgrad in ``wgrad``."""
    import adahop
    from adahop.harness.model import Llama, LlamaConfig
    from adahop.harness.provenance import write_results

    names = adahop.export_strategies(adahop.convert(Llama(LlamaConfig.from_name("tiny", 512, max_seq_len=128)), "adahop"))
    recs = [{"model": model, "recipe": "adahop", "seed": 0, "layer": name, "slot": slot,
             "strategy": {"fwd": "iht", "dgrad": "iht", "wgrad": wgrad}[slot]}
            for name in names for slot in ("fwd", "dgrad", "wgrad")]
    write_results(path, recs, config={"test": True})
    return path


def test_a_run_map_is_measured_for_the_recipes_that_could_have_fixed_it(tmp_path):
    out = tmp_path / "memory.json"
    the_map = write_map(tmp_path / "map.json")
    load_script().main(["--size", "smoke", "--only", "model", "--recipes", "mxfp4,adahop,adahop-no-bf16,adahop-exact-bf16",
                        "--strategy-map", str(the_map), "--out", str(out)])
    recs = read_results(out)["records"]
    assert {r["what"] for r in recs} == {"model"}
    by = {(r["recipe"], r["phase"]): r for r in recs}
    # adahop-no-bf16's table has no BF16: adahop's map is not one it could have fixed.
    assert sorted(k for k in by if k[1] == "run map") == [("adahop", "run map"), ("adahop-exact-bf16", "run map")]
    assert by["adahop", "run map"]["strategy_map"] == "tiny_adahop_s0"
    (fixed_map, n), = by["adahop", "run map"]["strategies"].items()  # one map, on every layer
    assert "'wgrad': 'bf16'" in fixed_map and n == 14
    # adahop's BF16 wgrad reads X back from its MXFP4 copy: it saves what plain MXFP4 saves. The
    # exact fallback keeps X in BF16 for it: more, by at least one BF16 copy of a layer's input.
    plain, exact = by["adahop", "run map"]["saved_bytes"], by["adahop-exact-bf16", "run map"]["saved_bytes"]
    assert plain == by["mxfp4", "fixed"]["saved_bytes"]
    tokens, dim = 2 * 128, 128  # smoke: batch 2 x 128; the tiny preset is 128 wide
    assert exact >= plain + tokens * dim * 2


def test_a_map_of_another_model_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="map of a 125m run"):
        load_script().main(["--size", "smoke", "--only", "model", "--recipes", "adahop",
                            "--strategy-map", str(write_map(tmp_path / "map.json", model="125m")),
                            "--out", str(tmp_path / "memory.json")])
