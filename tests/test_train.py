"""adahop.harness.train and experiments/pretrain.py on CPU: learning, exact resume, NaN stop, stop on request/SIGTERM, CLI, DDP (gloo)."""

import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import adahop
from adahop.harness.model import export_hf, load_hf
from adahop.harness.provenance import REPO_ROOT, ResultsConflict, read_results
from adahop.harness.train import (
    COMPILE_MODES,
    CUDAGRAPH_MODES,
    DistInfo,
    NonFiniteLossError,
    RandomTokenBatches,
    TrainConfig,
    Trainer,
    TrainingStopped,
    WarmupCosine,
    allocate_optimizer_state,
    corpus_batches,
    step_times,
    summarize,
)

# The tiny model's ops are too small to gain from a second thread (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("one_thread")

SCRIPT = REPO_ROOT / "experiments" / "pretrain.py"
SMALL = dict(model="tiny", seq_len=64, batch_size=4, lr=3e-3, warmup_steps=2, eval_interval=4, eval_batches=2,
             checkpoint_interval=4, steps=8)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, write_corpus):
    """A data folder built by adahop.harness.data from documents of a small random grammar: a 400-token
    BPE, ~40k uint16 train tokens, ~4k held out."""
    rng = np.random.default_rng(0)
    subjects, verbs, objects = (["the cat", "a dog", "my friend", "the king", "an old man"],
                                ["sees", "likes", "eats", "finds", "holds"],
                                ["the ball", "a red apple", "the sword", "some bread", "a small boat"])
    docs = [" ".join(f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}." for _ in range(10))
            for _ in range(900)]
    return write_corpus(tmp_path_factory.mktemp("corpus"), docs, 810, 400)


def make_trainer(corpus, out_dir, **overrides) -> Trainer:
    cfg = TrainConfig(**{**SMALL, **overrides})
    vocab, train, held_out = corpus_batches(corpus, cfg, DistInfo())
    return Trainer(cfg, vocab, train, held_out, out_dir=out_dir, device="cpu", progress=False)


def losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r and "event" not in r}


@pytest.mark.parametrize("fused", [False, True])
def test_optimizer_state_made_before_the_first_step_trains_bit_for_bit_as_made_in_it(fused):
    def model_and_optimizer():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.LayerNorm(8))
        decay = [p for p in model.parameters() if p.dim() >= 2]
        rest = [p for p in model.parameters() if p.dim() < 2]
        return model, torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                                        lr=1e-2, fused=fused)

    early, early_opt = model_and_optimizer()
    before = [p.detach().clone() for p in early.parameters()]
    allocate_optimizer_state(early_opt)
    assert all(torch.equal(p, b) for p, b in zip(early.parameters(), before)) and all(p.grad is None for p in early.parameters())
    assert [g["lr"] for g in early_opt.param_groups] == [1e-2, 1e-2]
    for state in early_opt.state.values():
        assert float(state["step"]) == 0 and not state["exp_avg"].any() and not state["exp_avg_sq"].any()
    lazy, lazy_opt = model_and_optimizer()
    for model, opt in ((early, early_opt), (lazy, lazy_opt)):
        for step in range(3):
            opt.zero_grad(set_to_none=True)
            model(torch.randn(4, 16, generator=torch.Generator().manual_seed(step))).square().sum().backward()
            opt.step()
    assert all(torch.equal(a, b) for a, b in zip(early.parameters(), lazy.parameters()))
    for a, b in zip(early_opt.state.values(), lazy_opt.state.values()):
        assert all(torch.equal(a[k], b[k]) for k in ("step", "exp_avg", "exp_avg_sq"))
    allocate_optimizer_state(early_opt)  # the state exists: nothing happens
    assert all(float(state["step"]) == 3 for state in early_opt.state.values())


def test_optimizer_state_cannot_be_made_over_gradients():
    model = torch.nn.Linear(4, 4)
    model(torch.ones(1, 4)).sum().backward()
    with pytest.raises(ValueError, match="already hold gradients"):
        allocate_optimizer_state(torch.optim.AdamW(model.parameters()))


def test_the_trainer_makes_its_optimizer_state_up_front_and_trains_as_without(corpus, tmp_path, monkeypatch):
    up_front = make_trainer(corpus, tmp_path / "up_front", steps=4)
    assert len(up_front.optimizer.state) == len(list(up_front.model.parameters()))
    up_front.run()
    import adahop.harness.train as train_module

    monkeypatch.setattr(train_module, "allocate_optimizer_state", lambda optimizer: None)
    lazy = make_trainer(corpus, tmp_path / "lazy", steps=4)
    assert not lazy.optimizer.state
    lazy.run()
    assert losses(tmp_path / "up_front") == losses(tmp_path / "lazy")
    assert all(torch.equal(a, b) for a, b in zip(up_front.model.state_dict().values(), lazy.model.state_dict().values()))


class StepHook:
    """A forward hook on the first block that acts at a given training step (1-based)."""

    def __init__(self, at_step: int, action: str):
        self.at_step, self.action, self.calls = at_step, action, 0

    def __call__(self, module, args, output):
        if not module.training:
            return None
        self.calls += 1
        if self.calls != self.at_step:
            return None
        if self.action == "kill":
            raise KeyboardInterrupt("simulated kill")
        if self.action == "stop":
            self.trainer.request_stop("test")
            return None
        return output * float("nan")


def test_warmup_cosine_schedule():
    f = WarmupCosine(warmup=4, total=14, min_ratio=0.1)
    assert [f(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(4) == 1.0 and math.isclose(f(13), 0.1) and math.isclose(f(9), 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 5 / 9)))
    assert all(f(s) >= f(s + 1) for s in range(4, 20))


