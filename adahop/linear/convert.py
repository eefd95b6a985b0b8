"""The model-level API: convert a model's linear layers, step them, export and fix their strategies.

::

    model = adahop.convert(model, "adahop", optimizer=opt)  # every nn.Linear but the LM head
    compiled = torch.compile(model)                          # one graph once strategies are fixed
    with adahop.eager_while_calibrating(model):              # each step's forward and backward
        loss_fn(compiled(x), y).backward()
    adahop.export_strategies(model)                          # labels and strategies, JSON-ready
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections import Counter, defaultdict
from typing import Any, Iterable, Iterator, Mapping

import torch
from torch import nn

from adahop.linear.module import QuantLinear
from adahop.linear.seeds import DrawState
from adahop.policy import SLOTS, Strategy
from adahop.recipes import Recipe, get_recipe

# Sibling layers that read one input, by their names in one parent (Hugging Face Llama and this
# project's model): they share the input's quantization and its saved copy.
SIBLINGS: tuple[tuple[str, ...], ...] = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def _skip_names(skip: Any) -> tuple[str, ...]:
    if isinstance(skip, str):
        return (skip,)
    try:
        names = tuple(skip)
    except TypeError:
        raise TypeError(f"skip must be a module name or an iterable of names, got {type(skip).__name__}") from None
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise TypeError(f"skip must hold module names (str), got {bad[:3]}")
    return names


def _skipped(name: str, skip: Iterable[str]) -> bool:
    return any(name == s or name.endswith("." + s) for s in skip)


def quant_layers(model: nn.Module) -> Iterable[tuple[str, QuantLinear]]:
    """``(name, layer)`` for every :class:`QuantLinear` of ``model``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    return [(n, mod) for n, mod in model.named_modules() if isinstance(mod, QuantLinear)]


def _group_siblings(model: nn.Module, groups: Iterable[Iterable[str]]) -> None:
    """Give sibling layers (``groups``: names of children of one parent) one input group."""
    for _, parent in model.named_modules():
        for names in groups:
            layers = [parent._modules.get(n) for n in names]
            if len(layers) > 1 and all(isinstance(m, QuantLinear) for m in layers) \
                    and len({m.in_features for m in layers}) == 1:
                group = min(m.layer_id for m in layers)
                for m in layers:
                    m.input_group = group


