"""Run a command on GPUs that no other job of this machine holds.

    python experiments/claim_gpus.py N -- python experiments/pretrain.py ...

The workflow starts every GPU stage through this launcher. Snakemake's ``gpu`` resource bounds how
many GPUs the running jobs ask for in all (``--resources gpu=8`` on an eight-GPU machine; the
default profile allows 1); this picks which: it takes an exclusive lock on N GPUs' lock files
(``flock``, keyed on each GPU's UUID) and replaces itself with the command, with
``CUDA_VISIBLE_DEVICES`` naming those GPUs. The command inherits the locks, so they last exactly
as long as it runs, however it ends; a signal (a wall-time limit's SIGTERM) reaches it directly.
Where every GPU is held it waits for one.

Nothing is claimed where ``CUDA_VISIBLE_DEVICES`` is already set (a Slurm job's GPUs, or a choice
of your own), where ``nvidia-smi`` lists no GPU (a CPU machine), or with ``ADAHOP_GPU_LOCKS=0``.
The lock files live in ``ADAHOP_GPU_LOCK_DIR`` (default: the system's temporary folder).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import re
import subprocess
import sys
import tempfile
import time

POLL_S = 5.0


def machine_gpus() -> list[str]:
    """The UUID of each GPU ``nvidia-smi`` lists (what CUDA_VISIBLE_DEVICES takes, whatever order
    CUDA numbers the GPUs in); none where it is missing or fails."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=120, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def lock_path(lock_dir: str, uuid: str) -> str:
    return os.path.join(lock_dir, f"adahop-gpu-{re.sub(r'[^A-Za-z0-9_.-]', '_', uuid)}.lock")


def try_claim(gpus: list[str], count: int, lock_dir: str) -> list[tuple[str, int]] | None:
    """Locks on ``count`` of ``gpus`` (``(uuid, open fd)``, in the machine's order), or None,
    holding nothing, where fewer are free: a job asking for several GPUs never sits on part of
    them while it waits."""
    held = []
    for uuid in gpus:
        # Read-only: flock needs no write access, so a lock file another user made still serves.
        path = lock_path(lock_dir, uuid)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
        except OSError as e:
            raise OSError(f"cannot open the GPU lock file {path} ({e.strerror}): set ADAHOP_GPU_LOCK_DIR to a "
                          "folder every user of the machine can write, or ADAHOP_GPU_LOCKS=0") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        held.append((uuid, fd))
        if len(held) == count:
            return held
    for _, fd in held:
        os.close(fd)
    return None


def claim(count: int, gpus: list[str], lock_dir: str, poll_s: float = POLL_S,
          timeout_s: float | None = None) -> list[tuple[str, int]]:
    """Wait until ``count`` of ``gpus`` are free and lock them; TimeoutError after ``timeout_s``."""
    if count > len(gpus):
        raise ValueError(f"the job asks for {count} GPUs; this machine has {len(gpus)}")
    start = time.monotonic()
    told = False
    while (held := try_claim(gpus, count, lock_dir)) is None:
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            raise TimeoutError(f"no {count} free GPUs within {timeout_s:g} s (lock files in {lock_dir})")
        if not told:
            print(f"claim_gpus: waiting for {count} free GPU(s); every GPU's lock in {lock_dir} is held",
                  file=sys.stderr, flush=True)
            told = True
        time.sleep(poll_s)
    return held


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("count", type=int, help="GPUs the command needs")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command and its arguments")
    args = p.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if args.count < 1:
        p.error(f"count must be at least 1, got {args.count}")
    if not args.command:
        p.error("no command to run (give it after --)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if "CUDA_VISIBLE_DEVICES" not in os.environ and os.environ.get("ADAHOP_GPU_LOCKS", "1") != "0":
        gpus = machine_gpus()
        if gpus:
            lock_dir = os.environ.get("ADAHOP_GPU_LOCK_DIR") or tempfile.gettempdir()
            try:
                os.makedirs(lock_dir, exist_ok=True)
                held = claim(args.count, gpus, lock_dir)
            except (ValueError, OSError) as e:
                sys.exit(f"claim_gpus: {e}")
            for _, fd in held:
                os.set_inheritable(fd, True)
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(uuid for uuid, _ in held)
            print(f"claim_gpus: CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']}", file=sys.stderr, flush=True)
    os.execvp(args.command[0], args.command)


if __name__ == "__main__":
    main()
