"""Which strategy runs each of a layer's three GEMMs: pattern pairs, the strategy table, calibration.

A layer's GEMMs (DESIGN §1), each ``A · B`` with A the left operand:

=========  ==================  =====================  =====================
slot       GEMM                A (left)               B (right)
=========  ==================  =====================  =====================
``fwd``    Y  = X · Wᵀ         X (tokens × in)        Wᵀ  → label opp(w)
``dgrad``  dX = dY · W         dY (tokens × out)      W   → label w
``wgrad``  dW = dYᵀ · X        dYᵀ → label opp(g)     X   → label x
=========  ==================  =====================  =====================

``x``, ``w`` and ``g`` (grad_output) are labelled as stored (:mod:`adahop.patterns`); transposing
an operand swaps ``row`` and ``col``.

Two policies turn calibration into per-GEMM strategies:

* ``table``: majority-vote labels → pattern pairs → :class:`StrategyTable` (the reference table of
  DESIGN §1 by default).
* ``lqs`` (HOT's layer-wise quantizer selection, :mod:`adahop.hot`): BF16 ``fwd``, HOT's
  low-rank INT8 ``wgrad``, and for ``dgrad`` HOT's INT4 GEMM with grad_output scaled per tensor,
  or per token where that cuts the measured quantization error by more than the recipe's
  ``measured_margin`` (HOT: one half).
* ``measured``: per GEMM, the FP4 strategy with the lowest relative output error summed over the
  calibration batches, an OE strategy only when it beats ``mxfp4``/``iht`` by a margin (it
  costs a BF16 GEMM of k rows, and never has a higher error). BF16 is not a candidate (it would
  always win); ``iht+oe-left`` is not a ``wgrad`` candidate (X is saved only in MXFP4, see
  :func:`effective_strategy`).

Calibration state (:class:`Calibration`) is plain data so it travels in checkpoints.
"""

from __future__ import annotations

import enum
import warnings
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from adahop.patterns import PATTERNS, Pattern, opposite

SLOTS = ("fwd", "dgrad", "wgrad")
ROLES = ("x", "w", "g")


class Strategy(str, enum.Enum):
    """How one GEMM runs.

    BF16: unquantized, in the layer's compute dtype. MXFP4: both operands quantized, no transform.
    IHT: block-Hadamard along the inner dimension, then MXFP4. IHT_OE_LEFT / IHT_OE_RIGHT: IHT,
    with the ``k`` outer rows of largest magnitude of A (left) or of Bᵀ (right) computed in BF16.

    HOT's GEMMs (:mod:`adahop.hot`), each for one slot: HOT_INT4 / HOT_INT4_TOKEN (``dgrad``): a
    block-16 Hadamard along ``out`` on dY and W, both in INT4 (dY stochastically rounded with one
    scale per tensor, or per token; W SAWB-clipped per tensor). HOT_LOWRANK_INT8 (``wgrad``): dY and
    X projected onto the lower half of the Walsh sequencies along tokens, then INT8 (X saved so).
    HOT_INT8 (``wgrad``, an ablation beyond HOT): the same INT8 quantizers without the projection.
    """

    BF16 = "bf16"
    MXFP4 = "mxfp4"
    IHT = "iht"
    IHT_OE_LEFT = "iht+oe-left"
    IHT_OE_RIGHT = "iht+oe-right"
    HOT_INT4 = "hot-int4"
    HOT_INT4_TOKEN = "hot-int4-token"
    HOT_LOWRANK_INT8 = "hot-lowrank-int8"
    HOT_INT8 = "hot-int8"

    @property
    def quantized(self) -> bool:
        return self is not Strategy.BF16

    @property
    def mxfp4(self) -> bool:
        """Runs through the MXFP4 quantizers (MXFP4, IHT and its OE variants)."""
        return self.quantized and not self.hot

    @property
    def hadamard(self) -> bool:
        return self.mxfp4 and self is not Strategy.MXFP4

    @property
    def hot(self) -> bool:
        return self in HOT_SLOTS

    @property
    def lowrank(self) -> bool:
        """Projects along tokens before quantizing (HOT's ``wgrad``; X is then saved projected)."""
        return self is Strategy.HOT_LOWRANK_INT8

    @property
    def slots(self) -> tuple[str, ...]:
        """The slots this strategy can run: HOT's GEMMs one each, every other strategy all three."""
        return HOT_SLOTS.get(self, SLOTS)


