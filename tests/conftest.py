"""Fixtures shared across tests/ (subfolders have their own conftest for their own needs)."""

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module of small reference-path ops: starting threads costs more than
    they save there (10x slower with 2 threads on a loaded 2-core machine). Opt in with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
