"""Copies of the GEMM operands of every linear layer, taken by hooks that leave the run unchanged.

:class:`OperandCapture` hooks every ``nn.Linear`` of a model (:class:`adahop.linear.QuantLinear`
is one) and, while *armed* for a capture point, keeps for each layer, from its first call at that
point:

* ``x``: the layer input as the GEMM sees it, ``(T, in)`` (cast to the autocast dtype when
  autocast is on), ``T`` up to ``max_tokens`` rows of the flattened tokens;
* ``w``: the weight, ``(out, in)``, as it is in that forward (before the step's update);
* ``g``: grad_output, ``(T, out)``, the gradient arriving at the layer output, **the same token
  rows as** ``x`` (so ``wgrad`` = gᵀ·x over the kept tokens is a real, shorter, weight gradient).

Why the run cannot change: the forward hook returns ``None`` (output untouched) and reads its
input through ``detach()``; the gradient hook on the output tensor returns ``None`` (gradient
untouched); the token subsample draws from its own ``torch.Generator`` (the global RNG streams
that dropout, sampling and stochastic rounding use are never advanced); nothing is written into a
module. ``tests/test_study.py`` checks per-step losses bit for bit with and without capture.

Token subsample: ``T = min(max_tokens, tokens)`` rounded down to a multiple of 32 (the MXFP4
block: ``wgrad`` quantizes along tokens), rows drawn without replacement and kept in order. A
layer called with fewer than 32 tokens is not captured (a warning names it).

Equivalent to storing ``(x[idx], w, grad_output[idx])`` of ``nn.Linear.forward``/``backward``
for a fixed random ``idx``.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch import nn

from adahop.linear import derive_seed

MX_BLOCK = 32


@dataclass
class Captured:
    """Operands of one linear layer at one capture point (see the module docstring).

    x: ``(T, in)``; w: ``(out, in)``; g: ``(T, out)`` or ``None`` until the backward ran (or if no
    gradient reached the layer). tokens: rows the layer saw before the subsample.
    """

    x: torch.Tensor
    w: torch.Tensor
    g: torch.Tensor | None
    tokens: int

    @property
    def complete(self) -> bool:
        return self.g is not None


def block_and_kind(name: str) -> tuple[int | None, str]:
    """Block index and the layer's name inside its block.

    ``model.layers.3.self_attn.q_proj`` → ``(3, "self_attn.q_proj")``;
    ``encoder.layer.0.attention.self.query`` → ``(0, "attention.self.query")``; a name without a
    numbered component → ``(None, name)``.
    """
    m = re.search(r"(?:^|\.)(\d+)\.(.+)$", name)
    return (int(m.group(1)), m.group(2)) if m else (None, name)


class OperandCapture:
    """Hooks on every ``nn.Linear`` of ``model`` (except ``skip``) that copy X, W and grad_output.

    Use as a context manager (hooks removed on exit); inside, ``with cap.armed(point):`` around
    one forward + backward captures that point. ``captures[point][layer_name]`` is a
    :class:`Captured`. ``skip``: module names (full, or their last component) to leave alone.
    ``max_tokens``: rows kept per layer (a multiple of 32). ``seed``: the subsample's seed (mixed
    with the point and the layer's index). ``store_device``: where copies go (default: where the
    tensors are; ``"cpu"`` frees accelerator memory).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        max_tokens: int = 1024,
        skip: tuple[str, ...] = ("lm_head",),
        seed: int = 0,
        store_device: torch.device | str | None = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"OperandCapture takes an nn.Module, got {type(model).__name__}")
        if max_tokens < MX_BLOCK or max_tokens % MX_BLOCK:
            raise ValueError(f"max_tokens must be a positive multiple of {MX_BLOCK}, got {max_tokens}")
        self.model, self.max_tokens, self.seed = model, max_tokens, seed
        self.store_device = torch.device(store_device) if store_device is not None else None
        self.layers: dict[str, nn.Linear] = {}
        for name, mod in model.named_modules():
            if isinstance(mod, nn.Linear) and not any(name == s or name.endswith("." + s) for s in skip):
                self.layers.setdefault(name, mod)
        if not self.layers:
            raise ValueError("the model has no nn.Linear layers to capture (after skip)")
        self.captures: dict[int, dict[str, Captured]] = {}
        self._point: int | None = None
        self._handles: list[Any] = []

    # -- hooks

    def __enter__(self) -> "OperandCapture":
        for index, (name, mod) in enumerate(self.layers.items()):
            self._handles.append(mod.register_forward_hook(self._forward_hook(name, index), with_kwargs=True))
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    @contextlib.contextmanager
    def armed(self, point: int) -> Iterator[dict[str, Captured]]:
        """Capture the first call of every layer inside this block under ``point`` (an int: a step)."""
        if isinstance(point, bool) or not isinstance(point, int):
            raise TypeError(f"a capture point is an int (a step or batch index), got {type(point).__name__}")
        if not self._handles:
            raise RuntimeError("arm an OperandCapture inside its `with` block (hooks are not registered)")
        if point in self.captures:
            raise ValueError(f"capture point {point!r} was already taken")
        self._point = point
        self.captures[point] = {}
        try:
            yield self.captures[point]
        finally:
            self._point = None

    def _store(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.store_device) if self.store_device is not None else t

    def _forward_hook(self, name: str, index: int):
        def hook(mod: nn.Linear, args: tuple, kwargs: dict, output: torch.Tensor) -> None:
            point = self._point
            if point is None or name in self.captures[point]:
                return None
            x = args[0] if args else kwargs.get("input")
            if not isinstance(x, torch.Tensor) or not isinstance(output, torch.Tensor):
                raise TypeError(f"{name}: cannot capture a call whose input/output is not a tensor")
            with torch.no_grad():
                x2 = x.detach().reshape(-1, mod.in_features)
                w = mod.weight.detach()
                if torch.is_autocast_enabled(x.device.type):
                    dt = torch.get_autocast_dtype(x.device.type)
                    x2, w = x2.to(dt), w.to(dt)
                tokens = x2.shape[0]
                keep = min(self.max_tokens, tokens) // MX_BLOCK * MX_BLOCK
                if keep == 0:
                    warnings.warn(f"{name}: {tokens} tokens (< {MX_BLOCK}) at point {point!r}: not captured",
                                  stacklevel=2)
                    return None
                gen = torch.Generator().manual_seed(derive_seed(self.seed, point, index))
                idx = torch.randperm(tokens, generator=gen)[:keep].sort().values.to(x2.device)
                cap = Captured(self._store(x2.index_select(0, idx)), self._store(w.clone()), None, tokens)
            self.captures[point][name] = cap
            if output.requires_grad:
                def grad_hook(grad: torch.Tensor) -> None:
                    g = grad.detach().reshape(-1, mod.out_features).index_select(0, idx)
                    cap.g = self._store(g)
                    return None

                output.register_hook(grad_hook)
            return None

        return hook

    # -- results

    def complete(self, point: int) -> dict[str, Captured]:
        """The layers of ``point`` that have all three operands (a backward reached them)."""
        return {n: c for n, c in self.captures.get(point, {}).items() if c.complete}

    def drop(self, point: int) -> None:
        """Free a point's tensors (keeps the point name taken)."""
        self.captures[point] = {}
