"""Measuring what autograd keeps for backward: :class:`SavedTensorMeter`."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class SavedTensorMeter:
    """Counts the bytes autograd saves for backward inside ``with SavedTensorMeter(model) as m:``.

    Unique storages are counted once (views share memory). ``param_bytes`` are saved tensors that
    are parameters of ``params_of`` (kept alive anyway); ``activation_bytes`` the rest.
    Equivalent to summing ``storage.nbytes()`` over ``torch.autograd.graph.saved_tensors_hooks``.
    """

    def __init__(self, params_of: nn.Module | None = None) -> None:
        self._params = {p.untyped_storage().data_ptr() for p in params_of.parameters()} if params_of else set()
        self.storages: dict[int, tuple[int, bool]] = {}
        self.tensors: list[tuple[tuple[int, ...], torch.dtype, bool]] = []  # (shape, dtype, is_param)
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        is_param = st.data_ptr() in self._params
        self.storages[st.data_ptr()] = (st.nbytes(), is_param)
        self.tensors.append((tuple(t.shape), t.dtype, is_param))
        return t

    def __enter__(self) -> "SavedTensorMeter":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)

    @property
    def total_bytes(self) -> int:
        return sum(n for n, _ in self.storages.values())

    @property
    def param_bytes(self) -> int:
        return sum(n for n, is_param in self.storages.values() if is_param)

    @property
    def activation_bytes(self) -> int:
        return self.total_bytes - self.param_bytes
