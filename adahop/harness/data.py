"""Token data for pretraining: tokenizer, token shards, the training sampler, eval batches.

Layout of a data folder ``data/<corpus>/`` (docs/CONTRACTS.md, "Data"):

- ``text/train.jsonl``, ``text/val.jsonl``: the cleaned documents, one ``{"id", "source",
  "text"}`` per line (written by :mod:`adahop.harness.corpus`).
- ``tokenizer.json``: a byte-level BPE (``tokenizers``), trained on the train split only, with
  the special tokens ``<|bos|>`` (id 0) and ``<|eos|>`` (id 1). Load it with
  ``tokenizers.Tokenizer.from_file`` or ``transformers.PreTrainedTokenizerFast(
  tokenizer_file=..., bos_token="<|bos|>", eos_token="<|eos|>")``.
- ``train.bin``, ``val.bin``: flat token ids (``uint16`` when the vocabulary is below 65536,
  else ``uint32``, little-endian), each document followed by ``<|eos|>``. No BOS is written: a
  consumer that wants one prepends it.
- ``meta.json``: ``vocab_size``, ``dtype``, ``bos_id``, ``eos_id``, token and document counts,
  sha256 of each shard and of the tokenizer.
- ``manifest.json``: sources, versions, licences, sizes, dedup and split rules, checksums.

Training: :class:`TokenBatches` draws random contiguous windows. Step ``s`` of a run with
seed ``seed`` uses the window starts ``PCG64(SeedSequence([seed, s])).random_raw(world_size *
batch_size) % (n - seq_len)``, and rank ``r`` takes the ``r``-th block of ``batch_size`` of
them. So the stream depends only on ``(seed, step)``: ``state_dict()`` is the step counter,
a resumed run continues it exactly, and a world of ``W`` ranks with batch ``B`` sees the same
global batches as one rank with batch ``W·B``. Windows are drawn with replacement (no epochs).

Evaluation: :func:`iter_eval_batches` walks the held-out split in non-overlapping windows in
order (the same batches every call), dropping the tail that does not fill a global batch.

Carry: :func:`write_bundle` packs what the GPU machine needs (the xz-compressed shards, the
tokenizer, manifest and meta); :func:`rebuild_from_bundle` unpacks them there (stdlib only) and
checks every file against the checksums in ``meta.json``.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import shutil
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN)
SPLITS = ("train", "val")
# xz preset of the carry bundle: 9 + extreme packs the full corpus' train.bin from 70.4 to 29.0 MB.
XZ_PRESET = 9 | lzma.PRESET_EXTREME


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_json(path: str | os.PathLike, obj) -> None:
    """Deterministic JSON (sorted keys, fixed indentation, trailing newline)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False) + "\n",
                          encoding="utf-8")


# --------------------------------------------------------------------------- documents (jsonl)


def write_jsonl(path: str | os.PathLike, records: Iterable[dict]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False, sort_keys=True) + "\n")