def test_bf16_recipe_learns_and_logs(corpus, tmp_path):
    trainer = make_trainer(corpus, tmp_path / "run", steps=24, eval_interval=12)
    history = trainer.run()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 25))
    for key in ("tokens", "loss", "lr", "grad_norm", "tokens_per_s", "mfu", "peak_mem_gib"):
        assert key in rows[0], key
    assert rows[-1]["tokens"] == 24 * 4 * 64
    vals = [r["val_loss"] for r in rows if "val_loss" in r]
    assert len(vals) == 2 and vals[1] < vals[0] < math.log(trainer.model_config.vocab_size)
    assert rows[-1]["loss"] < rows[0]["loss"] - 1.0
    summary = summarize(history)
    assert summary["final_val_loss"] == vals[-1] and summary["best_val_loss"] == min(vals)
    assert [c.name for c in trainer.checkpoints()] == ["step_00000020.pt", "step_00000024.pt"]


def timed_rows(seconds: dict[int, float], log_every: int = 1, tokens_per_step: int = 100) -> list[dict]:
    """Metrics rows whose steps took ``seconds`` (step → s), logged every ``log_every`` steps."""
    rows, last = [], 0
    for step in range(log_every, max(seconds) + 1, log_every):
        took = sum(seconds[s] for s in range(last + 1, step + 1))
        rows.append({"step": step, "tokens": step * tokens_per_step, "loss": 1.0,
                     "tokens_per_s": (step - last) * tokens_per_step / took})
        last = step
    return rows


def test_step_times_split_calibration_and_the_step_after_it_from_plain_steps():
    # steps 1-4 calibrate (3 s; step 1 also compiles: 5 s), step 5 is the first after (4 s), the rest 1 s
    seconds = {1: 5.0, 2: 3.0, 3: 3.0, 4: 3.0, 5: 4.0, **{s: 1.0 for s in range(6, 13)}}
    history = [*timed_rows(seconds), {"step": 12, "event": "stopped", "reason": "test"}]
    out = step_times(history, [(1, 4)])
    assert out["train_s"] == pytest.approx(25.0) and out["step_s"] == pytest.approx(1.0)
    assert out["first_s"] == pytest.approx(4.0)  # the first step's compilation, not calibration's
    cal = out["calibration"]
    assert cal["windows"] == [[1, 4]] and cal["steps"] == 4
    assert cal["s"] == pytest.approx(6.0) and cal["after_s"] == pytest.approx(3.0)
    assert cal["share"] == pytest.approx(6.0 / 25.0)
    assert step_times(history)["calibration"] is None  # a recipe that does not calibrate
    # logged every 2 steps: an interval's time is spread over its steps
    coarse = step_times(timed_rows(seconds, log_every=2), [(1, 4)])
    assert coarse["train_s"] == pytest.approx(25.0) and coarse["step_s"] == pytest.approx(1.0)
    assert coarse["calibration"]["steps"] == 4
    assert step_times([]) == {"train_s": None, "step_s": None, "first_s": None, "calibration": None}


def test_resume_after_kill_continues_the_same_loss_curve(corpus, tmp_path):
    make_trainer(corpus, tmp_path / "straight").run()

    killed = make_trainer(corpus, tmp_path / "killed")
    killed.model.model.layers[0].register_forward_hook(StepHook(at_step=7, action="kill"))
    with pytest.raises(KeyboardInterrupt):
        killed.run()
    assert max(losses(tmp_path / "killed")) == 6  # steps 5–6 were logged after the step-4 checkpoint
    resumed = make_trainer(corpus, tmp_path / "killed")
    assert resumed.step == 4
    resumed.run()

    straight, again = losses(tmp_path / "straight"), losses(tmp_path / "killed")
    assert list(again) == list(range(1, 9))
    assert again == straight  # bit-for-bit on CPU

    # Which code trained which steps: a resume adds a segment from its step, with the commit it runs.
    assert [seg["from_step"] for seg in resumed.segments] == [0, 4]
    assert resumed.segments[0]["git_commit"] == resumed.segments[1]["git_commit"] is not None


