"""Pretraining loop: one :class:`Trainer` for every recipe, one GPU or many (``torchrun``), or CPU.

What a run does, step by step (one optimizer step = ``grad_accum`` micro-batches per rank):

1. the model (:mod:`adahop.harness.model`) is built from a named size and the tokenizer's vocabulary,
   converted with ``adahop.convert(model, recipe)`` (every linear but the LM head) or, for the
   torchao peers of :data:`FLOAT8_PEERS`, with torchao's ``convert_to_float8_training`` (the LM
   head skipped too), optionally ``torch.compile``-d, and wrapped in DDP when ``WORLD_SIZE > 1``
   (FSDP2 with ``fsdp``: see :func:`shard_fsdp`); a compiled model runs eagerly while its layers
   calibrate and compiles once they are fixed (``adahop.eager_while_calibrating``);
2. forward + backward under bf16 autocast on CUDA (fp32 on CPU, see :class:`TrainConfig`),
   gradients all-reduced by DDP (reduce-scattered by FSDP) on the last micro-batch only;
3. the loss (mean over ranks) and the gradient norm are checked: a non-finite value stops the
   run with :class:`NonFiniteLossError` *before* the update, so the last checkpoint stays good;
   its message and the logged ``non-finite`` event say which of the two was not finite;
4. clip, AdamW step (fused on CUDA; its state made before the first step,
   :func:`allocate_optimizer_state`), warmup + cosine LR, then ``adahop.on_optimizer_step(model)``
   (which advances a recipe's calibration);
5. every ``eval_interval`` steps the held-out loss; every ``checkpoint_interval`` steps an atomic
   checkpoint (model with the layers' extra state = calibrated strategies, optimizer, scheduler,
   each rank's data-sampler and RNG states and its layers' calibration votes so far); a JSONL
   metrics line per ``log_interval`` steps.

Checkpoints under FSDP hold full (unsharded) state dicts, gathered to rank 0's host memory
through ``torch.distributed.checkpoint.state_dict`` and loaded back by every rank from the one
file: the same single-file layout as DDP's and one process's, which :func:`adahop.harness.model.export_hf`
and the strategy export read directly. It needs rank 0 to hold the fp32 weights and both AdamW
moments in host memory (16 bytes a parameter: 44 GiB for ``3b``), which the sizes of
:mod:`adahop.harness.model` fit; a sharded ``torch.distributed.checkpoint`` directory would be the way
past that.

A run restarted with the same ``out_dir`` resumes from its latest checkpoint and continues on the
same loss curve (``tests/test_train.py`` checks per-step losses bit-for-bit on CPU).
:meth:`Trainer.request_stop` (``experiments/pretrain.py`` calls it on SIGTERM, as ``timeout``,
Slurm and ``torchrun`` send it) ends the run at the next step boundary that every rank agrees on,
checkpoints that step and raises :class:`TrainingStopped`, so a time-limited job loses no steps.

Throughput is measured as tokens per second of wall time between log lines (eval and checkpoint
time excluded), MFU as ``flops_per_token · tokens/s / (peak · world_size)`` with
:meth:`adahop.harness.model.LlamaConfig.flops_per_token` (6N + 12·L·H·Q·T) and the dense bf16 peak of
:data:`PEAK_BF16_FLOPS`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import re
import resource
import statistics
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

import adahop
import adahop.linear
from adahop.harness.model import Llama, LlamaConfig, rope_tables
from adahop.harness.provenance import atomic_write_text, git_state

# Dense bf16 tensor-core peaks (FLOP/s) by a substring of the CUDA device name; the first match
# wins, so the more specific names come first. Unknown devices (and CPUs) report no MFU.
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),
    ("A100", 312e12),
    ("B200", 2250e12),
)

# torchao's float8 training recipes, measured as end-to-end peers of adahop's recipes (a Hopper
# user's alternative to FP4): our name -> Float8LinearConfig.from_recipe_name's. They are not
# adahop recipes (adahop.recipes holds adahop's own) and results mark them ``peer: torchao``.
FLOAT8_PEERS: dict[str, str] = {"float8-tensorwise": "tensorwise", "float8-rowwise": "rowwise"}

# NVLink multicast (NVLS) stays off for NCCL, symmetric memory and NVSHMEM: it needs fabric-manager
# support that not every multi-GPU host has, and where it is missing their set-up fails or stalls.
MULTI_GPU_ENV: dict[str, str] = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                 "NVSHMEM_DISABLE_NVLS": "1"}

# Keys a resumed run may change without changing its loss curve.
RESUMABLE_CHANGES = frozenset({"eval_interval", "eval_batches", "checkpoint_interval", "keep_checkpoints",
                               "log_interval", "compile", "compile_mode"})

# torch.compile modes a run may ask for; the reduce-overhead family records the compiled forward and
# backward as CUDA graphs (one replay instead of a launch per kernel: for host-bound steps).
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")


def compile_label(compile: bool, compile_mode: Any) -> str:
    """How a run executes, for tables and figures: ``eager``, ``compiled`` or ``compiled, CUDA
    graphs`` (``compile_mode`` may be missing from older records: None, or NaN from pandas)."""
    if not compile:
        return "eager"
    return "compiled, CUDA graphs" if isinstance(compile_mode, str) and compile_mode in CUDAGRAPH_MODES else "compiled"


@dataclasses.dataclass
class TrainConfig:
    """Everything that defines a run; checkpoints and results record it.

    Batch: ``batch_size`` sequences of ``seq_len`` tokens per micro-batch per rank; one optimizer
    step sees ``batch_size · grad_accum · world_size`` sequences. ``steps`` optimizer steps, or
    fewer when ``max_tokens`` (training tokens, all ranks) is reached first — the LR schedule is
    laid out over the steps actually run. ``precision``: ``"auto"`` is bf16 autocast on CUDA and
    plain fp32 on CPU (CPU bf16 matmuls are slow on most hosts and buy the smoke tests nothing);
    ``"bf16"`` or ``"fp32"`` force one. ``recipe``: an adahop recipe (``adahop.RECIPES``) or a torchao
    peer of :data:`FLOAT8_PEERS`; ``recipe_overrides`` go to ``adahop.convert`` (a peer has no
    adahop fields: a profile's overrides, meant for adahop's recipes, do not apply to it).
    ``fsdp``: with several ranks, FSDP2 (:func:`shard_fsdp`) in place of DDP.
    ``eval_interval``/``checkpoint_interval`` of 0 mean only at the end; ``eval_batches`` (per
    rank) of 0 means the whole held-out split.
    """

    model: str = "tiny"
    recipe: str = "bf16"
    seed: int = 0
    steps: int = 200
    max_tokens: int | None = None
    batch_size: int = 8
    grad_accum: int = 1
    seq_len: int = 256
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 20
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    adam_eps: float = 1e-8
    grad_clip: float = 1.0
    eval_interval: int = 50
    eval_batches: int = 8
    checkpoint_interval: int = 100
    keep_checkpoints: int = 2
    log_interval: int = 1
    precision: str = "auto"
    compile: bool = False
    compile_mode: str = "default"
    fsdp: bool = False
    recipe_overrides: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "grad_accum", "seq_len", "log_interval", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "eval_interval", "eval_batches", "checkpoint_interval"):
            if getattr(self, name) < 0:
                raise ValueError(f"TrainConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.compile_mode not in COMPILE_MODES:
            raise ValueError(f"compile_mode must be one of {COMPILE_MODES}, got {self.compile_mode!r}")
        if self.compile and self.compile_mode in CUDAGRAPH_MODES and self.grad_accum > 1 and self.fsdp:
            # The trainer keeps .grad allocated so that each replay's gradients are added into it
            # (Trainer.keep_grads); FSDP2 accumulates unsharded gradients its own way, untested here.
            raise ValueError(f"compile_mode={self.compile_mode!r} (CUDA graphs) with grad_accum={self.grad_accum} "
                             "and fsdp: use grad_accum=1 (a larger batch_size) or a compile mode without CUDA graphs")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ValueError(f"precision must be 'auto', 'bf16' or 'fp32', got {self.precision!r}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio must lie in [0, 1], got {self.min_lr_ratio}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "TrainConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown training config keys {unknown}; known: {sorted(known)}")
        return cls(**values)

    @classmethod
    def from_section(cls, section: dict[str, Any], **overrides: Any) -> "TrainConfig":
        """A profile's ``pretrain`` section (its TrainConfig fields; the workflow's own keys such as
        ``models`` are skipped), then ``overrides``. The section's ``compile_recipes``: where it
        compiles and ``overrides`` leave ``compile`` unset, only the recipes it names compile."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {**{k: v for k, v in section.items() if k in known}, **overrides}
        only = section.get("compile_recipes")
        if only is not None and "compile" not in overrides and values.get("compile"):
            values["compile"] = values.get("recipe", cls.recipe) in only
        return cls.from_dict(values)

    def total_steps(self, world_size: int) -> int:
        if self.max_tokens is None:
            return self.steps
        per_step = self.batch_size * self.grad_accum * self.seq_len * world_size
        return max(1, min(self.steps, self.max_tokens // per_step))


class NonFiniteLossError(RuntimeError):
    """Loss or gradient norm became NaN/Inf; the message says which (``non_finite``: ``"loss"``
    and/or ``"grad_norm"``), the step and the last good checkpoint."""

    def __init__(self, message: str, non_finite: list[str]) -> None:
        super().__init__(message)
        self.non_finite = non_finite


class TrainingStopped(RuntimeError):
    """:meth:`Trainer.run` ended early on :meth:`Trainer.request_stop`; ``step`` is checkpointed
    (``checkpoint``, None without an ``out_dir``), so the same run resumes from there."""

    def __init__(self, step: int, checkpoint: Path | None, reason: str) -> None:
        where = f"checkpoint {checkpoint}" if checkpoint is not None else "no out_dir, nothing saved"
        super().__init__(f"stopped after step {step} ({reason}); {where}")
        self.step, self.checkpoint, self.reason = step, checkpoint, reason


# ---------------------------------------------------------------------------------------------
# Small pieces: schedule, distributed set-up, device facts
# ---------------------------------------------------------------------------------------------

class WarmupCosine:
    """LR multiplier for step ``s`` (0-based): linear warmup ``(s+1)/warmup`` to 1, then a cosine
    from 1 to ``min_ratio`` at ``total - 1``. A callable object so ``LambdaLR`` checkpoints it."""

    def __init__(self, warmup: int, total: int, min_ratio: float):
        self.warmup, self.total, self.min_ratio = warmup, total, min_ratio

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.total - 1 - self.warmup))
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


