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
# Under pytest-xdist (-n auto: one worker process per core) each worker computes on one thread:
# torch's default of one thread per core would run cores² threads on the cores, and the suite's
# small reference-path ops lose more to that contention than threads gain them (the suite takes
# half the time on 2 cores). Subprocesses (torchrun, the kernel compiler) inherit the setting.
# An OMP_NUM_THREADS set by the caller wins.
if os.environ.get("PYTEST_XDIST_WORKER") and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
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


@pytest.fixture(scope="session")
def write_corpus():
    """``write(folder, docs, n_train, vocab_size)``: the documents as an adahop.harness.data folder (text
    splits, the first ``n_train`` for training, then a BPE and token shards); returns the folder."""
    from adahop.harness import data

    def write(out, docs, n_train, vocab_size):
        for split, part in (("train", docs[:n_train]), ("val", docs[n_train:])):
            data.write_jsonl(out / "text" / f"{split}.jsonl",
                             ({"id": f"{split}-{i}", "source": "grammar", "text": t} for i, t in enumerate(part)))
        data.write_shards(out, vocab_size=vocab_size)
        return out

    return write


@pytest.fixture(scope="session")
def word_corpus(tmp_path_factory, write_corpus):
    """``make(seed, words_per_doc)``: a corpus folder of 300 documents of words drawn at random from
    a 12-word list (270 for training), a 300-token BPE."""
    import numpy as np

    words = ["the", "cat", "sees", "a", "dog", "king", "holds", "red", "apple", "boat", "old", "man"]

    def make(seed, words_per_doc):
        rng = np.random.default_rng(seed)
        docs = [" ".join(rng.choice(words, size=words_per_doc)) + "." for _ in range(300)]
        return write_corpus(tmp_path_factory.mktemp("corpus"), docs, 270, 300)

    return make
