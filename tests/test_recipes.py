"""The recipe registry (adahop.recipes), and every recipe's layer against an fp64 nn.Linear.

Error floors (relative Frobenius error of the output and each gradient against fp64; fp32 layer,
128→64, 192 tokens, k=8 outlier rows) were measured on CPU (reference path) and set ~25% above
the measurement (the numbers are deterministic for the seed; the margin covers backends whose
fp32 accumulation order differs). What they reflect:

* MXFP4 RNE on Gaussian data has ≈0.11 relative error per element, so a product of two quantized
  operands lands at ≈0.16-0.2 (``mxfp4``, ``uniform-iht``, measured y 0.16-0.17, dX/dW ≈0.20).
* SR on both backward operands (``tseng``, ``quartet-style``) is unbiased but noisier than RNE:
  dX and dW ≈0.23-0.24 against ≈0.20.
* With planted outliers (4 of 128 input channels ×20 in X, 4 of 192 tokens ×20 in dY), plain MXFP4
  degrades (y 0.21, dW 0.24), a Hadamard recovers part of it (y 0.16, dW 0.15). AdaHOP's table
  picks iht / iht+oe-left / bf16 and cuts dX to 0.06 (the outlier tokens of dY computed exactly)
  and dW to 0.11 (BF16 dY against the MXFP4 copy of X); the measured policy picks oe-right for
  wgrad instead and reaches dW 0.04.
* Forward BF16 (``tseng``, ``hot``) and the bias gradient (a sum of the unquantized dY) are exact.
* ``hot``: INT4 dgrad after a block-16 Hadamard, dY stochastically rounded per tensor (Gaussian;
  measured 0.27, tests/test_hot.py derives ≈0.25) or per token (planted outlier tokens, where the
  selection picks it: 0.21); the low-rank wgrad keeps half the token sequencies, so on tokens with
  no neighbour correlation dW's error is ≈ sqrt(1/2) (measured 0.71 and 0.65).
* ``hot-no-lowrank``: the same INT8 quantizers without the projection: dW 0.06 on Gaussian data,
  0.29 with planted outliers (SAWB clips X's outlier channels at ≈2.4 rms; dY's outlier tokens
  share one INT8 scale); dY per token in dgrad (Gaussian 0.19).
* ``adahop-bf16-cal`` observes what ``adahop`` observes (the votes come from the operands, not the
  GEMMs), so it fixes the same strategies and meets the same floors.
"""

import dataclasses

import pytest
import torch
from torch import nn

import adahop
from adahop.linear import SavedTensorMeter
from adahop.patterns import PatternDetector, planted_outliers
from adahop.policy import REFERENCE_TABLE, Strategy
from adahop.recipes import FIELD_TYPES, RECIPES, Recipe, get_recipe, recipe_from_dict


pytestmark = pytest.mark.usefixtures("one_thread")

IN, OUT, BATCH, SEQ = 128, 64, 2, 96
CALIBRATION_STEPS = 2

# recipe -> data -> (y, dx, dw) floors; db is exact for every recipe (dY is not quantized for it).
FLOORS = {
    "bf16": {"gaussian": (1e-6, 1e-6, 1e-6), "outliers": (1e-6, 1e-6, 1e-6)},  # fp32 nn.Linear: 2e-7
    "mxfp4": {"gaussian": (0.20, 0.26, 0.25), "outliers": (0.26, 0.26, 0.30)},
    "uniform-iht": {"gaussian": (0.21, 0.25, 0.26), "outliers": (0.20, 0.28, 0.19)},
    "tseng": {"gaussian": (1e-6, 0.29, 0.30), "outliers": (1e-6, 0.29, 0.22)},
    "quartet-style": {"gaussian": (0.21, 0.29, 0.30), "outliers": (0.20, 0.29, 0.22)},
    "adahop": {"gaussian": (0.21, 0.25, 0.26), "outliers": (0.20, 0.08, 0.14)},
    "adahop-measured": {"gaussian": (0.21, 0.25, 0.25), "outliers": (0.20, 0.08, 0.05)},
    "adahop-no-oe": {"gaussian": (0.21, 0.25, 0.26), "outliers": (0.20, 0.28, 0.14)},
    "adahop-no-bf16": {"gaussian": (0.21, 0.25, 0.26), "outliers": (0.20, 0.08, 0.19)},
    "adahop-recal": {"gaussian": (0.21, 0.25, 0.26), "outliers": (0.20, 0.08, 0.14)},
    # wgrad col-col in BF16 against X saved as it came (fp32 here): exact on the planted outliers
    "adahop-exact-bf16": {"gaussian": (0.21, 0.25, 0.26), "outliers": (0.20, 0.08, 1e-6)},
    "adahop-bf16-cal": {"gaussian": (0.21, 0.25, 0.26), "outliers": (0.20, 0.08, 0.14)},
    "adahop-cached-w": {"gaussian": (0.21, 0.25, 0.26), "outliers": (0.20, 0.08, 0.14)},  # adahop's numerics
    "hot": {"gaussian": (1e-6, 0.34, 0.89), "outliers": (1e-6, 0.27, 0.82)},
    "hot-no-lowrank": {"gaussian": (1e-6, 0.24, 0.08), "outliers": (1e-6, 0.27, 0.36)},
}


