"""Pattern pairs, the strategy table, and calibration (adahop.policy, through QuantLinear)."""

import warnings

import pytest
import torch

import adahop
from adahop.linear import QuantLinear
from adahop.patterns import planted_outliers
from adahop.policy import (
    MEASURED_CANDIDATES,
    REFERENCE_TABLE,
    Calibration,
    Strategy,
    StrategyTable,
    decide,
    effective_strategy,
    majority,
    pattern_pairs,
)


pytestmark = pytest.mark.usefixtures("one_thread")


def test_pattern_pairs_follow_design():
    # fwd (x, opp(w)) · dgrad (g, w) · wgrad (opp(g), x)
    assert pattern_pairs({"x": "col", "w": "row", "g": "none"}) == {
        "fwd": ("col", "col"), "dgrad": ("none", "row"), "wgrad": ("none", "col")}
    assert pattern_pairs({"x": "none", "w": "none", "g": "row"}) == {
        "fwd": ("none", "none"), "dgrad": ("row", "none"), "wgrad": ("col", "none")}


@pytest.mark.parametrize("labels", [{"x": "col", "w": "row"}, {"x": "col", "w": "row", "g": "diag"}],
                         ids=["missing", "unknown"])
def test_pattern_pairs_reject_bad_labels(labels):
    with pytest.raises(ValueError):
        pattern_pairs(labels)


def test_reference_table_is_design_table():
    expected = {
        "row-row": "iht", "col-row": "iht", "col-none": "iht", "none-row": "iht", "none-none": "iht",
        "row-none": "iht+oe-left", "row-col": "iht+oe-right", "none-col": "iht+oe-right", "col-col": "bf16",
    }
    assert REFERENCE_TABLE.to_dict() == expected
    assert REFERENCE_TABLE[("row", "none")] is Strategy.IHT_OE_LEFT


@pytest.mark.parametrize("change", [{"drop": "row-row"}, {"add": "row-diag"}, {"set": "bogus"}],
                         ids=["missing_pair", "unknown_pair", "unknown_strategy"])
def test_table_validation(change):
    mapping = REFERENCE_TABLE.to_dict()
    if "drop" in change:
        del mapping[change["drop"]]
    if "add" in change:
        mapping[change["add"]] = "iht"
    if "set" in change:
        mapping["row-row"] = change["set"]
    with pytest.raises(ValueError):
        StrategyTable.from_mapping(mapping)


def test_wgrad_oe_left_falls_back_to_iht():
    assert effective_strategy("wgrad", Strategy.IHT_OE_LEFT) is Strategy.IHT
    assert effective_strategy("dgrad", Strategy.IHT_OE_LEFT) is Strategy.IHT_OE_LEFT
    # g labelled col makes the wgrad pair (row, none): the table says OE-left, the layer runs IHT.
    strategies = REFERENCE_TABLE.strategies({"x": "none", "w": "none", "g": "col"})
    assert REFERENCE_TABLE[("row", "none")] is Strategy.IHT_OE_LEFT
    assert strategies["wgrad"] is Strategy.IHT
    assert Strategy.IHT_OE_LEFT not in MEASURED_CANDIDATES["wgrad"]


@pytest.mark.parametrize(
    "votes,expected",
    [({"row": 3, "col": 1, "none": 2}, "row"), ({"row": 2, "col": 2, "none": 0}, "row"),
     ({"row": 2, "col": 2, "none": 2}, "none"), ({"row": 0, "col": 3, "none": 3}, "none"), ({}, "none")],
    ids=["clear", "tie_row_col", "three_way_tie", "tie_col_none", "empty"],
)
def test_majority_and_tie_order(votes, expected):
    assert majority(votes) == expected


def test_measured_picks_oe_only_when_it_pays():
    cal = Calibration()
    # relative errors: mxfp4 0.20, iht 0.15, oe-left 0.14 (7% better: not enough), oe-right 0.05
    for slot in ("fwd", "dgrad"):
        cal.add_errors(slot, {Strategy.MXFP4: (0.04, 1.0), Strategy.IHT: (0.0225, 1.0),
                              Strategy.IHT_OE_LEFT: (0.0196, 1.0), Strategy.IHT_OE_RIGHT: (0.0196, 1.0)})
    cal.add_errors("wgrad", {Strategy.MXFP4: (0.01, 1.0), Strategy.IHT: (0.0225, 1.0), Strategy.IHT_OE_RIGHT: (0.0025, 1.0)})
    picked = cal.measured_strategies(margin=0.1)
    assert picked == {"fwd": Strategy.IHT, "dgrad": Strategy.IHT, "wgrad": Strategy.IHT_OE_RIGHT}
    assert cal.measured_strategies(margin=0.0)["fwd"] is Strategy.IHT_OE_LEFT  # ties go to the earlier