def iter_documents(path: str | os.PathLike) -> Iterator[str]:
    """The ``text`` of each line of a documents file (``.jsonl``)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"documents file {path} does not exist; build the corpus first "
                                "(experiments/build_corpus.py)")
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)["text"]


# --------------------------------------------------------------------------- tokenizer


def train_tokenizer(texts: Iterable[str], vocab_size: int, min_frequency: int = 2):
    """A byte-level BPE trained on ``texts``; ids 0 and 1 are ``<|bos|>`` and ``<|eos|>``.

    Byte level (GPT-2 pre-tokenizer regex, 256-byte initial alphabet): every string
    round-trips, with no unknown token. Deterministic for the same texts: the trainer breaks
    ties in pair counts by token id, and ids come from the sorted byte alphabet (no
    continuing-subword prefix, whose ids would follow hash-map order). Checked by
    ``tests/test_data.py::test_tokenizer_training_is_deterministic``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 256 + len(SPECIAL_TOKENS) + 1:
        raise ValueError(f"vocab_size {vocab_size} is below the byte alphabet + special tokens (259)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def load_tokenizer(path: str | os.PathLike):
    from tokenizers import Tokenizer

    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.exists():
        raise FileNotFoundError(f"tokenizer {path} does not exist; build the corpus first")
    return Tokenizer.from_file(str(path))


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def encode_to_file(tokenizer, texts: Iterable[str], path: str | os.PathLike, eos_id: int,
                   dtype: np.dtype, batch_docs: int = 512) -> tuple[int, int]:
    """Tokenize ``texts`` in order into the flat file ``path`` (each document + EOS).

    Returns ``(tokens, documents)``. ``encode_batch`` runs on all cores; the output does not
    depend on how many.
    """
    dtype = np.dtype(dtype).newbyteorder("<")
    n_tok = n_doc = 0
    with open(path, "wb") as f:
        batch: list[str] = []

        def flush() -> None:
            nonlocal n_tok, n_doc
            for enc in tokenizer.encode_batch(batch, add_special_tokens=False):
                ids = np.asarray(enc.ids + [eos_id], dtype=dtype)
                f.write(ids.tobytes())
                n_tok += ids.size
            n_doc += len(batch)
            batch.clear()

        for text in texts:
            batch.append(text)
            if len(batch) == batch_docs:
                flush()
        if batch:
            flush()
    return n_tok, n_doc


def write_shards(data_dir: str | os.PathLike, vocab_size: int) -> dict:
    """Train a tokenizer of ``vocab_size`` on the train split into ``data_dir/tokenizer.json``,
    tokenize both splits into ``train.bin``/``val.bin`` and write ``meta.json``; return the
    meta. The documents are read from ``data_dir/text/{train,val}.jsonl``.
    """
    data_dir = Path(data_dir)
    files = {split: data_dir / "text" / f"{split}.jsonl" for split in SPLITS}
    tokenizer = train_tokenizer(iter_documents(files["train"]), vocab_size)
    tokenizer.save(str(data_dir / "tokenizer.json"))
    vocab = tokenizer.get_vocab_size()
    ids = {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS}
    if None in ids.values():
        raise ValueError(f"tokenizer lacks the special tokens {SPECIAL_TOKENS}")
    dtype = token_dtype(vocab)
    meta = {"vocab_size": vocab, "dtype": dtype.name, "byteorder": "little",
            "bos_id": ids[BOS_TOKEN], "eos_id": ids[EOS_TOKEN], "bos_token": BOS_TOKEN,
            "eos_token": EOS_TOKEN, "layout": "flat token ids; each document followed by eos_id",
            "tokens": {}, "documents": {}, "sha256": {}}
    for split in SPLITS:
        n_tok, n_doc = encode_to_file(tokenizer, iter_documents(files[split]),
                                      data_dir / f"{split}.bin", ids[EOS_TOKEN], dtype)
        meta["tokens"][split], meta["documents"][split] = n_tok, n_doc
        meta["sha256"][f"{split}.bin"] = sha256_file(data_dir / f"{split}.bin")
    meta["sha256"]["tokenizer.json"] = sha256_file(data_dir / "tokenizer.json")
    write_json(data_dir / "meta.json", meta)
    return meta


# --------------------------------------------------------------------------- loading


def read_meta(data_dir: str | os.PathLike) -> dict:
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise FileNotFoundError(
            f"data folder {data_dir} does not exist; build it with "
            f"`python experiments/build_corpus.py --config config/<profile>.yaml --out {data_dir}` "
            "or rebuild it from a carry bundle (--from-bundle)")
    path = data_dir / "meta.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: {data_dir} is not a finished data folder")
    return json.loads(path.read_text())