def convert(
    model: nn.Module,
    recipe: str | Recipe,
    skip: str | Iterable[str] = ("lm_head",),
    *,
    optimizer: torch.optim.Optimizer | None = None,
    share_input: Iterable[Iterable[str]] = SIBLINGS,
    **overrides: Any,
) -> nn.Module:
    """Swap every ``nn.Linear`` of ``model`` for a :class:`QuantLinear` under ``recipe``; return the model.

    skip: a module name or names (full dotted names or their last components) to leave alone.
    Layers whose features are not multiples of ``max(32, hadamard_size)`` stay ``nn.Linear`` (BF16)
    with one warning listing them. A recipe that is BF16 everywhere (``bf16``) returns ``model``
    unchanged. Parameters are shared, not copied; layer ids follow ``named_modules`` order.
    A bare ``nn.Linear`` is converted and returned.
    optimizer: when given, a step post-hook calls :func:`on_optimizer_step` after each of its
        steps (do not call it yourself then).
    torch.compile: compile the converted model as usual, before or after calibration. Layers that
        calibrate run eagerly (graph breaks); the step that fixes their strategies (or starts a
        recalibration) calls ``torch.compiler.reset()``, so the next call retraces the model as one
        graph. That reset drops everything this process compiled, other models included.
    share_input: groups of child names of one parent that read the same input (default: q/k/v and
        gate/up): they quantize it once under ``torch.compile``, and save one copy for backward.
    Converting a model already converted under another recipe is an error; a model with nothing
    to convert comes back unchanged, with a warning.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    recipe = get_recipe(recipe, **overrides)
    skip = _skip_names(skip)
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    existing = list(quant_layers(model))
    others = sorted({layer.recipe.name for _, layer in existing if layer.recipe != recipe})
    if others:
        raise ValueError(f"convert({recipe.name!r}): the model is already converted under {others}; "
                         "convert the original (unconverted) model instead")
    if not recipe.swaps_linear:
        return model
    m = recipe.dim_multiple

    def fits(lin: nn.Linear) -> bool:
        return lin.in_features % m == 0 and lin.out_features % m == 0

    if type(model) is nn.Linear:
        if not fits(model):
            raise ValueError(f"nn.Linear({model.in_features}, {model.out_features}): features must be multiples of {m}")
        layer = QuantLinear.from_linear(model, recipe)
        if optimizer is not None:
            _step_with(optimizer, layer)
        return layer
    swapped: dict[int, QuantLinear] = {}
    kept: list[str] = []
    first_id = 1 + max((layer.layer_id for _, layer in existing), default=-1)
    for parent_name, parent in list(model.named_modules()):
        # _modules, not named_children(): the latter yields a module registered twice only once.
        for child_name, child in list(parent._modules.items()):
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            if type(child) is not nn.Linear or _skipped(name, skip):
                continue
            if not fits(child):
                kept.append(f"{name} ({child.in_features}→{child.out_features})")
                continue
            if id(child) not in swapped:  # a Linear shared by two parents stays shared
                swapped[id(child)] = QuantLinear.from_linear(child, recipe, layer_id=first_id + len(swapped))
            setattr(parent, child_name, swapped[id(child)])
    if kept:
        warnings.warn(f"convert({recipe.name!r}): kept in BF16, features not multiples of {m}: {', '.join(kept)}",
                      stacklevel=2)
    if not swapped:
        warnings.warn(f"convert({recipe.name!r}): the model has no nn.Linear to convert "
                      f"(skip={list(skip)}); it comes back unchanged", stacklevel=2)
        return model
    # One draw counter for the whole model, bumped once per forward by its first layer.
    state = existing[0][1].draw_state if existing else DrawState(next(iter(swapped.values())).weight.device)
    for i, layer in enumerate(swapped.values()):
        layer.share_draws(state, bumps=not existing and i == 0)
    _group_siblings(model, [tuple(g) for g in share_input])
    if optimizer is not None:
        _step_with(optimizer, model)
    return model


def _step_with(optimizer: torch.optim.Optimizer, model: nn.Module) -> None:
    def hook(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        _step(model)

    optimizer.register_step_post_hook(hook)


def _step(model: nn.Module) -> None:
    layers = [layer for _, layer in quant_layers(model)]
    with _retrace_if_fixed_changes(layers):
        for layer in layers:
            layer.on_optimizer_step()
    # The step's new weights (fused optimizers leave no version mark), layers just fixed.
    refresh = _refreshers.get(model)
    if refresh is None:
        refresh = _refreshers[model] = GraphedRefresh()
    refresh([layer for layer in layers if layer.caches_weight])


class GraphedRefresh:
    """Refreshes the weight caches of a model's layers after each optimizer step, on CUDA by
    replaying one CUDA graph that captured every layer's refresh.

    Eager, a refresh costs each layer a few hundred microseconds of host time (its quantize
    operators and the copies into the cache), which a step under CUDA graphs does not hide: 1b
    trained under them slower with the cache than without it. The first refresh of a set of layers
    runs eagerly (it allocates the cache) and captures the graph; later ones replay it while every
    layer reads and writes the same memory with the same plan (``QuantLinear._refresh_target``),
    and run eagerly and capture again where one changed (a new fix, a cast, a move, a load). A
    capture that fails leaves the refresh eager, with a warning.
    """

    def __init__(self) -> None:
        self.graph: torch.cuda.CUDAGraph | None = None
        self.target: tuple | None = None
        self.failed = False

    def __call__(self, layers: list[QuantLinear]) -> None:
        if not layers:
            return
        graphable = (not self.failed and all(layer.weight.is_cuda for layer in layers)
                     and not torch.cuda.is_current_stream_capturing())
        target = tuple(layer._refresh_target() for layer in layers) if graphable else None
        if target is not None and target == self.target:
            self.graph.replay()
            for layer in layers:
                layer._mark_refreshed()
            return
        self.graph = self.target = None
        for layer in layers:
            layer.refresh_weight_cache(force=True)
        if graphable:
            self._capture(layers)

    def _capture(self, layers: list[QuantLinear]) -> None:
        target = tuple(layer._refresh_target() for layer in layers)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                for layer in layers:
                    layer.refresh_weight_cache(force=True)
        except RuntimeError as e:
            self.failed = True
            warnings.warn(f"weight_cache: capturing the caches' refresh in a CUDA graph failed ({e}); "
                          "they refresh eagerly after each optimizer step", stacklevel=3)
            return
        if tuple(layer._refresh_target() for layer in layers) != target:
            # The capture allocated a cache buffer rather than writing the one in place: its contents
            # were never computed. Refill eagerly and leave the refresh eager.
            self.failed = True
            for layer in layers:
                layer.refresh_weight_cache(force=True)
            warnings.warn("weight_cache: the caches' refresh did not write its buffers in place under CUDA "
                          "graph capture; they refresh eagerly after each optimizer step", stacklevel=3)
            return
        self.graph, self.target = graph, target


_refreshers: weakref.WeakKeyDictionary[nn.Module, GraphedRefresh] = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def _retrace_if_fixed_changes(layers: list[QuantLinear]) -> Iterator[None]:
    """Reset torch.compile's caches when, in the block, a layer was fixed or starts recalibrating.

    A layer that is not fixed is a graph break in a compiled model, and the code Dynamo compiled
    around it keeps calling it eagerly after it is fixed (no guard of the surrounding graphs reads
    the layer's phase). The reset makes the next call retrace the model as one graph with the
    fixed layers inlined: one recompile of what this process compiled, once per (re)fix.
    """
    before = [layer.phase == "fixed" for layer in layers]
    try:
        yield
    finally:  # a fix that failed half-way has still changed some layers
        if any((layer.phase == "fixed") != was for layer, was in zip(layers, before)):
            torch.compiler.reset()


def calibrating(model: nn.Module) -> bool:
    """Whether a QuantLinear of ``model`` is not fixed (calibrating or recalibrating): it observes
    its operands eagerly then, a graph break in a compiled model."""
    return any(layer.phase != "fixed" for _, layer in quant_layers(model))


def eager_while_calibrating(model: nn.Module) -> contextlib.AbstractContextManager:
    """A context in which ``torch.compile``-d code runs eagerly while a layer of ``model``
    calibrates (``torch.compiler.set_stance("force_eager")``), and as compiled otherwise.

    A compiled model with calibrating layers compiles the fragments between those graph breaks,
    and the fix discards them (:func:`_retrace_if_fixed_changes`): compile work that no fixed step
    uses. In this context the calibrating steps compile nothing, and the first fixed step compiles
    the model once. Wrap each step's forward and backward (the trainer does); a recalibration
    window runs eagerly too, and the graphs compiled before it serve again after it.
    """
    return _force_eager() if calibrating(model) else contextlib.nullcontext()


@contextlib.contextmanager
def _force_eager() -> Iterator[None]:
    # Not set_stance(...) itself as the returned context: constructing it already switches the
    # stance, so a context made but never entered would leave the process eager.
    with torch.compiler.set_stance("force_eager"):
        yield


def advance_draws(model: nn.Module) -> None:
    """Give the next forward fresh draws without a step: call between the micro-batches of a step
    (gradient accumulation), or they round alike. Done by :func:`on_optimizer_step` after a step."""
    for _, layer in quant_layers(model):
        layer.advance_draws()
        layer.refresh_weight_cache()  # a no-op unless the weight changed


def refresh_weights(model: nn.Module, dtype: torch.dtype | None = None, force: bool = False) -> int:
    """Fill or refresh the weight cache of every QuantLinear whose recipe has ``weight_cache`` (and
    is fixed) from its current weight; the number of layers re-quantized.

    Unchanged layers are skipped unless ``force``: a change is seen through the weight's version
    counter, which fused optimizers do not advance. ``dtype``: the dtype the forward computes in
    (``torch.bfloat16`` under bf16 autocast), by default each layer's last eager one. Call it once
    before the first compiled forward, and after changing weights in place outside an optimizer step
    (with ``force`` if a fused kernel changed them); the optimizer hook of :func:`convert` and
    :func:`on_optimizer_step` refresh every cache themselves.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    return sum(layer.refresh_weight_cache(dtype, force) for _, layer in quant_layers(model))


def on_optimizer_step(model: nn.Module) -> None:
    """Call after every optimizer step (unless ``convert`` got the optimizer): advances the
    calibration schedule of every QuantLinear (resetting torch.compile's caches on the step that
    fixes strategies: see :func:`convert`)."""
    _step(model)


def export_strategies(model: nn.Module) -> dict[str, dict[str, Any]]:
    """``{module name: layer.export()}`` for every QuantLinear: labels, pairs, strategies (JSON-ready)."""
    return {name: layer.export() for name, layer in quant_layers(model)}


def fix_strategies(model: nn.Module, strategies: Mapping[str, Mapping[str, Strategy | str]]) -> nn.Module:
    """Fix every policy QuantLinear of ``model`` to a strategy map ``{module name: {slot: strategy}}``
    (the ``strategies`` of :func:`export_strategies`, or the records of ``experiments/strategies.py``
    grouped by layer). The map must name exactly the model's policy layers: a missing or unknown
    name is an error, not a layer left calibrating. Returns ``model``."""
    layers = {name: layer for name, layer in quant_layers(model) if layer.recipe.policy is not None}
    if not layers:
        raise ValueError("fix_strategies: the model has no QuantLinear of a policy recipe (convert it with adahop, ...)")
    missing, unknown = sorted(set(layers) - set(strategies)), sorted(set(strategies) - set(layers))
    if missing or unknown:
        raise ValueError(f"fix_strategies: the map does not match the model's policy layers: "
                         f"missing {missing[:5]}{' ...' if len(missing) > 5 else ''} ({len(missing)}), "
                         f"unknown {unknown[:5]}{' ...' if len(unknown) > 5 else ''} ({len(unknown)})")
    for name, layer in layers.items():  # every entry checked before any layer changes
        layer.checked_map(strategies[name])
    with _retrace_if_fixed_changes(list(layers.values())):
        for name, layer in layers.items():
            layer.fix(strategies[name])
    return model


def strategy_fixes(model: nn.Module) -> list[dict[str, Any]]:
    """Per step at which calibrating layers fixed (or re-fixed) their strategies: how many GEMMs run
    each strategy from then on (``counts``, slot → strategy → n) and how many changed since the
    previous fix (``changed``; 0 at the first). Empty for a model without policy layers."""
    by_step: dict[int, dict[str, dict[str, str]]] = defaultdict(dict)
    for name, layer in quant_layers(model):
        for fix in layer.fixed_at:
            by_step[fix["step"]][name] = fix["strategies"]
    out, current = [], {}
    for step in sorted(by_step):
        fixed = by_step[step]
        changed = sum(current[n][slot] != s for n, strategies in fixed.items() if n in current
                      for slot, s in strategies.items())
        current.update(fixed)
        counts = {slot: dict(Counter(s[slot] for s in current.values())) for slot in SLOTS}
        out.append({"step": step, "layers": len(fixed), "counts": counts, "changed": changed})
    return out