HOT_SLOTS: dict[Strategy, tuple[str, ...]] = {
    Strategy.HOT_INT4: ("dgrad",), Strategy.HOT_INT4_TOKEN: ("dgrad",), Strategy.HOT_LOWRANK_INT8: ("wgrad",),
    Strategy.HOT_INT8: ("wgrad",),
}


def check_slot(slot: str, strategy: Strategy, where: str) -> None:
    """ValueError when ``strategy`` cannot run ``slot`` (HOT's GEMMs are each one slot's)."""
    if slot not in strategy.slots:
        raise ValueError(f"{where}: strategy {strategy.value!r} runs only {list(strategy.slots)}, not {slot!r}")


def parse_strategy(value: Strategy | str) -> Strategy:
    """``value`` as a :class:`Strategy`: a Strategy or its name (TypeError for any other type,
    ValueError for an unknown name)."""
    if not isinstance(value, str):
        raise TypeError(f"a strategy must be a Strategy or its name, got {type(value).__name__} {value!r}")
    try:
        return Strategy(value)
    except ValueError:
        raise ValueError(f"unknown strategy {value!r}; choose from {[s.value for s in Strategy]}") from None


def effective_strategy(slot: str, strategy: Strategy) -> Strategy:
    """The strategy a slot actually runs: ``wgrad`` OE-left falls back to IHT.

    OE-left on ``wgrad`` needs the outlier rows of dYᵀ against X in BF16, and X is kept only in
    MXFP4 (DESIGN §1), so the layer runs plain IHT there.
    """
    if slot == "wgrad" and strategy is Strategy.IHT_OE_LEFT:
        return Strategy.IHT
    return strategy


def pattern_pairs(labels: Mapping[str, str]) -> dict[str, tuple[Pattern, Pattern]]:
    """Pattern pair ``(A, B)`` of each GEMM from the labels of ``x``, ``w`` and ``g``.

    Equivalent to ``fwd: (x, opp(w))``, ``dgrad: (g, w)``, ``wgrad: (opp(g), x)``.
    """
    missing = [r for r in ROLES if r not in labels]
    if missing:
        raise ValueError(f"labels for {missing} are missing; need x, w and g")
    for role in ROLES:
        if labels[role] not in PATTERNS:
            raise ValueError(f"label of {role} is {labels[role]!r}; expected one of {PATTERNS}")
    x, w, g = labels["x"], labels["w"], labels["g"]
    return {"fwd": (x, opposite(w)), "dgrad": (g, w), "wgrad": (opposite(g), x)}


def pair_key(pair: tuple[str, str]) -> str:
    return f"{pair[0]}-{pair[1]}"


# DESIGN §1, the reference recipe's table.
REFERENCE_TABLE_ENTRIES = {
    "row-row": "iht", "col-row": "iht", "col-none": "iht", "none-row": "iht", "none-none": "iht",
    "row-none": "iht+oe-left",
    "row-col": "iht+oe-right", "none-col": "iht+oe-right",
    "col-col": "bf16",
}


@dataclass(frozen=True)
class StrategyTable:
    """Pattern pair ``"A-B"`` → strategy, for all nine pairs. Configuration, not code."""

    entries: tuple[tuple[str, Strategy], ...]

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Strategy | str]) -> "StrategyTable":
        keys = {f"{a}-{b}" for a in PATTERNS for b in PATTERNS}
        if set(mapping) != keys:
            missing, extra = sorted(keys - set(mapping)), sorted(set(mapping) - keys)
            raise ValueError(f"a strategy table needs exactly the nine pairs; missing {missing}, unknown {extra}")
        entries = tuple(sorted((k, parse_strategy(v)) for k, v in mapping.items()))
        for key, strategy in entries:
            if strategy.hot:  # a table cell serves every slot
                raise ValueError(f"strategy table cell {key!r}: {strategy.value!r} runs one slot only, "
                                 "so no table can hold it")
        return cls(entries)

    def __getitem__(self, pair: tuple[str, str] | str) -> Strategy:
        key = pair if isinstance(pair, str) else pair_key(pair)
        return dict(self.entries)[key]

    def to_dict(self) -> dict[str, str]:
        return {k: v.value for k, v in self.entries}

    def strategies(self, labels: Mapping[str, str]) -> dict[str, Strategy]:
        """Strategy per slot for these labels (after the ``wgrad`` OE-left fallback)."""
        return {slot: effective_strategy(slot, self[pair]) for slot, pair in pattern_pairs(labels).items()}