def make_data(kind: str):
    m = BATCH * SEQ
    planted = kind == "outliers"
    x = planted_outliers(m, IN, n_cols=4 if planted else 0, col_factor=20, seed=0)
    g = planted_outliers(m, OUT, n_rows=4 if planted else 0, row_factor=20, seed=1)
    return x.reshape(BATCH, SEQ, IN), g.reshape(BATCH, SEQ, OUT)


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b).norm() / b.norm()).item()


def run_recipe(name: str, kind: str, **overrides):
    """Converted layer (calibrated first for policy recipes) vs fp64 nn.Linear: errors and layer."""
    torch.manual_seed(0)
    base = nn.Linear(IN, OUT)
    ref = nn.Linear(IN, OUT).double()
    ref.load_state_dict(base.state_dict())
    if RECIPES[name].policy:
        overrides.setdefault("calibration_steps", CALIBRATION_STEPS)
    layer = adahop.convert(base, name, outlier_k=8, **overrides)
    x, g = make_data(kind)
    for _ in range(CALIBRATION_STEPS if RECIPES[name].policy else 0):
        layer(x.clone().requires_grad_()).backward(g)
        adahop.on_optimizer_step(layer)
        layer.zero_grad()
    xq = x.clone().requires_grad_()
    y = layer(xq)
    y.backward(g)
    xr = x.double().requires_grad_()
    yr = ref(xr)
    yr.backward(g.double())
    errors = {
        "y": relative(y, yr), "dx": relative(xq.grad, xr.grad),
        "dw": relative(layer.weight.grad, ref.weight.grad), "db": relative(layer.bias.grad, ref.bias.grad),
    }
    return errors, layer


def test_every_recipe_has_floors():
    assert set(FLOORS) == set(RECIPES)


@pytest.mark.parametrize("kind", ["gaussian", "outliers"])
@pytest.mark.parametrize("name", list(RECIPES))
def test_recipe_output_and_gradients_against_fp64(name, kind):
    errors, _ = run_recipe(name, kind)
    y_floor, dx_floor, dw_floor = FLOORS[name][kind]
    assert errors["y"] <= y_floor, errors
    assert errors["dx"] <= dx_floor, errors
    assert errors["dw"] <= dw_floor, errors
    assert errors["db"] <= 1e-6, errors


def test_policy_recipes_pick_the_expected_strategies_on_planted_outliers():
    # X: outlier channels (col), W: none, dY: outlier tokens (row) -> pairs fwd col-none,
    # dgrad row-none, wgrad col-col (DESIGN §1 table: iht, iht+oe-left, bf16).
    _, layer = run_recipe("adahop", "outliers")
    assert layer.calibration.labels() == {"x": "col", "w": "none", "g": "row"}
    assert layer.strategies == {"fwd": Strategy.IHT, "dgrad": Strategy.IHT_OE_LEFT, "wgrad": Strategy.BF16}
    # Measured: OE wins where it cuts the error by > 10% (the outlier tokens of dY in dgrad; for
    # fwd and wgrad, exact rows of X's outlier channels/tokens), plain IHT elsewhere.
    _, measured = run_recipe("adahop-measured", "outliers")
    assert measured.strategies["dgrad"] is Strategy.IHT_OE_LEFT
    assert all(s is not Strategy.BF16 for s in measured.strategies.values())


def test_measured_policy_prefers_plain_iht_without_outliers():
    _, layer = run_recipe("adahop-measured", "gaussian")
    assert set(layer.strategies.values()) <= {Strategy.IHT, Strategy.MXFP4}, layer.strategies


