"""Data parallelism on CPU (2 gloo ranks): DDP and FSDP2 with a calibrating recipe against one process.

Each test launches this file under ``torchrun`` (``python -m torch.distributed.run``, 2 ranks; the
``__main__`` block at the end is the ranks' code) and compares what the ranks wrote with a
one-process run over the same global batches, made in the test process. The recipe is ``adahop``
calibrating for 3 steps, so calibration ends inside the run and every rank fixes its strategies
from the votes summed over ranks (``Calibration.all_reduce``).

The one-process run takes each global batch as 2 accumulated micro-batches, the ranks' two shares
in rank order: a layer votes on the operand of each forward it runs, so under data parallelism
each rank labels its own share, and only gradient accumulation over the same shares gives one
process the same votes (a single forward over the whole batch labels it as a whole and may pick
another label for a layer, and then other strategies).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

import adahop
from adahop.policy import PATTERNS, ROLES, Calibration, Strategy
from adahop.harness.provenance import REPO_ROOT
from adahop.harness.train import RandomTokenBatches, TrainConfig, Trainer, init_distributed

pytestmark = [pytest.mark.distributed, pytest.mark.usefixtures("one_thread")]

WORLD = 2
VOCAB, SEQ, PER_RANK = 256, 64, 2
CALIBRATION_STEPS, STEPS = 3, 5
# The losses of 2 ranks against 1 process over the same global batches: the same operands, the
# same votes, so what differs is only the order of float reductions (DDP's all-reduce or FSDP's
# reduce-scatter of two half-batch gradients against their sum accumulated in one process), fp32 on
# CPU, ~1e-7 relative. Rounding to nearest is forced (adahop's stochastic rounding of grad_output
# draws from a seed that includes the micro-batch index: 0 on both ranks, 0 and 1 in one process),
# so the quantized operands agree. MXFP4 can still turn a 1e-7 difference into one code step of an
# element that sits on a rounding boundary; 1e-5 relative leaves room for a few such flips over 5
# steps and is still ~10x below the loss change of one step on a rank that trained on the other
# rank's data or a gradient summed instead of averaged (both fail it).
LOSS_RTOL = 1e-5


def config(**overrides) -> TrainConfig:
    return TrainConfig(**{
        "model": "tiny", "recipe": "adahop", "steps": STEPS, "batch_size": PER_RANK, "seq_len": SEQ, "lr": 3e-3,
        "warmup_steps": 2, "eval_interval": 0, "checkpoint_interval": 0, "log_interval": 1, "precision": "fp32",
        "recipe_overrides": {"calibration_steps": CALIBRATION_STEPS, "grad_rounding": "rne"}, **overrides})


class Shares:
    """The ranks' shares of each global batch, one after the other: the micro-batches of the one
    process that stands in for all ranks."""

    def __init__(self):
        self.ranks = [GlobalBatches(r, WORLD) for r in range(WORLD)]
        self.pending: list = []

    def __iter__(self):
        return self

    def __next__(self):
        if not self.pending:
            self.pending = [next(share) for share in self.ranks]
        return self.pending.pop(0)

    def state_dict(self):
        return self.ranks[0].state_dict()

    def load_state_dict(self, state):
        for share in self.ranks:
            share.load_state_dict(state)


class GlobalBatches:
    """Rank ``rank``'s rows of one stream of global batches of ``WORLD * PER_RANK`` sequences: the
    same stream whatever the world size (one process takes every row)."""

    def __init__(self, rank: int, world: int):
        self.source = RandomTokenBatches(VOCAB, SEQ, WORLD * PER_RANK, seed=7)
        self.rows = slice(rank * WORLD * PER_RANK // world, (rank + 1) * WORLD * PER_RANK // world)

    def __iter__(self):
        return self

    def __next__(self):
        x, y = next(self.source)
        return x[self.rows], y[self.rows]

    def state_dict(self):
        return self.source.state_dict()

    def load_state_dict(self, state):
        self.source.load_state_dict(state)


def trainer(rank: int, world: int, out_dir: Path | None = None, **overrides) -> Trainer:
    from adahop.harness.train import DistInfo

    info = DistInfo(rank, rank, world)
    batches = GlobalBatches(rank, world) if world == WORLD else Shares()
    cfg = config(grad_accum=WORLD // world, **overrides)
    return Trainer(cfg, VOCAB, batches, out_dir=out_dir, dist_info=info, device="cpu", progress=False)


def metrics_losses(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r and "event" not in r]


def summed_calibrations(rank: int) -> dict:
    """Calibration.all_reduce on rank-dependent votes and errors, both before and after."""
    cal = Calibration()
    for _ in range(rank + 1):
        cal.vote("x", "row")
    cal.vote("g", "col" if rank else "none")
    cal.add_errors("fwd", {Strategy.MXFP4: (1.0 + rank, 10.0), Strategy.IHT: (0.5 * (rank + 1), 10.0)})
    if rank == 1:  # a slot only one rank measured still reaches every rank
        cal.add_errors("wgrad", {Strategy.IHT: (2.0, 8.0)})
    cal.all_reduce()
    return cal.to_dict()


# ---------------------------------------------------------------------------------------------
# The ranks' side (torchrun runs this file)


def rank_main(mode: str, out: Path) -> None:
    torch.set_num_threads(1)
    info, _ = init_distributed("cpu")
    try:
        result: dict = {"rank": info.rank}
        if mode == "ddp":
            result["calibration"] = summed_calibrations(info.rank)
            t = trainer(info.rank, info.world_size)
            result["losses"] = [r["loss"] for r in t.run()]
            result["strategies"] = adahop.export_strategies(t.model)
        else:
            # Straight, with the last step checkpointed and exported as a whole model.
            t = trainer(info.rank, info.world_size, out / "straight", fsdp=True)
            result["losses"] = [r["loss"] for r in t.run()]
            result["strategies"] = adahop.export_strategies(t.model)
            exported = t.export_model()
            if info.is_main:
                result["exported"] = {k: v.clone() for k, v in exported.state_dict().items()}
            # Stopped after step 2 (a checkpoint inside calibration), resumed by a new trainer.
            first = trainer(info.rank, info.world_size, out / "resumed", fsdp=True, checkpoint_interval=2)
            first.run(until=2)
            del first
            resumed = trainer(info.rank, info.world_size, out / "resumed", fsdp=True, checkpoint_interval=2)
            result["resumed_from"] = resumed.step
            resumed.run()
            result["resumed_strategies"] = adahop.export_strategies(resumed.model)
        torch.save(result, out / f"rank{info.rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_ranks(mode: str, out: Path) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD}",
                    __file__, mode, str(out)], check=True, env=env, cwd=REPO_ROOT, timeout=240)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


@pytest.fixture(scope="module")
def ddp_ranks(tmp_path_factory) -> list[dict]:
    return run_ranks("ddp", tmp_path_factory.mktemp("ddp"))


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory) -> tuple[Path, list[dict]]:
    out = tmp_path_factory.mktemp("fsdp")
    return out, run_ranks("fsdp", out)


@pytest.fixture(scope="module")
def one_process() -> dict:
    """The same steps in one process over the same global batches, the ranks' shares accumulated."""
    t = trainer(0, 1)
    losses = [r["loss"] for r in t.run()]
    return {"losses": losses, "strategies": adahop.export_strategies(t.model), "model": t.model}


