"""Fixtures and session set-up shared across tests/ (subfolders add their own).

Triton decides between interpreter and compiler when it is first imported, and many imports pull
it in early (``torch.compiler.disable`` imports Dynamo, which imports Triton). So on a machine
without a GPU this root conftest, loaded before any test module, sets ``TRITON_INTERPRET=1`` for
the whole session: tests/kernels runs the kernels in the interpreter. ``ADAHOP_BACKEND=reference``
keeps every test outside tests/kernels on the backend it has without the variable (the reference
on CPU); tests/kernels/conftest.py lifts it there. On a GPU nothing is set and kernels compile.
"""

import os

import pytest
import torch

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
# Tells tests/kernels/conftest.py that the reference default below was set here, not by the user.
REFERENCE_DEFAULT_FLAG = "ADAHOP_TESTS_SET_REFERENCE_BACKEND"
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"
    if "ADAHOP_BACKEND" not in os.environ:
        os.environ["ADAHOP_BACKEND"] = "reference"
        os.environ[REFERENCE_DEFAULT_FLAG] = "1"


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module of small reference-path ops: starting threads costs more than
    they save there (10x slower with 2 threads on a loaded 2-core machine). Opt in with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