def load_tokens(data_dir: str | os.PathLike, split: str) -> np.memmap:
    """The flat token ids of ``split`` (``"train"`` or ``"val"``) as a read-only memmap.

    Shape ``(n_tokens,)``, dtype from ``meta.json`` (``uint16`` below 65536 ids). Equivalent to
    ``np.fromfile(data_dir/f"{split}.bin", dtype)`` without reading the file.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    meta = read_meta(data_dir)
    path = Path(data_dir) / f"{split}.bin"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist (meta.json lists it): rebuild the data folder")
    dtype = np.dtype(meta["dtype"]).newbyteorder("<")
    size = path.stat().st_size
    expected = meta["tokens"][split] * dtype.itemsize
    if size != expected:
        raise ValueError(f"{path} holds {size} bytes, meta.json says {meta['tokens'][split]} "
                         f"{dtype.name} tokens ({expected} bytes): the folder is inconsistent")
    return np.memmap(path, dtype=dtype, mode="r")


def _check_positive(**kwargs) -> None:
    for name, value in kwargs.items():
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_rank(rank: int, world_size: int) -> None:
    _check_positive(world_size=world_size)
    if not isinstance(rank, (int, np.integer)) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank!r}")


def _windows(tokens: np.ndarray, starts: np.ndarray, seq_len: int):
    import torch

    idx = starts[:, None] + np.arange(seq_len + 1)[None, :]
    block = torch.from_numpy(tokens[idx].astype(np.int64))
    return block[:, :-1], block[:, 1:]


class TokenBatches:
    """Endless stream of training batches ``(inputs, targets)``, int64 ``(batch_size, seq_len)``
    CPU tensors, ``targets`` = ``inputs`` shifted by one token (next-token prediction).

    Random contiguous windows, reproducible from ``(seed, step)`` (module docstring). Resume:
    ``batches.load_state_dict(saved)`` with the dict ``state_dict()`` returned; it refuses a
    state from a different stream (seed, seq_len, batch size, world size or data). Windows may
    cross document boundaries (the EOS between documents is a token like any other).
    Equivalent to nanoGPT's ``get_batch`` with a per-step generator.
    """

    def __init__(self, data_dir: str | os.PathLike, split: str, seq_len: int, batch_size: int,
                 seed: int, rank: int = 0, world_size: int = 1):
        _check_positive(seq_len=seq_len, batch_size=batch_size)
        _check_rank(rank, world_size)
        if not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        self.tokens = load_tokens(data_dir, split)
        if len(self.tokens) < seq_len + 2:
            raise ValueError(f"{split} split has {len(self.tokens)} tokens, fewer than seq_len + 2 "
                             f"= {seq_len + 2}")
        self.split, self.seq_len, self.batch_size = split, int(seq_len), int(batch_size)
        self.seed, self.rank, self.world_size = int(seed), int(rank), int(world_size)
        self.step = 0

    def starts(self, step: int) -> np.ndarray:
        """Window starts of this rank at ``step``: int64 ``(batch_size,)``."""
        bitgen = np.random.PCG64(np.random.SeedSequence([self.seed, step]))
        raw = bitgen.random_raw(self.world_size * self.batch_size)
        starts = (raw % np.uint64(len(self.tokens) - self.seq_len)).astype(np.int64)
        return starts[self.rank * self.batch_size:(self.rank + 1) * self.batch_size]

    def __iter__(self):
        return self

    def __next__(self):
        batch = _windows(self.tokens, self.starts(self.step), self.seq_len)
        self.step += 1
        return batch

    def state_dict(self) -> dict:
        return {"step": self.step, "seed": self.seed, "split": self.split, "seq_len": self.seq_len,
                "batch_size": self.batch_size, "world_size": self.world_size,
                "num_tokens": len(self.tokens)}

    def load_state_dict(self, state: dict) -> None:
        mine = self.state_dict()
        diff = {k: (state.get(k), mine[k]) for k in mine if k != "step" and state.get(k) != mine[k]}
        if diff:
            raise ValueError(f"TokenBatches state is from a different stream (saved, current): {diff}")
        if not isinstance(state["step"], int) or state["step"] < 0:
            raise ValueError(f"TokenBatches state has an invalid step {state['step']!r}")
        self.step = state["step"]


def iter_eval_batches(data_dir: str | os.PathLike, seq_len: int, batch_size: int,
                      split: str = "val", rank: int = 0, world_size: int = 1,
                      max_batches: int | None = None):
    """Deterministic held-out batches ``(inputs, targets)``, int64 ``(batch_size, seq_len)``.

    Non-overlapping windows ``tokens[i*seq_len : (i+1)*seq_len + 1]`` in order; global batch
    ``j`` holds windows ``j*W*B ... (j+1)*W*B - 1`` (``W`` = world_size, ``B`` = batch_size) and
    rank ``r`` takes its ``r``-th block of ``B``. The tail that does not fill a global batch is
    dropped, so every rank yields the same number of batches (at most ``max_batches``).
    Equivalent to averaging the loss over the first ``n·W·B`` windows of the split.
    """
    _check_positive(seq_len=seq_len, batch_size=batch_size)
    _check_rank(rank, world_size)
    if max_batches is not None:
        _check_positive(max_batches=max_batches)
    tokens = load_tokens(data_dir, split)
    windows = (len(tokens) - 1) // seq_len
    n_batches = windows // (world_size * batch_size)
    if n_batches == 0:
        raise ValueError(f"{split} split ({len(tokens)} tokens) is too small for one global batch "
                         f"of {world_size}×{batch_size} windows of {seq_len} tokens")
    if max_batches is not None:
        n_batches = min(n_batches, max_batches)
    for j in range(n_batches):
        first = (j * world_size + rank) * batch_size
        yield _windows(tokens, (first + np.arange(batch_size)) * seq_len, seq_len)


# --------------------------------------------------------------------------- carry bundle

# The bundle carries the token shards, not the text: measured on the full corpus (141 MB of
# text, 35.2 M train tokens, vocab 32768), train.bin.xz is 29.0 MB against 32.5 MB for
# train.jsonl.xz, and unpacking needs no tokenizer run (nor the same tokenizers version).
BUNDLE_FILES = ("train.bin.xz", "val.bin.xz", "tokenizer.json", "manifest.json", "meta.json")


def write_bundle(data_dir: str | os.PathLike, bundle_dir: str | os.PathLike) -> dict:
    """Pack ``data_dir`` for the GPU machine: both shards xz-compressed, the tokenizer, the
    manifest and the meta (whose sha256 the unpacking checks). Returns ``{file: bytes}``."""
    data_dir, bundle_dir = Path(data_dir), Path(bundle_dir)
    read_meta(data_dir)
    bundle_dir.mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        with open(data_dir / f"{split}.bin", "rb") as f, lzma.open(
                bundle_dir / f"{split}.bin.xz", "wb", preset=XZ_PRESET) as out:
            shutil.copyfileobj(f, out, 1 << 20)
    for name in ("tokenizer.json", "manifest.json", "meta.json"):
        shutil.copyfile(data_dir / name, bundle_dir / name)
    return {name: (bundle_dir / name).stat().st_size for name in BUNDLE_FILES}


def rebuild_from_bundle(bundle_dir: str | os.PathLike, out_dir: str | os.PathLike) -> dict:
    """Unpack a bundle into a data folder (stdlib + numpy only) and check every file's sha256
    against the bundled meta; a mismatch raises. Returns the meta. The folder has no ``text/``
    (nothing on the GPU machine reads it)."""
    bundle_dir, out_dir = Path(bundle_dir), Path(out_dir)
    missing = [n for n in BUNDLE_FILES if not (bundle_dir / n).exists()]
    if missing:
        raise FileNotFoundError(f"carry bundle {bundle_dir} lacks {missing}")
    meta = json.loads((bundle_dir / "meta.json").read_text())
    out_dir.mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        with lzma.open(bundle_dir / f"{split}.bin.xz", "rb") as f, open(out_dir / f"{split}.bin", "wb") as out:
            shutil.copyfileobj(f, out, 1 << 20)
    for name in ("tokenizer.json", "manifest.json", "meta.json"):
        shutil.copyfile(bundle_dir / name, out_dir / name)
    bad = sorted(name for name, digest in meta["sha256"].items() if sha256_file(out_dir / name) != digest)
    if bad:
        raise RuntimeError(f"unpacked {bad} in {out_dir} differ from the bundle's checksums: "
                           "the bundle is damaged; copy it again")
    return meta


def _tokenizers_version() -> str:
    import tokenizers

    return tokenizers.__version__
