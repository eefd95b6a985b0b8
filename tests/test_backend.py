"""The backend switch and FasterOf, the per-input choice between interchangeable implementations."""

import pytest
import torch

from adahop.backend import Backend, FasterOf, resolve_backend


def test_resolve_backend_names_and_errors(monkeypatch):
    monkeypatch.delenv("ADAHOP_BACKEND", raising=False)
    assert resolve_backend("cpu", "reference") is Backend.REFERENCE
    with pytest.raises(ValueError, match="unknown backend 'fast'"):
        resolve_backend("cpu", "fast")


def test_faster_of_times_each_input_kind_once_and_keeps_the_faster():
    calls, timed = [], []
    seconds = {"a": 2.0, "b": 1.0}

    def timer(fn):
        fn()
        return seconds[calls[-1]]

    def make(name):
        def impl(x):
            calls.append(name)
            return x + (1 if name == "a" else 2)
        return impl

    pick = FasterOf({"a": make("a"), "b": make("b")}, timer=lambda fn: timed.append(1) or timer(fn))
    x = torch.zeros(4, 5)
    assert torch.equal(pick(x), x + 2)  # "b" is faster
    assert len(timed) == 2 and list(pick.choices.values()) == ["b"]
    calls.clear()
    pick(torch.ones(4, 5))  # same kind: no timing
    assert len(timed) == 2 and calls == ["b"]
    seconds.update(a=0.5)
    pick(torch.zeros(4, 5).t())  # other strides and shape: timed again, now "a" wins
    assert len(timed) == 4 and sorted(pick.choices.values()) == ["a", "b"]
    pick(torch.zeros(4, 5, dtype=torch.float64))  # another dtype: timed again
    assert len(timed) == 6 and len(pick.choices) == 3


def test_faster_of_needs_two_candidates():
    with pytest.raises(ValueError, match="at least two"):
        FasterOf({"only": lambda x: x})