@dataclasses.dataclass
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def rank_device(kind: str | None, info: DistInfo) -> torch.device:
    """This rank's device: ``kind`` ``"cpu"`` or ``"cuda"`` (default: CUDA when there is one);
    on CUDA, rank ``LOCAL_RANK`` takes GPU ``LOCAL_RANK``."""
    kind = kind or ("cuda" if torch.cuda.is_available() else "cpu")
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {kind!r}")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but torch sees no CUDA device")
    return torch.device("cuda", info.local_rank) if kind == "cuda" else torch.device("cpu")


def init_distributed(kind: str | None = None) -> tuple[DistInfo, torch.device]:
    """This process's rank and device; joins the ``torchrun`` process group when
    ``WORLD_SIZE > 1`` (NCCL on CUDA, gloo on CPU), with :data:`MULTI_GPU_ENV` set where the
    launcher left those variables unset."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        for key, value in MULTI_GPU_ENV.items():
            os.environ.setdefault(key, value)
    info = DistInfo() if world == 1 else DistInfo(int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0")), world)
    device = rank_device(kind, info)
    if world > 1 and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return info, device


def torchao_version() -> str | None:
    """The installed torchao's version, or None where it is not importable."""
    try:
        import torchao
    except ImportError:
        return None
    return str(getattr(torchao, "__version__", "unknown"))


