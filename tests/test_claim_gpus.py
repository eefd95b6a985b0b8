"""experiments/claim_gpus.py: each GPU job of the workflow on GPUs no other job holds.

A fake ``nvidia-smi`` on PATH stands for a machine's GPUs; the locks are real (flock).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "experiments" / "claim_gpus.py"
spec = importlib.util.spec_from_file_location("claim_gpus", SCRIPT)
claim_gpus = importlib.util.module_from_spec(spec)
spec.loader.exec_module(claim_gpus)

GPUS = ["GPU-aaaa", "GPU-bbbb", "GPU-cccc"]
PRINT_GPUS = [sys.executable, "-c", "import os; print(os.environ.get('CUDA_VISIBLE_DEVICES', 'unset'))"]


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """An environment whose nvidia-smi lists GPUS, with its own lock folder."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + "".join(f"echo {g}\n" for g in GPUS))
    smi.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "ADAHOP_GPU_LOCKS")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", ADAHOP_GPU_LOCK_DIR=str(tmp_path / "locks"))
    (tmp_path / "locks").mkdir()
    return env


def run(env, *command, count=1):
    return subprocess.run([sys.executable, str(SCRIPT), str(count), "--", *command], env=env, capture_output=True,
                          text=True, timeout=60)


def close(held):
    for _, fd in held:
        os.close(fd)


def test_claims_take_free_gpus_in_order_and_all_or_nothing(tmp_path):
    first = claim_gpus.try_claim(GPUS, 2, str(tmp_path))
    assert [g for g, _ in first] == GPUS[:2]
    # Two more are not free: nothing is held, so the third GPU stays free for a one-GPU job.
    assert claim_gpus.try_claim(GPUS, 2, str(tmp_path)) is None
    third = claim_gpus.try_claim(GPUS, 1, str(tmp_path))
    assert [g for g, _ in third] == GPUS[2:]
    close(first)
    again = claim_gpus.try_claim(GPUS, 2, str(tmp_path))
    assert [g for g, _ in again] == GPUS[:2]
    close(again + third)


def test_a_claim_waits_for_a_free_gpu_then_gives_up_at_its_timeout(tmp_path):
    held = claim_gpus.try_claim(GPUS, 3, str(tmp_path))
    with pytest.raises(TimeoutError, match="no 1 free GPUs within 0.2 s"):
        claim_gpus.claim(1, GPUS, str(tmp_path), poll_s=0.05, timeout_s=0.2)
    close(held)
    assert [g for g, _ in claim_gpus.claim(1, GPUS, str(tmp_path), timeout_s=0.2)] == GPUS[:1]


def test_more_gpus_than_the_machine_has_is_refused(machine):
    with pytest.raises(ValueError, match="asks for 4 GPUs; this machine has 3"):
        claim_gpus.claim(4, GPUS, "/nonexistent")
    out = run(machine, *PRINT_GPUS, count=4)
    assert out.returncode != 0 and "asks for 4 GPUs; this machine has 3" in out.stderr


def test_concurrent_jobs_get_different_gpus_and_a_finished_job_frees_its_own(machine):
    holder = subprocess.Popen([sys.executable, str(SCRIPT), "2", "--", sys.executable, "-c",
                               "import os, sys, time; print(os.environ['CUDA_VISIBLE_DEVICES'], flush=True); "
                               "sys.stdin.readline()"],
                              env=machine, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "GPU-aaaa,GPU-bbbb"
        assert run(machine, *PRINT_GPUS).stdout.strip() == "GPU-cccc"
    finally:
        holder.communicate("\n", timeout=60)
    # The locks went with the process that held them; the job's log says which GPUs it ran on.
    out = run(machine, *PRINT_GPUS, count=3)
    assert out.stdout.strip() == ",".join(GPUS)
    assert f"claim_gpus: CUDA_VISIBLE_DEVICES={','.join(GPUS)}" in out.stderr


def test_the_command_replaces_the_launcher(machine):
    # A signal sent to the job (a wall-time limit's SIGTERM) reaches the command itself.
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "1", "--", sys.executable, "-c",
                             "import os; print(os.getpid())"], env=machine, stdout=subprocess.PIPE, text=True)
    assert int(proc.communicate(timeout=60)[0]) == proc.pid


@pytest.mark.parametrize("setting", [{"CUDA_VISIBLE_DEVICES": "3"}, {"ADAHOP_GPU_LOCKS": "0"}])
def test_nothing_is_claimed_where_gpus_are_chosen_already_or_locks_are_off(machine, setting):
    held = claim_gpus.try_claim(GPUS, 3, machine["ADAHOP_GPU_LOCK_DIR"])
    try:  # every GPU held: a claim would wait past run()'s timeout
        assert run({**machine, **setting}, *PRINT_GPUS).stdout.strip() == setting.get("CUDA_VISIBLE_DEVICES", "unset")
    finally:
        close(held)


def test_a_machine_without_gpus_runs_the_command_as_it_is(machine, tmp_path):
    # No nvidia-smi on PATH (the commands are absolute paths).
    assert run({**machine, "PATH": str(tmp_path / "empty")}, *PRINT_GPUS).stdout.strip() == "unset"


@pytest.mark.parametrize(("argv", "match"), [(["0", "--", "true"], "count must be at least 1"),
                                             (["1"], "no command to run"), (["1", "--"], "no command to run")])
def test_bad_arguments_are_refused(argv, match, capsys):
    with pytest.raises(SystemExit):
        claim_gpus.parse_args(argv)
    assert match in capsys.readouterr().err


def test_a_lock_folder_is_made_and_an_unusable_one_is_named(machine, tmp_path):
    fresh = tmp_path / "new" / "locks"
    assert run({**machine, "ADAHOP_GPU_LOCK_DIR": str(fresh)}, *PRINT_GPUS).stdout.strip() == GPUS[0]
    assert fresh.is_dir()
    blocked = tmp_path / "file"
    blocked.write_text("")
    out = run({**machine, "ADAHOP_GPU_LOCK_DIR": str(blocked / "locks")}, *PRINT_GPUS)
    assert out.returncode != 0 and str(blocked / "locks") in out.stderr, out.stderr

