"""Linear-layer forward + backward per recipe, beside nn.Linear bf16 and torchao float8, same run.

One benchmark per (variant, layer shape): ``torch.autograd.grad`` of the layer's output for X and W
(no bias, as in Llama), bf16 operands, each shape's token count. Work = the three GEMMs, 6·T·in·out flop;
the figure is TFLOP/s of that work, so ratios between figures are speed-ups.

Peers, timed in the same process: ``nn.Linear-bf16`` (cuBLAS bf16, eager) and, on CUDA where
torchao imports, ``torchao-float8-rowwise`` and ``-tensorwise`` (``convert_to_float8_training``,
``torch.compile``d as torchao intends). On CUDA the quantized layer is compiled too. Ceiling: the device's GEMM ceiling of tests/bench/conftest.py
(cuBLAS FP8 rowwise on the H200) at the forward GEMM's shape.

Targets on the H200: the ``iht`` variant >= 1.6x ``nn.Linear-bf16`` and >= 1.2x torchao float8
tensorwise at Llama-3 8B shapes (16k tokens), >= 1.0x at k/v and at our 125m model's layers. The gpu profile adds the layers of our 125m pretraining model at its 64k tokens a step
(where the end-to-end throughput is decided) and a 256-token layer whose GPU work is negligible:
its time is the host's cost of one fwd+bwd (Python, checks, kernel launches), the bound of the
eager quantized training steps. On CUDA each benchmark also times the layer and its peers replayed
from CUDA graphs (the record's ``replayed``): the device's time alone, as a training step under
CUDA graphs spends it. No timing asserts: ``experiments/layer_bench.py`` collects the JSON.
"""

import functools
import os
from typing import Callable

import pytest
import torch
from torch import nn

import adahop
from adahop import hot, ops

CUDA = torch.cuda.is_available()
PROFILE = os.environ.get("ADAHOP_BENCH_PROFILE") or ("gpu" if CUDA else "smoke")  # as tests/bench/conftest.py
# (name, (tokens, in_features, out_features)): Llama-3 8B's projections at 16k tokens, our 125m
# model's at 64k, and a layer too small to occupy the GPU (host overhead) on the GPU.
LAYERS = {
    "smoke": [("128-128", (128, 128, 128)), ("128-256", (128, 128, 256))],
    "gpu": [("llama3-8b-q/o", (16384, 4096, 4096)), ("llama3-8b-k/v", (16384, 4096, 1024)),
            ("llama3-8b-gate/up", (16384, 4096, 14336)), ("llama3-8b-down", (16384, 14336, 4096)),
            ("ours-125m-attn-64k", (65536, 768, 768)), ("ours-125m-gate/up-64k", (65536, 768, 2048)),
            ("ours-125m-down-64k", (65536, 2048, 768)), ("host-overhead-256", (256, 256, 256))],
}[PROFILE]
# variant -> (recipe, overrides): every strategy of the layer, each on all three GEMMs it allows.
VARIANTS = {
    "mxfp4": ("mxfp4", {}),
    "iht": ("uniform-iht", {}),
    # A micro-batch after the first of its optimizer step (gradient accumulation): W's operands come
    # from the weight cache, filled before timing as the optimizer step's hook fills it.
    "iht-cached-w": ("uniform-iht", {"weight_cache": True}),
    "oe-left": ("uniform-iht", {"fwd": "iht+oe-left", "dgrad": "iht+oe-left", "wgrad": "iht"}),
    "oe-right": ("uniform-iht", {"fwd": "iht+oe-right", "dgrad": "iht+oe-right", "wgrad": "iht+oe-right"}),
    "tseng": ("tseng", {}),
    "quartet-style": ("quartet-style", {}),
    # HOT's backward: INT4 dgrad (dY per tensor or per token, as its calibration picks per layer) and
    # the low-rank INT8 wgrad; its forward is bf16.
    "hot": ("hot", {"fwd": "bf16", "dgrad": "hot-int4", "wgrad": "hot-lowrank-int8"}),
    "hot-token": ("hot", {"fwd": "bf16", "dgrad": "hot-int4-token", "wgrad": "hot-lowrank-int8"}),
}
GEMMS = {"hot": "bf16 forward, int4/int8 backward GEMMs"}  # by recipe; the rest are MXFP4