def check_recipe(name: str) -> None:
    """Raise a clear error for a recipe the Trainer cannot run here: a name that is neither an
    adahop recipe nor a peer of :data:`FLOAT8_PEERS` (ValueError), a peer without torchao
    (ImportError). Cheap: a script checks every recipe of a run before measuring the first."""
    if name in FLOAT8_PEERS:
        if torchao_version() is None:
            raise ImportError(f"recipe {name!r} is torchao's float8 training, but torchao is not importable; "
                              f"install it (pip install 'adahop[float8]') or leave {name!r} out")
        return
    if name not in adahop.RECIPES:
        raise ValueError(f"unknown recipe {name!r}; choose one of {sorted(adahop.RECIPES)} "
                         f"or torchao's {sorted(FLOAT8_PEERS)}")


def convert_float8(model: nn.Module, peer: str, skip: Iterable[str] = ("lm_head",)) -> nn.Module:
    """Swap every ``nn.Linear`` of ``model`` but those named in ``skip`` for torchao's
    ``Float8Linear`` under ``Float8LinearConfig.from_recipe_name(FLOAT8_PEERS[peer])``, in place;
    returns ``model``. The LM head stays ``nn.Linear``, as adahop's recipes keep it in BF16.

    Equivalent to ``torchao.float8.convert_to_float8_training(model, config=..., module_filter_fn=...)``.
    """
    if peer not in FLOAT8_PEERS:
        raise ValueError(f"peer must be one of {sorted(FLOAT8_PEERS)}, got {peer!r}")
    check_recipe(peer)
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    skip = tuple(skip)
    config = Float8LinearConfig.from_recipe_name(FLOAT8_PEERS[peer])
    return convert_to_float8_training(
        model, config=config, module_filter_fn=lambda module, fqn: not any(fqn == s or fqn.endswith("." + s) for s in skip)
    )


def check_float8_device(peer: str, device: torch.device) -> None:
    """torchao's float8 GEMMs (``torch._scaled_mm``) need compute capability 8.9 (Ada, Hopper) or
    newer on CUDA; on an older GPU the error would come from deep inside the first step."""
    if device.type == "cuda":
        capability = torch.cuda.get_device_capability(device)
        if capability < (8, 9):
            raise ValueError(f"recipe {peer!r}: torchao float8 training needs a GPU of compute capability 8.9 "
                             f"or newer; {torch.cuda.get_device_name(device)} has {capability[0]}.{capability[1]}")


def shard_fsdp(model: Llama, device: torch.device, world_size: int, bf16: bool, compile_mode: str | None) -> Llama:
    """FSDP2 in place: ``fully_shard`` on every decoder block, then on the root (embedding, final
    norm and the LM head tied to it), over a 1-D mesh of ``world_size`` ranks. Returns ``model``.

    Precision follows the trainer's: with ``bf16`` each block's parameters are gathered in bf16
    (``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``: the gradients are reduced and
    the optimizer steps in fp32 on the fp32 shards); the trainer's autocast stays on, so the ops it
    keeps in fp32 still run in fp32. Unlike DDP's fp32 weights under autocast, the activations
    between blocks are then bf16 (the gathered embedding is), as in other FSDP2 trainers. Without
    ``bf16`` everything is fp32. ``compile_mode``: each block's ``forward`` ``torch.compile``-d in that mode (FSDP2's
    hooks stay outside the compiled graphs; module names and checkpoints are unchanged).

    Equivalent to DDP over the same global batch up to the bf16 rounding of the gathered weights
    (without ``bf16``: up to the order of the float reductions).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (world_size,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    for block in model.model.layers:
        if compile_mode is not None:
            # The block's forward, not its call: FSDP2's gather/reshard hooks run around it, eagerly.
            block.forward = torch.compile(block.forward, mode=compile_mode)
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def peak_bf16_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_FLOPS if key in name), None)


def measured(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The throughput records that hold figures: all but those of a recipe that ran out of memory
    or that a signal stopped (``error``; experiments/pretrain.py writes them)."""
    return [r for r in records if "error" not in r]


def peak_is_shared(records: list[dict[str, Any]], index: int) -> bool:
    """Whether the CUDA-graph peak of ``records[index]`` may hold an earlier recipe's pool.

    Under CUDA graphs a recipe's peak is the bytes reserved, and the graphs' pool lives as long as
    torch.compile's caches. Files written before the throughput stage reset them between recipes
    (their records have no ``memory_at_start``) kept every earlier recipe's pool reserved, except
    where a recipe's own calibration reset them when it fixed its strategies: such a record's peak
    bounds the recipe's own from above."""
    r = records[index]
    if index == 0 or "memory_at_start" in r or r.get("compile_mode") not in CUDAGRAPH_MODES:
        return False
    recipe = adahop.RECIPES.get(r["recipe"])
    return recipe is None or recipe.calibration_steps == 0


def peak_memory_gib(device: torch.device, cudagraphs: bool = False) -> float:
    """CUDA: peak bytes allocated by tensors, or with ``cudagraphs`` peak bytes reserved (a CUDA
    graph's replay allocates nothing: its working set is its memory pool, reserved for as long as
    the graph lives; count it after ``torch.cuda.empty_cache()``). CPU: the process's peak resident
    set size."""
    if device.type == "cuda":
        peak = torch.cuda.max_memory_reserved if cudagraphs else torch.cuda.max_memory_allocated
        return peak(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # ru_maxrss is KiB on Linux


def allocator_summary(snapshot: dict[str, Any]) -> dict[str, Any]:
    """What the CUDA caching allocator holds, from ``torch.cuda.memory._snapshot()``: reserved
    bytes (every segment), the bytes tensors hold in them (active) and the cached rest (inactive:
    free for reuse, but only by allocations that fit its blocks), in GiB, the largest inactive
    block, and the same per memory pool (a CUDA graph's private pool is one; ``(0, 0)`` is the
    default pool), largest reserved first. Under CUDA graphs a pool's inactive bytes are what its
    recording cached and its replays never fill."""
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("segments"), list):
        raise ValueError("snapshot must be the dict of torch.cuda.memory._snapshot(), with a 'segments' list")
    pools: dict[str, dict[str, Any]] = {}
    for seg in snapshot["segments"]:
        pool = pools.setdefault(str(tuple(seg.get("segment_pool_id", (0, 0)))),
                                {"segments": 0, "reserved": 0, "active": 0, "largest_inactive": 0})
        pool["segments"] += 1
        pool["reserved"] += seg["total_size"]
        pool["active"] += seg["active_size"]
        for block in seg.get("blocks", []):
            if block["state"] == "inactive":
                pool["largest_inactive"] = max(pool["largest_inactive"], block["size"])

    def gib(p: dict[str, Any]) -> dict[str, Any]:
        return {"segments": p["segments"], "reserved_gib": p["reserved"] / 2**30, "active_gib": p["active"] / 2**30,
                "inactive_gib": (p["reserved"] - p["active"]) / 2**30, "largest_inactive_gib": p["largest_inactive"] / 2**30}

    total = {k: sum(p[k] for p in pools.values()) for k in ("segments", "reserved", "active")}
    total["largest_inactive"] = max((p["largest_inactive"] for p in pools.values()), default=0)
    return {**gib(total),
            "pools": [{"pool": name, **gib(p)} for name, p in sorted(pools.items(), key=lambda kv: -kv[1]["reserved"])]}


