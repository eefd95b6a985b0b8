"""Kernel tests: through Triton's interpreter on CPU, compiled where a CUDA GPU is present.

Triton decides interpreter or compiler when it is first imported, and the interpreter reads the
variable again while kernels run, so ``TRITON_INTERPRET=1`` is set here at import and stays set
for the whole session. ``ADAHOP_BACKEND=reference`` keeps every test outside this folder on the
backend it has without the variable (the reference on CPU); the autouse fixture below lifts it
for the tests in this folder, where the Triton backend is the default again.
"""

import os
import sys

import pytest
import torch

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
_BACKEND_SET_HERE = False
if not ON_GPU:
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        raise RuntimeError(
            "triton was imported before tests/kernels/conftest.py could set TRITON_INTERPRET=1, so the "
            "kernels would not run in the interpreter: import triton lazily in test modules collected "
            "earlier (tests/bench/), or run with TRITON_INTERPRET=1 set"
        )
    os.environ["TRITON_INTERPRET"] = "1"
    if "ADAHOP_BACKEND" not in os.environ:
        os.environ["ADAHOP_BACKEND"] = "reference"
        _BACKEND_SET_HERE = True


@pytest.fixture(autouse=True)
def _kernel_backend_default(monkeypatch):
    if _BACKEND_SET_HERE:
        monkeypatch.delenv("ADAHOP_BACKEND")


@pytest.fixture
def device() -> str:
    """Where the kernels under test run: the GPU when there is one, else the CPU (interpreter)."""
    return "cuda" if ON_GPU else "cpu"