def test_a_resume_under_other_code_is_recorded(corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("ADAHOP_GIT_COMMIT", "a" * 40)
    monkeypatch.setenv("ADAHOP_GIT_DIRTY", "0")
    first = make_trainer(corpus, tmp_path / "run")
    first.run(until=4)
    monkeypatch.setenv("ADAHOP_GIT_COMMIT", "b" * 40)
    monkeypatch.setenv("ADAHOP_GIT_DIRTY", "1")
    second = make_trainer(corpus, tmp_path / "run")
    assert second.step == 4
    second.run()
    assert second.segments == [{"from_step": 0, "git_commit": "a" * 40, "git_dirty": False},
                               {"from_step": 4, "git_commit": "b" * 40, "git_dirty": True}]
    last = torch.load(second.checkpoints()[-1], map_location="cpu", weights_only=False)
    assert last["segments"] == second.segments


def test_request_stop_checkpoints_that_step_and_resumes_on_the_same_curve(corpus, tmp_path):
    make_trainer(corpus, tmp_path / "straight").run()

    stopped = make_trainer(corpus, tmp_path / "stopped")
    hook = StepHook(at_step=6, action="stop")
    hook.trainer = stopped
    stopped.model.model.layers[0].register_forward_hook(hook)
    with pytest.raises(TrainingStopped, match=r"after step 6 \(test\).*step_00000006\.pt") as err:
        stopped.run()
    assert err.value.step == 6 and err.value.checkpoint.exists()  # between the step-4 and step-8 checkpoints
    rows = [json.loads(line) for line in (tmp_path / "stopped" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1] == {"step": 6, "event": "stopped", "reason": "test"}
    resumed = make_trainer(corpus, tmp_path / "stopped")
    assert resumed.step == 6
    resumed.run()
    assert losses(tmp_path / "stopped") == losses(tmp_path / "straight")  # bit-for-bit on CPU, no step lost


def sigterm_after_three_steps(launcher, out, tmp_path, corpus, profile, *args) -> tuple[int, str, int]:
    """Start a long run, SIGTERM the launcher once three steps are logged; (status, stderr, last step)."""
    cmd = [*launcher, str(SCRIPT), "--config", str(profile), "--model", "tiny", "--recipe", "bf16",
           "--data", str(corpus), "--out", str(out), "--results", str(tmp_path / "r.json"), "--steps", "100000",
           "--eval-interval", "0", "--checkpoint-interval", "0", "--device", "cpu", "--no-progress", *args]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        metrics = out / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    step = rows[-1]["step"]
    assert rows[-1] == {"step": step, "event": "stopped", "reason": "signal SIGTERM"}, stderr
    assert [c.name for c in (out / "checkpoints").iterdir()] == [f"step_{step:08d}.pt"]
    assert not (tmp_path / "r.json").exists()
    return proc.returncode, stderr, step


def test_cli_sigterm_stops_at_a_step_boundary_with_a_checkpoint(corpus, profile, tmp_path):
    status, stderr, _ = sigterm_after_three_steps([sys.executable], tmp_path / "run", tmp_path, corpus, profile)
    assert status == load_script().EXIT_STOPPED, stderr
    assert "the same command resumes there" in stderr


def test_repeated_sigterm_is_one_request_and_a_late_one_ends_the_process():
    """``timeout`` signals the process and then its group: the second SIGTERM, arriving after the
    handler ran for the first (raise_signal runs it at once), is the same request, not a kill; one
    well after the first gets the default action and the process ends at once."""
    code = (f"import importlib.util, signal, time\n"
            f"spec = importlib.util.spec_from_file_location('p', {str(SCRIPT)!r})\n"
            f"m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            f"stop = m.StopOnSignal(repeat_grace_s=0.5)\n"
            f"signal.raise_signal(signal.SIGTERM); signal.raise_signal(signal.SIGTERM)\n"
            f"print('repeat ignored:', stop.reason, flush=True)\n"
            f"time.sleep(1.0)\n"
            f"signal.raise_signal(signal.SIGTERM)\n"
            f"print('survived the late one', flush=True)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.stdout == "repeat ignored: signal SIGTERM\n", proc.stderr
    assert proc.returncode == -signal.SIGTERM, proc.stderr


@pytest.mark.distributed
def test_torchrun_sigterm_stops_every_rank_at_one_checkpointed_step(corpus, profile, tmp_path):
    """torchrun passes its SIGTERM to the ranks; they agree on the step and rank 0 saves it."""
    _, _, step = sigterm_after_three_steps([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                            "--nproc_per_node=2"], tmp_path / "run", tmp_path, corpus, profile,
                                           "--batch-size", "2")
    state = torch.load(tmp_path / "run" / "checkpoints" / f"step_{step:08d}.pt", weights_only=False)
    assert state["step"] == step and len(state["ranks"]) == 2


def test_resume_refuses_a_different_config(corpus, tmp_path):
    make_trainer(corpus, tmp_path / "run", steps=4).run()
    with pytest.raises(ValueError, match="different config.*lr"):
        make_trainer(corpus, tmp_path / "run", steps=4, lr=1e-3)


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(corpus, tmp_path):
    trainer = make_trainer(corpus, tmp_path / "run")
    trainer.model.model.layers[0].register_forward_hook(StepHook(at_step=6, action="nan"))
    with pytest.raises(NonFiniteLossError, match=r"non-finite training loss and gradient norm at step 6.*step_00000004\.pt") as err:
        trainer.run()
    assert err.value.non_finite == ["loss", "grad_norm"]
    assert [c.name for c in trainer.checkpoints()] == ["step_00000004.pt"]
    state = torch.load(trainer.checkpoints()[0], weights_only=False)
    assert all(torch.isfinite(v).all() for v in state["model"].values() if torch.is_tensor(v))
    assert trainer.step == 5  # the bad update was never applied
    event = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert event["event"] == "non-finite" and event["non_finite"] == ["loss", "grad_norm"] and event["step"] == 6


class GradHook:
    """Multiplies a parameter's gradient by inf at one training step (1-based): a finite loss
    whose backward overflowed."""

    def __init__(self, trainer: Trainer, at_step: int):
        self.trainer, self.at_step = trainer, at_step

    def __call__(self, grad):
        return grad * float("inf") if self.trainer.step + 1 == self.at_step else grad


@pytest.mark.parametrize("recipe", ["bf16", "adahop"])
def test_non_finite_gradient_norm_with_a_finite_loss_says_so(corpus, tmp_path, recipe):
    """A gradient that overflows while the loss is finite: the stop names the gradient norm, during
    adahop's calibration (step 2 of 3) as after it, and nothing of the step is applied."""
    overrides = {"recipe_overrides": {"calibration_steps": 3}} if recipe == "adahop" else {}
    trainer = make_trainer(corpus, tmp_path / "run", recipe=recipe, checkpoint_interval=1, **overrides)
    trainer.model.model.layers[0].mlp.up_proj.weight.register_hook(GradHook(trainer, at_step=2))
    with pytest.raises(NonFiniteLossError, match=r"non-finite gradient norm \(the loss was finite\) at step 2") as err:
        trainer.run()
    assert err.value.non_finite == ["grad_norm"]
    event = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert event["non_finite"] == ["grad_norm"] and math.isfinite(float(event["loss"]))
    assert trainer.step == 1 and [c.name for c in trainer.checkpoints()] == ["step_00000001.pt"]
    if recipe == "adahop":  # still calibrating: the stop left the layers' state as step 1 made it
        assert {layer.phase for _, layer in adahop.linear.quant_layers(trainer.model)} == {"calibrating"}
        assert {layer.step for _, layer in adahop.linear.quant_layers(trainer.model)} == {1}


def test_max_tokens_caps_the_run(corpus, tmp_path):
    trainer = make_trainer(corpus, tmp_path / "run", steps=100, max_tokens=5 * 4 * 64 + 10)
    assert trainer.total_steps == 5


def test_config_rejects_unknown_keys_and_bad_values():
    with pytest.raises(ValueError, match="unknown training config keys"):
        TrainConfig.from_dict({"learning_rate": 1e-3})
    with pytest.raises(ValueError, match="batch_size"):
        TrainConfig(batch_size=0)
    with pytest.raises(ValueError, match="precision"):
        TrainConfig(precision="fp8")
    with pytest.raises(ValueError, match="compile_mode must be one of"):
        TrainConfig(compile_mode="fastest")
    with pytest.raises(ValueError, match=r"\(CUDA graphs\) with grad_accum=2 and fsdp"):
        TrainConfig(compile=True, compile_mode="reduce-overhead", grad_accum=2, fsdp=True)
    TrainConfig(compile=True, compile_mode="reduce-overhead", grad_accum=2)  # one process: .grad kept allocated
    TrainConfig(compile=True, compile_mode="max-autotune-no-cudagraphs", grad_accum=2, fsdp=True)  # no graphs


def test_compile_modes_are_the_profile_schemas_and_cuda_graphs_only_on_cuda():
    schema = yaml.safe_load((REPO_ROOT / "config" / "schema.yaml").read_text())
    enums = [node["compile_mode"]["enum"] for node in _nodes_with(schema, "compile_mode")]
    assert len(enums) == 2 and all(tuple(e) == COMPILE_MODES for e in enums)  # pretrain section, throughput runs
    assert set(CUDAGRAPH_MODES) <= set(COMPILE_MODES)
    cfg = TrainConfig(**{**SMALL, "compile": True, "compile_mode": "reduce-overhead", "eval_interval": 0})
    trainer = Trainer(cfg, 512, RandomTokenBatches(512, cfg.seq_len, cfg.batch_size), device="cpu", progress=False)
    assert not trainer.cudagraphs  # CUDA graphs need CUDA: on a CPU the mode compiles without them


def _nodes_with(node, key):
    """Every mapping in a parsed YAML tree that holds ``key`` as a mapping."""
    if isinstance(node, dict):
        if isinstance(node.get(key), dict):
            yield node
        for v in node.values():
            yield from _nodes_with(v, key)
    elif isinstance(node, list):
        for v in node:
            yield from _nodes_with(v, key)


def load_script():
    spec = importlib.util.spec_from_file_location("pretrain_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def profile(tmp_path):
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump({"pretrain": {k: v for k, v in SMALL.items() if k != "model"} | {"log_interval": 1},
                                    "other_stage": {"x": 1}}))
    return path


def test_cli_writes_run_dir_hf_export_and_results(corpus, profile, tmp_path):
    out, results = tmp_path / "runs" / "tiny_bf16_s0", tmp_path / "results" / "tiny_bf16_s0.json"
    load_script().main(["--config", str(profile), "--model", "tiny", "--recipe", "bf16", "--seed", "0",
                        "--data", str(corpus), "--out", str(out), "--results", str(results),
                        "--steps", "6", "--device", "cpu", "--no-progress"])
    record = read_results(results)["records"][0]
    assert record["steps"] == 6 and record["tokens"] == 6 * 4 * 64 and record["final_val_loss"] is not None
    assert [seg["from_step"] for seg in record["segments"]] == [0]  # one start, no resume
    assert record["strategy_fixes"] == []  # bf16: no calibrating layers
    assert record["data_sha256"] == json.loads((corpus / "meta.json").read_text())["sha256"]
    assert read_results(results)["provenance"]["config"]["seq_len"] == 64  # from the profile
    assert (out / "strategies.json").exists() and (out / "checkpoints" / "step_00000006.pt").exists()
    model = load_hf(out / "hf")
    ids = torch.randint(0, model.config.vocab_size, (1, 16))
    trainer_state = torch.load(out / "checkpoints" / "step_00000006.pt", weights_only=False)["model"]
    assert torch.equal(model.state_dict()["model.norm.weight"], trainer_state["model.norm.weight"])
    assert torch.isfinite(model(ids)[0]).all()


def test_cli_throughput_only(profile, tmp_path, monkeypatch):
    results = tmp_path / "throughput.json"
    args = ["--config", str(profile), "--throughput-only", "--model", "tiny", "--vocab-size", "512",
            "--untimed-steps", "2", "--steps", "3", "--results", str(results), "--device", "cpu", "--no-progress",
            "--profile", str(tmp_path / "prof")]
    script = load_script()
    # The file is written after each recipe: a run cut short after the first keeps its record.
    real = script.Trainer
    calls = []

    def cut_after_first(*a, **k):
        calls.append(1)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(script, "Trainer", cut_after_first)
    with pytest.raises(KeyboardInterrupt):
        script.main([*args, "--recipe", "bf16,mxfp4"])
    (record,) = read_results(results)["records"]
    assert record["recipe"] == "bf16" and record["timed_steps"] == 3 and record["tokens_per_s"] > 0
    assert record["untimed_s"] > 0 and record["compile_mode"] is None  # not compiled
    assert len(record["untimed_step_s"]) == 2 and all(t > 0 for t in record["untimed_step_s"])
    assert 0 <= record["build_s"] < record["untimed_s"]
    assert record["mfu"] is None  # no peak FLOP/s for a CPU
    assert record["peak_allocated_gib"] is None and record["memory_at_start"] is None  # CUDA only
    assert record["allocator_at_start"] is None
    assert record["untimed_peak_allocated_gib"] is None
    assert record["config"]["steps"] == 2 + 3 + script.PROFILE_STEPS
    assert "training steps" in (tmp_path / "prof" / "profile_tiny_bf16.txt").read_text()
    # The same command again completes and replaces that file; another configuration is refused.
    monkeypatch.setattr(script, "Trainer", real)
    script.main([*args, "--recipe", "bf16,mxfp4"])
    assert [r["recipe"] for r in read_results(results)["records"]] == ["bf16", "mxfp4"]
    assert not (tmp_path / "throughput-partial.json").exists()
    with pytest.raises(ResultsConflict):
        script.main([*args, "--recipe", "bf16"])
    # A rerun cut short leaves the complete file as it was and writes what it measured beside it.
    complete = results.read_text()
    calls.clear()
    monkeypatch.setattr(script, "Trainer", cut_after_first)
    with pytest.raises(KeyboardInterrupt):
        script.main([*args, "--recipe", "bf16,mxfp4"])
    assert results.read_text() == complete
    assert [r["recipe"] for r in read_results(tmp_path / "throughput-partial.json")["records"]] == ["bf16"]


def test_throughput_builds_each_recipe_after_the_last_is_freed(profile, tmp_path, monkeypatch):
    # A recipe's trainer held into the next recipe (by the signal handler, or by a reference cycle
    # that no collection has reached yet) stays beside it on the GPU: at 3b, 47 GB of state.
    script = load_script()
    real, built, alive_at_build = script.Trainer, [], []

    def cyclic(*a, **k):
        alive_at_build.append([ref() is not None for ref in built])
        trainer = real(*a, **k)
        trainer.self_reference = trainer  # a cycle: refcounting alone never frees it
        built.append(weakref.ref(trainer))
        return trainer

    monkeypatch.setattr(script, "Trainer", cyclic)
    script.main(["--config", str(profile), "--throughput-only", "--model", "tiny", "--vocab-size", "512",
                 "--untimed-steps", "1", "--steps", "1", "--device", "cpu", "--no-progress",
                 "--recipe", "bf16,mxfp4", "--results", str(tmp_path / "throughput.json")])
    assert alive_at_build == [[], [False]]
    records = read_results(tmp_path / "throughput.json")["records"]
    assert [r["allocated_before_gib"] for r in records] == [None, None]  # CUDA only


def test_throughput_records_a_recipe_out_of_memory_and_measures_the_next(profile, tmp_path, monkeypatch):
    # A recipe too large for the GPU at this size is a finding of the stage, not its end: the
    # recipes after it are still measured and the file says where it ran out.
    script = load_script()
    real = script.Trainer

    class OutOfMemoryInMxfp4(real):
        def run(self, until=None):
            if self.cfg.recipe == "mxfp4":  # its first untimed step fits, its second does not
                super().run(until=1)
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 96.00 MiB. GPU 0 has ...\nmore")
            return super().run(until=until)

    monkeypatch.setattr(script, "Trainer", OutOfMemoryInMxfp4)
    results = tmp_path / "throughput.json"
    assert script.main(["--config", str(profile), "--throughput-only", "--model", "tiny", "--vocab-size", "512",
                        "--untimed-steps", "2", "--steps", "1", "--device", "cpu", "--no-progress",
                        "--recipe", "bf16,mxfp4,uniform-iht", "--results", str(results)]) == 0
    bf16, oom, iht = read_results(results)["records"]
    assert bf16["tokens_per_s"] > 0 and iht["tokens_per_s"] > 0 and "error" not in iht
    assert oom["recipe"] == "mxfp4" and oom["error"] == "out of memory" and "tokens_per_s" not in oom
    assert oom["failed_at"] == "in step 2 (untimed)"
    assert oom["message"] == "CUDA out of memory. Tried to allocate 96.00 MiB. GPU 0 has ..."
    assert oom["config"]["recipe"] == "mxfp4" and oom["batch_size"] == bf16["batch_size"]


def test_throughput_sigterm_records_the_recipe_in_progress_at_once_and_after_its_step(profile, tmp_path,
                                                                                      monkeypatch, capsys):
    # A compiling step can outlast a scheduler's grace period (Slurm's KillWait): the record of
    # where the recipe stood is written at the signal, before the step ends, then again after it.
    script = load_script()
    real, seen_mid_step = script.Trainer, []
    results = tmp_path / "throughput.json"

    class SignalledInMxfp4(real):
        def train_step(self):
            if self.cfg.recipe == "mxfp4" and self.step == 1:  # inside its second step
                signal.raise_signal(signal.SIGTERM)  # the handler runs now, as it would mid-compile
                seen_mid_step.append(read_results(results)["records"])
            return super().train_step()

    monkeypatch.setattr(script, "Trainer", SignalledInMxfp4)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        status = script.main(["--config", str(profile), "--throughput-only", "--model", "tiny", "--vocab-size", "512",
                              "--untimed-steps", "3", "--steps", "1", "--device", "cpu", "--no-progress",
                              "--recipe", "bf16,mxfp4,uniform-iht", "--results", str(results)])
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert status == script.EXIT_STOPPED
    assert f"{results} holds the recipes measured and where mxfp4 stopped" in capsys.readouterr().err
    [[bf16, early]] = seen_mid_step
    assert bf16["recipe"] == "bf16" and bf16["tokens_per_s"] > 0
    assert early["recipe"] == "mxfp4" and early["error"] == "stopped" and early["reason"] == "signal SIGTERM"
    assert early["failed_at"] == "in step 2 (untimed)" and len(early["step_s"]) == 1 and early["step_running_s"] >= 0
    records = read_results(results)["records"]
    assert [r["recipe"] for r in records] == ["bf16", "mxfp4"]  # uniform-iht never began
    final = records[1]
    assert final["failed_at"] == "after step 2 (untimed)" and final["step_running_s"] is None
    assert len(final["step_s"]) == 2 and all(t > 0 for t in final["step_s"]) and "tokens_per_s" not in final
    assert final["config"]["recipe"] == "mxfp4" and final["batch_size"] == bf16["batch_size"]
    assert final["compile_phase_s"] == {}  # not compiled


class Halves:
    """Splits each batch of a source into two micro-batches of half the sequences."""

    def __init__(self, source):
        self.source, self.pending = source, []

    def __next__(self):
        if not self.pending:
            x, y = next(self.source)
            half = x.shape[0] // 2
            self.pending = [(x[:half], y[:half]), (x[half:], y[half:])]
        return self.pending.pop(0)


@pytest.mark.parametrize("recipe, flag, compiled", [("bf16", None, True), ("adahop", None, False),
                                                    ("adahop", "--compile", True), ("bf16", "--no-compile", False)])
def test_profile_compiles_only_its_compile_recipes_unless_told(tmp_path, recipe, flag, compiled):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"pretrain": {"compile": True, "compile_recipes": ["bf16"], "steps": 3}}))
    script = load_script()
    args = script.parse_args(["--config", str(path), "--recipe", recipe, "--data", "d", "--out", "o",
                              *([flag] if flag else [])])
    assert script.resolve_config(args).compile is compiled


