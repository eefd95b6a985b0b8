"""``QuantLinear``: ``nn.Linear`` whose fwd, dgrad and wgrad GEMMs run under a recipe.

Phases. A recipe with fixed strategies runs them from the first step. A policy recipe
(``adahop``, ``hot``, ...) first *calibrates*: for ``calibration_steps`` optimizer steps it runs
``calibration_strategy`` (plain MXFP4), or every GEMM in BF16 under ``calibration_precision="bf16"``,
while it labels X, W and grad_output (and, for ``lqs``, measures HOT's dgrad quantizers on
grad_output), then fixes its strategies from the votes (:func:`adahop.policy.decide`; summed over ranks when distributed).
Calibration runs eagerly (its observations are host-side votes; under ``torch.compile`` the
calibrating forward is excluded from the graph); once fixed, the forward is traced: the strategies
are static attributes, so fixing them costs one recompile, and later steps none.

Shapes: ``in_features`` and ``out_features`` must be multiples of ``max(32, hadamard_size)``
(the constructor raises ValueError; :func:`adahop.convert` keeps such layers as ``nn.Linear``
and warns). Inputs ``(..., in)`` are flattened to tokens; a token count that is not a multiple
of it is zero-padded inside the layer (zero rows change neither the output rows nor dW).

Autocast: under ``torch.autocast`` the layer casts X, W and bias to the autocast dtype (as
``F.linear`` would) and runs with autocast off; outside it, X and W must share a dtype.

Draws: every SR draw and random-sign vector has its own seed from (run seed, layer or input group,
GEMM, operand) and the draw counter, an int64 device tensor advanced after every optimizer step
(and between micro-batches by :func:`adahop.linear.advance_draws`), outside any compiled graph
(:mod:`adahop.linear.seeds`), so runs are reproducible and no two steps share a seed.

Weight cache (``recipe.weight_cache``): a fixed layer quantizes W once per optimizer step into
buffers (:meth:`QuantLinear.refresh_weight_cache`) that every forward of the step reads. The
optimizer step refreshes them (the optimizer hook of :func:`adahop.convert`, or
:func:`adahop.on_optimizer_step`), as does loading a state dict. Eagerly the layer also refreshes
them whenever the weight's version counter or the compute dtype changed. A compiled graph cannot
read a version counter, and fused optimizers do not advance it: a weight changed in place outside an
optimizer step must be followed by :func:`adahop.refresh_weights` before the next compiled forward.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from adahop import hot
from adahop.backend import resolve_backend
from adahop.formats import FP8_GROUP
from adahop.linear.function import CACHE_FIELDS, LayerPlan, QuantLinearFunction, SlotPlan, _q_fields, weight_operands
from adahop.linear.gemm import GemmConfig, Operand, score_strategies, slot_specs
from adahop.linear.seeds import DrawState, derive_seed, draw_seed
from adahop.policy import (
    SLOTS,
    Calibration,
    Strategy,
    check_slot,
    decide,
    effective_strategy,
    parse_strategy,
    pattern_pairs,
    strategies_from_dict,
    strategies_to_dict,
)
from adahop.recipes import Recipe, get_recipe, recipe_from_dict

EXTRA_STATE_VERSION = 2
_INPUT_GROUP = 1 << 40  # keeps input-group salts apart from layer salts
_LQS_DRAWS = 0x105  # salts the draws of HOT's quantizer selection apart from the GEMMs' draws
# Buffers of the weight cache: W's then Wᵀ's CACHE_FIELDS.
_CACHE_BUFFERS = tuple(f"w_cache_{side}_{f}" for side in ("in", "out") for f in CACHE_FIELDS)


def _gemm_config(device: torch.device, backend: str) -> GemmConfig:
    return GemmConfig.for_device(device, backend, blockwise=device.type == "cuda" and _blockwise_fp8())


def _blockwise_fp8() -> bool:
    """Whether the FP8 layers use blockwise-scaled GEMMs (``ADAHOP_FP8_SCALING=rowwise`` turns them off)."""
    return os.environ.get("ADAHOP_FP8_SCALING", "blockwise") == "blockwise"


class _Observer:
    """What a calibrating call hands its backward: the layer, and the tokens kept for measuring."""

    def __init__(self, layer: "QuantLinear", sample_idx: torch.Tensor | None) -> None:
        self.layer, self.sample_idx = layer, sample_idx
        self.tokens = 0

    def observe_backward(self, g, w_full, x_sample, counter) -> None:
        self.layer._observe_backward(g[: self.tokens], g, w_full, self.sample_idx, x_sample, counter)


class QuantLinear(nn.Linear):
    """``nn.Linear`` whose fwd, dgrad and wgrad GEMMs run under a recipe (see the module docstring).

    in_features, out_features: multiples of ``max(32, recipe.hadamard_size)``.
    recipe: a registry name or :class:`~adahop.recipes.Recipe`; ``overrides`` replace its fields.
    layer_id: index of this layer in its model (part of every seed; :func:`adahop.convert` assigns
    it, and the ``input_group`` siblings share).

    State (kept in ``state_dict`` through ``get_extra_state``): optimizer ``step``, ``phase``
    (``calibrating``, ``recalibrating`` or ``fixed``), the :class:`~adahop.policy.Calibration`
    votes/errors, the fixed strategies and the draw counter. Call :meth:`on_optimizer_step` after
    every optimizer step (:func:`adahop.convert` with ``optimizer=`` does it for you).
    Equivalent to ``nn.Linear`` up to the recipe's quantization error.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        recipe: str | Recipe = "adahop",
        layer_id: int = 0,
        device: Any = None,
        dtype: torch.dtype | None = None,
        **overrides: Any,
    ) -> None:
        for name, value in (("in_features", in_features), ("out_features", out_features), ("layer_id", layer_id)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
        recipe = get_recipe(recipe, **overrides)
        if not recipe.swaps_linear:
            raise ValueError(f"recipe {recipe.name!r} runs every GEMM in BF16: use nn.Linear")
        m = recipe.dim_multiple
        if in_features % m or out_features % m:
            raise ValueError(
                f"QuantLinear({in_features}, {out_features}): in and out features must be multiples of {m} "
                f"(MX blocks of 32 and Hadamard blocks of {recipe.hadamard_size}); keep this layer as nn.Linear"
            )
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.recipe = recipe
        self.layer_id = layer_id
        self.input_group = layer_id
        self.step = 0
        self.calibration = Calibration()  # the votes (and errors) behind the current strategies
        self.recalibration: Calibration | None = None  # those being gathered while recalibrating
        self.fixed_at: list[dict[str, Any]] = []  # every (re)fix: step and strategies
        self.nonfinite_observations = 0
        if recipe.policy is None:
            self.phase, self.strategies = "fixed", dict(recipe.fixed_strategies)
        else:
            self.phase, self.strategies = "calibrating", None
        self.draw_state = DrawState(None if device == "meta" else device)
        self.bumps_draws = True  # this layer advances the draw counter (convert: the model's first layer only)
        self._plans: dict[tuple, LayerPlan] = {}
        self.register_load_state_dict_pre_hook(_warn_if_state_missing)
        for name in _CACHE_BUFFERS:
            self.register_buffer(name, None, persistent=False)
        # The weight cache's key (eager checks only: never read under torch.compile, whose guards
        # would fail at every step on the version it holds), whether it is filled, and its dtype.
        self._w_cache_key: tuple | None = None
        self._w_cache_ready = False
        self._w_cache_dtype: torch.dtype | None = None
        self._compute_dtype: torch.dtype | None = None  # of the last eager forward
        self.register_load_state_dict_post_hook(_refresh_after_load)

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe: str | Recipe, layer_id: int = 0, **overrides: Any) -> "QuantLinear":
        """A QuantLinear sharing ``linear``'s weight and bias parameters (no copy)."""
        new = cls(linear.in_features, linear.out_features, linear.bias is not None,
                  recipe=recipe, layer_id=layer_id, device="meta", **overrides)
        new.weight = linear.weight
        new.bias = linear.bias
        new.draw_state = DrawState(linear.weight.device)
        new.train(linear.training)
        return new

    def share_draws(self, state: DrawState, bumps: bool) -> None:
        """Read the draw counter of ``state`` (a model's), and advance it in forward when ``bumps``."""
        self.draw_state, self.bumps_draws = state, bumps

    # -- what runs now

    @property
    def active_strategies(self) -> dict[str, Strategy]:
        if self.phase == "calibrating":
            if self.recipe.calibration_precision == "bf16":
                return {slot: Strategy.BF16 for slot in SLOTS}
            return {slot: effective_strategy(slot, self.recipe.calibration_strategy) for slot in SLOTS}
        return self.strategies

    @property
    def layer_salt(self) -> int:
        return derive_seed(self.recipe.seed, self.layer_id)

    @property
    def input_salt(self) -> int:
        return derive_seed(self.recipe.seed, _INPUT_GROUP + self.input_group)

    def build_plan(self, tokens: int, dtype: torch.dtype, device: torch.device, need_backward: bool) -> LayerPlan:
        """The :class:`LayerPlan` of a call with ``tokens`` (padded) rows of ``dtype`` on ``device``."""
        strategies = self.active_strategies
        gemm = _gemm_config(device, resolve_backend(device).value)
        if any(s.hot for s in strategies.values()) and not torch.compiler.is_compiling():
            hot.hot_gemm_path(device, gemm.backend)  # logs HOT's GEMM paths once per device
        shapes = {"fwd": (tokens, self.out_features, self.in_features),
                  "dgrad": (tokens, self.in_features, self.out_features),
                  "wgrad": (self.out_features, self.in_features, tokens)}
        # BF16 calibration is BF16 throughout: wgrad reads X as it came, not an MXFP4 copy.
        exact = self.phase == "calibrating" and self.recipe.calibration_precision == "bf16"
        slots = {}
        for slot in SLOTS:
            s = strategies[slot]
            a, b = (None, None) if exact else slot_specs(self.recipe, slot, s, self.layer_salt, self.input_salt)
            m, n, k = shapes[slot]
            la, lb = gemm.layouts(m, n, k, dtype) if s.mxfp4 else (None, None)
            slots[slot] = SlotPlan(s, a, b, la, lb)
        return LayerPlan(slots["fwd"], slots["dgrad"], slots["wgrad"], self.recipe.outlier_k, need_backward, gemm,
                         self.recipe.weight_for_backward == "param", self.caches_weight)

    def _plan(self, tokens: int, dtype: torch.dtype, device: torch.device, need_backward: bool) -> LayerPlan:
        if torch.compiler.is_compiling():
            return self.build_plan(tokens, dtype, device, need_backward)
        key = (tokens, dtype, device, need_backward, torch.is_autocast_enabled(device.type), self.phase)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self.build_plan(tokens, dtype, device, need_backward)
        return plan

    @property
    def phase(self) -> str:
        """``"calibrating"``, ``"fixed"`` or ``"recalibrating"``."""
        return self._phase

    @phase.setter
    def phase(self, value: str) -> None:
        self._phase = value
        # A layer that is not fixed runs eagerly: its instance's forward is the compiler-disabled
        # one, which a compiled model calls as an opaque function (a graph break at the call). Were
        # the branch inside forward, Dynamo would compile forward as a frame of its own, once per
        # layer and shape, and past the recompile limit leave every layer eager after the fix too.
        # Fixing removes the instance attribute, so the caller's guard on it fails and it retraces
        # with the layer inlined.
        if value == "fixed":
            self.__dict__.pop("forward", None)
        else:
            self.__dict__["forward"] = self._eager_forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._forward(x)

    @torch.compiler.disable
    def _eager_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"QuantLinear takes a torch.Tensor, got {type(x).__name__}")
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"input of shape {tuple(x.shape)} does not end in in_features={self.in_features}")
        w, b = self.weight, self.bias
        device_type = x.device.type
        if torch.is_autocast_enabled(device_type):
            dt = torch.get_autocast_dtype(device_type)
            x, w = x.to(dt), w.to(dt)
            b = b.to(dt) if b is not None else None
        elif x.dtype != w.dtype:
            raise ValueError(f"input dtype {x.dtype} differs from weight dtype {w.dtype}; cast one or use torch.autocast")
        if self.recipe.weight_cache and not torch.compiler.is_compiling():
            self._compute_dtype = x.dtype  # what a refresh after this layer's fix quantizes W from
        lead = x.shape[:-1]
        x2d = x.reshape(-1, self.in_features).contiguous()
        tokens = x2d.shape[0]
        need_backward = torch.is_grad_enabled() and (x2d.requires_grad or w.requires_grad)
        pad = (-tokens) % self.recipe.dim_multiple
        xp = F.pad(x2d, (0, 0, 0, pad)) if pad else x2d
        if self.phase != "fixed" and self.training and need_backward:
            y = self._calibrating_forward(x2d, xp, w)
        else:
            plan = self._plan(xp.shape[0], xp.dtype, xp.device, need_backward)
            cache = self._weight_cache(xp.dtype) if plan.weight_cached else ()
            with torch.autocast(device_type, enabled=False):
                y = QuantLinearFunction.apply(xp, w, self._w_param(plan), self.draw_state.value, plan, None, *cache)
        # Slice only when padded: a no-op slice still costs a zero-filled gradient and a copy in backward.
        y = y[:tokens] if pad else y
        # The bias outside the Function: autograd adds it and sums its gradient (see QuantLinearFunction).
        return (y if b is None else y + b).reshape(*lead, self.out_features)

    # -- the weight cache (recipe.weight_cache)

    def _weight_cache(self, dtype: torch.dtype) -> tuple[torch.Tensor | None, ...]:
        if torch.compiler.is_compiling():
            if not self._w_cache_ready or self._w_cache_dtype != dtype:
                have = "is empty" if not self._w_cache_ready else f"holds W quantized from {self._w_cache_dtype}"
                raise RuntimeError(
                    f"QuantLinear({self.in_features}→{self.out_features}): its weight cache {have}, and a compiled "
                    f"forward in {dtype} cannot refresh it; call adahop.refresh_weights(model, dtype={dtype}) before "
                    f"the first compiled forward (and after changing weights outside an optimizer step)")
        else:
            self.refresh_weight_cache(dtype)
        return tuple(self._buffers[name] for name in _CACHE_BUFFERS)

    def _weight_cache_plan(self, dtype: torch.dtype) -> LayerPlan:
        # W's operands depend on neither the token count nor the autocast state: any cached plan serves.
        return self._plan(FP8_GROUP, dtype, self.weight.device, True)

    def _weight_cache_key(self, dtype: torch.dtype, plan: LayerPlan) -> tuple:
        w = self.weight
        return (w._version, w.data_ptr(), w.device, dtype, plan.fwd, plan.dgrad, plan.gemm)

    @property
    def caches_weight(self) -> bool:
        """Whether the layer keeps a weight cache now (its recipe's ``weight_cache``, once fixed)."""
        return self.recipe.weight_cache and self.phase == "fixed"

    def _cache_dtype(self, dtype: torch.dtype | None) -> torch.dtype:
        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype or None, got {type(dtype).__name__} {dtype!r}")
        return dtype or self._compute_dtype or self._w_cache_dtype or self.weight.dtype

    def _refresh_target(self) -> tuple:
        """What a refresh of the cache (of the default dtype) reads and writes, by address, and how:
        the cache's key without the weight's version, and the buffers. A CUDA graph that captured
        the refresh (:class:`adahop.linear.convert.GraphedRefresh`) replays it only while this holds."""
        dtype = self._cache_dtype(None)
        buffers = tuple(None if (b := self._buffers[n]) is None else (b.data_ptr(), b.shape, b.stride(), b.dtype)
                        for n in _CACHE_BUFFERS)
        return (*self._weight_cache_key(dtype, self._weight_cache_plan(dtype))[1:], self.weight.dtype,
                self.weight.shape, self._w_cache_ready, self._w_cache_dtype, buffers)

    def _mark_refreshed(self) -> None:
        """Record that the cache holds the current weight: a replayed refresh wrote it, with the
        :meth:`_refresh_target` of the refresh that filled the cache, so only the version changed."""
        self._w_cache_key = (self.weight._version, *self._w_cache_key[1:])

    @torch.no_grad()
    def refresh_weight_cache(self, dtype: torch.dtype | None = None, force: bool = False) -> bool:
        """Quantize W into the weight cache if it may have changed since the cache was filled (or
        with ``force``); whether it did.

        ``dtype``: the compute dtype the forward casts W to (autocast's), by default the one of the
        last eager forward, else the cache's, else the weight's. Does nothing unless the recipe has
        ``weight_cache`` and the layer is fixed. Buffers of unchanged shapes are overwritten in place,
        so compiled graphs and CUDA graphs that read them see the new values. Without ``force``, a
        change is seen through the weight's version counter, which in-place PyTorch ops advance and
        fused optimizers (``torch.optim.AdamW(fused=True)``) do not: the optimizer step forces it.
        """
        if not self.caches_weight:
            return False
        dtype = self._cache_dtype(dtype)
        if _is_dtensor(self.weight):
            raise NotImplementedError("weight_cache needs the whole weight on each rank; under FSDP2 (sharded DTensor "
                                      "weights) use a recipe without weight_cache")
        plan = self._weight_cache_plan(dtype)
        key = self._weight_cache_key(dtype, plan)
        if key == self._w_cache_key and not force:
            return False
        w = self.weight.detach().to(dtype)
        wq, wq_t = weight_operands(w, plan, self.draw_state.value)
        for name, t in zip(_CACHE_BUFFERS, _q_fields(wq) + _q_fields(wq_t)):
            old = self._buffers[name]
            # An inference tensor (filled under torch.inference_mode) takes no in-place write outside it.
            writable = old is not None and (torch.is_inference_mode_enabled() or not old.is_inference())
            if (t is not None and writable and (old.shape, old.stride(), old.dtype, old.device)
                    == (t.shape, t.stride(), t.dtype, t.device)):
                old.copy_(t)
            else:
                self._buffers[name] = t
        self._w_cache_key, self._w_cache_ready, self._w_cache_dtype = key, True, dtype
        return True

    def _apply(self, fn, recurse: bool = True):
        dtypes = [None if self._buffers[n] is None else self._buffers[n].dtype for n in _CACHE_BUFFERS]
        out = super()._apply(fn, recurse)
        # Module.to(dtype) casts floating buffers, FP8 operands and their scales among them: such a
        # cache is dropped (an eager forward fills it again; a compiled one asks for refresh_weights).
        # A move to another device keeps it valid.
        if [None if self._buffers[n] is None else self._buffers[n].dtype for n in _CACHE_BUFFERS] != dtypes:
            for name in _CACHE_BUFFERS:
                self._buffers[name] = None
            self._w_cache_key, self._w_cache_ready = None, False
        return out

    def _w_param(self, plan: LayerPlan) -> torch.Tensor | None:
        # Passed only where the backward re-reads it: the Function takes no tensor twice (Dynamo).
        return self.weight if plan.weight_from_param else None

    # -- calibration

    def _calibrating_forward(self, x2d: torch.Tensor, xp: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        plan = self._plan(xp.shape[0], xp.dtype, xp.device, True)
        counter = self.draw_state.value
        sample_idx = None
        if self.recipe.policy == "measured":
            n = min(self.recipe.measure_tokens, xp.shape[0])
            gen = torch.Generator().manual_seed(derive_seed(self.layer_salt, int(counter.item()), 0xCA11))
            sample_idx = torch.randperm(xp.shape[0], generator=gen)[:n].sort().values.to(xp.device)
        observer = _Observer(self, sample_idx)
        observer.tokens = x2d.shape[0]
        self._observe_forward(x2d, w, xp, sample_idx, counter)
        with torch.autocast(xp.device.type, enabled=False):
            return QuantLinearFunction.apply(xp, w, self._w_param(plan), counter, plan, observer)

    @property
    def _collecting(self) -> Calibration:
        """The calibration this step's observations go to."""
        return self.recalibration if self.phase == "recalibrating" else self.calibration

    def _finite(self, *tensors: torch.Tensor) -> bool:
        # A non-finite operand gets no vote: the step's loss or gradient norm is non-finite too,
        # and the trainer stops on that, as it does after calibration.
        if all(bool(torch.isfinite(t).all()) for t in tensors):
            return True
        self.nonfinite_observations += 1
        return False

    def _observe_forward(self, x, w, xp, sample_idx, counter) -> None:
        detect = self.recipe.detector
        with torch.no_grad():
            if not self._finite(x, w):
                return
            # Siblings (one input group) see the same X in one forward: detect its pattern once.
            labels = self.draw_state.labels
            key = (self.input_group, int(counter.item()))
            if key not in labels:
                labels.clear()
                labels[key] = detect(x)
            self._collecting.vote("x", labels[key])
            self._collecting.vote("w", detect(w))
            if sample_idx is not None:
                self._collecting.add_errors(
                    "fwd", score_strategies(self.recipe, "fwd", Operand(xp), Operand(w), self.layer_salt, counter))

    def _observe_backward(self, g_tokens, g, w_full, sample_idx, x_sample, counter) -> None:
        with torch.no_grad():
            if not self._finite(g):
                return
            self._collecting.vote("g", self.recipe.detector(g_tokens))
            if self.recipe.policy == "lqs":
                seed = draw_seed(counter, derive_seed(self.layer_salt, _LQS_DRAWS))
                self._collecting.add_errors("dgrad", hot.selection_errors(g_tokens, seed))
            if sample_idx is not None:
                self._collecting.add_errors(
                    "dgrad", score_strategies(self.recipe, "dgrad", Operand(g), Operand(w_full, transpose=True),
                                              self.layer_salt, counter))
                self._collecting.add_errors(
                    "wgrad", score_strategies(self.recipe, "wgrad", Operand(g[sample_idx], transpose=True),
                                              Operand(x_sample, transpose=True), self.layer_salt, counter))

    def advance_draws(self) -> None:
        """Move the draw counter on (if this layer owns the advance): the next forward draws anew."""
        if self.bumps_draws:
            with torch.no_grad():
                self.draw_state.value.add_(1)

    def on_optimizer_step(self) -> None:
        """Advance the step counter and the draws; end calibration after ``calibration_steps`` steps;
        with ``recalibration_interval`` I, observe again from each step C + k·I (k ≥ 1) for C steps."""
        self.step += 1
        self.advance_draws()
        c, interval = self.recipe.calibration_steps, self.recipe.recalibration_interval
        since = self.step - c
        if self.phase == "calibrating" and self.step >= c:
            self.finish_calibration()
        elif self.phase == "fixed" and interval and since > 0 and since % interval == 0:
            self.phase, self.recalibration = "recalibrating", Calibration()
        elif self.phase == "recalibrating" and since % interval >= c:
            self.calibration, self.recalibration = self.recalibration, None
            self.finish_calibration()

    def finish_calibration(self) -> None:
        """Fix the strategies from the votes/errors gathered so far (summed over DDP ranks)."""
        self.calibration.all_reduce()
        if not any(self.calibration.votes["g"].values()):
            warnings.warn(f"layer {self.layer_id}: no backward ran during calibration, so grad_output has no "
                          "votes and is labelled 'none'", stacklevel=2)
        self.strategies = decide(self.recipe.policy, self.calibration, self.recipe.table,
                                 f"layer {self.layer_id}", self.recipe.measured_margin)
        self.phase = "fixed"
        self._plans.clear()  # plans hold the strategies
        self.fixed_at.append({"step": self.step, "strategies": strategies_to_dict(self.strategies)})

    def checked_map(self, strategies: Mapping[str, Strategy | str]) -> dict[str, Strategy]:
        """``strategies`` (slot → strategy) parsed, or a ValueError saying why this layer cannot take it."""
        if self.recipe.policy is None:
            raise ValueError(f"layer {self.layer_id}: recipe {self.recipe.name!r} has fixed strategies; "
                             "only a policy recipe (adahop, ...) takes a strategy map")
        if not isinstance(strategies, Mapping) or set(strategies) != set(SLOTS):
            got = sorted(strategies) if isinstance(strategies, Mapping) else type(strategies).__name__
            raise ValueError(f"layer {self.layer_id}: a strategy map names the slots {list(SLOTS)}, got {got}")
        parsed = {slot: parse_strategy(strategies[slot]) for slot in SLOTS}
        for slot, strategy in parsed.items():
            check_slot(slot, strategy, f"layer {self.layer_id}")
            if effective_strategy(slot, strategy) is not strategy:
                raise ValueError(f"layer {self.layer_id}: {slot} cannot run {strategy.value!r} (X is saved only in "
                                 f"MXFP4, so no BF16 rows of it are left for the backward); use "
                                 f"{effective_strategy(slot, strategy).value!r}, as the policy does")
        return parsed

    def fix(self, strategies: Mapping[str, Strategy | str]) -> None:
        """Fix this layer's strategies to ``strategies`` (slot → strategy), ending or skipping its
        calibration: e.g. to reuse the map a calibrated run fixed (``export_strategies``) for a run,
        a measurement or a fine-tune. Only for policy recipes (a fixed recipe's strategies are the
        recipe); a recalibrating recipe still recalibrates on its schedule."""
        self.strategies = self.checked_map(strategies)
        self.phase, self.recalibration = "fixed", None
        self._plans.clear()
        self.fixed_at.append({"step": self.step, "strategies": strategies_to_dict(self.strategies), "from": "map"})

    # -- state

    def export(self) -> dict[str, Any]:
        """The layer's labels, pattern pairs and strategies as JSON-ready data."""
        out: dict[str, Any] = {
            "recipe": self.recipe.name,
            "layer_id": self.layer_id,
            "phase": self.phase,
            "step": self.step,
            "shape": [self.out_features, self.in_features],
            "strategies": strategies_to_dict(self.strategies) if self.strategies else None,
        }
        if self.recipe.policy is not None:
            labels = self.calibration.labels()
            # Labels and pairs are the calibration's: none while it runs, none for a map fixed from outside.
            labelled = self.phase != "calibrating" and not (self.fixed_at and self.fixed_at[-1].get("from") == "map")
            out.update(
                policy=self.recipe.policy,
                calibration_steps=self.recipe.calibration_steps,
                labels=labels if labelled else None,
                votes=self.calibration.to_dict()["votes"],
                pairs={s: "-".join(p) for s, p in pattern_pairs(labels).items()} if labelled else None,
                relative_errors=self.calibration.relative_errors() or None,
            )
            if self.recipe.recalibration_interval:
                out["fixed_at"] = list(self.fixed_at)
        return out

    def get_extra_state(self) -> dict[str, Any]:
        return {
            "version": EXTRA_STATE_VERSION,
            "recipe": self.recipe.to_dict(),
            "layer_id": self.layer_id,
            "input_group": self.input_group,
            "step": self.step,
            "draws": int(self.draw_state.value.item()),
            "phase": self.phase,
            "strategies": strategies_to_dict(self.strategies) if self.strategies else None,
            "calibration": self.calibration.to_dict(),
            "recalibration": self.recalibration.to_dict() if self.recalibration is not None else None,
            "fixed_at": list(self.fixed_at),
        }

    def set_extra_state(self, state: Any) -> None:
        if not isinstance(state, dict) or state.get("version") != EXTRA_STATE_VERSION:
            raise ValueError(f"QuantLinear state has an unknown format (expected version {EXTRA_STATE_VERSION})")
        saved = recipe_from_dict(state["recipe"]).to_dict()
        mine = self.recipe.to_dict()
        # weight_cache changes where W is quantized, not what the layer computes: either way loads.
        diff = sorted(key for key in mine if mine[key] != saved.get(key) and key != "weight_cache")
        if diff:
            raise ValueError(
                f"checkpoint layer was trained with recipe {saved['name']!r} differing in {diff} from this "
                f"layer's {mine['name']!r}; convert the model with the same recipe and overrides"
            )
        if state["phase"] not in ("calibrating", "fixed", "recalibrating"):
            raise ValueError(f"unknown phase {state['phase']!r} in QuantLinear state")
        self.layer_id, self.step, self.phase = int(state["layer_id"]), int(state["step"]), state["phase"]
        self.input_group = int(state["input_group"])
        self.draw_state.value.fill_(int(state["draws"]))
        self.strategies = strategies_from_dict(state["strategies"]) if state["strategies"] else None
        self.calibration = Calibration.from_dict(state["calibration"])
        recal = state["recalibration"]
        self.recalibration = Calibration.from_dict(recal) if recal is not None else None
        self.fixed_at = list(state["fixed_at"])
        self._plans.clear()

    def extra_repr(self) -> str:
        strat = strategies_to_dict(self.strategies) if self.strategies else "calibrating"
        return f"{super().extra_repr()}, recipe={self.recipe.name}, strategies={strat}"


def _is_dtensor(t: torch.Tensor) -> bool:
    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def _refresh_after_load(module: "QuantLinear", incompatible_keys: Any) -> None:
    # A loaded weight (copied in place) or strategies: the cache refreshes now if it was in use.
    if module._w_cache_ready:
        module.refresh_weight_cache(force=True)


def _warn_if_state_missing(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
    # A checkpoint without this layer's state would restart calibration: never silently.
    if prefix + "weight" in state_dict and prefix + "_extra_state" not in state_dict:
        warnings.warn(
            f"{prefix or 'layer'}: loaded weights without their AdaHOP state (_extra_state); the layer keeps "
            f"its current phase {module.phase!r} at step {module.step} and will calibrate again if not fixed",
            stacklevel=2,
        )