def test_bf16_recipe_leaves_nn_linear_untouched():
    model = nn.Sequential(nn.Linear(IN, OUT))
    assert adahop.convert(model, "bf16")[0].__class__ is nn.Linear


def test_profile_schema_lists_the_calibrating_recipes_and_every_recipe():
    # The workflow reads these from config/schema.yaml, not from the registry (no torch at parse time).
    import yaml

    from adahop.harness.provenance import REPO_ROOT

    defs = yaml.safe_load((REPO_ROOT / "config" / "schema.yaml").read_text())["$defs"]
    assert defs["calibrating_recipe"]["enum"] == [name for name, r in RECIPES.items() if r.policy is not None]
    assert defs["recipe"]["enum"] == list(RECIPES)


def test_registry_entries():
    assert set(RECIPES) == {"bf16", "mxfp4", "uniform-iht", "tseng", "quartet-style", "hot", "hot-no-lowrank", "adahop",
                            "adahop-measured", "adahop-no-oe", "adahop-no-bf16", "adahop-recal", "adahop-exact-bf16",
                            "adahop-bf16-cal", "adahop-cached-w"}
    tseng, quartet = RECIPES["tseng"], RECIPES["quartet-style"]
    assert tseng.fwd is Strategy.BF16 and quartet.fwd is Strategy.IHT
    for r in (tseng, quartet):
        assert (r.dgrad, r.wgrad) == (Strategy.IHT, Strategy.IHT)
        assert r.random_signs == frozenset({"dgrad", "wgrad"}) and r.grad_rounding == r.saved_rounding == "sr"
    assert RECIPES["mxfp4"].fixed_strategies == {s: Strategy.MXFP4 for s in ("fwd", "dgrad", "wgrad")}
    assert RECIPES["uniform-iht"].random_signs == frozenset()
    for name in ("adahop", "adahop-measured"):
        r = RECIPES[name]
        assert r.calibration_steps == 30 and r.outlier_k == 64 and r.grad_rounding == "sr"
        assert r.table == REFERENCE_TABLE and r.calibration_strategy is Strategy.MXFP4
    recal = RECIPES["adahop-recal"]
    assert recal.recalibration_interval == 250 and recal.table == REFERENCE_TABLE and recal.calibration_steps == 30
    assert all(RECIPES[n].recalibration_interval == 0 for n in RECIPES if n != "adahop-recal")
    exact = RECIPES["adahop-exact-bf16"]
    assert exact.bf16_wgrad_input == "bf16" and exact.table == REFERENCE_TABLE and exact.calibration_steps == 30
    assert all(RECIPES[n].bf16_wgrad_input == "mxfp4" for n in RECIPES if n != "adahop-exact-bf16")
    # Calibration precision: plain MXFP4 by default; BF16 for the ablation and for HOT.
    assert {n for n, r in RECIPES.items() if r.calibration_precision == "bf16"} == {"adahop-bf16-cal", "hot"}
    cal = RECIPES["adahop-bf16-cal"]
    assert cal.policy == "table" and cal.table == REFERENCE_TABLE and cal.calibration_steps == 30
    hot = RECIPES["hot"]
    assert hot.policy == "lqs" and hot.calibration_steps == 30 and hot.measured_margin == 0.5
    # HOT's ablation: its dgrad as hot's selection picked at 125m, its wgrad without the projection.
    assert RECIPES["hot-no-lowrank"].fixed_strategies == {"fwd": Strategy.BF16, "dgrad": Strategy.HOT_INT4_TOKEN,
                                                          "wgrad": Strategy.HOT_INT8}
    # The ablations: the reference table with IHT in the OE cells (no-oe) or in the BF16 cell (no-bf16).
    ref = REFERENCE_TABLE.to_dict()
    for name, dropped in (("adahop-no-oe", {"iht+oe-left", "iht+oe-right"}), ("adahop-no-bf16", {"bf16"})):
        r = RECIPES[name]
        assert r.policy == "table" and r.calibration_steps == 30 and r.outlier_k == 64
        changed = {pair for pair in ref if r.table[pair] is not Strategy(ref[pair])}
        assert changed == {pair for pair, s in ref.items() if s in dropped} and changed
        assert all(r.table[pair] is Strategy.IHT for pair in changed)