def test_grad_accumulation_matches_the_full_batch():
    """2 micro-batches of 2 sequences against 1 batch of the same 4: the same steps up to float
    summation order."""
    cfg = TrainConfig(**{**SMALL, "steps": 3, "eval_interval": 0})
    full = Trainer(cfg, 512, RandomTokenBatches(512, 64, 4, seed=3), device="cpu", progress=False).run()
    accum_cfg = TrainConfig(**{**SMALL, "steps": 3, "eval_interval": 0, "batch_size": 2, "grad_accum": 2})
    accum = Trainer(accum_cfg, 512, Halves(RandomTokenBatches(512, 64, 4, seed=3)), device="cpu",
                    progress=False).run()
    np.testing.assert_allclose([r["loss"] for r in accum], [r["loss"] for r in full], rtol=1e-5)
    np.testing.assert_allclose([r["grad_norm"] for r in accum], [r["grad_norm"] for r in full], rtol=1e-4)
    assert [r["tokens"] for r in accum] == [r["tokens"] for r in full]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("recipe", ["bf16", "mxfp4"])
def test_grad_accumulation_under_cuda_graphs_matches_compiled_without_them(recipe):
    """2 micro-batches a step replayed from CUDA graphs against the same steps compiled without
    graphs: each replay's gradients are added into the kept .grad, none is overwritten by the next."""
    runs = {}
    for mode in ("default", "reduce-overhead"):
        torch._dynamo.reset()
        cfg = TrainConfig(**{**SMALL, "steps": 4, "eval_interval": 0, "checkpoint_interval": 0, "batch_size": 2,
                             "grad_accum": 2, "recipe": recipe, "compile": True, "compile_mode": mode})
        trainer = Trainer(cfg, 512, Halves(RandomTokenBatches(512, 64, 4, seed=3)), device="cuda", progress=False)
        assert trainer.keep_grads == (mode == "reduce-overhead")
        runs[mode] = trainer.run()
    graphs, plain = runs["reduce-overhead"], runs["default"]
    np.testing.assert_allclose([r["loss"] for r in graphs], [r["loss"] for r in plain], rtol=1e-5)
    np.testing.assert_allclose([r["grad_norm"] for r in graphs], [r["grad_norm"] for r in plain], rtol=1e-4)