def test_measured_without_errors_is_an_error():
    with pytest.raises(RuntimeError, match="no calibration errors"):
        Calibration().measured_strategies()


def test_decide_warns_without_observations():
    with pytest.warns(UserWarning, match="no calibration data"):
        assert decide("table", Calibration(), REFERENCE_TABLE) == {s: Strategy.IHT for s in ("fwd", "dgrad", "wgrad")}
    with pytest.raises(ValueError):
        decide("vibes", Calibration(), REFERENCE_TABLE)


def test_calibration_state_round_trip():
    cal = Calibration()
    cal.vote("x", "col")
    cal.vote("g", "row")
    cal.add_errors("fwd", {Strategy.IHT: (1.0, 4.0)})
    back = Calibration.from_dict(cal.to_dict())
    assert back.to_dict() == cal.to_dict()
    assert back.relative_errors() == {"fwd": {"iht": 0.5}}
    with pytest.raises(ValueError):
        cal.vote("y", "row")


# ---- calibration through the layer

IN, OUT, TOKENS = 64, 64, 64


def _batch(step: int):
    x = planted_outliers(TOKENS, IN, n_cols=2, col_factor=20, seed=step)
    g = planted_outliers(TOKENS, OUT, n_rows=2, row_factor=20, seed=100 + step)
    return x, g


def calibrate(recipe: str, steps: int, seed: int = 0, eval_calls: int = 0) -> QuantLinear:
    torch.manual_seed(0)
    layer = adahop.convert(torch.nn.Linear(IN, OUT), recipe, calibration_steps=steps, outlier_k=4, seed=seed)
    for step in range(steps):
        x, g = _batch(step)
        assert layer.phase == "calibrating" and layer.strategies is None
        assert set(layer.active_strategies.values()) == {Strategy.MXFP4}
        layer(x.requires_grad_()).backward(g)
        for _ in range(eval_calls):
            with torch.no_grad():
                layer(x)
        adahop.on_optimizer_step(layer)
    return layer


def test_table_calibration_labels_and_fixes_strategies():
    layer = calibrate("adahop", 3, eval_calls=1)
    assert layer.phase == "fixed" and layer.step == 3
    # 3 training forwards/backwards voted; the no_grad forwards did not.
    assert layer.calibration.votes["x"] == {"row": 0, "col": 3, "none": 0}
    assert layer.calibration.votes["g"] == {"row": 3, "col": 0, "none": 0}
    assert layer.calibration.labels() == {"x": "col", "w": "none", "g": "row"}
    assert layer.strategies == REFERENCE_TABLE.strategies(layer.calibration.labels())
    exported = adahop.export_strategies(torch.nn.Sequential(layer))["0"]
    assert exported["pairs"] == {"fwd": "col-none", "dgrad": "row-none", "wgrad": "col-col"}
    assert exported["strategies"] == {"fwd": "iht", "dgrad": "iht+oe-left", "wgrad": "bf16"}


@pytest.mark.parametrize("recipe", ["adahop", "adahop-measured"])
def test_calibration_is_deterministic_for_a_seed(recipe):
    a, b = calibrate(recipe, 2, seed=5), calibrate(recipe, 2, seed=5)
    assert a.get_extra_state() == b.get_extra_state()
    if recipe == "adahop-measured":
        # The SR draws of the scored candidates come from the seed: another seed, other errors.
        c = calibrate(recipe, 2, seed=6)
        assert c.calibration.errors != a.calibration.errors
        assert set(a.calibration.errors) == {"fwd", "dgrad", "wgrad"}


def test_layer_without_observations_warns_and_defaults():
    layer = adahop.convert(torch.nn.Linear(IN, OUT), "adahop", calibration_steps=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        adahop.on_optimizer_step(layer)
    assert any("no calibration data" in str(w.message) for w in caught)
    assert layer.phase == "fixed" and set(layer.strategies.values()) == {Strategy.IHT}


def test_measured_layer_without_backward_takes_the_table():
    layer = adahop.convert(torch.nn.Linear(IN, OUT), "adahop-measured", calibration_steps=1)
    x, _ = _batch(0)
    layer(x.requires_grad_())  # forward only: fwd errors measured, dgrad/wgrad not
    with pytest.warns(UserWarning) as record:
        adahop.on_optimizer_step(layer)
    messages = [str(w.message) for w in record]
    assert any("using the strategy table" in m for m in messages)
    assert any("layer 0: no backward ran during calibration" in m for m in messages)
    assert layer.phase == "fixed"
    assert layer.strategies["dgrad"] is REFERENCE_TABLE.strategies(layer.calibration.labels())["dgrad"]