def test_ablations_swap_only_their_part_of_the_table_on_planted_outliers():
    # Planted pairs (test above): fwd col-none -> iht, dgrad row-none -> iht+oe-left, wgrad col-col -> bf16.
    _, no_oe = run_recipe("adahop-no-oe", "outliers")
    assert no_oe.strategies == {"fwd": Strategy.IHT, "dgrad": Strategy.IHT, "wgrad": Strategy.BF16}
    _, no_bf16 = run_recipe("adahop-no-bf16", "outliers")
    assert no_bf16.strategies == {"fwd": Strategy.IHT, "dgrad": Strategy.IHT_OE_LEFT, "wgrad": Strategy.IHT}


def test_overrides_are_coerced_from_plain_data():
    r = get_recipe("adahop", calibration_steps=5, outlier_k=32, random_signs=["wgrad"],
                   detector={"threshold": 6.0}, table={**REFERENCE_TABLE.to_dict(), "col-col": "iht"})
    assert r.calibration_steps == 5 and r.outlier_k == 32 and r.random_signs == frozenset({"wgrad"})
    assert r.detector == PatternDetector(threshold=6.0)
    assert r.table["col-col"] is Strategy.IHT
    fixed = get_recipe("adahop", fwd="iht", dgrad="iht+oe-left", wgrad="iht+oe-right")
    assert fixed.policy is None and fixed.wgrad is Strategy.IHT_OE_RIGHT


@pytest.mark.parametrize(
    "args,kw,err",
    [
        (("nope",), {}, ValueError),
        (("adahop",), {"outlier_kk": 3}, TypeError),
        (("adahop",), {"calibration_steps": 0}, ValueError),
        (("adahop",), {"fwd": "iht"}, ValueError),  # a fixed recipe needs all three slots
        (("mxfp4",), {"fwd": "fp4"}, ValueError),
        (("mxfp4",), {"grad_rounding": "floor"}, ValueError),
        (("mxfp4",), {"random_signs": ["bwd"]}, ValueError),
        (("mxfp4",), {"hadamard_size": 24}, ValueError),
        ((3,), {}, TypeError),
    ],
    ids=["unknown_recipe", "unknown_override", "no_calibration", "partial_slots", "bad_strategy",
         "bad_rounding", "bad_slot", "bad_hadamard", "not_a_recipe"],
)
def test_bad_recipes_are_rejected(args, kw, err):
    with pytest.raises(err):
        get_recipe(*args, **kw)


# One wrong type per field (bool where an int is due is wrong: True is no count of steps).
WRONG_TYPES = {
    "name": 3, "description": None, "fwd": 3, "dgrad": 1.0, "wgrad": ["iht"], "policy": 1,
    "calibration_steps": 2.5, "calibration_strategy": 4, "table": 1, "detector": 3, "outlier_k": "64",
    "hadamard_size": 32.0, "random_signs": 5, "grad_rounding": 1, "saved_rounding": None, "seed": "x",
    "measure_tokens": True, "measured_margin": "0.1", "weight_for_backward": 0, "recalibration_interval": 2.0,
    "bf16_wgrad_input": b"bf16", "calibration_precision": 16, "weight_cache": 1,
}


def test_every_field_has_a_type_and_a_wrong_type_case():
    names = [f.name for f in dataclasses.fields(Recipe)]
    assert sorted(FIELD_TYPES) == sorted(names) == sorted(WRONG_TYPES)


@pytest.mark.parametrize("field", list(WRONG_TYPES))
def test_an_override_of_the_wrong_type_raises_type_error_naming_it(field):
    value = WRONG_TYPES[field]
    slots = {s: "iht" for s in ("fwd", "dgrad", "wgrad") if s != field} if field in ("fwd", "dgrad", "wgrad") else {}
    with pytest.raises(TypeError, match=rf"{field} must be (a|an) .*, got {type(value).__name__} "):
        get_recipe("mxfp4" if slots else "adahop", **{field: value}, **slots)


@pytest.mark.parametrize(
    ("field", "value"),
    [("outlier_k", 2.5), ("calibration_steps", 2.5), ("seed", "x"), ("outlier_k", "64"), ("outlier_k", True),
     ("seed", False), ("hadamard_size", True)],
    ids=["outlier_k-float", "calibration_steps-float", "seed-str", "outlier_k-str", "outlier_k-bool", "seed-bool",
         "hadamard_size-bool"],
)
def test_the_overrides_a_new_user_tried_are_refused_with_the_field_and_value(field, value):
    with pytest.raises(TypeError, match=rf"recipe 'adahop': {field} must be an int, got {type(value).__name__} {value!r}"):
        get_recipe("adahop", **{field: value})


