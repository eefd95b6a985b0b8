"""Pretrain a Llama-style model with one recipe, or measure training throughput of several.

Training (one run; resumes when ``--out`` holds checkpoints)::

    python experiments/pretrain.py --config config/smoke.yaml --model tiny --recipe bf16 --seed 0 \\
        --data data/<corpus> --out runs/<name> [--results results/pretrain/<name>.json] \\
        [--steps N --batch-size B --grad-accum A --seq-len T --lr LR --eval-interval N --max-tokens N --compile]

writes ``<out>/metrics.jsonl``, ``<out>/checkpoints/``, ``<out>/strategies.json``, ``<out>/hf/``
(a ``LlamaForCausalLM`` directory, exported at the end) and the results file (final/best held-out
loss, tokens, tokens/s, MFU, peak memory, loss curve). Several GPUs:
``torchrun --standalone --nproc_per_node=2 experiments/pretrain.py ... [--fsdp]`` (same arguments;
``--batch-size`` is per GPU; DDP, or FSDP2 with ``--fsdp``: checkpoints then hold full state dicts
gathered on rank 0, see :mod:`adahop.harness.train`).

Throughput (random tokens, no eval, no files but the results; rules/throughput.smk runs each run
of the profile's ``throughput`` section this way)::

    python experiments/pretrain.py --config config/gpu.yaml --throughput-only --model 125m \\
        --recipe bf16,float8-tensorwise,float8-rowwise,adahop --seq-len 2048 --batch-size 32 --compile \\
        --steps 20 --results results/throughput/gpu/<run>.json

runs ``--untimed-steps`` (default 40: compilation, warm-up and a recipe's 30 calibration steps)
and then ``--steps`` timed steps for each recipe in turn, in the same process, so every recipe is
measured beside its peers; tokens/s, MFU and peak memory cover the timed steps only (``untimed_s``
says what building the model and the untimed steps took: the compile cost; ``compile_phase_s``, which
of ``torch.compile``'s phases that time went to). Recipes are
adahop's and torchao's float8 training (``float8-tensorwise``, ``float8-rowwise``: records say
``peer: torchao``, the provenance gives torchao's version; without torchao the run stops before
measuring anything).

Where the step time goes (on CUDA, on by default): ``--busy-steps`` (default 5) more steps after
the timed ones run under ``torch.profiler`` recording GPU activity only (CUPTI's kernel, memcpy and
memset records; no CPU op tracing, whose per-op cost would inflate exactly the host time measured).
The record's ``gpu_busy`` gives their wall time, the summed device time of those records, the time
the GPU had at least one running (``busy_s``, the union of their intervals: streams that overlap,
as DDP's gradient all-reduce does, count once) and ``busy_fraction`` = ``busy_s`` / wall time: well
under 1, the GPU waits for the host (Python, launches): a host-bound recipe. Kept off the timed steps
so that tokens/s stays unprofiled; ``profiled_tokens_per_s`` beside it shows what the profiler cost.

Where the memory goes (CUDA): each record's ``allocator_at_start`` splits what was reserved when the
timed steps began into the bytes tensors held and the bytes the caching allocator kept cached, per
memory pool (under CUDA graphs each graph tree's private pool is one). ``--memory-snapshot DIR``
also records the allocator's events through each recipe's untimed steps and writes
``DIR/memory_<model>_<recipe>.pickle``, which https://pytorch.org/memory_viz opens: which
allocation made each block of a pool.

SIGTERM (``timeout``, Slurm, ``torchrun`` forwarding its own) ends training at the next step
boundary: that step is checkpointed and the script exits with status 75 (EX_TEMPFAIL); the same
command resumes there. ``timeout`` sends its SIGTERM twice, to the process and then to its process
group (torchrun's ranks get theirs and the launcher's): a repeat within a few seconds is the same
request; a SIGTERM after that ends the process at once. With ``--throughput-only`` the recipe in
progress gets a record in the results file at once (``error: stopped``, where, the wall time of each
step it finished and how long the step in progress had run: a compiling step can outlast a
scheduler's grace period), written again when that step ends; the script then exits with status 75.
Where ``--results`` already exists, a throughput run writes beside it (``<name>-partial.json``) until
its last recipe is recorded, then replaces it: a rerun cut short leaves the earlier file whole.

Settings come from the ``pretrain`` section of the profile: every key that is a field of
:class:`adahop.harness.train.TrainConfig` is a default, the command line overrides it; ``compile_recipes``
limits the profile's ``compile: true`` to the recipes it names; other keys of the section are the
workflow's (the profile's schema checks them).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import signal
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import yaml

from adahop.harness.data import read_meta
from adahop.linear import strategy_fixes
from adahop.harness.model import REFERENCE_VOCAB, export_hf
from adahop.harness.provenance import (
    check_replaceable,
    compile_cache_files,
    compile_seconds,
    compile_seconds_since,
    partial_path,
    write_results,
)
from adahop.harness.train import (
    COMPILE_MODES,
    RandomTokenBatches,
    TrainConfig,
    Trainer,
    TrainingStopped,
    check_recipe,
    corpus_batches,
    init_distributed,
    read_vocab_size,
    summarize,
)

# Exit status of a run stopped on SIGTERM after checkpointing (EX_TEMPFAIL: run it again to resume).
EXIT_STOPPED = 75


class StopOnSignal:
    """While installed, SIGTERM asks the watched trainer to stop after its current step
    (:meth:`Trainer.request_stop`). A repeat within ``repeat_grace_s`` of the first is the same
    request (``timeout`` signals the process and then its group, so every process gets two in a
    row; resetting the handler on the first would let the second kill the run before its checkpoint
    whenever the handler runs between them); a later one gets the default action (the process ends)."""

    def __init__(self, repeat_grace_s: float = 5.0) -> None:
        self.reason: str | None = None
        self.trainer: Trainer | None = None
        # Called with the reason at the first signal, after the trainer was asked to stop: the
        # throughput stage writes what the recipe in progress has done, which a hard kill after a
        # grace period shorter than the step in progress (Slurm's KillWait) would otherwise lose.
        self.on_request: Callable[[str], None] | None = None
        self.repeat_grace_s = repeat_grace_s
        self.first_at: float | None = None
        self.previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        now = time.monotonic()
        if self.first_at is not None:
            if now - self.first_at > self.repeat_grace_s:
                signal.signal(signum, signal.SIG_DFL)
                signal.raise_signal(signum)
            return
        self.first_at = now
        self.reason = f"signal {signal.Signals(signum).name}"
        if self.trainer is not None:
            self.trainer.request_stop(self.reason)
        if self.on_request is not None:
            try:
                self.on_request(self.reason)
            except Exception as err:  # noqa: BLE001 - the step in progress must not end on it
                print(f"pretrain: could not record the stop request: {err!r}", file=sys.stderr)

    def watch(self, trainer: Trainer) -> Trainer:
        """Route the signal to ``trainer`` (one that arrived before it existed applies at once)."""
        self.trainer = trainer
        if self.reason:
            trainer.request_stop(self.reason)
        return trainer

    def restore(self) -> None:
        """Put the previous handler back and let the trainer go (its DDP reducer must be freed
        before the process group is destroyed, not at interpreter exit, where gloo deadlocks).
        After a SIGTERM the handler stays: the process is ending on it, and a repeat still due
        must not kill it before it exits with its status."""
        if self.first_at is None:
            signal.signal(signal.SIGTERM, self.previous)
        self.release()

    def release(self) -> None:
        """Let the watched trainer go (a signal until the next :meth:`watch` stops nothing), and
        forget :attr:`on_request`, which described it."""
        self.trainer, self.on_request = None, None


# Keys of the profile's pretrain section the script reads besides TrainConfig's fields.
SECTION_KEYS = ("compile_recipes",)

# Command-line flags that override TrainConfig fields of the same name.
OVERRIDES = ("model", "recipe", "seed", "steps", "batch_size", "grad_accum", "seq_len", "lr", "warmup_steps",
             "eval_interval", "eval_batches", "checkpoint_interval", "max_tokens", "compile", "compile_mode", "precision", "fsdp")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="profile YAML (its 'pretrain' section)")
    p.add_argument("--data", help="corpus directory (train.bin, val.bin, meta.json, tokenizer.json)")
    p.add_argument("--out", help="run directory (metrics, checkpoints, strategies, hf export)")
    p.add_argument("--results", help="results JSON (default results/pretrain/<name of --out>.json)")
    p.add_argument("--model")
    p.add_argument("--recipe", help="a recipe name; with --throughput-only a comma-separated list")
    p.add_argument("--seed", type=int)
    p.add_argument("--steps", type=int)
    p.add_argument("--batch-size", type=int, help="sequences per micro-batch per rank")
    p.add_argument("--grad-accum", type=int)
    p.add_argument("--seq-len", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--warmup-steps", type=int)
    p.add_argument("--eval-interval", type=int)
    p.add_argument("--eval-batches", type=int)
    p.add_argument("--checkpoint-interval", type=int)
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--precision", choices=("auto", "bf16", "fp32"))
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--compile-mode", choices=COMPILE_MODES,
                   help="torch.compile mode with --compile (reduce-overhead: CUDA graphs; default: the profile's)")
    p.add_argument("--fsdp", action=argparse.BooleanOptionalAction, default=None,
                   help="several ranks: FSDP2 (fully_shard per block, then the root) in place of DDP")
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when there is a GPU")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--throughput-only", action="store_true", help="random tokens, timed steps, no files")
    p.add_argument("--untimed-steps", type=int, default=40, help="throughput: steps run before timing")
    p.add_argument("--busy-steps", type=int, default=BUSY_STEPS,
                   help="throughput on CUDA: steps after the timed ones whose GPU-busy share of wall time is "
                        "measured (kernel-only torch.profiler); 0: not measured")
    p.add_argument("--profile", type=Path, metavar="DIR",
                   help="throughput: after the timed steps, profile 3 more (torch.profiler) and write "
                        "DIR/profile_<model>_<recipe>.txt, the kernels and ops by GPU and by self-CPU time")
    p.add_argument("--memory-snapshot", type=Path, metavar="DIR",
                   help="throughput on CUDA: record the allocator's history through each recipe's untimed steps "
                        "and write DIR/memory_<model>_<recipe>.pickle (open it at https://pytorch.org/memory_viz)")
    p.add_argument("--recipe-override", action="append", default=[], metavar="FIELD=VALUE",
                   help="a recipe field for every quantized recipe (YAML value), over the profile's "
                        "recipe_overrides; repeatable, e.g. --recipe-override weight_cache=true")
    p.add_argument("--vocab-size", type=int, help=f"throughput without --data (default {REFERENCE_VOCAB})")
    args = p.parse_args(argv)
    for name in ("untimed_steps", "busy_steps"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if not args.throughput_only and (args.data is None or args.out is None):
        p.error("--data and --out are required (unless --throughput-only)")
    if args.throughput_only and args.results is None:
        p.error("--throughput-only needs --results")
    if args.memory_snapshot is not None and not args.throughput_only:
        p.error("--memory-snapshot is for --throughput-only")
    args.recipe_overrides = {}
    for item in args.recipe_override:
        field, sep, value = item.partition("=")
        if not sep or not field:
            p.error(f"--recipe-override takes FIELD=VALUE, got {item!r}")
        args.recipe_overrides[field] = yaml.safe_load(value)
    return args


def resolve_config(args: argparse.Namespace, **forced: Any) -> TrainConfig:
    """Profile section ``pretrain`` (TrainConfig fields, ``compile_recipes``), then command-line
    overrides (``--compile``/``--no-compile`` win over ``compile_recipes``)."""
    profile = yaml.safe_load(Path(args.config).read_text()) or {}
    section = profile.get("pretrain") or {}
    overrides = {k: getattr(args, k) for k in OVERRIDES if getattr(args, k) is not None}
    if getattr(args, "recipe_overrides", None):
        overrides["recipe_overrides"] = {**(section.get("recipe_overrides") or {}), **args.recipe_overrides}
    return TrainConfig.from_section(section, **{**overrides, **forced})


def run_training(args: argparse.Namespace, stop: StopOnSignal) -> None:
    info, device = init_distributed(args.device)
    cfg = resolve_config(args)
    vocab_size, train_batches, eval_batches = corpus_batches(args.data, cfg, info)
    trainer = stop.watch(Trainer(cfg, vocab_size, train_batches, eval_batches, out_dir=args.out, dist_info=info,
                                 device=device, progress=not args.no_progress))
    history = trainer.run()
    exported = trainer.export_model()  # under FSDP every rank takes part in gathering the weights
    if not info.is_main:
        return
    out = Path(args.out)
    meta = read_meta(args.data)
    export_hf(exported, Path(args.data) / "tokenizer.json", out / "hf",
              bos_token=meta.get("bos_token"), eos_token=meta.get("eos_token"))
    name = out.name
    results = Path(args.results) if args.results else Path("results/pretrain") / f"{name}.json"
    record = {
        "name": name,
        "model": cfg.model,
        "recipe": cfg.recipe,
        "params": trainer.model_config.num_params(),
        "world_size": info.world_size,
        "fsdp": cfg.fsdp,
        "peer": trainer.peer,
        "tokens_per_step": trainer.tokens_per_step,
        "run_dir": str(out),
        # the data it was trained and evaluated on (meta.json's digests of the shards and tokenizer)
        "data_sha256": meta.get("sha256"),
        # the commits that trained it: more than one entry where the run was resumed
        "segments": trainer.segments,
        # when calibrating layers fixed their strategies (again, for a recalibrating recipe), and to what
        "strategy_fixes": strategy_fixes(trainer.model),
        **summarize(history, calibration_windows=trainer.calibration_windows()),
    }
    write_results(results, [record], config={**dataclasses.asdict(cfg), "data": str(args.data)},
                  seed=cfg.seed, device=trainer.device)
    print(f"pretrain: {name}: val loss {record['final_val_loss']}, {record['tokens_per_s']:,.0f} tokens/s -> {results}")


PROFILE_STEPS = 3
# Allocator events --memory-snapshot keeps, the latest: after the untimed steps those of the warm-up
# and CUDA-graph recording steps (replays allocate nothing); a pickled event with its Python stack
# takes a few KB.
SNAPSHOT_ENTRIES = 20_000
BUSY_STEPS = 5


def dump_memory_snapshot(directory: Path, model: str, recipe: str) -> None:
    """Write what the allocator recorded to ``directory/memory_<model>_<recipe>.pickle``; stop recording."""
    torch.cuda.memory._dump_snapshot(str(directory / f"memory_{model}_{recipe}.pickle"))
    torch.cuda.memory._record_memory_history(enabled=None)


def busy_split(intervals: Iterable[tuple[float, float]], wall_s: float) -> dict[str, float]:
    """GPU activity against wall time. ``intervals``: ``(start, end)`` seconds of each device record
    (kernel, memcpy, memset) in a window of ``wall_s`` seconds. ``kernel_s``: their summed durations
    (overlapping streams counted twice); ``busy_s``: the length of their union (the time at least one
    ran); ``busy_fraction`` = ``busy_s / wall_s``.

    Equivalent to ``busy_s = measure(⋃ [start, end])``.
    """
    if not wall_s > 0:
        raise ValueError(f"wall_s must be > 0, got {wall_s}")
    spans = sorted((float(a), float(b)) for a, b in intervals)
    if any(b < a for a, b in spans):
        raise ValueError("an interval ends before it starts")
    kernel_s = sum(b - a for a, b in spans)
    busy_s, open_start, open_end = 0.0, None, None
    for a, b in spans:
        if open_end is None or a > open_end:
            if open_end is not None:
                busy_s += open_end - open_start
            open_start, open_end = a, b
        else:
            open_end = max(open_end, b)
    if open_end is not None:
        busy_s += open_end - open_start
    return {"wall_s": wall_s, "kernel_s": kernel_s, "busy_s": busy_s, "busy_fraction": busy_s / wall_s}


def device_intervals(prof: Any, device_type: Any = None) -> list[tuple[float, float]]:
    """``(start, end)`` seconds of the profiler's events on ``device_type`` (default CUDA: the
    kernels, copies and memsets CUPTI recorded), user annotations left out."""
    from torch.autograd import DeviceType

    device_type = DeviceType.CUDA if device_type is None else device_type
    # User annotations projected on the device timeline span the gaps between their kernels: not work.
    return [(e.time_range.start / 1e6, e.time_range.end / 1e6) for e in prof.events()
            if e.device_type == device_type and e.time_range.end > e.time_range.start
            and not getattr(e, "is_user_annotation", False)]


def measure_busy(trainer: Trainer, steps: int) -> dict[str, Any] | None:
    """Run ``steps`` more training steps under a GPU-only torch.profiler and return
    :func:`busy_split` of their device records and wall time (with ``steps``, ``method`` and the
    steps' ``profiled_tokens_per_s``). None on a CPU (no device records) or for 0 steps."""
    if trainer.device.type != "cuda" or steps == 0:
        return None
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(trainer.device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        trainer.run(until=trainer.step + steps)  # synchronizes at the end of each logged step
        torch.cuda.synchronize(trainer.device)
        wall_s = time.perf_counter() - start
    split = busy_split(device_intervals(prof), wall_s)
    return {"steps": steps, **split, "profiled_tokens_per_s": steps * trainer.tokens_per_step / wall_s,
            "method": "torch.profiler, CUDA activity only (kernel, memcpy, memset records), steps after the timed ones"}


def profile_steps(trainer: Trainer, path: Path) -> None:
    """Run the trainer's remaining steps under torch.profiler; write ops and kernels by GPU and CPU time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if trainer.device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        trainer.run()
    events = prof.key_averages()
    tables = [f"{PROFILE_STEPS} training steps, {trainer.tokens_per_step} tokens each"]
    # By device time (where the GPU's time goes), then by self CPU time (what keeps the host busy:
    # a step whose GPU time is well under its wall time is bound by launches and Python).
    sorts = (["self_cuda_time_total"] if trainer.device.type == "cuda" else []) + ["self_cpu_time_total"]
    for sort in sorts:
        tables += [f"\n== sorted by {sort}", events.table(sort_by=sort, row_limit=50, max_name_column_width=90)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(tables) + "\n")
    print(f"profile: -> {path}")


def step_seconds(trainer: Trainer, records: list[dict[str, Any]]) -> list[float]:
    """The wall time of each step ``records`` (the trainer's, one a step) logged with a speed."""
    return [trainer.tokens_per_step / r["tokens_per_s"] for r in records if "tokens_per_s" in r]


def measure_recipe(args: argparse.Namespace, recipe: str, info: Any, device: torch.device, vocab_size: int,
                   stop: StopOnSignal, held_before: float | None, compile_before: dict[str, float]) -> dict[str, Any]:
    """Build ``recipe``'s trainer (watched by ``stop``), run its untimed, timed, busy and profiled
    steps, and return its throughput record."""
    base = resolve_config(args, recipe=recipe)
    timed = base.steps
    extra = PROFILE_STEPS if args.profile else 0
    busy = args.busy_steps if device.type == "cuda" else 0
    cfg = dataclasses.replace(base, steps=args.untimed_steps + timed + busy + extra, eval_interval=0,
                              checkpoint_interval=0, log_interval=1, max_tokens=None)
    batches = RandomTokenBatches(vocab_size, cfg.seq_len, cfg.batch_size, cfg.seed, info.rank)
    caches = compile_cache_files()
    snapshot = args.memory_snapshot is not None and info.is_main
    if snapshot:
        args.memory_snapshot.mkdir(parents=True, exist_ok=True)
        torch.cuda.memory._record_memory_history(max_entries=SNAPSHOT_ENTRIES, stacks="python")
    t_untimed = time.perf_counter()
    trainer = stop.watch(Trainer(cfg, vocab_size, batches, dist_info=info, device=device, progress=not args.no_progress))
    untimed = trainer.run(until=args.untimed_steps)  # compile, warm-up, calibration: not timed, not in peak memory
    untimed_s = time.perf_counter() - t_untimed
    compile_phase_s = compile_seconds_since(compile_before)
    if snapshot:
        dump_memory_snapshot(args.memory_snapshot, cfg.model, recipe)
    # Where the startup went: each untimed step's wall time (calibrating steps run eagerly, the
    # first fixed step compiles), and the rest, building the model.
    untimed_step_s = step_seconds(trainer, untimed)
    # CUDA: each untimed step's tensor peak; under CUDA graphs the step that records them shows
    # what the graphs' tensors took, against the pool the timed steps start with (memory_at_start).
    untimed_peak = [r["peak_allocated_gib"] for r in untimed if "peak_allocated_gib" in r] or None
    history = trainer.run(until=args.untimed_steps + timed)[args.untimed_steps:]
    # What the timed steps started from (the runs below set the trainer's own again).
    memory_at_start, allocator_at_start = trainer.memory_at_start, trainer.allocator_at_start
    gpu_busy = measure_busy(trainer, busy)
    if args.profile and info.is_main:
        profile_steps(trainer, args.profile / f"profile_{cfg.model}_{recipe}.txt")
    elif args.profile:
        trainer.run()
    seconds = sum(trainer.tokens_per_step / r["tokens_per_s"] for r in history)
    tps = len(history) * trainer.tokens_per_step / seconds
    return {
        "model": cfg.model,
        "recipe": recipe,
        # torchao for its float8 peers, None for adahop's own recipes
        "peer": trainer.peer,
        "params": trainer.model_config.num_params(),
        "world_size": info.world_size,
        "fsdp": cfg.fsdp,
        "batch_size": cfg.batch_size,
        "seq_len": cfg.seq_len,
        "compile": cfg.compile,
        "compile_mode": cfg.compile_mode if cfg.compile else None,
        # wall time of building the model and its untimed steps (compilation, warm-up, calibration)
        "untimed_s": untimed_s,
        "untimed_step_s": untimed_step_s,
        "build_s": untimed_s - sum(untimed_step_s),
        # of those seconds, torch.compile's phases (Dynamo, the backend, kernel compiles waited on)
        "compile_phase_s": compile_phase_s,
        # files in the compilers' caches when this recipe began: 0 for a cold start
        "compile_cache_files": caches,
        "timed_steps": len(history),
        "step_time_s": seconds / len(history),
        "tokens_per_s": tps,
        "mfu": (trainer.flops_per_token * tps / (trainer.peak_flops * info.world_size)
                if trainer.peak_flops else None),
        "flops_per_token": trainer.flops_per_token,
        "peak_mem_gib": max(r["peak_mem_gib"] for r in history),
        # CUDA: the tensors' peak (under CUDA graphs those outside the graphs' pool, whose
        # replays allocate nothing), and what the timed steps started from; None on a CPU
        "peak_allocated_gib": max(r["peak_allocated_gib"] for r in history) if device.type == "cuda" else None,
        "memory_at_start": memory_at_start,
        "allocated_before_gib": held_before,
        # CUDA: the reserved bytes as tensors and cache, per pool, at the same point
        "allocator_at_start": allocator_at_start,
        "untimed_peak_allocated_gib": untimed_peak,
        # GPU-busy share of wall time (None on a CPU), from steps after the timed ones
        "gpu_busy": gpu_busy,
        "final_loss": history[-1]["loss"],
        "config": dataclasses.asdict(cfg),
    }


def _phase(args: argparse.Namespace, step: int) -> str:
    return "untimed" if step <= args.untimed_steps else "timed or later"


def unmeasured_record(args: argparse.Namespace, recipe: str, error: str, failed_at: str, held_before: float | None,
                      **details: Any) -> dict[str, Any]:
    """The record of a recipe with no figures (``error``: why), ``failed_at`` saying where."""
    cfg = resolve_config(args, recipe=recipe)
    return {"model": cfg.model, "recipe": recipe, "world_size": 1, "fsdp": cfg.fsdp, "batch_size": cfg.batch_size,
            "seq_len": cfg.seq_len, "compile": cfg.compile, "compile_mode": cfg.compile_mode if cfg.compile else None,
            "error": error, "failed_at": failed_at, **details, "allocated_before_gib": held_before,
            "config": dataclasses.asdict(cfg)}


def out_of_memory_record(args: argparse.Namespace, recipe: str, trainer: Trainer | None,
                         err: torch.OutOfMemoryError, held_before: float | None) -> dict[str, Any]:
    """The record of a recipe that ran out of GPU memory: where (building the model, or the
    untimed or timed step it reached) and the allocator's message, in place of the figures."""
    failed_at = ("while building the model" if trainer is None
                 else f"in step {trainer.step + 1} ({_phase(args, trainer.step + 1)})")
    return unmeasured_record(args, recipe, "out of memory", failed_at, held_before,
                             message=str(err).splitlines()[0][:400])


def stopped_record(args: argparse.Namespace, recipe: str, trainer: Trainer | None, reason: str,
                   held_before: float | None, compile_before: dict[str, float], in_step: bool) -> dict[str, Any]:
    """The record of a recipe stopped by a signal before its figures: where, the wall time of each
    step it finished (``step_s``: the untimed ones say whether calibration or compilation took the
    time) and the compiler's phases finished by then (``compile_phase_s``). ``in_step``: written at
    the signal, while a step still runs (``step_running_s``: how long it had run); otherwise after
    the step it stopped at."""
    if trainer is None:
        failed_at, step_s, running = "while building the model", [], None
    else:
        step_s = step_seconds(trainer, trainer.history)
        running = None
        if in_step and trainer.step_started_at is not None:
            running = time.perf_counter() - trainer.step_started_at
        failed_at = (f"in step {trainer.step + 1} ({_phase(args, trainer.step + 1)})" if in_step
                     else f"after step {trainer.step} ({_phase(args, trainer.step)})")
    return unmeasured_record(args, recipe, "stopped", failed_at, held_before, reason=reason, step_s=step_s,
                             step_running_s=running, compile_phase_s=compile_seconds_since(compile_before))


def summary(record: dict[str, Any]) -> str:
    """One line for a throughput record: its figures, or where it ran out of memory."""
    if "error" in record:
        return f"{record['error']} {record['failed_at']}"
    mfu = f"{record['mfu']:.1%}" if record["mfu"] is not None else "n/a"
    busy = record["gpu_busy"]
    busy_text = f", GPU busy {busy['busy_fraction']:.0%} of wall time" if busy else ""
    return f"{record['tokens_per_s']:,.0f} tokens/s, MFU {mfu}, peak {record['peak_mem_gib']:.1f} GiB{busy_text}"


def run_throughput(args: argparse.Namespace, stop: StopOnSignal) -> None:
    info, device = init_distributed(args.device)
    if args.memory_snapshot is not None and device.type != "cuda":
        raise SystemExit(f"--memory-snapshot records the CUDA caching allocator; this run's device is {device.type}")
    recipes = args.recipe.split(",") if args.recipe else [resolve_config(args).recipe]
    for recipe in recipes:  # a missing torchao stops the run before the first measurement
        check_recipe(recipe)
    vocab_size = read_vocab_size(args.data) if args.data else (args.vocab_size or REFERENCE_VOCAB)
    records: list[dict[str, Any]] = []
    # One file config for the whole command, so the write after each recipe replaces this run's own
    # earlier write (same config) while a file of another configuration is refused.
    file_config = {"throughput_only": True, "untimed_steps": args.untimed_steps, "busy_steps": args.busy_steps,
                   "vocab_size": vocab_size, "recipes": recipes, "base": dataclasses.asdict(resolve_config(args))}
    # Where a file is already there (an earlier run's), this run writes beside it until its last
    # recipe is recorded: a rerun cut by a time limit leaves the earlier file whole.
    target = Path(args.results)
    progress = partial_path(target) if target.exists() else target
    if info.is_main:  # before measuring, not after the first recipe
        check_replaceable(target, file_config)
        if progress != target:
            check_replaceable(progress, file_config)

    def write(recs: list[dict[str, Any]], complete: bool = False) -> None:
        write_results(target if complete else progress, recs, config=file_config, seed=recs[-1]["config"]["seed"],
                      device=device)
        if complete and progress != target:
            progress.unlink(missing_ok=True)

    for recipe in recipes:
        # CUDA: what this process held before the recipe's trainer was built (~0: nothing left
        # of an earlier recipe); None on a CPU
        held_before = torch.cuda.memory_allocated(device) / 2**30 if device.type == "cuda" else None
        compile_before = compile_seconds()
        if info.is_main:  # at a signal: this recipe's record so far, beside those measured
            stop.on_request = lambda reason, recipe=recipe, held=held_before, before=compile_before: write(
                [*records, stopped_record(args, recipe, stop.trainer, reason, held, before, in_step=True)])
        try:
            records.append(measure_recipe(args, recipe, info, device, vocab_size, stop, held_before, compile_before))
        except TrainingStopped as err:
            if info.is_main:  # the step it was in has ended: the record again, with that step
                write([*records, stopped_record(args, recipe, stop.trainer, err.reason, held_before, compile_before,
                                                in_step=False)])
                print(f"pretrain: {progress} holds the recipes measured and where {recipe} stopped", file=sys.stderr)
            raise
        except torch.OutOfMemoryError as err:
            if info.world_size > 1:
                raise  # the other ranks wait in a collective for this one
            # That this recipe does not fit at this size on this GPU is the measurement; the
            # recipes after it still run.
            records.append(out_of_memory_record(args, recipe, stop.trainer, err, held_before))
            if args.memory_snapshot is not None:  # what held the memory when it ran out
                dump_memory_snapshot(args.memory_snapshot, records[-1]["model"], recipe)
        if info.is_main:
            print(f"throughput: {recipe}: {summary(records[-1])}")
            # After each recipe: a run cut short keeps what it measured.
            write(records, complete=len(records) == len(recipes))
        # The next recipe starts from nothing of this one's: its trainer (weights, gradients,
        # optimizer state: 47 GB at 3b), its compiled graphs and, under CUDA graphs, the graphs'
        # memory pool (which would otherwise stay reserved and count in the next recipe's peak; it
        # is freed only with the graphs). The signal handler's reference goes first, and the
        # collection runs after the last reference is gone, so a reference cycle through the
        # trainer cannot carry it into the next recipe's steps.
        stop.release()
        torch.compiler.reset()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop = StopOnSignal()
    try:
        (run_throughput if args.throughput_only else run_training)(args, stop)
    except TrainingStopped as err:
        if args.throughput_only:  # nothing to resume: the same command measures again
            print(f"pretrain: throughput stopped after step {err.step} ({err.reason}); the same command measures "
                  "again", file=sys.stderr)
        else:
            print(f"pretrain: {err}; the same command resumes there", file=sys.stderr)
        return EXIT_STOPPED
    finally:
        stop.restore()
        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
