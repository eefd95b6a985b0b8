"""adahop.harness.quality and experiments/quality.py: each recipe's gap to bf16 from pretraining and lm-eval records."""

import importlib.util
import math
from pathlib import Path

import pytest

from adahop.harness.provenance import read_results
from adahop.harness.quality import markdown, paired_gap_points, progress, quality_rows

REPO = Path(__file__).resolve().parent.parent


def pretrain(recipe, seed, loss, model="125m"):
    return {"name": f"{model}_{recipe}_s{seed}", "model": model, "recipe": recipe, "final_val_loss": loss}


def score(recipe, seed, task, metric, value, model="125m", limit=None):
    return {"task": task, "metric": metric, "value": value, "recipe": recipe, "model": model, "seed": seed,
            "limit": limit}


def test_gaps_are_mean_differences_with_the_bf16_spread_beside():
    runs = [pretrain("bf16", 0, 3.0), pretrain("bf16", 1, 3.2), pretrain("adahop", 0, 3.3), pretrain("adahop", 2, 3.5)]
    evals = [score(r, s, "corpus_ppl", "bits_per_byte", v)
             for r, s, v in (("bf16", 0, 1.0), ("bf16", 1, 1.2), ("adahop", 0, 1.5))]
    rows = {r["recipe"]: r for r in quality_rows(runs, evals)}
    assert list(rows) == ["bf16", "adahop"]  # the reference first
    loss = rows["adahop"]["final_val_loss"]
    assert math.isclose(loss["mean"], 3.4) and math.isclose(loss["gap_to_bf16"], 0.3)
    assert math.isclose(loss["bf16_sd"], math.sqrt(0.02)) and loss["per_seed"] == {"0": 3.3, "2": 3.5}
    assert rows["bf16"]["final_val_loss"]["gap_to_bf16"] is None
    assert math.isclose(rows["adahop"]["bits_per_byte"]["gap_to_bf16"], 0.4)
    assert rows["adahop"]["seeds"] == [0, 2]


def test_runs_trained_on_different_data_are_not_compared():
    same = {"train.bin": "a" * 64, "val.bin": "b" * 64}
    runs = [{**pretrain("bf16", 0, 3.0), "data_sha256": same}, {**pretrain("adahop", 0, 3.1), "data_sha256": same},
            pretrain("mxfp4", 0, 3.2)]  # from before the digests were recorded: not checked
    assert len(quality_rows(runs, [])) == 3
    runs.append({**pretrain("adahop", 1, 3.1), "data_sha256": {**same, "val.bin": "c" * 64}})
    with pytest.raises(ValueError, match=r"model 125m were trained on different data.*125m_adahop_s1"):
        quality_rows(runs, [])
    other_model = {**pretrain("bf16", 0, 2.0, model="1b"), "data_sha256": {"train.bin": "d" * 64}}
    assert len(quality_rows(runs[:3] + [other_model], [])) == 4


def test_mean_accuracy_counts_only_tasks_every_seed_and_bf16_have():
    evals = [
        score("bf16", 0, "piqa", "acc", 0.5), score("bf16", 0, "piqa", "acc_norm", 0.6),
        score("bf16", 0, "boolq", "acc", 0.4),
        score("mxfp4", 0, "piqa", "acc", 0.3), score("mxfp4", 0, "piqa", "acc_norm", 0.55),
        score("mxfp4", 0, "boolq", "acc", 0.5),
        score("mxfp4", 1, "piqa", "acc_norm", 0.45),  # seed 1 lacks boolq: not averaged
        score("mxfp4", 0, "sciq", "acc", 0.9),  # bf16 lacks sciq: not counted
        score("mxfp4", 0, "piqa", "acc_norm", 0.0, limit=5),  # a limited run: left out
    ]
    rows = {r["recipe"]: r for r in quality_rows([], evals)}
    acc = rows["mxfp4"]["mean_accuracy"]
    assert rows["mxfp4"]["tasks"] == ["boolq", "piqa"]
    assert acc["per_seed"] == {"0": pytest.approx((0.55 + 0.5) / 2)}  # acc_norm for piqa
    assert acc["gap_to_bf16"] == pytest.approx((0.55 + 0.5) / 2 - (0.6 + 0.4) / 2)


def timed(recipe, seed, train_s, step_s, calibration=None, **kw):
    return {**pretrain(recipe, seed, 3.0), "train_s": train_s, "step_s": step_s, "first_s": 20.0, "calibration": calibration,
            **kw}


