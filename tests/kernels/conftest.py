"""Kernel tests: through Triton's interpreter on CPU, compiled where a CUDA GPU is present.

tests/conftest.py sets ``TRITON_INTERPRET=1`` (no GPU) before anything imports Triton, and the
reference backend as the default outside this folder; here the Triton backend is the default again.
"""

import os

import pytest
import torch

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
_BACKEND_SET_HERE = os.environ.get("ADAHOP_TESTS_SET_REFERENCE_BACKEND") == "1"


@pytest.fixture(autouse=True)
def _kernel_backend_default(monkeypatch):
    if _BACKEND_SET_HERE:
        monkeypatch.delenv("ADAHOP_BACKEND")


@pytest.fixture
def device() -> str:
    """Where the kernels under test run: the GPU when there is one, else the CPU (interpreter)."""
    return "cuda" if ON_GPU else "cpu"