def fixed_everywhere(strategies: dict) -> bool:
    return bool(strategies) and all(layer["phase"] == "fixed" and layer["step"] == STEPS for layer in strategies.values())


def test_calibration_all_reduce_sums_votes_and_errors_over_ranks_and_is_a_no_op_alone(ddp_ranks):
    alone = Calibration()
    alone.vote("x", "row")
    alone.all_reduce()  # no process group: nothing to sum with
    assert alone.votes["x"]["row"] == 1
    summed = [r["calibration"] for r in ddp_ranks]
    assert summed[0] == summed[1]
    votes = summed[0]["votes"]
    assert votes["x"] == {"none": 0, "row": 1 + 2, "col": 0}  # rank 0 voted once, rank 1 twice
    assert votes["g"] == {"none": 1, "row": 0, "col": 1}
    assert all(votes[role][p] == 0 for role in ROLES if role not in ("x", "g") for p in PATTERNS)
    assert summed[0]["errors"]["fwd"] == {"mxfp4": [1.0 + 2.0, 20.0], "iht": [0.5 + 1.0, 20.0]}
    assert summed[0]["errors"]["wgrad"] == {"iht": [2.0, 8.0]}
    assert "dgrad" not in summed[0]["errors"]  # measured by no rank: stays unmeasured


def test_ddp_ranks_fix_the_same_strategies_and_match_one_process(ddp_ranks, one_process):
    ranks = ddp_ranks
    assert fixed_everywhere(ranks[0]["strategies"])
    assert ranks[0]["strategies"] == ranks[1]["strategies"] == one_process["strategies"]
    assert ranks[0]["losses"] == ranks[1]["losses"]  # the rank mean, the same number on both
    assert len(ranks[0]["losses"]) == STEPS
    np.testing.assert_allclose(ranks[0]["losses"], one_process["losses"], rtol=LOSS_RTOL)


def test_fsdp_ranks_fix_the_same_strategies_match_one_process_and_resume(fsdp_run, one_process):
    tmp_path, ranks = fsdp_run
    assert fixed_everywhere(ranks[0]["strategies"])
    assert ranks[0]["strategies"] == ranks[1]["strategies"] == one_process["strategies"]
    np.testing.assert_allclose(ranks[0]["losses"], one_process["losses"], rtol=LOSS_RTOL)
    # The checkpoint is one file of full tensors under the one-process model's names.
    state = torch.load(tmp_path / "straight" / "checkpoints" / f"step_{STEPS:08d}.pt", weights_only=False)
    reference = one_process["model"].state_dict()
    assert set(state["model"]) == set(reference)
    assert all(state["model"][k].shape == v.shape for k, v in reference.items() if torch.is_tensor(v))
    assert json.loads((tmp_path / "straight" / "strategies.json").read_text()) == ranks[0]["strategies"]
    # The exported model holds the trained full weights (what the HF export writes).
    exported = ranks[0]["exported"]
    assert "exported" not in ranks[1]
    for name, tensor in state["model"].items():
        if torch.is_tensor(tensor):
            assert torch.equal(exported[name], tensor), name
    # Resumed inside calibration (after step 2 of 3): the same curve and the same fixed strategies.
    assert [r["resumed_from"] for r in ranks] == [2, 2]
    assert metrics_losses(tmp_path / "resumed") == metrics_losses(tmp_path / "straight")
    assert ranks[0]["resumed_strategies"] == ranks[1]["resumed_strategies"] == ranks[0]["strategies"]


def test_fsdp_needs_several_ranks():
    with pytest.raises(ValueError, match="fsdp shards over ranks"):
        trainer(0, 1, fsdp=True)


if __name__ == "__main__":
    rank_main(sys.argv[1], Path(sys.argv[2]))