def test_training_time_counts_one_gpu_runs_alone_and_says_which_are_left_out():
    cal = lambda s, share: {"windows": [[1, 30]], "steps": 30, "s": s, "share": share, "after_s": 10.0}  # noqa: E731
    runs = [timed("bf16", 0, 240.0, 0.14), timed("adahop", 1, 600.0, 0.30, cal(90.0, 0.15)),
            timed("adahop", 2, 500.0, 0.28, cal(70.0, 0.14)),
            timed("adahop", 0, 575.0, 0.28, cal(78.0, 0.13), world_size=2),  # DDP: another set-up
            timed("mxfp4", 2, 690.0, 0.42, runs_per_gpu=2),  # shared its GPU
            pretrain("mxfp4", 0, 3.1)]  # an older record without step times
    rows = {r["recipe"]: r["train_time"] for r in quality_rows(runs, [])}
    assert rows["adahop"]["train_s"] == pytest.approx(550.0) and rows["adahop"]["calibration_s"] == pytest.approx(80.0)
    assert list(rows["adahop"]["per_seed"]) == ["1", "2"] and rows["adahop"]["left_out"] == {"0": "2 GPUs"}
    assert rows["bf16"]["calibration_s"] is None and rows["bf16"]["step_s"] == pytest.approx(0.14)
    assert rows["mxfp4"]["per_seed"] == {} and rows["mxfp4"]["left_out"] == {"2": "2 runs on one GPU"}
    text = markdown(quality_rows(runs, []), ["a.json"])
    assert "| 125m | adahop | 1, 2 (s0 left out: 2 GPUs) | 550 | 0.290 | 20.0 | 30 | 80.0 | 14.5% | 10.0 |" in text
    assert "| 125m | mxfp4 | none (s2 left out: 2 runs on one GPU) | — | — | — | — | — | — | — |" in text
    assert "Where the training time went" not in markdown(quality_rows([pretrain("bf16", 0, 3.0)], []), [])


def test_markdown_shows_means_gaps_and_sources():
    rows = quality_rows([pretrain("bf16", 0, 3.0), pretrain("bf16", 1, 3.2), pretrain("tseng", 0, 3.5)], [])
    text = markdown(rows, ["a.json"])
    assert "| 125m | tseng | 0 | 3.500 | +0.400 [0.141] |" in text and "- `a.json`" in text