def allocate_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Create ``optimizer``'s per-parameter state now, as its first step would, with the
    parameters and all later steps bit for bit the same.

    Why: the first step would allocate the state (AdamW's two moments, twice the weights' bytes)
    into blocks that the step's activations and gradients had just freed, splitting them. Once
    compiled steps keep activations and gradients in the CUDA graphs' pool, the remainders stay
    free in the default pool, where ``torch.cuda.empty_cache`` cannot return them (it returns whole
    free segments only), and count in the run's reserved peak (DESIGN §6). Made before any
    activation, the state gets segments of its own.

    How: one step with zero gradients and a zero learning rate (AdamW's moments stay zero, and its
    decay and update, both scaled by the rate, leave the parameters as they are), then each
    state's step count back to zero, as a fresh state has it. A no-op where the state exists."""
    if optimizer.state:
        return
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    if any(p.grad is not None for p in params):
        raise ValueError("allocate_optimizer_state: the parameters already hold gradients; call it before the first "
                         "backward")
    rates = [group["lr"] for group in optimizer.param_groups]
    try:
        for group in optimizer.param_groups:
            group["lr"] = 0.0
        for p in params:
            p.grad = torch.zeros_like(p)
        optimizer.step()
    finally:
        for group, rate in zip(optimizer.param_groups, rates):
            group["lr"] = rate
        for p in params:
            p.grad = None
    for state in optimizer.state.values():
        if torch.is_tensor(state.get("step")):
            state["step"].zero_()
        elif "step" in state:
            state["step"] = 0


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


# ---------------------------------------------------------------------------------------------
# Batches: the data module's sampler, or random tokens for throughput runs
# ---------------------------------------------------------------------------------------------

class RandomTokenBatches:
    """Endless ``(x, y)`` int64 ``(batch_size, seq_len)`` batches of uniform random tokens, drawn
    from a generator seeded by ``(seed, rank)``: the data of throughput runs, where only shapes
    matter. ``state_dict`` holds the generator, so it resumes like the real sampler."""

    def __init__(self, vocab_size: int, seq_len: int, batch_size: int, seed: int = 0, rank: int = 0):
        self.vocab_size, self.shape = vocab_size, (batch_size, seq_len + 1)
        self.generator = torch.Generator().manual_seed(seed * 1000003 + rank)

    def __iter__(self) -> "RandomTokenBatches":
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(0, self.vocab_size, self.shape, generator=self.generator)
        return tokens[:, :-1], tokens[:, 1:]

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])


def read_vocab_size(data_dir: str | Path) -> int:
    from adahop.harness.data import read_meta

    return int(read_meta(data_dir)["vocab_size"])


# ---------------------------------------------------------------------------------------------
# The trainer
# ---------------------------------------------------------------------------------------------