def test_random_token_batches_resume():
    a = RandomTokenBatches(100, 8, 2, seed=1)
    next(a)
    b = RandomTokenBatches(100, 8, 2, seed=1)
    b.load_state_dict(a.state_dict())
    assert all(torch.equal(u, v) for u, v in zip(next(a), next(b)))


@pytest.mark.parametrize("recipe", ["mxfp4", "adahop"])
def test_quantized_recipes_train_and_resume_with_strategies(corpus, tmp_path, recipe):
    overrides = {"recipe_overrides": {"calibration_steps": 2}} if recipe == "adahop" else {}
    trainer = make_trainer(corpus, tmp_path / "run", recipe=recipe, steps=4, checkpoint_interval=4, **overrides)
    trainer.run()
    rows = losses(tmp_path / "run")
    assert all(math.isfinite(v) for v in rows.values()) and rows[4] < rows[1]
    strategies = json.loads((tmp_path / "run" / "strategies.json").read_text())
    assert strategies == adahop.export_strategies(trainer.model)
    hf = load_hf(export_hf(trainer.model, corpus / "tokenizer.json", tmp_path / "hf"))
    assert torch.equal(hf.model.layers[0].mlp.up_proj.weight, trainer.model.model.layers[0].mlp.up_proj.weight)
    if recipe == "adahop":
        assert all(layer["phase"] == "fixed" for layer in strategies.values()), "calibration did not finish"
        resumed = make_trainer(corpus, tmp_path / "run", recipe=recipe, steps=4, checkpoint_interval=4, **overrides)
        assert adahop.export_strategies(resumed.model) == strategies


