"""experiments/strategies.py: the replayed calibration gives the strategy map of the full run."""

import importlib.util
import json

import pytest
import yaml

from adahop.policy import SLOTS
from adahop.harness.provenance import REPO_ROOT, read_results

pytestmark = pytest.mark.usefixtures("one_thread")


def load(name):
    spec = importlib.util.spec_from_file_location(f"{name}_script", REPO_ROOT / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def corpus(word_corpus):
    return word_corpus(1, 80)


@pytest.fixture
def profile(tmp_path):
    # Warm-up ends before calibration does, so the cosine schedule (which depends on the run's
    # total steps) shapes the calibration steps: the replay must keep the run's schedule. A
    # detector threshold low enough that the tiny model's operands get labels other than none.
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump({"pretrain": {
        "seq_len": 64, "batch_size": 2, "lr": 3e-3, "warmup_steps": 1, "steps": 7, "eval_interval": 3,
        "eval_batches": 1, "checkpoint_interval": 7, "log_interval": 1,
        "recipe_overrides": {"calibration_steps": 4, "detector": {"threshold": 1.5, "dominance": 1.2}},
        "models": ["tiny"], "compile_recipes": ["bf16"]}}))
    return path


def test_replay_reproduces_the_full_runs_strategy_map(corpus, profile, tmp_path):
    run = tmp_path / "run"
    load("pretrain").main(["--config", str(profile), "--model", "tiny", "--recipe", "adahop", "--seed", "3",
                           "--data", str(corpus), "--out", str(run), "--results", str(tmp_path / "pretrain.json"),
                           "--device", "cpu", "--no-progress"])
    full = json.loads((run / "strategies.json").read_text())
    out = tmp_path / "strategies.json"
    script = load("strategies")
    assert script.main(["--config", str(profile), "--data", str(corpus), "--model", "tiny", "--recipe", "adahop",
                        "--seed", "3", "--out", str(out), "--device", "cpu"]) == 0
    doc = read_results(out)
    recs = doc["records"]
    assert len(recs) == len(full) * len(SLOTS)
    for r in recs:
        e = full[r["layer"]]
        assert r["strategy"] == e["strategies"][r["slot"]] and r["pair"] == e["pairs"][r["slot"]]
        assert (r["label_x"], r["label_w"], r["label_g"]) == (e["labels"]["x"], e["labels"]["w"], e["labels"]["g"])
    labels = {r[f"label_{op}"] for r in recs for op in "xwg"}
    assert labels != {"none"}, "a test of nothing: every operand unlabelled"
    assert doc["provenance"]["config"]["steps"] == 7 and doc["provenance"]["seed"] == 3  # the run's schedule
    # The votes behind the labels, too: the replay is the run's calibration, not a similar one.
    cfg = script.TrainConfig.from_section(yaml.safe_load(profile.read_text())["pretrain"], model="tiny",
                                          recipe="adahop", seed=3, compile=False, eval_interval=0)
    replayed = script.replay(cfg, corpus, script.torch.device("cpu"))
    assert {n: e["votes"] for n, e in replayed.items()} == {n: e["votes"] for n, e in full.items()}


def test_replay_refuses_what_cannot_calibrate(corpus, profile, tmp_path):
    script = load("strategies")
    args = ["--config", str(profile), "--data", str(corpus), "--model", "tiny", "--seed", "0", "--device", "cpu",
            "--out", str(tmp_path / "s.json")]
    with pytest.raises(ValueError, match="no calibration to replay"):
        script.main([*args, "--recipe", "mxfp4"])
    short = tmp_path / "short.yaml"
    short.write_text(profile.read_text().replace("steps: 7", "steps: 2"))
    with pytest.raises(ValueError, match="fewer than its 4 calibration steps"):
        script.main([*args, "--recipe", "adahop", "--config", str(short)])
    assert not (tmp_path / "s.json").exists()
