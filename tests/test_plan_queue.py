"""scripts/plan_queue.py: the gpu profile's runs not yet evaluated, spread over GPUs for h200_queue.sh."""

import importlib.util
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("plan_queue", REPO / "scripts" / "plan_queue.py")
plan_queue = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plan_queue)


def queued(out: str) -> list[str]:
    """The RECIPE:SEED items of the printed per-GPU queues."""
    return [item for q in re.findall(r'^gpu \d+: ~\d+ s: "(.*)"$', out, re.M) for item in q.split()]


@pytest.fixture
def config(tmp_path):
    """The gpu profile with a seed no session has run added: the plan then holds runs not yet
    evaluated, whatever the committed results hold."""
    profile = yaml.safe_load((REPO / "config" / "gpu.yaml").read_text())
    profile["pretrain"]["seeds"] = [*profile["pretrain"]["seeds"], 99]
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(profile))
    return path


def test_every_run_not_evaluated_is_queued_once_and_no_other(capsys, config):
    assert plan_queue.main(["--config", str(config), "--gpus", "2", "--seconds", "1e9", "--stages", "memory"]) == 0
    out = capsys.readouterr().out
    profile = yaml.safe_load(config.read_text())
    runs = [r for r, _ in plan_queue.planned(profile["pretrain"])]
    evaluated = {p.stem for p in (REPO / "results" / "eval" / "gpu").glob("125m_*.json")} & {
        p.stem for p in (REPO / "results" / "pretrain" / "gpu").glob("125m_*.json")}
    want = [f"{r.split('_', 1)[1].rsplit('_s', 1)[0]}:{r.rsplit('_s', 1)[1]}" for r in runs if r not in evaluated]
    items = queued(out)
    assert any(w.endswith(":99") for w in want)
    assert items.count("stage:memory") == 1
    assert sorted(i for i in items if not i.startswith("stage:")) == sorted(want)
    assert "do not fit" not in out


def test_what_does_not_fit_is_listed_for_the_next_session(capsys, config):
    assert plan_queue.main(["--config", str(config), "--gpus", "1", "--seconds", "0"]) == 0
    out = capsys.readouterr().out
    assert [i for i in queued(out) if not i.startswith("stage:")] == []
    assert re.search(r"do not fit 0 s per GPU \(\d+\): .*_s99", out)


def test_main_runs_come_before_ablations_and_each_seed_before_the_next():
    plan = plan_queue.planned({"models": ["m"], "recipes": ["a", "b"], "seeds": [0, 1],
                               "ablations": {"recipes": ["c", "d"], "seeds": [0, 1]}})
    assert plan == [("m_a_s0", False), ("m_b_s0", False), ("m_a_s1", False), ("m_b_s1", False),
                    ("m_c_s0", True), ("m_d_s0", True), ("m_c_s1", True), ("m_d_s1", True)]


def test_unknown_stage_is_refused():
    with pytest.raises(SystemExit):
        plan_queue.main(["--stages", "bogus"])


def test_stages_are_the_queues_stages():
    script = (REPO / "scripts" / "h200_queue.sh").read_text()
    declared = re.search(r"declare -A STAGE_FILE=\((.*?)\)\n", script, re.S).group(1)
    assert set(re.findall(r"\[(\w+)\]=", declared)) == set(plan_queue.STAGE_S)


def test_the_queue_guards_each_stage_with_at_least_the_plans_estimate():
    # h200_queue.sh starts a stage only with STAGE_MIN_S seconds left; a guard below what the plan
    # budgets (what the stage took on the H200) would start stages that are then cut off.
    text = (REPO / "scripts" / "h200_queue.sh").read_text()
    guard = {k: int(v) for k, v in re.findall(r"\[(\w+)\]=(\d+)", re.search(r"STAGE_MIN_S=\((.*)\)", text).group(1))}
    assert set(guard) == set(plan_queue.STAGE_S)
    assert all(guard[stage] >= seconds for stage, seconds in plan_queue.STAGE_S.items()), (guard, plan_queue.STAGE_S)


def test_a_one_gpu_throughput_run_is_a_stage_and_the_queue_guards_it(capsys):
    profile = yaml.safe_load((REPO / "config" / "gpu.yaml").read_text())
    one_gpu = [r["name"] for r in profile["throughput"] if r["world_size"] == 1]
    ddp = [r["name"] for r in profile["throughput"] + profile.get("throughput_multi_gpu", []) if r["world_size"] > 1]
    assert one_gpu and ddp
    assert plan_queue.main(["--gpus", "1", "--seconds", "1e9", "--stages", f"throughput-{one_gpu[0]}"]) == 0
    assert f"stage:throughput-{one_gpu[0]}" in queued(capsys.readouterr().out)
    with pytest.raises(SystemExit):  # a DDP run needs its GPUs: not a queue stage
        plan_queue.main(["--stages", f"throughput-{ddp[0]}"])
    text = (REPO / "scripts" / "h200_queue.sh").read_text()
    guard = int(re.search(r"STAGE_MIN_S\[throughput-\$run\]=(\d+)", text).group(1))
    assert guard >= plan_queue.THROUGHPUT_STAGE_S


def test_a_recipe_that_calibrates_more_is_given_its_calibrating_steps():
    pretrain = yaml.safe_load((REPO / "config" / "gpu.yaml").read_text())["pretrain"]
    # 30 calibration steps (the profile's recipe_overrides), again every 250 steps for adahop-recal
    assert plan_queue.calibrating_steps("mxfp4", pretrain) == 0
    assert plan_queue.calibrating_steps("adahop", pretrain) == 30
    assert plan_queue.calibrating_steps("adahop-recal", pretrain) == 30 * (1 + (pretrain["steps"] - 31) // 250)
    runs = [{"calibration": {"s": 75.0, "steps": 30}}, {"calibration": {"s": 60.0, "steps": 30}},
            {"calibration": {"s": 10.0, "steps": 30}, "world_size": 2},  # DDP: another set-up, left out
            {"calibration": {"s": 200.0, "steps": 30}, "runs_per_gpu": 2},  # shared its GPU: left out
            {"calibration": None}]
    assert plan_queue.calibration_step_s(runs) == pytest.approx(2.25)
    # The newest commit's runs only: the detector's code sets the cost.
    dated = [{**r, "made_at": ("2026-11-30T10:00", "aaa")} for r in runs[:2]]
    dated.append({"calibration": {"s": 30.0, "steps": 30}, "made_at": ("2026-12-01T04:00", "bbb")})
    assert plan_queue.calibration_step_s(dated) == pytest.approx(1.0)
    assert plan_queue.calibration_step_s([{"calibration": None}], default=2.5) == 2.5