def variant_gemm_path(recipe: str, device: torch.device) -> str:
    """The path the variant's quantized GEMMs take on ``device`` (HOT's two integer GEMMs, named)."""
    if recipe == "hot":
        paths = hot.hot_gemm_path(device)
        return f"int4 {paths.int4}, int8 {paths.int8}"
    return ops.gemm_path(device).value


def fwd_bwd(layer: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, gy: torch.Tensor, weight: torch.Tensor):
    """One training step's work of ``layer`` (``weight`` its weight): Y, then dX and dW from dY."""
    return lambda: torch.autograd.grad(layer(x), (x, weight), gy)


@functools.lru_cache(maxsize=None)
def torchao_float8(fin: int, fout: int, device: torch.device, recipe: str) -> tuple[nn.Module, nn.Parameter] | None:
    """torchao's float8 training layer (``recipe``: rowwise or tensorwise) under ``torch.compile``, built once
    per shape, and its weight. Each benchmark compiles it afresh (:func:`fresh_compile_caches`).

    The weight comes from the uncompiled module: the compiled wrapper does not support indexing.
    """
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError:
        return None
    model = nn.Sequential(nn.Linear(fin, fout, bias=False)).to(device, torch.bfloat16)
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe))
    return torch.compile(model), model[0].weight


@pytest.fixture(autouse=True)
def fresh_compile_caches():
    """Each benchmark compiles its layer and the torchao peers from empty caches, as a training run
    does. torch.compile keeps one cache per code object, shared by every module of a class: without
    the reset a later shape recompiles with dynamic shapes, and past ``recompile_limit`` (8)
    compiles of the same forward the rest run eagerly, so most shapes would time other programs."""
    torch._dynamo.reset()


@pytest.mark.parametrize("shape", [s for _, s in LAYERS], ids=[n for n, _ in LAYERS])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_layer_fwd_bwd(benchmark, bench, variant, shape):
    tokens, fin, fout = shape
    recipe, overrides = VARIANTS[variant]
    device = bench.device
    x = bench.randn(tokens, fin, seed=1).requires_grad_()
    gy = bench.randn(tokens, fout, seed=2)
    linear = nn.Linear(fin, fout, bias=False).to(device, torch.bfloat16)
    layer = adahop.convert(nn.Linear(fin, fout, bias=False).to(device, torch.bfloat16), recipe, **overrides)
    adahop.refresh_weights(layer, torch.bfloat16)  # fills the cache of a weight_cache variant, else nothing
    # On the GPU the layer runs compiled, as the peers do: one graph of its operators.
    run = torch.compile(layer) if device.type == "cuda" else layer
    peers = {"nn.Linear-bf16": fwd_bwd(linear, x, gy, linear.weight)}
    for ao_recipe in ("rowwise", "tensorwise"):
        ao = torchao_float8(fin, fout, device, ao_recipe) if device.type == "cuda" else None
        if ao is not None:
            peers[f"torchao-float8-{ao_recipe}"] = fwd_bwd(ao[0], x, gy, ao[1])
    ceiling, _ = bench.ceilings.names_for_gemm()
    step = fwd_bwd(run, x, gy, layer.weight)
    info = bench.run(
        benchmark, step, op=f"linear fwd+bwd [{variant}]", shape=(tokens, fin, fout),
        dtype=f"bf16 in/out, {GEMMS.get(recipe, 'mxfp4 GEMMs')}", work=6 * tokens * fin * fout, unit="TFLOP/s", ceiling=ceiling,
        ceiling_shape=(tokens, fout, fin), peers=peers, gemm_path=variant_gemm_path(recipe, device),
    )
    if info is not None:
        benchmark.extra_info["layer"] = {
            "variant": variant, "recipe": recipe, "overrides": overrides, "tokens": tokens,
            "in_features": fin, "out_features": fout,
            "strategies": {k: v.value for k, v in layer.strategies.items()},
            "speedup_vs_bf16": info["ratio_to_peers"]["nn.Linear-bf16"],
            "compile_caches": "fresh",  # fresh_compile_caches: each benchmark compiled from empty caches
            # The same work replayed from CUDA graphs, the layer and its peers alike: what a step
            # under CUDA graphs spends on the device, where the figure above also holds the host's
            # launches (which bound the smaller shapes). The cached W is read as filled above.
            "replayed": bench.replayed(step, peers),
        }
