"""The one switch between the Triton kernels and the pure-PyTorch reference.

``Backend.TRITON`` runs ``kernels/`` (compiled on a GPU, through Triton's interpreter on CPU
tensors when ``TRITON_INTERPRET=1`` was set before the first kernel import).
``Backend.REFERENCE`` runs the fp32/fp64 oracles of ``adahop.formats`` and friends.

Default: Triton on CUDA tensors and under the interpreter, the reference otherwise. The
environment variable ``ADAHOP_BACKEND`` (``triton`` or ``reference``) overrides the default.
"""

from __future__ import annotations

import enum
import os
import statistics
from typing import Callable

import torch


class Backend(str, enum.Enum):
    TRITON = "triton"
    REFERENCE = "reference"


def triton_interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def resolve_backend(device: torch.device | str, requested: Backend | str | None = None) -> Backend:
    """The backend that runs an op on ``device``: ``requested``, else ``ADAHOP_BACKEND``, else default."""
    device = torch.device(device)
    choice = requested if requested is not None else os.environ.get("ADAHOP_BACKEND")
    if choice is not None:
        try:
            backend = Backend(choice)
        except ValueError:
            raise ValueError(f"unknown backend {choice!r}; choose 'triton' or 'reference'") from None
        if backend is Backend.TRITON and device.type == "cpu" and not triton_interpreted():
            raise ValueError(
                "the triton backend on CPU tensors needs TRITON_INTERPRET=1 set before adahop is imported"
            )
        return backend
    if device.type == "cuda" or (device.type == "cpu" and triton_interpreted()):
        return Backend.TRITON
    return Backend.REFERENCE


def cuda_seconds(fn: Callable[[], object], reps: int = 3) -> float:
    """Median seconds of ``fn()`` on the current CUDA stream over ``reps`` timed calls, after one
    untimed call (Triton compiles, or loads from its cache, on the first)."""
    fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


class FasterOf:
    """The faster of interchangeable implementations of one op (the same result, bit for bit), timed
    once per input kind on its first call, as ``torch.backends.cudnn.benchmark`` picks convolutions.

    ``candidates``: name -> implementation taking the input tensor. An input's kind is its device,
    dtype, shape and strides; :attr:`choices` maps each kind met to the name chosen. ``timer``
    (default :func:`cuda_seconds`) times one call of a candidate. Which one wins can change from
    run to run where they are close; the results cannot.
    """

    def __init__(self, candidates: dict[str, Callable[[torch.Tensor], torch.Tensor]],
                 timer: Callable[[Callable[[], object]], float] = cuda_seconds):
        if len(candidates) < 2:
            raise ValueError(f"FasterOf needs at least two candidates, got {list(candidates)}")
        self.candidates, self.timer = dict(candidates), timer
        self.choices: dict[tuple, str] = {}

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        kind = (str(x.device), x.dtype, tuple(x.shape), x.stride())
        name = self.choices.get(kind)
        if name is None:
            seconds = {n: self.timer(lambda f=f: f(x)) for n, f in self.candidates.items()}
            name = self.choices[kind] = min(seconds, key=seconds.get)
        return self.candidates[name](x)
