"""HOT (adahop.hot) and its recipe: transforms, integer quantizers and GEMMs, the layer, calibration.

Expected error levels (relative Frobenius error against fp64, Gaussian operands):

* ``dgrad`` (INT4 after a block-16 Hadamard, which keeps Gaussian data Gaussian): dY rounded
  stochastically with one scale ``s = max|dY| / 7`` has error variance ``s²·p(1-p)``, on average
  ``s²/6``; with ``max|dY| ≈ 4σ`` over ~10⁴ values that is ``0.57σ/√6 ≈ 0.23``. Wᵀ under SAWB
  (clip ``(12.1 − 12.2·0.80)σ = 2.37σ``, ``s = 0.34σ``, rounding ``s²/12`` plus the clipped tail
  ``≈0.003σ²``) gives ``≈0.11``; the product ``≈ sqrt(0.23² + 0.11²) ≈ 0.26``. Scaled per token
  (64 values a row, ``max ≈ 2.4σ``) dY's share drops to ``≈0.14``, the product to ``≈0.18``.
* ``wgrad``: the projection keeps the lower half of the sequencies, the functions constant on
  token pairs, so ``dW ≈ ½ Σ_pairs (g₁+g₂)(x₁+x₂)ᵀ = ½ dW + ½ (cross products of neighbours)``.
  With tokens uncorrelated with their neighbours the two halves are orthogonal and of equal size:
  error ``sqrt(¼ + ¼) = sqrt(1/2) ≈ 0.71``. On pair-constant tokens the projection is exact and
  only INT8 remains: dY per tensor SR (``4σ/127/√6 ≈ 0.013``), X under SAWB at 8 bits, whose
  4-bit clip at ``2.37σ`` dominates (tail ``≈0.0032σ²``: ``≈0.057``), together ``≈0.06``.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import adahop
from adahop import hot
from adahop.hadamard import hadamard_matrix
from adahop.linear import Operand, SavedTensorMeter, strategy_mm
from adahop.ops import GemmPath
from adahop.patterns import planted_outliers
from adahop.policy import Calibration, Strategy, lqs_strategies

pytestmark = pytest.mark.usefixtures("one_thread")

IN, OUT, TOKENS = 128, 64, 192


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def seed(n: int) -> torch.Tensor:
    return torch.tensor([n], dtype=torch.int64)


def gaussian(*shape: int, s: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(s))


# ---------------------------------------------------------------------------------------------
# Transforms


@pytest.mark.parametrize("n", [2, 16, 32])
def test_hadamard_is_the_reference_matrix(n):
    assert torch.equal(hot.hadamard(n), hadamard_matrix(n))


def test_walsh_sequency_orders_the_rows_by_sign_changes():
    w = hot.walsh_sequency(32)
    assert ((w[:, 1:] != w[:, :-1]).sum(1) == torch.arange(32)).all()
    assert torch.equal(w @ w.t(), 32 * torch.eye(32, dtype=torch.float64))


def test_lowrank_projection_is_the_lower_half_of_the_sequencies():
    """Its rows are HOT's kept Walsh rows (sequency < 16 of 32, normalised) in another order, so
    PᵀP is the same projector: the average of each token pair."""
    n = hot.TOKEN_BLOCK
    p = hot.lowrank_tokens(torch.eye(n)).double()  # (16, 32): the projection matrix itself
    kept = hot.walsh_sequency(n)[: n // 2] / n**0.5
    match = p @ kept.t()  # a permutation matrix when the row sets agree
    assert torch.allclose(match.abs().sum(1), torch.ones(n // 2, dtype=torch.float64))
    assert torch.allclose(match.abs().amax(1), torch.ones(n // 2, dtype=torch.float64))
    pairs = torch.kron(torch.eye(n // 2, dtype=torch.float64), torch.full((2, 2), 0.5, dtype=torch.float64))
    assert torch.allclose(p.t() @ p, pairs, atol=1e-12)
    assert torch.allclose(kept.t() @ kept, pairs, atol=1e-12)


def test_lowrank_projection_runs_per_block_of_tokens():
    x = gaussian(96, 8)
    whole = hot.lowrank_tokens(x)
    parts = torch.cat([hot.lowrank_tokens(x[i:i + 32]) for i in range(0, 96, 32)])
    assert torch.equal(whole, parts)


# ---------------------------------------------------------------------------------------------
# Integer quantizers


def test_round_to_nearest_lands_on_the_grid_with_the_absmax_scale():
    x = gaussian(64, 32)
    q = hot.quantize_int(x, 4, "tensor")
    assert q.values.dtype == torch.int8 and q.scale.shape == (1, 1)
    assert q.scale.item() == pytest.approx(x.abs().max().item() / 7)
    assert q.values.abs().max() == 7
    assert torch.equal(q.values.float(), (x / q.scale).round())


def test_per_token_scales_are_the_row_absmax():
    x = gaussian(16, 32) * torch.logspace(-2, 2, 16)[:, None]
    q = hot.quantize_int(x, 8, "token")
    assert torch.allclose(q.scale.squeeze(1), x.abs().amax(1) / 127)
    assert (q.values.abs().amax(1) == 127).all()


def test_sawb_clips_at_its_formula():
    x = gaussian(256, 64)
    clip = 12.1 * x.square().mean().sqrt() - 12.2 * x.abs().mean()
    q = hot.quantize_int(x, 4, "sawb")
    assert q.scale.item() == pytest.approx(clip.item() / 7, rel=1e-6)
    assert clip < x.abs().max()  # Gaussian data is clipped


def test_sawb_without_a_positive_clip_takes_the_absmax():
    x = torch.tensor([[1.0, -1.0, 1.0, -1.0]])  # rms = mean|x|: the formula gives -0.1
    q = hot.quantize_int(x, 4, "sawb")
    assert q.scale.item() == pytest.approx(1 / 7) and torch.equal(q.values, torch.full((1, 4), 7).to(torch.int8) * x.sign().to(torch.int8))


def test_zeros_quantize_to_zeros_and_nan_shows_in_the_scale():
    z = hot.quantize_int(torch.zeros(4, 8), 4, "tensor", seed(1))
    assert torch.equal(z.dequantize(), torch.zeros(4, 8))
    x = gaussian(4, 8)
    x[1, 2] = float("nan")
    assert torch.isnan(hot.quantize_int(x, 4, "tensor").dequantize()).all()
    assert torch.isnan(hot.quantize_int(x, 4, "token").dequantize()[1]).all()


@pytest.mark.parametrize("scaling,bits", [("tensor", 4), ("token", 4), ("tensor", 8)])
def test_stochastic_rounding_is_unbiased(scaling, bits):
    """The mean over many draws approaches x: each draw's error has variance ≤ s²/4, so the mean
    of N draws is within 5·s/(2√N) of x everywhere (a 5σ bound over 512 values)."""
    x = gaussian(32, 16, s=3) * 3
    draws = 2000
    total = torch.zeros_like(x, dtype=torch.float64)
    for i in range(draws):
        total += hot.quantize_int(x, bits, scaling, seed(i)).dequantize().double()
    scale = hot.quantize_int(x, bits, scaling).scale.double()
    assert ((total / draws - x.double()).abs() <= 5 * scale / (2 * draws**0.5)).all()
    rne = hot.quantize_int(x, bits, scaling).dequantize()
    assert (total / draws - x.double()).abs().mean() < (rne.double() - x.double()).abs().mean() / 4


def test_uniform_draws_are_in_range_and_seeded():
    u = hot.uniform((64, 64), seed(5))
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.01
    assert torch.equal(u, hot.uniform((64, 64), seed(5)))
    assert not torch.equal(u, hot.uniform((64, 64), seed(6)))


@pytest.mark.parametrize(
    ("call", "match"),
    [(lambda: hot.quantize_int(torch.ones(4, 4), 4, "row"), "scaling must be one of"),
     (lambda: hot.quantize_int(torch.ones(4, 4), 9, "tensor"), r"bits must be in \[2, 8\]"),
     (lambda: hot.quantize_int(torch.ones(4), 4, "tensor"), "2-D operands"),
     (lambda: hot.quantize_int(torch.ones(4, 4), 4, "tensor", backend="cuda"), "unknown backend 'cuda'"),
     (lambda: hot.block_hadamard(torch.ones(4, 24)), "multiple of 16, got 24"),
     (lambda: hot.lowrank_tokens(torch.ones(48, 4)), "blocks of 32, got 48"),
     (lambda: hot.hadamard(12), "power of two, got 12"),
     (lambda: hot.wgrad(torch.ones(64, 8), hot.compress_tokens(torch.ones(32, 8)), seed=None,
                        paths=hot.HotPaths("reference", "reference"), out_dtype=torch.float32), "expected half")],
    ids=["bad-scaling", "bad-bits", "not-2d", "bad-backend", "hadamard-k", "lowrank-tokens", "hadamard-size", "wgrad-tokens"],
)
def test_bad_input_is_refused_naming_the_problem(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ---------------------------------------------------------------------------------------------
# GEMM paths


def test_paths_follow_the_devices_gemm_path():
    assert hot.paths_for(GemmPath.FP8_ROWWISE) == ("fp8-rowwise", "int-mm")
    assert hot.paths_for(GemmPath.DOT_SCALED) == ("dequant-matmul", "int-mm")
    assert hot.paths_for(GemmPath.REFERENCE) == ("reference", "reference")
    assert hot.hot_gemm_path("cpu") == ("reference", "reference")


def test_int4_paths_agree_with_the_exact_product():
    a = hot.quantize_int(gaussian(64, 96), 4, "token", seed(1))
    b = hot.quantize_int(gaussian(48, 96, s=1), 4, "sawb")
    exact = a.dequantize(torch.float64) @ b.dequantize(torch.float64).t()
    ref = hot.mm_int4(a, b, "reference", torch.float32)
    assert torch.allclose(ref.double(), exact, rtol=1e-6, atol=1e-6 * exact.abs().max().item())
    assert torch.equal(hot.mm_int4(a, b, "dequant-matmul", torch.float32), ref)


@pytest.mark.parametrize("m", [32, 16], ids=["int-mm", "too-few-rows-for-int-mm"])
def test_int8_paths_agree_bit_for_bit(m):
    a = hot.quantize_int(gaussian(m, 64), 8, "tensor", seed(2))
    b = hot.quantize_int(gaussian(64, 40, s=1), 8, "sawb")
    assert hot.int_mm_fits(m, 64, 40) is (m > 16)
    ref = hot.mm_int8(a, b, "reference", torch.float32)
    assert torch.equal(hot.mm_int8(a, b, "int-mm", torch.float32), ref)
    exact = a.values.long() @ b.values.long()
    assert torch.equal(ref, exact.float() * a.scale * b.scale)


def test_int_mm_gets_the_layout_of_the_int8_tensor_core_kernels(monkeypatch):
    # cuBLASLt's INT8 tensor-core GEMM needs A row-major and B column-major (K contiguous in both);
    # the wgrad operands arrive as a transposed view of dY's codes and X's row-major codes.
    seen, real = [], torch._int_mm

    def spy(a, b):
        seen.append((a.stride(), b.stride()))
        return real(a, b)

    monkeypatch.setattr(torch, "_int_mm", spy)
    g = hot.quantize_int(gaussian(64, 48), 8, "tensor", seed(4))  # (T, out): wgrad's A is its transpose
    x = hot.quantize_int(gaussian(64, 40, s=1), 8, "sawb")  # (T, in), row-major as saved

    def product(g, x):
        return hot.mm_int8(hot.IntTensor(g.values.t(), g.scale), x, "int-mm", torch.float32)

    ref = hot.mm_int8(hot.IntTensor(g.values.t(), g.scale), x, "reference", torch.float32)
    assert torch.equal(product(g, x), ref)
    # Compiled too: Inductor lays out the copies of traced PyTorch as it likes (it made A
    # column-major), an operator's inputs as they are.
    torch._dynamo.reset()
    assert torch.equal(torch.compile(product, fullgraph=True)(g, x), ref)
    assert seen == [((64, 1), (1, 64))] * 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_paths_match_the_reference():
    a = hot.quantize_int(gaussian(256, 512), 4, "token", seed(1))
    b = hot.quantize_int(gaussian(384, 512, s=1), 4, "sawb")
    cuda = lambda q: hot.IntTensor(q.values.cuda(), q.scale.cuda())  # noqa: E731
    paths = hot.hot_gemm_path("cuda")
    ref = hot.mm_int4(a, b, "reference", torch.float64)
    got = hot.mm_int4(cuda(a), cuda(b), paths.int4, torch.float32).cpu().double()
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    c = hot.quantize_int(gaussian(256, 512), 8, "tensor", seed(3))
    d = hot.quantize_int(gaussian(512, 384, s=2), 8, "sawb")
    assert paths.int8 == "int-mm"
    assert torch.equal(hot.mm_int8(cuda(c), cuda(d), "int-mm", torch.float32).cpu(),
                       hot.mm_int8(c, d, "reference", torch.float32))


# ---------------------------------------------------------------------------------------------
# The two GEMMs through strategy_mm (the layer's one path)


def test_dgrad_error_is_at_the_int4_level():
    g, w = gaussian(TOKENS, OUT), gaussian(OUT, IN, s=1)
    exact = g.double() @ w.double()
    for strategy, (low, high) in ((Strategy.HOT_INT4, (0.22, 0.31)), (Strategy.HOT_INT4_TOKEN, (0.15, 0.23))):
        dx = strategy_mm(strategy, Operand(g), Operand(w, transpose=True))
        assert low < relative(dx, exact) < high, strategy


def test_wgrad_error_is_the_projection_on_white_tokens_and_int8_on_pair_constant_ones():
    g, x = gaussian(TOKENS, OUT), gaussian(TOKENS, IN, s=1)
    dw = strategy_mm(Strategy.HOT_LOWRANK_INT8, Operand(g, transpose=True), Operand(x, transpose=True))
    assert 0.66 < relative(dw, g.double().t() @ x.double()) < 0.76
    # Against the projector itself (pairs averaged) only INT8 is left.
    pair_mean = lambda t: t.double().reshape(-1, 2, t.shape[1]).mean(1).repeat_interleave(2, 0)  # noqa: E731
    assert relative(dw, g.double().t() @ pair_mean(x)) < 0.08
    gp, xp = pair_mean(g).float(), pair_mean(x).float()  # constant on pairs: the projection is exact
    dwp = strategy_mm(Strategy.HOT_LOWRANK_INT8, Operand(gp, transpose=True), Operand(xp, transpose=True))
    assert 0.03 < relative(dwp, gp.double().t() @ xp.double()) < 0.08


def test_full_rank_wgrad_ablation_leaves_only_int8_error():
    g, x = gaussian(TOKENS, OUT), gaussian(TOKENS, IN, s=1)
    exact = g.double().t() @ x.double()
    dw = strategy_mm(Strategy.HOT_INT8, Operand(g, transpose=True), Operand(x, transpose=True))
    low_rank = strategy_mm(Strategy.HOT_LOWRANK_INT8, Operand(g, transpose=True), Operand(x, transpose=True))
    assert 0.01 < relative(dw, exact) < 0.1 < 0.66 < relative(low_rank, exact)
    with pytest.raises(ValueError, match="expected as many"):
        hot.wgrad(g, hot.compress_tokens(x), seed=None, paths=hot.HotPaths("reference", "reference"), out_dtype=torch.float32,
                  lowrank=False)


def test_wgrad_on_the_compressed_copy_equals_wgrad_on_x():
    g, x = gaussian(TOKENS, OUT), gaussian(TOKENS, IN, s=1)
    counter = torch.tensor(3)
    spec = adahop.linear.QuantSpec(False, "sr", 11)
    for strategy, lowrank in ((Strategy.HOT_LOWRANK_INT8, True), (Strategy.HOT_INT8, False)):
        full = strategy_mm(strategy, Operand(g, spec, transpose=True), Operand(x, transpose=True), counter=counter)
        saved = strategy_mm(strategy, Operand(g, spec, transpose=True),
                            Operand(None, q=hot.compress_tokens(x, lowrank=lowrank)), counter=counter)
        assert torch.equal(full, saved), strategy


# ---------------------------------------------------------------------------------------------
# The layer


def hot_layer(**overrides) -> tuple[nn.Module, nn.Linear]:
    torch.manual_seed(0)
    base = nn.Linear(IN, OUT)
    ref = nn.Linear(IN, OUT).double()
    ref.load_state_dict(base.state_dict())
    return adahop.convert(base, "hot", calibration_steps=2, **overrides), ref


def calibrate(layer, x, g, steps=2):
    for _ in range(steps):
        layer(x.clone().requires_grad_()).backward(g)
        adahop.on_optimizer_step(layer)
        layer.zero_grad()


def planted(kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    rows = 4 if kind == "outliers" else 0
    return (planted_outliers(TOKENS, IN, seed=0),
            planted_outliers(TOKENS, OUT, n_rows=rows, row_factor=20, seed=1))


@pytest.mark.parametrize("kind,picked", [("gaussian", Strategy.HOT_INT4), ("outliers", Strategy.HOT_INT4_TOKEN)])
def test_calibration_picks_per_token_scales_only_for_outlier_tokens(kind, picked):
    layer, ref = hot_layer()
    x, g = planted(kind)
    calibrate(layer, x, g)
    assert layer.strategies == {"fwd": Strategy.BF16, "dgrad": picked, "wgrad": Strategy.HOT_LOWRANK_INT8}
    rel = layer.calibration.relative_errors()["dgrad"]
    assert (rel["hot-int4-token"] < 0.5 * rel["hot-int4"]) is (picked is Strategy.HOT_INT4_TOKEN)
    xq = x.clone().requires_grad_()
    layer(xq).backward(g)
    xr = x.double().requires_grad_()
    ref(xr).backward(g.double())
    assert relative(xq.grad, xr.grad) < 0.32
    assert relative(layer.weight.grad, ref.weight.grad) < 0.8


def test_lqs_rule_is_more_than_half():
    def cal(tensor, token):
        c = Calibration()
        c.add_errors("dgrad", {Strategy.HOT_INT4: (tensor**2, 1.0), Strategy.HOT_INT4_TOKEN: (token**2, 1.0)})
        return c

    assert lqs_strategies(cal(0.4, 0.19))["dgrad"] is Strategy.HOT_INT4_TOKEN
    assert lqs_strategies(cal(0.4, 0.21))["dgrad"] is Strategy.HOT_INT4
    with pytest.warns(UserWarning, match="no grad_output errors"):
        assert lqs_strategies(Calibration())["dgrad"] is Strategy.HOT_INT4


def test_calibrating_steps_run_in_bf16_and_train():
    layer, ref = hot_layer()
    x, g = planted("outliers")
    xq = x.clone().requires_grad_()
    y = layer(xq)
    y.backward(g)
    xr = x.double().requires_grad_()
    ref(xr).backward(g.double())
    assert relative(y, ref(x.double())) < 1e-6 and relative(xq.grad, xr.grad) < 1e-6
    assert relative(layer.weight.grad, ref.weight.grad) < 1e-6


def test_saved_x_is_projected_int8_a_quarter_of_bf16():
    layer, _ = hot_layer()
    layer.fix({"fwd": "bf16", "dgrad": "hot-int4", "wgrad": "hot-lowrank-int8"})
    layer.to(torch.bfloat16)
    x = gaussian(TOKENS, IN).to(torch.bfloat16).requires_grad_()
    with SavedTensorMeter(layer) as meter:
        layer(x)
    activations = sorted((s, d) for s, d, is_param in meter.tensors if not is_param)
    assert activations == sorted([((TOKENS // 2, IN), torch.int8), ((1, 1), torch.float32), ((), torch.int64)])
    assert meter.activation_bytes == TOKENS * IN // 2 + 4 + 8
    with SavedTensorMeter() as plain:
        nn.Linear(IN, OUT, dtype=torch.bfloat16)(x)
    x_bf16 = TOKENS * IN * 2
    assert x_bf16 in {n for n, _ in plain.storages.values()}
    assert meter.activation_bytes - 12 == x_bf16 // 4
    # The full-rank ablation keeps X in INT8 at every token: half of BF16.
    layer.fix({"fwd": "bf16", "dgrad": "hot-int4", "wgrad": "hot-int8"})
    with SavedTensorMeter(layer) as full_rank:
        layer(x)
    assert ((TOKENS, IN), torch.int8) in {(s, d) for s, d, is_param in full_rank.tensors if not is_param}
    assert full_rank.activation_bytes - 12 == x_bf16 // 2


def test_checkpoint_round_trip_keeps_the_selection_and_the_draws():
    layer, _ = hot_layer()
    x, g = planted("outliers")
    calibrate(layer, x, g)
    state = layer.state_dict()
    other, _ = hot_layer()
    other.load_state_dict(state)
    assert other.strategies == layer.strategies and other.phase == "fixed"
    assert other.calibration.to_dict() == layer.calibration.to_dict()
    grads = []
    for m in (layer, other):
        xq = x.clone().requires_grad_()
        m(xq).backward(g)
        grads.append((xq.grad, m.weight.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


def test_a_checkpoint_of_another_calibration_precision_is_refused():
    mx = adahop.convert(nn.Linear(IN, OUT), "adahop")
    bf = adahop.convert(nn.Linear(IN, OUT), "adahop-bf16-cal")
    with pytest.raises(ValueError, match=r"differing in \['calibration_precision', 'description', 'name'\]"):
        bf.load_state_dict(mx.state_dict())


def test_a_hot_strategy_in_the_wrong_slot_is_refused_by_fix():
    layer, _ = hot_layer()
    with pytest.raises(ValueError, match="'hot-lowrank-int8' runs only \\['wgrad'\\], not 'dgrad'"):
        layer.fix({"fwd": "bf16", "dgrad": "hot-lowrank-int8", "wgrad": "hot-lowrank-int8"})


def test_the_fixed_layer_compiles_as_one_graph():
    """No host read in the fixed path: fullgraph=True refuses a graph break (``.item()``)."""
    torch._dynamo.reset()
    layer, _ = hot_layer()
    layer.fix({"fwd": "bf16", "dgrad": "hot-int4-token", "wgrad": "hot-lowrank-int8"})
    x, g = planted("outliers")
    xe = x.clone().requires_grad_()
    layer(xe).backward(g)
    eager = (xe.grad, layer.weight.grad.clone())
    layer.zero_grad()
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    xc = x.clone().requires_grad_()
    compiled(xc).backward(g)
    assert torch.equal(xc.grad, eager[0]) and torch.equal(layer.weight.grad, eager[1])
    torch._dynamo.reset()


# ---------------------------------------------------------------------------------------------
# calibration_precision on the adahop recipes


def test_bf16_calibration_runs_unquantized_and_observes_the_same():
    x = planted_outliers(TOKENS, IN, n_cols=4, col_factor=20, seed=0)
    g = planted_outliers(TOKENS, OUT, n_rows=4, row_factor=20, seed=1)
    errors, votes, saved = {}, {}, {}
    for name in ("adahop", "adahop-bf16-cal"):
        torch.manual_seed(0)
        base = nn.Linear(IN, OUT)
        layer = adahop.convert(base, name, calibration_steps=2, outlier_k=8)
        with SavedTensorMeter(layer) as meter:
            y = layer(x.clone().requires_grad_())
        y.backward(g)
        errors[name] = relative(y, base(x).detach().double())
        saved[name] = {(s, d) for s, d, is_param in meter.tensors if not is_param}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            calibrate(layer, x, g, steps=2)
        votes[name] = (layer.calibration.to_dict()["votes"], layer.strategies)
    assert errors["adahop-bf16-cal"] < 1e-6 < 0.05 < errors["adahop"]
    assert votes["adahop"] == votes["adahop-bf16-cal"]
    assert ((TOKENS, IN), torch.float32) in saved["adahop-bf16-cal"]  # X as it came, for an exact wgrad
    assert ((TOKENS, IN), torch.float32) not in saved["adahop"]