REFERENCE_TABLE = StrategyTable.from_mapping(REFERENCE_TABLE_ENTRIES)

MEASURED_CANDIDATES: dict[str, tuple[Strategy, ...]] = {
    "fwd": (Strategy.MXFP4, Strategy.IHT, Strategy.IHT_OE_LEFT, Strategy.IHT_OE_RIGHT),
    "dgrad": (Strategy.MXFP4, Strategy.IHT, Strategy.IHT_OE_LEFT, Strategy.IHT_OE_RIGHT),
    "wgrad": (Strategy.MXFP4, Strategy.IHT, Strategy.IHT_OE_RIGHT),
}

# HOT's layer-wise quantizer selection: the dgrad candidates (grad_output per tensor, per token).
LQS_CANDIDATES: tuple[Strategy, ...] = (Strategy.HOT_INT4, Strategy.HOT_INT4_TOKEN)

# A tied vote goes to the first label in this order: `none` sends pairs to plain IHT in the
# reference table, the choice that assumes least.
TIE_ORDER: tuple[Pattern, ...] = ("none", "row", "col")


def majority(votes: Mapping[str, int]) -> Pattern:
    """The label with most votes; ties broken in :data:`TIE_ORDER`. No votes gives ``none``."""
    return max(TIE_ORDER, key=lambda p: (votes.get(p, 0), -TIE_ORDER.index(p)))


@dataclass
class Calibration:
    """Votes and measured errors gathered during a layer's calibration steps (plain data).

    votes: role (``x``/``w``/``g``) → label → count (one vote per forward, or backward for ``g``).
    errors: slot → strategy → ``[sum of squared error, sum of squared reference]``.
    """

    votes: dict[str, dict[str, int]] = field(default_factory=lambda: {r: {p: 0 for p in PATTERNS} for r in ROLES})
    errors: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    def vote(self, role: str, label: str) -> None:
        if role not in ROLES or label not in PATTERNS:
            raise ValueError(f"cannot vote {label!r} for role {role!r}")
        self.votes[role][label] += 1

    def add_errors(self, slot: str, errors: Mapping[Strategy, tuple[float, float]]) -> None:
        bucket = self.errors.setdefault(slot, {})
        for strategy, (err2, ref2) in errors.items():
            acc = bucket.setdefault(Strategy(strategy).value, [0.0, 0.0])
            acc[0] += err2
            acc[1] += ref2

    def labels(self) -> dict[str, Pattern]:
        return {role: majority(self.votes[role]) for role in ROLES}

    def relative_errors(self) -> dict[str, dict[str, float]]:
        """slot → strategy → relative Frobenius error over all calibration batches."""
        return {
            slot: {s: (e / r) ** 0.5 if r > 0 else 0.0 for s, (e, r) in per.items()}
            for slot, per in self.errors.items()
        }

    def measured_strategies(self, margin: float = 0.1, slots: Iterable[str] = SLOTS) -> dict[str, Strategy]:
        """Per slot the measured candidate with the lowest relative error, OE only if it pays.

        An OE strategy always has an error no larger than IHT's (it recomputes k rows exactly) but
        costs an extra BF16 GEMM of k rows, so it replaces the better of ``mxfp4``/``iht`` only when
        its error is lower by more than the fraction ``margin``. Ties go to the earlier candidate.
        """
        rel = self.relative_errors()
        slots = list(slots)
        missing = [s for s in slots if s not in rel]
        if missing:
            raise RuntimeError(f"no calibration errors were measured for {missing}; did the layer run a backward?")
        out = {}
        for slot in slots:
            cands = [c for c in MEASURED_CANDIDATES[slot] if c.value in rel[slot]]
            plain = min((c for c in cands if c in (Strategy.MXFP4, Strategy.IHT)), key=lambda c: rel[slot][c.value])
            best = min(cands, key=lambda c: rel[slot][c.value])
            out[slot] = best if rel[slot][best.value] < (1 - margin) * rel[slot][plain.value] else plain
        return out

    def total_votes(self) -> int:
        return sum(sum(v.values()) for v in self.votes.values())

    def to_dict(self) -> dict:
        return {"votes": {r: dict(v) for r, v in self.votes.items()},
                "errors": {s: {k: list(v) for k, v in per.items()} for s, per in self.errors.items()}}

    @classmethod
    def from_dict(cls, d: Mapping) -> "Calibration":
        cal = cls()
        for role, votes in d.get("votes", {}).items():
            for label, n in votes.items():
                if role not in ROLES or label not in PATTERNS:
                    raise ValueError(f"calibration state has an unknown vote {role}/{label}")
                cal.votes[role][label] = int(n)
        cal.errors = {s: {k: [float(v[0]), float(v[1])] for k, v in per.items()} for s, per in d.get("errors", {}).items()}
        return cal

    def all_reduce(self) -> None:
        """Sum votes and errors over data-parallel ranks so every rank picks the same strategies."""
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return
        keys = [(s, c.value) for s in SLOTS for c in MEASURED_CANDIDATES[s]]
        keys += [("dgrad", c.value) for c in LQS_CANDIDATES]
        flat = [float(self.votes[r][p]) for r in ROLES for p in PATTERNS]
        flat += [v for s, c in keys for v in self.errors.get(s, {}).get(c, [0.0, 0.0])]
        t = torch.tensor(flat, dtype=torch.float64)
        if dist.get_backend() == "nccl":
            t = t.cuda()
        dist.all_reduce(t)
        vals = t.cpu().tolist()
        n = len(ROLES) * len(PATTERNS)
        for i, (r, p) in enumerate((r, p) for r in ROLES for p in PATTERNS):
            self.votes[r][p] = int(round(vals[i]))
        for j, (s, c) in enumerate(keys):
            err2, ref2 = vals[n + 2 * j: n + 2 * j + 2]
            if ref2 > 0:
                self.errors.setdefault(s, {})[c] = [err2, ref2]