def test_recalibrating_run_resumed_mid_window_matches_the_straight_run(corpus, tmp_path):
    """adahop-recal with 2 calibration steps and an interval of 4: fixes at steps 2, 8 and 12; a
    run killed at step 7 (inside the step 6-7 window, last checkpoint at 6) resumes on the same curve
    and the same fixes."""
    overrides = {"recipe": "adahop-recal", "steps": 12, "checkpoint_interval": 2, "eval_interval": 0,
                 "recipe_overrides": {"calibration_steps": 2, "recalibration_interval": 4}}
    straight = make_trainer(corpus, tmp_path / "straight", **overrides)
    straight.run()
    fixes = adahop.linear.strategy_fixes(straight.model)
    assert [f["step"] for f in fixes] == [2, 8, 12]
    assert all(f["layers"] == len(list(adahop.linear.quant_layers(straight.model))) for f in fixes)

    killed = make_trainer(corpus, tmp_path / "killed", **overrides)
    killed.model.model.layers[0].register_forward_hook(StepHook(at_step=8, action="kill"))
    with pytest.raises(KeyboardInterrupt):
        killed.run()
    resumed = make_trainer(corpus, tmp_path / "killed", **overrides)
    assert resumed.step == 6 and {m.phase for _, m in adahop.linear.quant_layers(resumed.model)} == {"recalibrating"}
    resumed.run()
    assert losses(tmp_path / "killed") == losses(tmp_path / "straight")  # bit-for-bit on CPU
    assert adahop.linear.strategy_fixes(resumed.model) == fixes


