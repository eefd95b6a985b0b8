"""The recipes compared by the suite, as data: one :class:`Recipe` per entry of :data:`RECIPES`.

A recipe says how each of a linear layer's three GEMMs (``fwd``, ``dgrad``, ``wgrad``; see
:mod:`adahop.policy`) runs: a fixed :class:`~adahop.policy.Strategy` per slot, or a policy that
fixes them after calibration; which slots draw random Hadamard signs; and how the backward
operands are rounded. :class:`adahop.linear.QuantLinear` reads nothing else, so adding a recipe is
one entry here plus its tests.

==================  =========================  ======================================================
recipe              fwd / dgrad / wgrad        notes
==================  =========================  ======================================================
``bf16``            bf16 / bf16 / bf16         ``convert`` leaves ``nn.Linear`` untouched
``mxfp4``           mxfp4 everywhere           no transform; SR on grad_output
``uniform-iht``     iht everywhere             a fixed Hadamard on every GEMM (HALO/Quartet-like fwd)
``tseng``           bf16 / iht / iht           Tseng et al. 2025: random-sign Hadamard + SR on every
                                               backward operand
``quartet-style``   iht / iht / iht            Hadamard + RTN forward, ``tseng``'s backward (Quartet
                                               uses QuEST clipping in the forward; RTN here)
``hot``             lqs policy                 HOT (Kim et al. 2025, :mod:`adahop.hot`): BF16 fwd;
                                               INT4 dgrad, block-16 Hadamard; low-rank INT8 wgrad on
                                               X saved projected in INT8; per-layer dY scale (tensor
                                               or token) from 30 BF16 calibration steps
``hot-no-lowrank``  bf16 / hot-int4-token /    ablation: ``hot`` without its low-rank ``wgrad`` (INT8
                    hot-int8                   dY and X at every token, X saved so); dY per token in
                                               ``dgrad``, what ``hot``'s selection picked in every
                                               layer at 125m; no calibration
``adahop``          table policy               30 calibration steps of plain MXFP4, then DESIGN §1
``adahop-measured`` measured policy            lowest measured output error per GEMM
``adahop-no-oe``    table policy               ablation: ``adahop``'s table with IHT where it has
                                               OE-left/right (only the BF16 fallback left)
``adahop-no-bf16``  table policy               ablation: ``adahop``'s table with IHT where it has BF16
                                               (col-col), every GEMM in FP4
``adahop-recal``    table policy               ``adahop`` that recalibrates every 250 steps, keeping its
                                               current strategies while it observes
``adahop-exact-bf16`` table policy             ``adahop`` whose BF16 wgrad fallback is exact: those layers
                                               save X in BF16, not MXFP4 (beyond the paper)
``adahop-bf16-cal`` table policy               ablation: ``adahop`` calibrating in BF16 (every GEMM
                                               unquantized while it observes), not plain MXFP4
==================  =========================  ======================================================

The two ablations separate what ``adahop`` adds over ``uniform-iht``: the outlier-extraction picks
and the BF16 fallback (each ablation keeps one of the two). The paper's fallback runs against X as
the forward saved it, in MXFP4 (DESIGN §1), so it keeps X's quantization error; ``adahop-exact-bf16``
asks what the fallback would buy at full precision, at the cost of a BF16 copy of X in each such
layer (``bf16_wgrad_input``).

Calibration precision. ``calibration_precision="mxfp4"`` (the default) calibrates while running
``calibration_strategy`` (plain MXFP4); ``"bf16"`` runs every GEMM in BF16 while the layer observes
(X saved as it came), the observations unchanged. The default is what the public AdaHOP code we
could read does: its calibration wrapper dispatches "identical to plain MXFP4" until the modes are
fixed (AMD's ALTO integration of AdaHOP, ``MXFP4CalibrationWrapper`` / ``MXFP4AdaHOPWrapper`` with
modes ``"none"``), and it is what this suite's committed ``adahop`` runs did; ``adahop-bf16-cal``
is the other reading (BF16 steps while calibrating). ``hot`` calibrates in BF16, as HOT's
selection pass runs the model unquantized.

Rounding: the forward operands always round to nearest (ties to even). ``grad_rounding`` applies
to grad_output in both backward GEMMs; ``saved_rounding`` to the copies of X (along tokens) and W
(along ``out``) that the forward quantizes for the backward.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from adahop.checks import HADAMARD_SIZES
from adahop.patterns import PatternDetector
from adahop.policy import (
    REFERENCE_TABLE,
    REFERENCE_TABLE_ENTRIES,
    SLOTS,
    Strategy,
    StrategyTable,
    check_slot,
    parse_strategy,
)

POLICIES = ("table", "measured", "lqs")
CALIBRATION_PRECISIONS = ("mxfp4", "bf16")
ROUNDINGS = ("rne", "sr")


_INT, _STR, _NONE = (int,), (str,), (type(None),)
# Field -> (accepted types, how a message names them). Recipe.__post_init__ checks every field;
# get_recipe first turns plain data (names, lists, mappings) into these types.
FIELD_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "name": (_STR, "a str"),
    "description": (_STR, "a str"),
    **{slot: ((Strategy, *_NONE), "a Strategy or None") for slot in SLOTS},
    "policy": ((*_STR, *_NONE), "a str or None"),
    "calibration_steps": (_INT, "an int"),
    "calibration_strategy": ((Strategy,), "a Strategy"),
    "table": ((StrategyTable,), "a StrategyTable"),
    "detector": ((PatternDetector,), "a PatternDetector"),
    "outlier_k": (_INT, "an int"),
    "hadamard_size": (_INT, "an int"),
    "random_signs": ((frozenset,), "a frozenset of slot names"),
    "grad_rounding": (_STR, "a str"),
    "saved_rounding": (_STR, "a str"),
    "seed": (_INT, "an int"),
    "measure_tokens": (_INT, "an int"),
    "measured_margin": ((int, float), "a float"),
    "weight_for_backward": (_STR, "a str"),
    "recalibration_interval": (_INT, "an int"),
    "bf16_wgrad_input": (_STR, "a str"),
    "calibration_precision": (_STR, "a str"),
    "weight_cache": ((bool,), "a bool"),
}


@dataclass(frozen=True)
class Recipe:
    """How a converted linear layer runs its GEMMs (see the module docstring).

    fwd, dgrad, wgrad: fixed strategies, or ``None`` for all three when ``policy`` is set.
    policy: ``"table"``, ``"measured"`` or ``"lqs"`` (HOT's layer-wise quantizer selection):
        strategies fixed after ``calibration_steps`` optimizer steps of ``calibration_strategy``
        (plain MXFP4) or of BF16 (``calibration_precision``).
    outlier_k: rows computed in BF16 by the OE strategies (clamped to the operand's row count).
    hadamard_size: block size of the transform (16, 32, 64 or 128; layer dims must be multiples of
        ``max(32, hadamard_size)``).
    random_signs: slots whose transform draws fresh ±1 signs per step and layer (from ``seed``).
    grad_rounding, saved_rounding: ``"rne"`` or ``"sr"`` (see the module docstring).
    seed: run seed from which every SR draw and sign vector is derived (with layer, step, call).
    measure_tokens: tokens of X kept in BF16 during ``measured`` calibration to score ``wgrad``.
    measured_margin: the relative error reduction the costlier candidate must bring to be picked:
        an OE strategy (``measured``), the per-token dY scale (``lqs``; HOT: 0.5).
    recalibration_interval: 0 (calibrate once), or every this many steps after the first
        calibration ends the layer observes its operands' patterns again for ``calibration_steps``
        steps, still running its current strategies, and then fixes new ones from those votes
        (must exceed ``calibration_steps``; policy recipes only).
    weight_for_backward: ``"mxfp4"`` (DESIGN §1: W quantized along ``out`` in the forward and saved,
        4.25 bits per weight per layer in flight) or ``"param"`` (nothing of W saved; the backward
        re-quantizes it from the parameter: less memory, one more read of W).
    weight_cache: quantize W once per optimizer step, not once per forward: a fixed layer keeps W's
        GEMM operands (along ``in`` for the forward, along ``out`` for dgrad, in the FP8 form the GEMM
        reads on Hopper) in buffers that every micro-batch of the step reads, refreshed after each
        optimizer step and load (see :func:`adahop.refresh_weights` for weights changed otherwise). The same numerics: it needs W's
        quantization to draw nothing (no ``random_signs`` on ``fwd`` or ``dgrad``,
        ``saved_rounding="rne"``) and ``weight_for_backward="mxfp4"``. Costs W's operands in memory
        between steps (about 2 bytes a weight on Hopper).
    bf16_wgrad_input: X as a ``bf16`` wgrad reads it: ``"mxfp4"`` (DESIGN §1: the plain-MXFP4 copy
        the forward saves, dequantized) or ``"bf16"`` (the forward saves X in BF16 instead, 16 bits
        per value where it saved 4.25, and the GEMM is exact up to BF16 rounding).
    calibration_precision: ``"mxfp4"`` (run ``calibration_strategy`` while calibrating) or
        ``"bf16"`` (every GEMM in BF16 while calibrating); see the module docstring for the default.
    """

    name: str
    description: str = ""
    fwd: Strategy | None = None
    dgrad: Strategy | None = None
    wgrad: Strategy | None = None
    policy: str | None = None
    calibration_steps: int = 0
    calibration_strategy: Strategy = Strategy.MXFP4
    table: StrategyTable = REFERENCE_TABLE
    detector: PatternDetector = field(default_factory=PatternDetector)
    outlier_k: int = 64
    hadamard_size: int = 32
    random_signs: frozenset[str] = frozenset()
    grad_rounding: str = "sr"
    saved_rounding: str = "rne"
    seed: int = 0
    measure_tokens: int = 512
    measured_margin: float = 0.1
    weight_for_backward: str = "mxfp4"
    recalibration_interval: int = 0
    bf16_wgrad_input: str = "mxfp4"
    calibration_precision: str = "mxfp4"
    weight_cache: bool = False

    def __post_init__(self) -> None:
        self._check_types()
        fixed = [getattr(self, s) for s in SLOTS]
        if self.policy is None:
            if any(s is None for s in fixed):
                raise ValueError(f"recipe {self.name!r}: without a policy every slot needs a fixed strategy")
            for slot in SLOTS:
                check_slot(slot, getattr(self, slot), f"recipe {self.name!r}")
        else:
            if self.policy not in POLICIES:
                raise ValueError(f"recipe {self.name!r}: policy must be one of {POLICIES}, got {self.policy!r}")
            if any(s is not None for s in fixed):
                raise ValueError(f"recipe {self.name!r}: a policy recipe takes no fixed fwd/dgrad/wgrad strategies")
            if self.calibration_steps < 1:
                raise ValueError(f"recipe {self.name!r}: policy {self.policy!r} needs calibration_steps >= 1")
        if self.outlier_k < 1:
            raise ValueError(f"recipe {self.name!r}: outlier_k must be >= 1, got {self.outlier_k}")
        if self.hadamard_size not in HADAMARD_SIZES:
            raise ValueError(f"recipe {self.name!r}: hadamard_size must be one of {HADAMARD_SIZES} (the sizes the "
                             f"quantizers take), got {self.hadamard_size}")
        for attr in ("grad_rounding", "saved_rounding"):
            if getattr(self, attr) not in ROUNDINGS:
                raise ValueError(f"recipe {self.name!r}: {attr} must be one of {ROUNDINGS}, got {getattr(self, attr)!r}")
        if not set(self.random_signs) <= set(SLOTS):
            raise ValueError(f"recipe {self.name!r}: random_signs must name slots of {SLOTS}, got {sorted(self.random_signs)}")
        if self.weight_for_backward not in ("mxfp4", "param"):
            raise ValueError(f"recipe {self.name!r}: weight_for_backward must be 'mxfp4' or 'param', "
                             f"got {self.weight_for_backward!r}")
        if self.weight_cache:
            drawn = sorted(set(self.random_signs) & {"fwd", "dgrad"})
            if drawn or self.saved_rounding != "rne" or self.weight_for_backward != "mxfp4":
                why = (f"random_signs names {drawn}" if drawn else f"saved_rounding is {self.saved_rounding!r}"
                       if self.saved_rounding != "rne" else f"weight_for_backward is {self.weight_for_backward!r}")
                raise ValueError(f"recipe {self.name!r}: weight_cache needs W quantized without draws and saved "
                                 f"for backward (no random_signs on fwd/dgrad, saved_rounding='rne', "
                                 f"weight_for_backward='mxfp4'); {why}")
        if self.bf16_wgrad_input not in ("mxfp4", "bf16"):
            raise ValueError(f"recipe {self.name!r}: bf16_wgrad_input must be 'mxfp4' or 'bf16', "
                             f"got {self.bf16_wgrad_input!r}")
        if self.calibration_precision not in CALIBRATION_PRECISIONS:
            raise ValueError(f"recipe {self.name!r}: calibration_precision must be one of {CALIBRATION_PRECISIONS}, "
                             f"got {self.calibration_precision!r}")
        if self.calibration_strategy.hot:
            raise ValueError(f"recipe {self.name!r}: calibration_strategy runs every slot; "
                             f"{self.calibration_strategy.value!r} runs one")
        if not 0.0 <= self.measured_margin < 1.0:
            raise ValueError(f"recipe {self.name!r}: measured_margin must be in [0, 1), got {self.measured_margin}")
        if self.recalibration_interval < 0:
            raise ValueError(f"recipe {self.name!r}: recalibration_interval must be >= 0, got {self.recalibration_interval}")
        if self.recalibration_interval and (self.policy is None or self.recalibration_interval <= self.calibration_steps):
            raise ValueError(f"recipe {self.name!r}: recalibration_interval needs a policy and must exceed "
                             f"calibration_steps ({self.calibration_steps}), got {self.recalibration_interval}")
        if self.measure_tokens < 32 or self.measure_tokens % 32:
            raise ValueError(f"recipe {self.name!r}: measure_tokens must be a positive multiple of 32")

    def _check_types(self) -> None:
        """A TypeError naming the first field whose value is not of the field's type (bool is no int)."""
        for name, (types, what) in FIELD_TYPES.items():
            value = getattr(self, name)
            if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
                label = f"recipe {self.name!r}: " if isinstance(self.name, str) else ""
                raise TypeError(f"{label}{name} must be {what}, got {type(value).__name__} {value!r}")
        if not all(isinstance(s, str) for s in self.random_signs):
            raise TypeError(f"recipe {self.name!r}: random_signs must hold slot names (str), got {sorted(map(repr, self.random_signs))}")

    def calibration_windows(self, total_steps: int) -> list[tuple[int, int]]:
        """The optimizer steps in which this recipe's layers observe their operands, as inclusive
        ``(first, last)`` ranges of 1-based steps up to ``total_steps``: the first
        ``calibration_steps``, and with ``recalibration_interval`` I the ``calibration_steps`` after
        each step C + k·I (k >= 1), the schedule of :meth:`QuantLinear.on_optimizer_step`. Empty for a
        recipe with fixed strategies."""
        if self.policy is None or total_steps < 1:
            return []
        c, interval = self.calibration_steps, self.recalibration_interval
        windows = [(1, min(c, total_steps))]
        k = 1
        while interval and c + k * interval < total_steps:
            start = c + k * interval + 1
            windows.append((start, min(start + c - 1, total_steps)))
            k += 1
        return windows

    @property
    def fixed_strategies(self) -> dict[str, Strategy] | None:
        return None if self.policy else {s: getattr(self, s) for s in SLOTS}

    @property
    def swaps_linear(self) -> bool:
        """False for a recipe that is BF16 everywhere: ``convert`` keeps ``nn.Linear`` then."""
        return self.policy is not None or any(s.quantized for s in self.fixed_strategies.values())

    @property
    def dim_multiple(self) -> int:
        """Every quantized dimension (in, out, tokens) must be a multiple of this."""
        return max(32, self.hadamard_size)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (for checkpoints, results provenance and comparison on resume)."""
        d = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Strategy):
                v = v.value
            elif isinstance(v, StrategyTable):
                v = v.to_dict()
            elif isinstance(v, PatternDetector):
                v = dataclasses.asdict(v)
            elif isinstance(v, frozenset):
                v = sorted(v)
            d[f.name] = v
        return d


def _coerce(name: str, value: Any) -> Any:
    """Turn an override given as plain data (strings, lists, dicts) into the field's type; a value
    of another type is passed on for :meth:`Recipe._check_types` to name."""
    if name in ("fwd", "dgrad", "wgrad", "calibration_strategy"):
        return parse_strategy(value) if isinstance(value, str) else value
    if name == "table" and isinstance(value, Mapping):
        return StrategyTable.from_mapping(value)
    if name == "detector" and isinstance(value, Mapping):
        return PatternDetector(**value)
    if name == "random_signs":
        if isinstance(value, str):
            return frozenset([value])
        if isinstance(value, (list, tuple, set, frozenset)):
            return frozenset(value)
    return value


def _fixed(name: str, description: str, fwd: str, dgrad: str, wgrad: str, **kw: Any) -> Recipe:
    return Recipe(name, description, Strategy(fwd), Strategy(dgrad), Strategy(wgrad), **kw)


def _policy(name: str, description: str, policy: str, table: StrategyTable = REFERENCE_TABLE, **kw: Any) -> Recipe:
    return Recipe(name, description, policy=policy, calibration_steps=30, table=table, **kw)


def _reference_table_with_iht_for(*strategies: str) -> StrategyTable:
    """The reference table with IHT in every cell that holds one of ``strategies``."""
    return StrategyTable.from_mapping({pair: "iht" if s in strategies else s for pair, s in REFERENCE_TABLE_ENTRIES.items()})


_BACKWARD_RHT_SR = dict(random_signs=frozenset({"dgrad", "wgrad"}), saved_rounding="sr")

RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        _fixed("bf16", "nn.Linear in BF16 (the reference)", "bf16", "bf16", "bf16"),
        _fixed("mxfp4", "naive MXFP4 on every GEMM, no transform", "mxfp4", "mxfp4", "mxfp4"),
        _fixed("uniform-iht", "a fixed block-32 Hadamard + MXFP4 on every GEMM", "iht", "iht", "iht"),
        _fixed("tseng", "BF16 forward; MXFP4 backward with random-sign Hadamard + SR (Tseng et al. 2025)",
               "bf16", "iht", "iht", **_BACKWARD_RHT_SR),
        _fixed("quartet-style", "Hadamard + RTN MXFP4 forward; random-sign Hadamard + SR backward",
               "iht", "iht", "iht", **_BACKWARD_RHT_SR),
        _policy("hot", "HOT (Kim et al. 2025): BF16 forward, INT4 Hadamard dgrad, low-rank INT8 wgrad on X saved "
                "in INT8, per-layer dY scale", "lqs", calibration_precision="bf16", measured_margin=0.5),
        _fixed("hot-no-lowrank", "ablation: HOT's INT4 dgrad (per token) with its INT8 wgrad at full rank (no "
               "projection along tokens)", "bf16", "hot-int4-token", "hot-int8"),
        _policy("adahop", "AdaHOP: calibrated outlier patterns → strategy table (DESIGN §1)", "table"),
        _policy("adahop-measured", "per GEMM the strategy with the lowest measured calibration error", "measured"),
        _policy("adahop-no-oe", "ablation: AdaHOP's table with IHT in place of OE-left/right (BF16 fallback kept)",
                "table", _reference_table_with_iht_for("iht+oe-left", "iht+oe-right")),
        _policy("adahop-no-bf16", "ablation: AdaHOP's table with IHT in place of the BF16 fallback (all GEMMs FP4)",
                "table", _reference_table_with_iht_for("bf16")),
        _policy("adahop-recal", "AdaHOP recalibrating every 250 steps (30 steps of votes under its current strategies)",
                "table", recalibration_interval=250),
        _policy("adahop-exact-bf16", "AdaHOP whose BF16 wgrad fallback reads X saved in BF16 (exact, more memory)",
                "table", bf16_wgrad_input="bf16"),
        _policy("adahop-bf16-cal", "ablation: AdaHOP calibrating in BF16 (unquantized GEMMs while it observes)",
                "table", calibration_precision="bf16"),
        _policy("adahop-cached-w", "AdaHOP quantizing W once per optimizer step (weight_cache): the same numerics, "
                "W's FP8 operands kept between steps", "table", weight_cache=True),
    )
}


def get_recipe(recipe: str | Recipe, **overrides: Any) -> Recipe:
    """The registry entry ``recipe`` (or a :class:`Recipe`), with fields replaced by ``overrides``.

    Overrides may be plain data (``fwd="iht"``, ``random_signs=["wgrad"]``, ``table={...}``).
    Setting ``fwd``/``dgrad``/``wgrad`` on a policy recipe turns it into a fixed one (``policy=None``,
    so all three must be given) unless ``policy`` is given too. Unknown names, and values of another
    type than the field's (:data:`FIELD_TYPES`; ``outlier_k=2.5``, ``seed="1"``), raise TypeError.
    """
    if isinstance(recipe, str):
        if recipe not in RECIPES:
            raise ValueError(f"unknown recipe {recipe!r}; registered: {sorted(RECIPES)}")
        recipe = RECIPES[recipe]
    elif not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be a name or a Recipe, got {type(recipe).__name__}")
    names = {f.name for f in dataclasses.fields(Recipe)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise TypeError(f"unknown recipe overrides {unknown}; valid: {sorted(names)}")
    if not overrides:
        return recipe
    changes = {k: _coerce(k, v) for k, v in overrides.items()}
    if recipe.policy and "policy" not in changes and any(s in changes for s in SLOTS):
        changes["policy"] = None
    return dataclasses.replace(recipe, **changes)


def recipe_from_dict(d: Mapping[str, Any]) -> Recipe:
    """Inverse of :meth:`Recipe.to_dict`."""
    return Recipe(**{k: _coerce(k, v) for k, v in d.items()})