def decide(
    policy: str, calibration: Calibration, table: StrategyTable, where: str = "layer", margin: float = 0.1
) -> dict[str, Strategy]:
    """Fixed strategies at the end of calibration for ``policy`` (``table``, ``measured`` or ``lqs``)."""
    if policy not in ("table", "measured", "lqs"):
        raise ValueError(f"unknown policy {policy!r}; choose 'table', 'measured' or 'lqs'")
    if policy == "lqs":
        return lqs_strategies(calibration, where, margin)
    if calibration.total_votes() == 0:
        warnings.warn(f"{where}: no calibration data was observed; every label defaults to 'none'", stacklevel=2)
    from_table = table.strategies(calibration.labels())
    if policy == "table":
        return from_table
    unmeasured = [s for s in SLOTS if s not in calibration.errors]
    if unmeasured:
        # A layer that never ran a backward while calibrating (unused, or frozen) has nothing to
        # measure: it takes the table's choice rather than stopping the run.
        warnings.warn(f"{where}: no errors measured for {unmeasured}; using the strategy table there", stacklevel=2)
    measured = calibration.measured_strategies(margin, [s for s in SLOTS if s not in unmeasured])
    return {s: measured.get(s, from_table[s]) for s in SLOTS}


def lqs_strategies(calibration: Calibration, where: str = "layer", margin: float = 0.5) -> dict[str, Strategy]:
    """HOT's strategies for one layer from its measured dgrad quantization errors.

    grad_output is scaled per token (HOT_INT4_TOKEN) only where that quantizer's relative error is
    below ``1 - margin`` times the per-tensor one's (HOT: ``margin`` 0.5, "cuts the error by more
    than half"); everywhere else per tensor, the cheaper scale. Equivalent to HOT's
    ``calibaration_worker`` rule ``min_qerror - qerror > 0.5 * min_qerror``.
    """
    rel = calibration.relative_errors().get("dgrad", {})
    tensor, token = (rel.get(c.value) for c in LQS_CANDIDATES)
    if tensor is None or token is None:
        warnings.warn(f"{where}: no grad_output errors were measured; grad_output is scaled per tensor", stacklevel=3)
        per_token = False
    else:
        per_token = token < (1 - margin) * tensor
    return {"fwd": Strategy.BF16, "dgrad": Strategy.HOT_INT4_TOKEN if per_token else Strategy.HOT_INT4,
            "wgrad": Strategy.HOT_LOWRANK_INT8}


def strategies_to_dict(strategies: Mapping[str, Strategy]) -> dict[str, str]:
    return {slot: Strategy(strategies[slot]).value for slot in SLOTS}


def strategies_from_dict(d: Mapping[str, str], slots: Iterable[str] = SLOTS) -> dict[str, Strategy]:
    return {slot: parse_strategy(d[slot]) for slot in slots}
