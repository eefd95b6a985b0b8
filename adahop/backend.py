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