def test_script_on_the_committed_gpu_runs(tmp_path):
    spec = importlib.util.spec_from_file_location("quality", REPO / "experiments" / "quality.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    files = sorted(str(p) for stage in ("pretrain", "eval") for p in (REPO / "results" / stage / "gpu").glob("125m_*.json"))
    assert module.main(["--out", str(tmp_path / "q"), *files]) == 0
    doc = read_results(tmp_path / "q.json")
    assert {r["recipe"] for r in doc["records"]} >= {"bf16"}
    assert set(doc["provenance"]["source_commits"]) == set(files)
    assert (tmp_path / "q.md").read_text().startswith("# Quality gap to bf16")
    with pytest.raises(ValueError, match="neither pretraining nor lm-eval"):
        module.main(["--out", str(tmp_path / "q"), str(REPO / "results" / "layer_bench" / "gpu" / "layers.json")])


def test_limited_evaluations_count_where_a_model_has_no_full_ones():
    evals = [score(r, 0, "piqa", "acc", v, limit=20) for r, v in (("bf16", 0.5), ("mxfp4", 0.4))]
    evals.append(score("mxfp4", 0, "piqa", "acc", 0.9, limit=5))  # another limit: left out
    rows = {r["recipe"]: r for r in quality_rows([], evals)}
    assert rows["mxfp4"]["eval_limit"] == 20
    assert rows["mxfp4"]["mean_accuracy"]["gap_to_bf16"] == pytest.approx(-0.1)
    assert "(first 20 documents)" in markdown(list(rows.values()), [])


def test_paired_differences_use_only_the_seeds_both_recipes_have():
    runs = [pretrain("bf16", 0, 3.0), pretrain("bf16", 1, 3.2),
            pretrain("adahop", 0, 3.1), pretrain("adahop", 1, 3.25), pretrain("adahop", 2, 9.9),
            pretrain("mxfp4", 1, 3.3), pretrain("tseng", 0, 3.05)]
    rows = {r["recipe"]: r for r in quality_rows(runs, [score("bf16", 0, "corpus_ppl", "bits_per_byte", 1.0),
                                                         score("adahop", 0, "corpus_ppl", "bits_per_byte", 1.1)])}
    ada = rows["adahop"]["paired"]
    assert list(ada) == ["bf16", "mxfp4", "tseng"]  # the reference first; the method against every recipe
    loss = ada["bf16"]["final_val_loss"]
    assert loss["seeds"] == [0, 1] and loss["per_seed"] == {"0": pytest.approx(0.1), "1": pytest.approx(0.05)}
    assert loss["mean"] == pytest.approx(0.075) and loss["sd"] == pytest.approx(math.sqrt(2) * 0.025)
    assert loss["lower"] == 0
    half = 12.7062047 * loss["sd"] / math.sqrt(2)  # t(0.975, 1 degree of freedom)
    assert loss["ci95"] == [pytest.approx(0.075 - half), pytest.approx(0.075 + half)]
    assert ada["mxfp4"]["final_val_loss"] == {"seeds": [1], "per_seed": {"1": pytest.approx(-0.05)},
                                              "mean": pytest.approx(-0.05), "sd": None, "ci95": None, "lower": 1}
    assert "bits_per_byte" not in ada["mxfp4"] and ada["bf16"]["bits_per_byte"]["mean"] == pytest.approx(0.1)
    assert ada["tseng"]["final_val_loss"]["lower"] == 0  # 3.1 − 3.05 > 0
    assert list(rows["tseng"]["paired"]) == ["bf16"] and rows["bf16"]["paired"] == {}  # other recipes: bf16 only


def test_uniform_rotation_is_paired_with_plain_mxfp4():
    runs = [pretrain("bf16", 0, 3.0), pretrain("mxfp4", 0, 3.1), pretrain("uniform-iht", 0, 3.08)]
    rows = {r["recipe"]: r for r in quality_rows(runs, [])}
    pairs = rows["uniform-iht"]["paired"]
    assert list(pairs) == ["bf16", "mxfp4"] and list(rows["mxfp4"]["paired"]) == ["bf16"]
    assert pairs["mxfp4"]["final_val_loss"]["per_seed"] == {"0": pytest.approx(-0.02)}
    assert pairs["mxfp4"]["final_val_loss"]["lower"] == 1


def test_markdown_pairs_by_seed_and_names_the_evaluated_seeds():
    runs = [pretrain("bf16", 0, 3.0), pretrain("bf16", 1, 3.2), pretrain("adahop", 0, 3.1), pretrain("adahop", 1, 3.12)]
    evals = [score("adahop", 1, "corpus_ppl", "bits_per_byte", 1.0)]
    text = markdown(quality_rows(runs, evals), [])
    assert "| 125m | adahop | 0, 1 (lm-eval: 1) |" in text
    assert "| 125m | adahop | bf16 | +0.010 ± 0.127 (s0 +0.100, s1 -0.080, 95% CI [-1.134, +1.154]) | 1 of 2 | — | — |" in text


def test_a_seed_whose_runs_differ_in_world_size_is_marked():
    runs = [pretrain("bf16", 0, 3.0), pretrain("bf16", 1, 3.1), pretrain("adahop", 0, 3.05) | {"world_size": 2},
            pretrain("adahop", 1, 3.12)]
    rows = {r["recipe"]: r for r in quality_rows(runs, [])}
    assert rows["adahop"]["world_size"] == {"0": 2, "1": 1}
    assert rows["adahop"]["paired"]["bf16"]["world_size_differs"] == [0]
    md = markdown(list(rows.values()), [])
    assert "s0† +0.050" in md and "s1 +0.020" in md and "different numbers of GPUs" in md
    same = {r["recipe"]: r for r in quality_rows([pretrain("bf16", 0, 3.0), pretrain("adahop", 0, 3.05)], [])}
    assert same["adahop"]["paired"]["bf16"]["world_size_differs"] == []
    assert "†" not in markdown(list(same.values()), [])


def test_progress_sorts_the_planned_runs_by_what_they_have():
    planned = ["125m_bf16_s0", "125m_bf16_s1", "125m_tseng_s0", "125m_tseng_s1"]
    runs = [pretrain("bf16", 0, 3.0), pretrain("bf16", 1, 3.1), pretrain("mxfp4", 0, 3.2)]
    evals = [score("bf16", 0, "corpus_ppl", "bits_per_byte", 1.1), score("tseng", 0, "piqa", "acc", 0.5),
             score("tseng", 1, "piqa", "acc", None)]  # a task without a value is no evaluation
    state = progress(planned, runs, evals)
    assert state == {"evaluated": ["125m_bf16_s0"], "trained_only": ["125m_bf16_s1"],
                     "evaluated_only": ["125m_tseng_s0"], "missing": ["125m_tseng_s1"], "unplanned": ["125m_mxfp4_s0"]}
    text = markdown(quality_rows(runs, evals), ["a.json"], progress_state=state)
    assert "1 of the 4 planned runs are trained and evaluated." in text
    assert "Not run yet (1): `125m_tseng_s1`." in text and "Trained, no lm-eval yet (1): `125m_bf16_s1`." in text
    assert "## Progress" not in markdown(quality_rows(runs, evals), ["a.json"])


def test_sources_list_their_commits_and_a_mix_of_commits_is_pointed_out():
    runs = [pretrain("bf16", 0, 3.0), pretrain("mxfp4", 0, 3.2)]
    rows = quality_rows(runs, [])
    one = markdown(rows, ["a.json", "b.json"], commits={"a.json": "a" * 40, "b.json": "a" * 40})
    assert "- `a.json` (aaaaaaa)" in one and "hold the code's" not in one
    mixed = markdown(rows, ["a.json", "b.json", "c.json"], commits={"a.json": "a" * 40, "b.json": "b" * 40, "c.json": None})
    assert ": 2 commits." in mixed and "may also hold the code's" in mixed
    assert "- `b.json` (bbbbbbb)" in mixed and "- `c.json`\n" in mixed  # no commit: nothing made up
    assert "Sources:\n- `a.json`" in markdown(rows, ["a.json"])


def test_script_writes_the_plan_and_its_progress(tmp_path):
    spec = importlib.util.spec_from_file_location("quality", REPO / "experiments" / "quality.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    files = [str(REPO / "results" / "pretrain" / "gpu" / "125m_bf16_s0.json")]
    assert module.main(["--out", str(tmp_path / "q"), "--planned", "125m_bf16_s0,125m_bf16_s9", *files]) == 0
    config = read_results(tmp_path / "q.json")["provenance"]["config"]
    assert config["planned"] == ["125m_bf16_s0", "125m_bf16_s9"]
    assert config["progress"]["trained_only"] == ["125m_bf16_s0"] and config["progress"]["missing"] == ["125m_bf16_s9"]
    assert "Not run yet (1): `125m_bf16_s9`." in (tmp_path / "q.md").read_text()


def curve_run(recipe, seed, points, model="m"):
    """A pretraining record with held-out evaluations at ``points`` ({step: loss}), 10 tokens a step."""
    return {"name": f"{model}_{recipe}_s{seed}", "model": model, "recipe": recipe, "final_val_loss": list(points.values())[-1],
            "tokens_per_step": 10, "val_curve": [{"step": s, "val_loss": v} for s, v in points.items()]}


def test_loss_gap_pairs_each_run_with_bf16_of_the_same_seed_and_step():
    runs = [curve_run("bf16", 0, {10: 3.0, 20: 2.5}), curve_run("bf16", 1, {10: 3.2}),
            curve_run("adahop", 0, {10: 3.1, 20: 2.45}), curve_run("adahop", 1, {10: 3.5}),
            curve_run("adahop", 2, {10: 9.0}),  # no bf16 seed 2: left out
            curve_run("mxfp4", 1, {30: 2.0})]  # no bf16 point at that step: left out
    gaps = sorted(paired_gap_points(runs), key=lambda p: (p["seed"], p["tokens"]))
    assert [(p["recipe"], p["seed"], p["tokens"]) for p in gaps] == [("adahop", 0, 100), ("adahop", 0, 200), ("adahop", 1, 100)]
    assert [p["gap"] for p in gaps] == pytest.approx([0.1, -0.05, 0.3])


def test_gap_curve_is_the_mean_min_and_max_over_shared_seeds_and_the_markdown_shows_it():
    runs = [curve_run("bf16", 0, {10: 3.0, 20: 2.5}), curve_run("bf16", 1, {10: 3.2}),
            curve_run("adahop", 0, {10: 3.1, 20: 2.45}), curve_run("adahop", 1, {10: 3.5})]
    rows = {r["recipe"]: r for r in quality_rows(runs, [])}
    assert rows["bf16"]["gap_curve"] == []
    curve = rows["adahop"]["gap_curve"]
    assert [(p["tokens"], p["seeds"]) for p in curve] == [(100, 2), (200, 1)]
    assert curve[0]["mean"] == pytest.approx(0.2) and (curve[0]["min"], curve[0]["max"]) == pytest.approx((0.1, 0.3))
    text = markdown(list(rows.values()), ["a.json"])
    assert "## m: held-out loss − bf16 over training" in text
    assert "| tokens | adahop (2) |" in text and "| 100 | +0.200 |" in text and "| 200 | -0.050 (1) |" in text