class Trainer:
    """Builds model, optimizer and schedule for ``cfg`` and runs it (see the module docstring).

    ``train_batches``: an iterator of ``(x, y)`` int64 ``(batch_size, seq_len)`` tensors with
    ``state_dict``/``load_state_dict`` (this rank's share). ``eval_batches``: a callable returning
    an iterable of this rank's held-out ``(x, y)`` (``None``: no evaluation). ``out_dir``: where
    ``metrics.jsonl``, ``checkpoints/`` and ``strategies.json`` go (``None``: nothing written, as in
    throughput runs); a run whose ``out_dir`` holds checkpoints resumes from the latest.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        vocab_size: int,
        train_batches: Iterator,
        eval_batches: Callable[[], Iterable] | None = None,
        out_dir: str | Path | None = None,
        dist_info: DistInfo | None = None,
        device: torch.device | str | None = None,
        progress: bool = True,
    ):
        self.cfg = cfg
        self.dist = dist_info or DistInfo()
        self.device = torch.device(device) if device is not None else rank_device(None, self.dist)
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.train_batches, self.eval_batches = train_batches, eval_batches
        self.progress = progress and self.dist.is_main
        self.total_steps = cfg.total_steps(self.dist.world_size)
        self.tokens_per_step = cfg.batch_size * cfg.grad_accum * cfg.seq_len * self.dist.world_size

        # The same seed on every rank gives the same initial weights (DDP also broadcasts them).
        torch.manual_seed(cfg.seed)
        self.model_config = LlamaConfig.from_name(cfg.model, vocab_size=vocab_size, max_seq_len=cfg.seq_len)
        if cfg.fsdp and self.dist.world_size == 1:
            raise ValueError("TrainConfig.fsdp shards over ranks: launch several with torchrun "
                             "(--nproc_per_node > 1), or leave fsdp off for one process")
        check_recipe(cfg.recipe)
        # A torchao peer: torchao's layers, no adahop recipe (nothing calibrates).
        self.peer: str | None = "torchao" if cfg.recipe in FLOAT8_PEERS else None
        if self.peer:
            check_float8_device(cfg.recipe, self.device)
        with torch.device(self.device):
            model = Llama(self.model_config)
        use_bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and self.device.type == "cuda")
        if self.peer:
            self.recipe: adahop.Recipe | None = None
            self.model = convert_float8(model, cfg.recipe)
        else:
            # The recipe derives its stochastic rounding and random signs from the run's seed.
            self.recipe = adahop.get_recipe(cfg.recipe, **{"seed": cfg.seed, **cfg.recipe_overrides})
            self.model = adahop.convert(model, self.recipe)
        self.fsdp = cfg.fsdp
        self.cudagraphs = cfg.compile and cfg.compile_mode in CUDAGRAPH_MODES and self.device.type == "cuda"
        self.memory_at_start: dict[str, float] | None = None  # CUDA: set by run()
        self.allocator_at_start: dict[str, Any] | None = None  # CUDA: set by run()
        if self.fsdp:
            self.model = shard_fsdp(self.model, self.device, self.dist.world_size, use_bf16,
                                    cfg.compile_mode if cfg.compile else None)
            self.runner: nn.Module = self.model
            self.ddp: nn.Module = self.model
        else:
            self.runner = torch.compile(self.model, mode=cfg.compile_mode) if cfg.compile else self.model
            self.ddp = self.runner
            if self.dist.world_size > 1:
                self.ddp = nn.parallel.DistributedDataParallel(
                    self.runner, device_ids=[self.device.index] if self.device.type == "cuda" else None
                )

        decay = [p for p in self.model.parameters() if p.requires_grad and p.dim() >= 2]
        no_decay = [p for p in self.model.parameters() if p.requires_grad and p.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps, fused=self.device.type == "cuda",
        )
        allocate_optimizer_state(self.optimizer)  # before any activation: no fragments around it
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, WarmupCosine(cfg.warmup_steps, self.total_steps, cfg.min_lr_ratio)
        )
        self.autocast = (
            (lambda: torch.autocast(self.device.type, dtype=torch.bfloat16)) if use_bf16 else contextlib.nullcontext
        )
        # Under CUDA graphs a gradient the autograd engine finds no .grad for becomes the .grad: the
        # backward graph's output memory, which the next micro-batch's replay overwrites, so the
        # gradients accumulated over micro-batches come out wrong without an error
        # (pytorch/pytorch#96693, #169545). With .grad allocated from the start and zeroed, not
        # freed, after each step, every replay's gradient is added into it before the next replay.
        self.keep_grads = self.cudagraphs and cfg.grad_accum > 1
        if self.keep_grads and self.dist.world_size > 1:
            # DDP's reducer reads the accumulated .grad at the last micro-batch's hooks, untested here.
            raise ValueError(f"compile_mode={cfg.compile_mode!r} (CUDA graphs) with grad_accum={cfg.grad_accum} on "
                             f"{self.dist.world_size} ranks: use grad_accum=1 (a larger batch_size) or a compile "
                             "mode without CUDA graphs")
        if self.keep_grads:
            for p in self.model.parameters():
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
        if self.recipe is not None and self.recipe.weight_cache:  # before the first (compiled) forward
            adahop.refresh_weights(self.model, torch.bfloat16 if use_bf16 else torch.float32)
        self.flops_per_token = self.model_config.flops_per_token(cfg.seq_len)
        self.peak_flops = peak_bf16_flops(self.device)

        self.step = 0
        self.best_val_loss: float | None = None
        self.last_checkpoint: Path | None = None
        self.history: list[dict[str, Any]] = []
        # Which code trained which steps: one entry per start or resume (a run split over several
        # jobs, or resumed on a machine that kept an older commit's checkpoint, says so).
        commit, dirty = git_state()
        self.segments: list[dict[str, Any]] = [{"from_step": 0, "git_commit": commit, "git_dirty": dirty}]
        self.stop_reason: str | None = None  # set by request_stop (e.g. from a signal handler)
        self._stop_agreed = False  # some rank asked to stop (from the last step's all-reduce)
        # perf_counter() when the step in progress began (None before the first): how long a step
        # has run when a signal asks the run to stop (a compiling step can take minutes)
        self.step_started_at: float | None = None
        if self.out_dir is not None:
            self._resume()

    def calibration_windows(self) -> list[tuple[int, int]]:
        """The recipe's calibration windows over this run's steps (:func:`step_times`); none for a peer."""
        return self.recipe.calibration_windows(self.total_steps) if self.recipe is not None else []

    def full_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(model, optimizer)`` state dicts with full tensors. Under FSDP a collective (every rank
        calls it): gathered to rank 0's host memory, empty dicts elsewhere; the optimizer's is keyed
        by parameter names there (``torch.distributed.checkpoint.state_dict``)."""
        if not self.fsdp:
            return self.model.state_dict(), self.optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return (get_model_state_dict(self.model, options=options),
                get_optimizer_state_dict(self.model, self.optimizer, options=options))

    def export_model(self) -> Llama | None:
        """The trained model with full weights, on the main rank (None on the others): ``self.model``
        itself, or under FSDP (a collective) a plain :class:`Llama` on the CPU built from the gathered
        weights (the layers' strategies are not part of it; ``adahop.export_strategies(self.model)``
        has them on every rank). What :func:`adahop.harness.model.export_hf` takes."""
        if not self.fsdp:
            return self.model if self.dist.is_main else None
        state, _ = self.full_state()
        if not self.dist.is_main:
            return None
        with torch.device("meta"):
            plain = Llama(self.model_config)
        weights = {k: v for k, v in state.items() if not k.endswith("_extra_state")}
        plain.load_state_dict(weights, strict=True, assign=True)
        if self.model_config.tie_embeddings:
            plain.lm_head.weight = plain.model.embed_tokens.weight
        # Non-persistent buffers are not in a state dict: computed again, as Llama() does.
        plain.rope_cos, plain.rope_sin = (torch.as_tensor(t) for t in rope_tables(
            self.model_config.head_dim, self.model_config.max_seq_len, self.model_config.rope_theta))
        return plain

    def request_stop(self, reason: str = "stop requested") -> None:
        """Ask :meth:`run` to end after the current step: checkpoint it, then raise
        :class:`TrainingStopped`. Only sets a flag, so a signal handler may call it; the ranks
        agree through the loss all-reduce of the next step, so all of them stop at the same one."""
        self.stop_reason = reason

    # -- files ---------------------------------------------------------------------------------

    @property
    def checkpoint_dir(self) -> Path:
        assert self.out_dir is not None
        return self.out_dir / "checkpoints"

    def checkpoints(self) -> list[Path]:
        """Complete checkpoints in step order (a write in progress has a temp name)."""
        if self.out_dir is None or not self.checkpoint_dir.is_dir():
            return []
        return sorted(p for p in self.checkpoint_dir.iterdir() if re.fullmatch(r"step_\d{8}\.pt", p.name))

    def _log(self, record: dict[str, Any]) -> None:
        self.history.append(record)
        if self.out_dir is not None and self.dist.is_main:
            with open(self.out_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")

    def _gather(self, obj: Any) -> list[Any]:
        if self.dist.world_size == 1:
            return [obj]
        out: list[Any] = [None] * self.dist.world_size
        dist.all_gather_object(out, obj)
        return out

    def save_checkpoint(self) -> Path | None:
        """Atomic: written to a temp file in the same folder, then renamed. Rank 0 writes; every
        rank contributes its sampler and RNG states and its layers' calibration state (the votes a
        rank gathered inside a calibration window are its own until the window's end sums them), and
        every rank returns once the file is there. Returns its path (None without an ``out_dir``)."""
        if self.out_dir is None:
            return None
        layers = {name: layer.get_extra_state() for name, layer in adahop.linear.quant_layers(self.model)}
        per_rank = self._gather({"data": self.train_batches.state_dict(), "rng": rng_state(), "layers": layers})
        strategies = self._gather(adahop.export_strategies(self.model))
        path = self.checkpoint_dir / f"step_{self.step:08d}.pt"
        model_state, optimizer_state = self.full_state() if (self.dist.is_main or self.fsdp) else ({}, {})
        if self.dist.is_main:
            # Votes differ between ranks until a window ends; the fixed strategies must not.
            fixed = [{name: layer["strategies"] for name, layer in s.items()} for s in strategies]
            if any(f != fixed[0] for f in fixed):
                warnings.warn("calibrated strategies differ between ranks; the checkpoint keeps rank 0's")
            state = {
                "step": self.step,
                "config": dataclasses.asdict(self.cfg),
                "world_size": self.dist.world_size,
                "model": model_state,
                "optimizer": optimizer_state,
                "scheduler": self.scheduler.state_dict(),
                "ranks": per_rank,
                "best_val_loss": self.best_val_loss,
                "segments": self.segments,
            }
            self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            with open(tmp, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            atomic_write_text(self.out_dir / "strategies.json", json.dumps(strategies[0], indent=1, default=str) + "\n")
            for old in self.checkpoints()[: -self.cfg.keep_checkpoints]:
                old.unlink()
        if self.dist.world_size > 1:
            dist.barrier()  # no rank goes on (or resumes) before the file is complete
        self.last_checkpoint = path
        return path

    def _resume(self) -> None:
        assert self.out_dir is not None
        if self.dist.is_main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        found = self.checkpoints()
        if not found:
            if self.dist.is_main:
                (self.out_dir / "metrics.jsonl").unlink(missing_ok=True)
            return
        # On the CPU: RNG states must stay CPU tensors; weights and optimizer state are copied to
        # their parameters' device by load_state_dict.
        state = torch.load(found[-1], map_location="cpu", weights_only=False)
        changed = sorted(
            k for k, v in dataclasses.asdict(self.cfg).items()
            if k not in RESUMABLE_CHANGES and state["config"].get(k) != v
        )
        if changed:
            raise ValueError(f"{found[-1]} was written with a different config ({changed}); use another out_dir")
        if state["world_size"] != self.dist.world_size:
            raise ValueError(f"{found[-1]} was written by {state['world_size']} ranks, this run has {self.dist.world_size}")
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_model_state_dict,
                set_optimizer_state_dict,
            )

            # Every rank read the whole file; each keeps its shard of the full tensors.
            options = StateDictOptions(full_state_dict=True)
            set_model_state_dict(self.model, state["model"], options=options)
            set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"], options=options)
        else:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        mine = state["ranks"][self.dist.rank]
        # The model's state is rank 0's: each rank takes back its own calibration votes.
        for name, layer in adahop.linear.quant_layers(self.model):
            if name in mine.get("layers", {}):
                layer.set_extra_state(mine["layers"][name])
        self.train_batches.load_state_dict(mine["data"])
        set_rng_state(mine["rng"])
        self.step, self.best_val_loss, self.last_checkpoint = state["step"], state["best_val_loss"], found[-1]
        # (a checkpoint without segments: the code of its steps is unknown)
        earlier = state.get("segments", [{"from_step": 0, "git_commit": None, "git_dirty": None}])
        self.segments = [*earlier, {**self.segments[-1], "from_step": self.step}]
        # Lines logged after the checkpoint belong to the lost part of the interrupted run.
        metrics = self.out_dir / "metrics.jsonl"
        if self.dist.is_main and metrics.exists():
            kept = [line for line in metrics.read_text().splitlines() if json.loads(line).get("step", 0) <= self.step]
            atomic_write_text(metrics, "".join(line + "\n" for line in kept))
            self.history = [json.loads(line) for line in kept]

    # -- steps ---------------------------------------------------------------------------------

    def _to_device(self, batch: tuple[Any, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = (torch.as_tensor(t).to(self.device, torch.int64, non_blocking=True) for t in batch)
        return x, y

    def _mean_over_ranks(self, values: torch.Tensor) -> torch.Tensor:
        if self.dist.world_size > 1:
            dist.all_reduce(values)  # SUM: gloo has no AVG
            values = values / self.dist.world_size
        return values

    def train_step(self) -> dict[str, float]:
        """One optimizer step; returns the rank-mean loss, grad norm and the LR it used."""
        self.ddp.train()
        loss_sum = torch.zeros((), device=self.device)
        for micro in range(self.cfg.grad_accum):
            x, y = self._to_device(next(self.train_batches))
            last = micro == self.cfg.grad_accum - 1
            sync = contextlib.nullcontext()
            if self.fsdp:
                self.model.set_requires_gradient_sync(last)
            elif self.dist.world_size > 1 and not last:
                sync = self.ddp.no_sync()
            if self.cudagraphs:
                # A new step: the graphs' previous outputs (last micro-batch's loss) are no longer read.
                torch.compiler.cudagraph_mark_step_begin()
            # While layers calibrate (eager graph breaks), compiled code runs eagerly: the model
            # compiles once, at the first fixed step (adahop.eager_while_calibrating).
            with sync, adahop.eager_while_calibrating(self.model):
                with self.autocast():
                    _, loss = self.ddp(x, y)
                (loss / self.cfg.grad_accum).backward()
            loss_sum += loss.detach().float()
            if not last:  # the next micro-batch rounds with fresh draws (after a step, on_optimizer_step does it)
                adahop.linear.advance_draws(self.model)
        max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf")
        if self.fsdp:
            # The norm of sharded gradients is a partial DTensor: made whole (one all-reduce) first.
            params = [p for p in self.model.parameters() if p.grad is not None]
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params])
            grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, grad_norm)
        else:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        # The stop flag rides on the one all-reduce (and host sync) that the step has anyway.
        stop_flag = torch.full((), 1.0 if self.stop_reason else 0.0, device=loss_sum.device)
        loss_v, norm_v, stop_v = self._mean_over_ranks(
            torch.stack([loss_sum / self.cfg.grad_accum, grad_norm.float(), stop_flag])
        ).tolist()
        self._stop_agreed = stop_v > 0
        step = self.step + 1
        bad = [key for key, value in (("loss", loss_v), ("grad_norm", norm_v)) if not math.isfinite(value)]
        if bad:
            self.optimizer.zero_grad(set_to_none=not self.keep_grads)
            self._log({"step": step, "event": "non-finite", "non_finite": bad, "loss": str(loss_v),
                       "grad_norm": str(norm_v)})
            kept = (f"the last good checkpoint is {self.last_checkpoint}" if self.last_checkpoint
                    else "no checkpoint was written before it")
            # A finite loss with a non-finite norm points at the backward (a gradient overflowed).
            which = {("loss",): "training loss", ("grad_norm",): "gradient norm (the loss was finite)",
                     ("loss", "grad_norm"): "training loss and gradient norm"}[tuple(bad)]
            raise NonFiniteLossError(
                f"non-finite {which} at step {step}: loss {loss_v}, gradient norm {norm_v}; "
                f"stopped before applying the update, {kept}", bad
            )
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=not self.keep_grads)
        adahop.on_optimizer_step(self.model)
        self.step = step
        return {"loss": loss_v, "grad_norm": norm_v, "lr": lr}

    @torch.no_grad()
    def evaluate(self) -> float | None:
        """Mean held-out loss over this rank's eval batches, averaged over ranks (batch-weighted)."""
        if self.eval_batches is None:
            return None
        self.runner.eval()
        total = torch.zeros(2, device=self.device, dtype=torch.float64)
        for batch in self.eval_batches():
            x, y = self._to_device(batch)
            with self.autocast(), adahop.eager_while_calibrating(self.model):
                _, loss = self.runner(x, y)
            total += torch.stack([loss.double(), torch.ones((), device=self.device, dtype=torch.float64)])
        if self.dist.world_size > 1:
            dist.all_reduce(total)
        self.runner.train()
        if total[1] == 0:
            raise ValueError("the held-out split gave no eval batches (too few tokens for one sequence?)")
        return (total[0] / total[1]).item()

    def run(self, until: int | None = None) -> list[dict[str, Any]]:
        """Train from the current (or resumed) step to ``until`` (default and at most
        ``total_steps``); returns all records logged so far. Peak memory counts from this call on."""
        cfg = self.cfg
        stop = self.total_steps if until is None else min(until, self.total_steps)
        bar = None
        if self.progress:
            from tqdm import tqdm

            bar = tqdm(total=self.total_steps, initial=self.step, unit="step", dynamic_ncols=True)
        if self.device.type == "cuda":
            if self.cudagraphs:  # the cache held outside the graphs' pools is not this run's peak
                torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            # What this call starts from: the graphs' pools recorded by earlier calls and the tensors
            # that live across steps (weights, optimizer state). A replay allocates nothing: under
            # CUDA graphs the allocated bytes are those outside the pools, and the pools are
            # (nearly all of) reserved minus allocated.
            self.memory_at_start = {"allocated_gib": torch.cuda.memory_allocated(self.device) / 2**30,
                                    "reserved_gib": torch.cuda.memory_reserved(self.device) / 2**30}
            # How the reserved bytes split into tensors and cache, per pool (a graph's pool is one).
            self.allocator_at_start = allocator_summary(torch.cuda.memory._snapshot(self.device))
        # Throughput clock: wall time between log lines minus the time spent evaluating and saving.
        t_last, steps_since, paused = time.perf_counter(), 0, 0.0
        try:
            while self.step < stop:
                self.step_started_at = time.perf_counter()
                out = self.train_step()
                steps_since += 1
                final = self.step == self.total_steps
                record: dict[str, Any] = {}
                if self.step % cfg.log_interval == 0 or final:
                    if self.device.type == "cuda":
                        torch.cuda.synchronize(self.device)
                    tps = steps_since * self.tokens_per_step / (time.perf_counter() - t_last - paused)
                    t_last, steps_since, paused = time.perf_counter(), 0, 0.0
                    record = {
                        "step": self.step,
                        "tokens": self.step * self.tokens_per_step,
                        **out,
                        "tokens_per_s": tps,
                        "mfu": (self.flops_per_token * tps / (self.peak_flops * self.dist.world_size)
                                if self.peak_flops else None),
                        "peak_mem_gib": peak_memory_gib(self.device, self.cudagraphs),
                    }
                    if self.device.type == "cuda":
                        record["peak_allocated_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
                        # Each record's peaks are its own interval's (the run's peak is their max): a
                        # step that records CUDA graphs shows what its tensors took, apart from the
                        # eager steps before it.
                        torch.cuda.reset_peak_memory_stats(self.device)
                    if bar is not None:
                        bar.set_postfix(loss=f"{out['loss']:.3f}", tok_s=f"{tps:,.0f}")
                t_pause = time.perf_counter()
                if (cfg.eval_interval and self.step % cfg.eval_interval == 0) or final:
                    val = self.evaluate()
                    if val is not None:
                        self.best_val_loss = val if self.best_val_loss is None else min(self.best_val_loss, val)
                        record = {"step": self.step, "tokens": self.step * self.tokens_per_step, **record,
                                  "val_loss": val}
                if record:
                    self._log(record)
                due = (cfg.checkpoint_interval and self.step % cfg.checkpoint_interval == 0) or final
                if self.out_dir is not None and (due or self._stop_agreed):
                    self.save_checkpoint()
                paused += time.perf_counter() - t_pause
                if bar is not None:
                    bar.update(1)
                if self._stop_agreed and not final:
                    reason = self.stop_reason or "another rank was asked to stop"
                    self._log({"step": self.step, "event": "stopped", "reason": reason})
                    saved = self.checkpoint_dir / f"step_{self.step:08d}.pt" if self.out_dir is not None else None
                    raise TrainingStopped(self.step, saved, reason)
        finally:
            if bar is not None:
                bar.close()
        return self.history


def step_times(history: list[dict[str, Any]], calibration_windows: Iterable[tuple[int, int]] = ()) -> dict[str, Any]:
    """Where a run's training time went, from its metrics records: each logged interval's seconds
    are its tokens over its tokens/s (the trainer's clock leaves held-out evaluation and checkpoints
    out). ``train_s``: all steps. ``step_s``: the median seconds per step over the intervals after
    the first that touch no calibration window nor the step after one. ``first_s``: the first
    logged step's time above ``step_s`` (compilation, autotuning, allocator warm-up). With
    ``calibration_windows`` (``Recipe.calibration_windows``: inclusive 1-based step ranges in which
    the layers observe their operands), ``calibration``: the windows, their steps, ``s`` (their
    time above ``step_s``, the first logged step left to ``first_s``) and ``after_s`` (the time
    above ``step_s`` of the step after each window, the first with the newly fixed strategies:
    their kernels compile or load from the cache then), each also as a share of ``train_s``; None
    for a recipe that does not calibrate. Approximate where an interval spans more than one step
    (the log interval): its time is spread evenly over its steps."""
    windows = [(int(a), int(b)) for a, b in calibration_windows]
    in_window = lambda step: any(a <= step <= b for a, b in windows)  # noqa: E731
    after_window = {b + 1 for _, b in windows}
    per_step: list[tuple[int, float]] = []  # (step, seconds), an interval's time spread over its steps
    prev_step = prev_tokens = 0
    for r in history:
        if "loss" not in r or not r.get("tokens_per_s") or r["step"] <= prev_step:
            continue
        n = r["step"] - prev_step
        seconds = (r["tokens"] - prev_tokens) / r["tokens_per_s"]
        per_step += [(prev_step + i + 1, seconds / n) for i in range(n)]
        prev_step, prev_tokens = r["step"], r["tokens"]
    if not per_step:
        return {"train_s": None, "step_s": None, "first_s": None, "calibration": None}
    train_s = sum(t for _, t in per_step)
    plain = [t for step, t in per_step[1:] if not in_window(step) and step not in after_window]
    step_s = statistics.median(plain) if plain else statistics.median(t for _, t in per_step)
    calibration = None
    if windows:
        rest = per_step[1:]
        cal_s = sum(t - step_s for step, t in rest if in_window(step))
        after_s = sum(t - step_s for step, t in rest if step in after_window)
        calibration = {"windows": [list(w) for w in windows], "steps": sum(in_window(s) for s, _ in per_step),
                       "s": cal_s, "share": cal_s / train_s, "after_s": after_s, "after_share": after_s / train_s}
    return {"train_s": train_s, "step_s": step_s, "first_s": per_step[0][1] - step_s, "calibration": calibration}


def summarize(history: list[dict[str, Any]], points: int = 20,
              calibration_windows: Iterable[tuple[int, int]] = ()) -> dict[str, Any]:
    """Headline numbers of a run from its metrics records: final and best held-out loss, tokens,
    median tokens/s and MFU over the log intervals after the first (compilation and warm-up),
    peak memory, the training-loss curve at about ``points`` evenly spaced steps, and where the
    training time went (:func:`step_times`, with the recipe's ``calibration_windows``)."""
    train = [r for r in history if "loss" in r and "tokens_per_s" in r]
    val = [r for r in history if r.get("val_loss") is not None]
    steady = train[1:] or train
    tps = [r["tokens_per_s"] for r in steady]
    mfu = [r["mfu"] for r in steady if r.get("mfu") is not None]
    every = max(1, len(train) // points)
    return {
        "steps": train[-1]["step"] if train else 0,
        "tokens": train[-1]["tokens"] if train else 0,
        "final_loss": train[-1]["loss"] if train else None,
        "final_val_loss": val[-1]["val_loss"] if val else None,
        "best_val_loss": min(r["val_loss"] for r in val) if val else None,
        "tokens_per_s": statistics.median(tps) if tps else None,
        "mfu": statistics.median(mfu) if mfu else None,
        "peak_mem_gib": max(r["peak_mem_gib"] for r in train) if train else None,
        "loss_curve": [{"step": r["step"], "loss": r["loss"]} for r in train[::every]],
        "val_curve": [{"step": r["step"], "val_loss": r["val_loss"]} for r in val],
        **step_times(history, calibration_windows),
    }


def corpus_batches(
    data_dir: str | Path, cfg: TrainConfig, dist_info: DistInfo
) -> tuple[int, Iterator, Callable[[], Iterable]]:
    """``(vocab_size, train batches, held-out batches)`` of a corpus directory for this rank,
    through :mod:`adahop.harness.data` (the sampler resumes from its ``state_dict``)."""
    from adahop.harness import data

    vocab_size = read_vocab_size(data_dir)
    train = data.TokenBatches(data_dir, "train", cfg.seq_len, cfg.batch_size, cfg.seed,
                              dist_info.rank, dist_info.world_size)

    def held_out() -> Iterable:
        return data.iter_eval_batches(data_dir, cfg.seq_len, cfg.batch_size, split="val", rank=dist_info.rank,
                                      world_size=dist_info.world_size, max_batches=cfg.eval_batches or None)

    return vocab_size, train, held_out
