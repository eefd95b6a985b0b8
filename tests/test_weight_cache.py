"""``weight_cache``: W quantized once per optimizer step, read by every micro-batch of the step.

The cache changes where W is quantized, never what the layer computes: each test compares a cached
model with the same model uncached, bit for bit, eagerly and compiled, with gradient accumulation.
"""

from __future__ import annotations

import copy
import sys

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounterWithBackend

import adahop
from adahop.harness.model import Llama, LlamaConfig
from adahop.linear import function as function_module
from adahop.linear import module as module_module
from adahop.recipes import get_recipe

VOCAB, BATCH, SEQ, MICRO = 256, 2, 64, 3
REFRESHERS = sys.modules["adahop.linear.convert"]._refreshers  # the module, which adahop.linear.convert (a function) hides


def tiny(recipe: str, cache: bool, fused: bool = False) -> tuple[Llama, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = Llama(LlamaConfig.from_name("tiny", vocab_size=VOCAB, n_layers=1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused)
    overrides = {"calibration_steps": 2} if get_recipe(recipe).policy else {}
    adahop.convert(model, recipe, optimizer=opt, weight_cache=cache, **overrides)
    return model, opt


def tokens(step: int, micro: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(100 * step + micro))


def train(fn, model, opt, steps: int, first: int = 0) -> list[float]:
    """Steps of MICRO micro-batches each (gradient accumulation, fresh draws between them)."""
    losses = []
    for step in range(first, first + steps):
        for micro in range(MICRO):
            toks = tokens(step, micro)
            loss = fn(toks, toks)[1]
            (loss / MICRO).backward()
            losses.append(loss.item())
            if micro < MICRO - 1:
                adahop.linear.advance_draws(model)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return losses


def params(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def assert_cache_trains_alike(recipe: str, steps: int, fused: bool = False, fixed: dict | None = None) -> None:
    """The same losses and weights, bit for bit, with the cache and without."""
    runs = []
    for cache in (False, True):
        model, opt = tiny(recipe, cache, fused)
        if fixed is not None:
            adahop.fix_strategies(model, {name: fixed for name, _ in adahop.linear.quant_layers(model)})
        runs.append((train(model, model, opt, steps), params(model)))
    (losses, weights), (cached_losses, cached_weights) = runs
    assert cached_losses == losses
    assert all(torch.equal(a, b) for a, b in zip(weights, cached_weights))


@pytest.mark.parametrize(("recipe", "fused"), [("uniform-iht", False), ("mxfp4", False), ("adahop", False),
                                              ("uniform-iht", True)])
def test_cached_weights_train_bit_for_bit_as_uncached(recipe, fused):
    """adahop calibrates for two steps (no cache while calibrating), then fixes its strategies
    (OE among them where the tiny model's patterns ask for it) and caches from then on. A fused
    AdamW updates the weights without advancing their version counters: the step refreshes anyway."""
    assert_cache_trains_alike(recipe, 4, fused)


@pytest.mark.parametrize("fixed", [
    {"fwd": "iht+oe-right", "dgrad": "iht+oe-right", "wgrad": "iht"},  # W's outlier rows from the cache's maxima
    {"fwd": "bf16", "dgrad": "iht", "wgrad": "bf16"},  # only Wᵀ cached
    {"fwd": "iht", "dgrad": "bf16", "wgrad": "iht+oe-right"},  # only W along `in` cached
])
def test_cached_weights_train_as_uncached_under_each_strategy(fixed):
    assert_cache_trains_alike("adahop", 2, fixed=fixed)


def test_w_is_quantized_once_per_optimizer_step(monkeypatch):
    model, opt = tiny("uniform-iht", True)
    layers = [layer for _, layer in adahop.linear.quant_layers(model)]
    calls = []

    def counting(w, plan, counter):
        calls.append(tuple(w.shape))
        return weight_operands(w, plan, counter)

    weight_operands = function_module.weight_operands
    monkeypatch.setattr(module_module, "weight_operands", counting)
    monkeypatch.setattr(function_module, "weight_operands", counting)
    train(model, model, opt, 1)  # the first forward fills the caches; the step refreshes them
    assert len(calls) == 2 * len(layers)
    calls.clear()
    train(model, model, opt, 2, first=1)  # each step: MICRO micro-batches read, the step refreshes
    assert len(calls) == 2 * len(layers)
    assert sorted(calls) == sorted(2 * [tuple(layer.weight.shape) for layer in layers])


def test_uncached_layers_quantize_w_in_every_forward(monkeypatch):
    model, opt = tiny("uniform-iht", False)
    n = len(list(adahop.linear.quant_layers(model)))
    calls = []
    weight_operands = function_module.weight_operands
    monkeypatch.setattr(function_module, "weight_operands", lambda *a: calls.append(1) or weight_operands(*a))
    train(model, model, opt, 1)
    assert len(calls) == MICRO * n


def cached_and_plain() -> tuple[adahop.QuantLinear, adahop.QuantLinear, torch.Tensor]:
    """One layer with the cache and without, from the same weights, and an input."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(128, 256)
    return (adahop.convert(copy.deepcopy(linear), "uniform-iht", weight_cache=True),
            adahop.convert(copy.deepcopy(linear), "uniform-iht"), torch.randn(64, 128))


def test_a_weight_changed_in_place_is_requantized_by_the_eager_forward():
    cached, plain, x = cached_and_plain()
    assert torch.equal(cached(x), plain(x))
    with torch.no_grad():
        for layer in (cached, plain):
            layer.weight.mul_(-0.5)
    assert torch.equal(cached(x), plain(x))
    with torch.no_grad():  # not a new version: a new tensor in the parameter
        cached.weight.data = plain.weight.detach().flip(0).clone()
        plain.weight.data = plain.weight.detach().flip(0).clone()
    assert torch.equal(cached(x), plain(x))


def test_a_cache_filled_under_inference_mode_refreshes_outside_it():
    cached, plain, x = cached_and_plain()
    with torch.inference_mode():
        cached(x)
    with torch.no_grad():
        for layer in (cached, plain):
            layer.weight.mul_(2.0)
    assert torch.equal(cached(x), plain(x))


def test_a_cast_of_the_model_drops_the_cache():
    """``Module.to(dtype)`` casts floating buffers: the cache's (here OE-right's row maxima; on Hopper
    its FP8 operands and scales) would hold other values. Such a cache is dropped, and refilled."""
    torch.manual_seed(0)
    oe = {"fwd": "iht+oe-right", "dgrad": "iht+oe-right", "wgrad": "iht"}
    cached = adahop.convert(torch.nn.Linear(128, 256), "uniform-iht", weight_cache=True, **oe)
    adahop.refresh_weights(cached, torch.float32)
    assert cached.w_cache_in_amax.dtype == torch.float32
    cached.to("cpu")  # no cast: kept
    assert cached._w_cache_ready
    cached.to(torch.bfloat16)
    assert not cached._w_cache_ready and all(b is None for n, b in cached.named_buffers() if "cache" in n)
    x = torch.randn(64, 128, dtype=torch.bfloat16)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="weight cache is empty"):
        torch.compile(cached, backend="aot_eager", fullgraph=True)(x)
    plain = adahop.convert(torch.nn.Linear(128, 256), "uniform-iht", **oe).to(torch.bfloat16)
    plain.load_state_dict(cached.state_dict())  # a checkpoint loads with or without the cache
    assert torch.equal(cached(x), plain(x))  # eagerly refilled from the bf16 weight


def test_compiled_cached_model_is_one_graph_and_trains_as_eager():
    """One graph for every micro-batch and step: the cache is a set of buffers that the optimizer
    hook overwrites in place between steps (the compiled graph sees the new values)."""
    model, opt = tiny("uniform-iht", True)
    eager_model, eager_opt = tiny("uniform-iht", True)
    eager = train(eager_model, eager_model, eager_opt, 3)
    torch._dynamo.reset()
    assert adahop.refresh_weights(model, torch.float32) == len(list(adahop.linear.quant_layers(model)))
    assert adahop.refresh_weights(model, torch.float32) == 0  # nothing changed since
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        losses = train(compiled, model, opt, 3)
    assert counter.frame_count == 1, f"{counter.frame_count} graphs compiled"
    assert losses == eager
    assert all(torch.equal(a, b) for a, b in zip(params(eager_model), params(model)))


def test_compiled_forward_reads_weights_loaded_into_the_model():
    torch.manual_seed(0)
    linear = torch.nn.Linear(128, 256)
    model = adahop.convert(copy.deepcopy(linear), "uniform-iht", weight_cache=True)
    adahop.refresh_weights(model, torch.float32)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    x = torch.randn(64, 128)
    compiled(x)
    other = torch.nn.Linear(128, 256)
    model.load_state_dict({**model.state_dict(), "weight": other.weight.detach(), "bias": other.bias.detach()})
    expected = adahop.convert(copy.deepcopy(other), "uniform-iht")(x)
    assert torch.equal(compiled(x), expected)


def test_compiled_forward_with_an_empty_cache_names_refresh_weights():
    model = adahop.convert(torch.nn.Linear(128, 256), "uniform-iht", weight_cache=True)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"weight cache is empty.*adahop\.refresh_weights\(model, dtype=torch\.float32\)"):
        torch.compile(model, backend="aot_eager", fullgraph=True)(torch.randn(64, 128))


def test_compiled_forward_refuses_a_cache_of_another_dtype():
    model = adahop.convert(torch.nn.Linear(128, 256), "uniform-iht", weight_cache=True)
    adahop.refresh_weights(model, torch.float32)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception, match=r"holds W quantized from torch\.float32.*dtype=torch\.bfloat16"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            compiled(torch.randn(64, 128))


def test_refresh_weights_checks_its_arguments():
    model = adahop.convert(torch.nn.Linear(128, 256), "uniform-iht", weight_cache=True)
    with pytest.raises(TypeError, match="model must be an nn.Module, got str"):
        adahop.refresh_weights("model")
    with pytest.raises(TypeError, match="dtype must be a torch.dtype or None, got str 'bf16'"):
        adahop.refresh_weights(model, "bf16")


def test_uncached_recipes_fill_no_cache():
    model = adahop.convert(torch.nn.Linear(128, 256), "uniform-iht")
    assert adahop.refresh_weights(model, torch.float32) == 0
    model(torch.randn(64, 128))
    assert all(b is None for b in model.buffers() if b.dtype != torch.int64)


@pytest.mark.parametrize(("overrides", "why"), [
    ({"random_signs": ["dgrad"]}, r"random_signs names \['dgrad'\]"),
    ({"random_signs": ["fwd", "wgrad"]}, r"random_signs names \['fwd'\]"),
    ({"saved_rounding": "sr"}, "saved_rounding is 'sr'"),
    ({"weight_for_backward": "param"}, "weight_for_backward is 'param'"),
])
def test_weight_cache_refuses_recipes_that_draw_on_w(overrides, why):
    with pytest.raises(ValueError, match=rf"recipe 'uniform-iht': weight_cache needs W quantized without draws.*; {why}"):
        get_recipe("uniform-iht", weight_cache=True, **overrides)


def test_random_signs_on_wgrad_alone_keep_the_cache_allowed():
    assert get_recipe("uniform-iht", weight_cache=True, random_signs=["wgrad"]).weight_cache


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "inductor"])
@pytest.mark.parametrize(("fin", "fout"), [(1024, 512), (768, 256)], ids=["blockwise", "rowwise"])
def test_cached_weights_compute_as_uncached_on_cuda(fin, fout, compiled):
    """The kernels' path: Wᵀ leaves the quantize kernel in dgrad's FP8 layout (the blockwise GEMM's
    128×128 tiles where K is a multiple of 512, rows elsewhere) where the uncached layer re-encodes
    its saved packed copy; the products, and the weights after three accumulated steps of a fused
    AdamW (which leaves the weights' version counters alone), agree bit for bit."""
    torch.manual_seed(0)
    base = torch.nn.Linear(fin, fout, bias=False, device="cuda")
    runs = []
    for cache in (False, True):
        torch._dynamo.reset()
        layer = adahop.convert(copy.deepcopy(base), "uniform-iht", weight_cache=cache)
        opt = torch.optim.AdamW(layer.parameters(), lr=1e-2, fused=True)  # as the trainer's on CUDA
        adahop.refresh_weights(layer, torch.bfloat16)
        run = torch.compile(layer) if compiled else layer
        outs = []
        for step in range(3):
            for micro in range(2):
                x = torch.randn(512, fin, device="cuda", generator=torch.Generator("cuda").manual_seed(10 * step + micro))
                x.requires_grad_()
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    y = run(x)
                y.float().square().mean().backward()
                outs += [y.detach(), x.grad]
                adahop.linear.advance_draws(layer)
            opt.step()
            opt.zero_grad(set_to_none=True)
            adahop.on_optimizer_step(layer)
        runs.append((outs, layer.weight.detach().clone()))
        if cache:  # the steps' refreshes replayed a CUDA graph (checked by what they computed above)
            assert REFRESHERS[layer].graph is not None and not REFRESHERS[layer].failed
    (outs, w), (cached_outs, cached_w) = runs
    assert all(torch.equal(a, b) for a, b in zip(outs, cached_outs))
    assert torch.equal(w, cached_w)


def cache_contents(model) -> list[torch.Tensor | None]:
    return [None if (b := layer._buffers[n]) is None else b.clone()
            for _, layer in adahop.linear.quant_layers(model) for n in module_module._CACHE_BUFFERS]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_steps_refresh_replays_one_cuda_graph_and_captures_again_when_the_plans_change():
    """Each optimizer step refreshes every cache by replaying one CUDA graph, which writes what an
    eager refresh writes; new strategies (other plans, other buffers) make the next step refresh
    eagerly and capture a new graph."""
    torch.manual_seed(0)
    model = Llama(LlamaConfig.from_name("tiny", vocab_size=VOCAB, n_layers=2)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    adahop.convert(model, "adahop", optimizer=opt, weight_cache=True)
    names = [name for name, _ in adahop.linear.quant_layers(model)]
    adahop.fix_strategies(model, dict.fromkeys(names, {"fwd": "iht", "dgrad": "iht+oe-right", "wgrad": "iht"}))

    def step(i: int) -> None:
        toks = tokens(i, 0).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(toks, toks)[1]
        loss.backward()
        opt.step()  # its hook refreshes the caches
        opt.zero_grad(set_to_none=True)

    def assert_eager_refresh_agrees() -> None:
        replayed = cache_contents(model)
        assert adahop.refresh_weights(model, force=True) == len(names)
        eager = cache_contents(model)
        assert [a is None for a in replayed] == [b is None for b in eager]
        assert all(a is None or torch.equal(a, b) for a, b in zip(replayed, eager))

    step(0)  # refreshes eagerly, then captures
    refresher = REFRESHERS[model]
    graph = refresher.graph
    assert graph is not None and not refresher.failed
    for i in (1, 2):
        step(i)
        assert refresher.graph is graph
    assert_eager_refresh_agrees()
    adahop.fix_strategies(model, dict.fromkeys(names, {"fwd": "bf16", "dgrad": "iht", "wgrad": "iht"}))
    step(3)
    assert refresher.graph is not None and refresher.graph is not graph
    step(4)
    assert_eager_refresh_agrees()