@pytest.mark.distributed
def test_ddp_gloo_two_ranks_matches_one_process(corpus, profile, tmp_path):
    """2 ranks × 2 sequences against 1 process × 4 sequences: the same global batch, so the same
    loss curve up to the order of the float reductions (DDP averages two half-batch gradients)."""
    common = ["--config", str(profile), "--model", "tiny", "--data", str(corpus), "--steps", "4",
              "--checkpoint-interval", "0", "--device", "cpu", "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                    str(SCRIPT), *common, "--batch-size", "2", "--out", str(tmp_path / "ddp"),
                    "--results", str(tmp_path / "ddp.json")], check=True, env=env, cwd=REPO_ROOT, timeout=300)
    load_script().main([*common, "--batch-size", "4", "--out", str(tmp_path / "one"),
                        "--results", str(tmp_path / "one.json")])
    two, one = losses(tmp_path / "ddp"), losses(tmp_path / "one")
    assert list(two) == list(one) == [1, 2, 3, 4]
    np.testing.assert_allclose(list(two.values()), list(one.values()), rtol=1e-5)
    assert read_results(tmp_path / "ddp.json")["records"][0]["world_size"] == 2


# --------------------------------------------------------------------------- torchao float8 peers


@pytest.mark.parametrize("peer, scaling", [("float8-rowwise", "axiswise"), ("float8-tensorwise", "tensorwise")])
def test_float8_peer_converts_every_block_linear_but_not_the_lm_head_and_trains(peer, scaling):
    """torchao runs float8 training on a CPU too (torch._scaled_mm), so the peer's steps run here."""
    from torchao.float8.float8_linear import Float8Linear

    # One sequence of 16 tokens a step: torch._scaled_mm on a CPU takes time in proportion to the
    # tokens, and 16 is a multiple of 16, as it requires of a GEMM's dimensions on a GPU.
    cfg = TrainConfig(**{**SMALL, "recipe": peer, "steps": 3, "eval_interval": 0, "batch_size": 1, "seq_len": 16})
    trainer = Trainer(cfg, 512, RandomTokenBatches(512, 16, 1, seed=3), device="cpu", progress=False)
    assert trainer.peer == "torchao" and trainer.recipe is None and trainer.calibration_windows() == []
    reference = adahop.harness.model.Llama(trainer.model_config)
    block_linears = {n for n, m in reference.named_modules() if type(m) is torch.nn.Linear and n != "lm_head"}
    converted = {n: m for n, m in trainer.model.named_modules() if isinstance(m, Float8Linear)}
    assert set(converted) == block_linears and len(block_linears) == 7 * trainer.model_config.n_layers
    assert type(trainer.model.lm_head) is torch.nn.Linear
    assert {m.config.cast_config_weight.scaling_granularity.value for m in converted.values()} == {scaling}
    assert not list(adahop.linear.quant_layers(trainer.model))  # no adahop layer beside torchao's
    history = trainer.run()
    assert len(history) == 3 and all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in history)


def hide_torchao(monkeypatch):
    """As on a machine without torchao: importing it fails."""
    for name in [m for m in sys.modules if m == "torchao" or m.startswith("torchao.")] + ["torchao"]:
        monkeypatch.setitem(sys.modules, name, None)


def test_float8_peer_without_torchao_is_a_clear_error_before_anything_runs(profile, tmp_path, monkeypatch):
    hide_torchao(monkeypatch)
    cfg = TrainConfig(**{**SMALL, "recipe": "float8-rowwise"})
    with pytest.raises(ImportError, match=r"'float8-rowwise' is torchao's float8 training, but torchao is not importable"):
        Trainer(cfg, 512, RandomTokenBatches(512, 64, 4), device="cpu", progress=False)
    # The throughput run stops before its first recipe (bf16, which needs no torchao) is measured.
    results = tmp_path / "t.json"
    with pytest.raises(ImportError, match="torchao is not importable"):
        load_script().main(["--config", str(profile), "--throughput-only", "--model", "tiny", "--vocab-size", "256",
                            "--recipe", "bf16,float8-tensorwise", "--untimed-steps", "1", "--steps", "1",
                            "--results", str(results), "--device", "cpu", "--no-progress"])
    assert not results.exists()
    with pytest.raises(ValueError, match="unknown recipe 'float8'.*float8-rowwise"):
        Trainer(TrainConfig(**{**SMALL, "recipe": "float8"}), 512, RandomTokenBatches(512, 64, 4), device="cpu")


def test_throughput_records_mark_the_torchao_peer_and_its_version(profile, tmp_path):
    import torchao

    results = tmp_path / "t.json"
    # 16 tokens a step (as in the test above): the float8 steps' CPU GEMMs take time in proportion to them.
    load_script().main(["--config", str(profile), "--throughput-only", "--model", "tiny", "--vocab-size", "256",
                        "--recipe", "bf16,float8-rowwise", "--untimed-steps", "1", "--steps", "2",
                        "--batch-size", "1", "--seq-len", "16",
                        "--results", str(results), "--device", "cpu", "--no-progress"])
    doc = read_results(results)
    assert [(r["recipe"], r["peer"]) for r in doc["records"]] == [("bf16", None), ("float8-rowwise", "torchao")]
    assert doc["provenance"]["versions"]["torchao"] == torchao.__version__
    assert all(set(r["compile_cache_files"]) == {"triton", "inductor"} for r in doc["records"])
    assert all(r["compile_phase_s"] == {} for r in doc["records"])  # nothing compiled: no phases
    assert all(r["gpu_busy"] is None and r["fsdp"] is False for r in doc["records"])  # a CPU has no GPU time
    assert doc["provenance"]["config"]["busy_steps"] == 5