def test_a_recipe_built_directly_is_type_checked_too():
    with pytest.raises(TypeError, match="outlier_k must be an int, got float 2.5"):
        Recipe("x", fwd=Strategy.MXFP4, dgrad=Strategy.MXFP4, wgrad=Strategy.MXFP4, outlier_k=2.5)
    with pytest.raises(TypeError, match="random_signs must hold slot names"):
        Recipe("x", fwd=Strategy.IHT, dgrad=Strategy.IHT, wgrad=Strategy.IHT, random_signs=frozenset({1}))


def test_an_int_margin_is_a_float():
    assert get_recipe("adahop-measured", measured_margin=0).measured_margin == 0


@pytest.mark.parametrize("size", [2, 8, 256], ids=lambda s: f"h{s}")
def test_a_hadamard_size_the_quantizers_do_not_take_is_refused(size):
    with pytest.raises(ValueError, match=r"hadamard_size must be one of \(16, 32, 64, 128\)"):
        get_recipe("uniform-iht", hadamard_size=size)


@pytest.mark.parametrize(
    ("kw", "match"),
    [({"threshold": "4"}, "detector threshold must be a float, got str"),
     ({"dominance": None}, "detector dominance must be a float, got NoneType"),
     ({"cross_normalize": 1}, "detector cross_normalize must be a bool, got int")],
    ids=["threshold-str", "dominance-none", "cross_normalize-int"],
)
def test_detector_fields_are_type_checked(kw, match):
    with pytest.raises(TypeError, match=match):
        get_recipe("adahop", detector=kw)


@pytest.mark.parametrize("name", list(RECIPES))
def test_to_dict_round_trip(name):
    r = get_recipe(name, seed=7)
    assert recipe_from_dict(r.to_dict()) == r
    assert isinstance(r, Recipe) and dataclasses.is_dataclass(r)


def test_exact_bf16_fallback_saves_x_as_it_came_instead_of_its_mxfp4_copy():
    """adahop's BF16 wgrad reads X from its saved MXFP4 copy (X's error stays); adahop-exact-bf16
    saves X itself for that GEMM: dW exact, at 32 bits per value of X here (fp32) against 4.25."""
    x, g = make_data("outliers")
    saved, dw_error = {}, {}
    for name in ("adahop", "adahop-exact-bf16"):
        errors, layer = run_recipe(name, "outliers")
        assert layer.strategies["wgrad"] is Strategy.BF16
        dw_error[name] = errors["dw"]
        with SavedTensorMeter(layer) as meter:
            layer(x.clone().requires_grad_())
        saved[name] = {shape: dtype for shape, dtype, is_param in meter.tensors if not is_param}
    assert dw_error["adahop"] > 0.05 and dw_error["adahop-exact-bf16"] < 1e-6
    tokens = BATCH * SEQ
    assert saved["adahop-exact-bf16"].get((tokens, IN)) == torch.float32
    assert (tokens, IN) not in saved["adahop"] and (IN, tokens // 2) in saved["adahop"]  # packed E2M1 codes of Xᵀ
    assert (IN, tokens // 2) not in saved["adahop-exact-bf16"]


def test_bf16_wgrad_input_is_checked():
    with pytest.raises(ValueError, match="bf16_wgrad_input must be 'mxfp4' or 'bf16', got 'fp8'"):
        get_recipe("adahop", bf16_wgrad_input="fp8")


def test_calibration_precision_is_checked():
    with pytest.raises(ValueError, match="calibration_precision must be one of \\('mxfp4', 'bf16'\\), got 'fp8'"):
        get_recipe("adahop", calibration_precision="fp8")


@pytest.mark.parametrize(
    ("overrides", "match"),
    [({"fwd": "hot-int4", "dgrad": "hot-int4", "wgrad": "hot-lowrank-int8"}, "runs only \\['dgrad'\\], not 'fwd'"),
     ({"fwd": "bf16", "dgrad": "hot-lowrank-int8", "wgrad": "hot-lowrank-int8"}, "runs only \\['wgrad'\\], not 'dgrad'"),
     ({"calibration_strategy": "hot-int4"}, "calibration_strategy runs every slot"),
     ({"table": {**REFERENCE_TABLE.to_dict(), "col-col": "hot-int4"}}, "no table can hold it")],
    ids=["hot-int4-in-fwd", "lowrank-in-dgrad", "hot-calibration-strategy", "hot-in-table"],
)
def test_hot_strategies_are_refused_outside_their_slot(overrides, match):
    with pytest.raises(ValueError, match=match):
        get_recipe("adahop", **overrides)