# --------------------------------------------------------------------------- GPU-busy share


def test_busy_split_counts_overlapping_device_records_once():
    script = load_script()
    # two overlapping kernels (streams), one after a gap, one inside the first
    split = script.busy_split([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0), (0.5, 1.0)], wall_s=10.0)
    assert split == pytest.approx({"wall_s": 10.0, "kernel_s": 2.0 + 2.0 + 1.0 + 0.5, "busy_s": 3.0 + 1.0,
                                   "busy_fraction": 0.4})
    assert script.busy_split([], wall_s=1.0)["busy_fraction"] == 0.0  # an idle device
    with pytest.raises(ValueError, match="wall_s must be > 0"):
        script.busy_split([(0.0, 1.0)], wall_s=0.0)
    with pytest.raises(ValueError, match="ends before it starts"):
        script.busy_split([(2.0, 1.0)], wall_s=3.0)


def test_device_intervals_reads_the_profilers_events_of_one_device():
    """The profiler's event records as measure_busy reads them (CPU events here: this machine has no GPU)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        torch.randn(256, 256) @ torch.randn(256, 256)
        wall = time.perf_counter() - start
    cpu = load_script().device_intervals(prof, DeviceType.CPU)
    assert cpu and all(0 <= a < b for a, b in cpu)
    assert 0 < load_script().busy_split(cpu, wall + 1.0)["busy_s"] <= wall + 1.0
    assert load_script().device_intervals(prof) == []  # no CUDA records without a GPU


def _segment(pool, blocks):
    return {"segment_pool_id": pool, "total_size": sum(size for size, _ in blocks),
            "active_size": sum(size for size, state in blocks if state != "inactive"),
            "blocks": [{"size": size, "state": state} for size, state in blocks]}


def test_allocator_summary_splits_reserved_into_tensors_and_cache_per_pool():
    from adahop.harness.train import allocator_summary

    gib = 2**30
    snapshot = {"segments": [
        _segment((0, 0), [(1 * gib, "active_allocated"), (gib // 2, "inactive")]),
        _segment((1, 7), [(2 * gib, "active_allocated"), (gib, "inactive"), (gib // 4, "active_awaiting_free")]),
        _segment((1, 7), [(3 * gib, "inactive")]),
    ]}
    s = allocator_summary(snapshot)
    assert (s["segments"], s["reserved_gib"], s["active_gib"], s["inactive_gib"]) == (3, 7.75, 3.25, 4.5)
    assert s["largest_inactive_gib"] == 3.0
    graph, default = s["pools"]  # largest reserved first
    assert graph == {"pool": "(1, 7)", "segments": 2, "reserved_gib": 6.25, "active_gib": 2.25, "inactive_gib": 4.0,
                     "largest_inactive_gib": 3.0}
    assert default["pool"] == "(0, 0)" and default["inactive_gib"] == 0.5 and default["largest_inactive_gib"] == 0.5
    assert allocator_summary({"segments": []})["reserved_gib"] == 0 and allocator_summary({"segments": []})["pools"] == []


@pytest.mark.parametrize("bad", [None, [], {"device_traces": []}, {"segments": {}}])
def test_allocator_summary_refuses_what_is_not_a_snapshot(bad):
    from adahop.harness.train import allocator_summary

    with pytest.raises(ValueError, match="snapshot must be the dict of torch.cuda.memory._snapshot"):
        allocator_summary(bad)


def test_memory_snapshot_is_for_cuda_throughput_runs(profile, tmp_path, capsys):
    script = load_script()
    base = ["--config", str(profile), "--model", "tiny", "--vocab-size", "512", "--device", "cpu", "--no-progress",
            "--memory-snapshot", str(tmp_path / "snap")]
    with pytest.raises(SystemExit):
        script.main([*base, "--data", str(tmp_path), "--out", str(tmp_path / "run")])
    assert "--memory-snapshot is for --throughput-only" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--memory-snapshot records the CUDA caching allocator; this run's device is cpu"):
        script.main([*base, "--throughput-only", "--results", str(tmp_path / "t.json")])
    assert not (tmp_path / "snap").exists() and not (tmp_path / "t.json").exists()


def test_cli_recipe_overrides_reach_the_quantized_recipes(profile, tmp_path, capsys, monkeypatch):
    """``--recipe-override weight_cache=true`` with gradient accumulation: every micro-batch after
    the first reads the weights the step quantized; the record keeps the overrides it ran with."""
    results = tmp_path / "t.json"
    script = load_script()
    refreshed = []
    real = adahop.refresh_weights
    monkeypatch.setattr(adahop, "refresh_weights", lambda model, dtype=None: refreshed.append((dtype, real(model, dtype))))
    script.main(["--config", str(profile), "--throughput-only", "--model", "tiny", "--vocab-size", "512",
                 "--untimed-steps", "1", "--steps", "2", "--grad-accum", "2", "--results", str(results),
                 "--device", "cpu", "--no-progress", "--recipe", "bf16,mxfp4",
                 "--recipe-override", "weight_cache=true", "--recipe-override", "outlier_k=32"])
    bf16, mxfp4 = read_results(results)["records"]
    assert mxfp4["config"]["recipe_overrides"] == {"weight_cache": True, "outlier_k": 32}
    assert mxfp4["config"]["grad_accum"] == 2 and mxfp4["tokens_per_s"] > 0
    # The trainer filled mxfp4's caches (each layer's) before its first step; bf16 has none.
    assert [d for d, _ in refreshed] == [torch.float32] * 2 and refreshed[0][1] == 0 and refreshed[1][1] > 0
    with pytest.raises(SystemExit):
        script.main(["--config", str(profile), "--throughput-only", "--results", str(results),
                     "--recipe-override", "weight_cache"])
    assert "--recipe-override takes FIELD=VALUE, got 'weight_cache'" in capsys.readouterr().err
