"""Every paper figure script on results written by the real stage scripts at a tiny scale.

The results files are produced here (in a temporary folder, never under results/) by calling each
experiments/ script's ``main`` in this process with a tiny profile: pretraining (2 recipes × 2
seeds, 3 steps), lm-eval (2 documents of one task plus the corpus perplexity), the pattern study
(2 capture points), memory, one kernel and one layer benchmark, and end-to-end throughput (a CPU
run beside a GPU run without bf16 made from it). So a figure script that no longer reads what its
stage writes fails here, not in `snakemake all`.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image

from adahop.harness import data
from adahop.harness.provenance import read_results, write_results

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny ops, one thread
RUNS = [(recipe, seed) for recipe in ("bf16", "mxfp4") for seed in (0, 1)]
TINY_TRAIN = {"steps": 3, "batch_size": 2, "seq_len": 32, "lr": 3e-3, "warmup_steps": 1, "eval_interval": 2,
              "eval_batches": 1, "checkpoint_interval": 0, "precision": "fp32", "compile": False}


def load(path: Path):
    """A script as a module (experiments/ and paper_figs/ are folders of scripts, not packages)."""
    spec = importlib.util.spec_from_file_location(f"_{path.parent.name}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))  # their sibling imports (common, microbench)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


def run_main(path: Path, *argv) -> int | None:
    module = load(path)
    sys.path.insert(0, str(path.parent))
    try:
        return module.main([str(a) for a in argv])
    finally:
        sys.path.remove(str(path.parent))


def script(name: str) -> Path:
    path = ROOT / "experiments" / f"{name}.py"
    assert path.is_file(), f"stage script experiments/{name}.py is missing"
    return path


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("figures")


@pytest.fixture(scope="module")
def profile(work) -> Path:
    """The smoke profile shrunk further: every stage section present, tiny settings."""
    cfg = yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text())
    cfg["pretrain"].update(TINY_TRAIN)
    # max_length: the tiny model trains on 32 tokens; lm-eval refuses longer continuations.
    cfg["eval"].update(tasks=["arc_easy", "corpus_ppl"], limit=2, batch_size=2, dtype="float32", document_tokens=64,
                       max_length=256)
    cfg["patterns"].update(capture_steps=[1, 2], max_tokens=32, pretrained=[], recipes=["bf16", "mxfp4"])
    cfg["memory"] = {"size": "smoke", "layer_shapes": [[64, 64, 64], [64, 64, 128]], "batch_size": 1, "seq_len": 32,
                     "vocab_size": 256, "recipes": ["bf16", "mxfp4", "adahop"], "calibration_steps": 1}
    path = work / "profile.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def corpus(work) -> Path:
    """A data folder (adahop.harness.data) of sentences from a small random grammar, a 300-token BPE."""
    rng = np.random.default_rng(0)
    words = (["the cat", "a dog", "my friend", "the king"], ["sees", "likes", "finds", "holds"],
             ["the ball", "a red apple", "some bread", "a small boat"])
    docs = [" ".join(" ".join(rng.choice(w) for w in words) + "." for _ in range(12)) for _ in range(300)]
    out = work / "data"
    for split, part in (("train", docs[:270]), ("val", docs[270:])):
        data.write_jsonl(out / "text" / f"{split}.jsonl",
                         ({"id": f"{split}-{i}", "source": "grammar", "text": t} for i, t in enumerate(part)))
    data.write_shards(out, vocab_size=300)
    return out


@pytest.fixture(scope="module")
def pretrain_results(work, profile, corpus) -> list[Path]:
    path, out = script("pretrain"), []
    for recipe, seed in RUNS:
        name = f"tiny_{recipe}_s{seed}"
        results = work / "results" / "pretrain" / f"{name}.json"
        run_main(path, "--config", profile, "--model", "tiny", "--recipe", recipe, "--seed", seed, "--data", corpus,
                 "--out", work / "runs" / name, "--results", results, "--no-progress")
        out.append(results)
    return out


@pytest.fixture(scope="module")
def eval_results(work, profile, corpus, pretrain_results) -> list[Path]:
    path, out = script("evaluate"), []
    for recipe, seed in RUNS:
        name = f"tiny_{recipe}_s{seed}"
        results = work / "results" / "eval" / f"{name}.json"
        run_main(path, "--config", profile, "--checkpoint", work / "runs" / name / "hf", "--corpus-dir", corpus,
                 "--out", results, "--no-table")
        out.append(results)
    return out


@pytest.fixture(scope="module")
def patterns_results(work, profile, corpus) -> list[Path]:
    results = work / "results" / "patterns" / "patterns.json.gz"  # as the workflow writes it
    run_main(script("patterns"), "--config", profile, "--data", corpus, "--out", results)
    return [results]


@pytest.fixture(scope="module")
def memory_results(work, profile) -> list[Path]:
    results = work / "results" / "memory" / "memory.json"
    run_main(script("memory"), "--config", profile, "--out", results)
    return [results]


@pytest.fixture(scope="module")
def bench_results(work, profile) -> list[Path]:
    """One memory-bound kernel, one GEMM and one layer variant, through the real benchmark runners."""
    kernels, layers = work / "results" / "microbench" / "kernels.json", work / "results" / "layer_bench" / "layers.json"
    assert run_main(script("microbench"), "--config", profile, "--out", kernels, "--select",
                    "(test_dequantize and 256x512) or (test_mxfp4_mm and square-256 and not with and not forced)") == 0
    assert run_main(script("layer_bench"), "--config", profile, "--out", layers, "--select", "mxfp4 and 128-128") == 0
    return [kernels, layers]


@pytest.fixture(scope="module")
def throughput_results(work, profile) -> list[Path]:
    """A CPU run of the real script (bf16 and mxfp4: MFU null), and a 2-GPU FSDP2 run without bf16
    made from its records, with a torchao peer and GPU-busy shares (a GPU cannot be measured here)."""
    cpu = work / "results" / "throughput" / "tiny_cpu.json"
    run_main(script("pretrain"), "--config", profile, "--throughput-only", "--model", "tiny", "--recipe", "bf16,mxfp4",
             "--untimed-steps", 1, "--steps", 2, "--vocab-size", 256, "--device", "cpu", "--no-progress",
             "--results", cpu)
    doc = read_results(cpu)
    gpu = work / "results" / "throughput" / "tiny_ddp2_no_bf16.json"
    records = [{**doc["records"][1], "recipe": recipe, "world_size": 2, "mfu": mfu, "peak_mem_gib": gib,
                "peer": peer, "fsdp": True, "gpu_busy": {"busy_fraction": busy}}
               for recipe, mfu, gib, peer, busy in (("mxfp4", 0.2, 3.0, None, 0.6), ("adahop", 0.15, 3.5, None, 0.5),
                                                    ("float8-rowwise", 0.3, 2.5, "torchao", 0.9))]
    device = {"type": "cuda", "name": "NVIDIA H200", "capability": "9.0", "count": 2, "memory_gib": 139.8}
    write_results(gpu, records, config=doc["provenance"]["config"], extra_provenance={"device": device})
    return [cpu, gpu]


@pytest.fixture(scope="module")
def strategies_results(work, profile, corpus) -> list[Path]:
    """Strategy maps of two adahop seeds, calibrating for 2 of the 3 steps."""
    cfg = yaml.safe_load(profile.read_text())
    cfg["pretrain"]["recipe_overrides"] = {"calibration_steps": 2}
    calibrating = work / "profile_calibrating.yaml"
    calibrating.write_text(yaml.safe_dump(cfg))
    out = []
    for seed in (0, 1):
        path = work / "results" / "strategies" / f"tiny_adahop_s{seed}.json"
        run_main(script("strategies"), "--config", calibrating, "--data", corpus, "--model", "tiny",
                 "--recipe", "adahop", "--seed", seed, "--out", path, "--device", "cpu")
        out.append(path)
    return out


@pytest.fixture(scope="module")
def quality_results(pretrain_results, eval_results) -> list[Path]:
    """Pretraining and lm-eval results together, as the quality table reads them."""
    return [*pretrain_results, *eval_results]


FIGURES = {
    "fig1_patterns": "patterns_results",
    "fig2_pair_error": "patterns_results",
    "fig3_loss": "pretrain_results",
    "fig4_throughput": "bench_results",
    "fig5_memory": "memory_results",
    "fig6_lm_eval": "eval_results",
    "fig7_e2e_throughput": "throughput_results",
    "fig8_strategy_map": "strategies_results",
    "fig9_train_time": "pretrain_results",
    "fig10_paired_gaps": "quality_results",
}


@pytest.mark.parametrize("figure", list(FIGURES))
def test_figure_script_draws_png_and_pdf_from_its_stage_results(figure, request, work, profile):
    results = request.getfixturevalue(FIGURES[figure])
    assert all(read_results(p)["records"] for p in results)
    out = work / "out" / figure
    run_main(ROOT / "paper_figs" / f"{figure}.py", "--config", profile, "--out", out, *results)
    png, pdf = out.with_suffix(".png"), out.with_suffix(".pdf")
    assert pdf.read_bytes().startswith(b"%PDF")
    with Image.open(png) as img:
        assert img.format == "PNG" and min(img.size) > 300
        assert img.info["Source"] == ", ".join(str(p) for p in results)


def test_e2e_throughput_figure_has_no_ratio_without_bf16_and_no_mfu_on_cpu(work, profile, throughput_results,
                                                                          monkeypatch):
    figure = load(ROOT / "paper_figs" / "fig7_e2e_throughput.py")
    drawn = {}

    def keep(fig, args, docs):  # the panels as drawn, instead of files
        drawn["panels"] = [([p.get_width() for p in ax.patches], [t.get_text() for t in ax.texts]) for ax in fig.axes]
        drawn["hatched"] = [bool(p.get_hatch()) for p in fig.axes[0].patches]
        drawn["labels"] = [t.get_text() for t in fig.axes[0].get_yticklabels()]

    monkeypatch.setattr(figure.common, "save", keep)
    figure.main(["--out", str(work / "out" / "fig7_inspected"), *map(str, throughput_results)])
    (ratio, ratio_texts), (mfu, mfu_texts), (busy, busy_texts), (memory, _) = drawn["panels"]
    cpu, gpu = (read_results(p)["records"] for p in throughput_results)
    gpu = [gpu[2], gpu[0], gpu[1]]  # drawn peer first, then the registry's order (mxfp4 before adahop)
    # Ratios only for the run with bf16, against its own bf16; the other run's rows say why not.
    assert ratio == pytest.approx([1.0, cpu[1]["tokens_per_s"] / cpu[0]["tokens_per_s"]])
    assert sum("no bf16 record in this run: no ratio" in t for t in ratio_texts) == len(gpu)
    # MFU only for the GPU run (in %); the CPU run's rows say why not.
    assert mfu == pytest.approx([100 * r["mfu"] for r in gpu])
    assert sum("n/a" in t and "CPU" in t for t in mfu_texts) == len(cpu)
    # The GPU-busy share where measured (in %); the CPU run's records have none.
    assert busy == pytest.approx([100 * r["gpu_busy"]["busy_fraction"] for r in gpu])
    assert sum("n/a" in t for t in busy_texts) == len(cpu)
    assert memory == pytest.approx([r["peak_mem_gib"] for r in cpu + gpu])
    # The torchao peer: named as such, its bar hatched; the run's heading says FSDP2.
    assert "float8-rowwise (torchao)" in drawn["labels"] and any("2 GPUs, FSDP2" in t for t in drawn["labels"])
    assert drawn["hatched"] == [False, False]  # the CPU run's ratio bars; the GPU run has no ratio


def test_e2e_throughput_figure_draws_the_committed_gpu_files_that_predate_peers(work, monkeypatch):
    figure = load(ROOT / "paper_figs" / "fig7_e2e_throughput.py")
    committed = sorted((ROOT / "results" / "throughput" / "gpu").glob("*.json"))
    assert committed
    drawn = {}
    monkeypatch.setattr(figure.common, "save", lambda fig, args, docs: drawn.update(
        bars=sum(len(ax.patches) for ax in fig.axes), docs=len(docs)))
    figure.main(["--out", str(work / "out" / "fig7_committed"), *map(str, committed)])
    runs = [read_results(p)["records"] for p in committed]
    with_bf16 = sum(len(run) for run in runs if any(r["recipe"] == "bf16" for r in run))
    busy = sum(1 for run in runs for r in run if r.get("gpu_busy"))
    # a ratio bar per record of a run with bf16, an MFU and a memory bar per record, a GPU-busy bar
    # per record that measured it (files older than that measurement have none)
    assert drawn["docs"] == len(committed) and drawn["bars"] == with_bf16 + 2 * sum(map(len, runs)) + busy


def test_figure_script_refuses_results_of_another_stage(work, profile, memory_results):
    with pytest.raises(ValueError, match=r"lack \['loss_curve'"):
        run_main(ROOT / "paper_figs" / "fig3_loss.py", "--config", profile, "--out", work / "out" / "wrong", *memory_results)
    assert not (work / "out" / "wrong.png").exists()


def test_paired_figure_refuses_results_of_another_stage_and_lm_eval_alone(work, profile, memory_results,
                                                                          eval_results):
    with pytest.raises(ValueError, match="neither pretraining nor lm-eval"):
        run_main(ROOT / "paper_figs" / "fig10_paired_gaps.py", "--out", work / "out" / "wrong10", *memory_results)
    with pytest.raises(ValueError, match="no pretraining records"):
        run_main(ROOT / "paper_figs" / "fig10_paired_gaps.py", "--out", work / "out" / "wrong10", *eval_results)
    assert not (work / "out" / "wrong10.png").exists()


def test_figure_script_refuses_a_file_that_is_not_a_results_file(work, profile):
    bad = work / "not_results.json"
    bad.write_text('{"records": []}')
    with pytest.raises(ValueError, match="not a results file"):
        run_main(ROOT / "paper_figs" / "fig5_memory.py", "--out", work / "out" / "bad", bad)


def test_every_registry_recipe_has_its_own_colour():
    from adahop.recipes import RECIPES

    palette = load(ROOT / "paper_figs" / "common.py").recipe_palette()
    assert set(palette) == set(RECIPES)
    assert len({tuple(np.round(c, 3)) for c in palette.values()}) == len(RECIPES)


def test_e2e_throughput_figure_leaves_out_a_recipe_that_ran_out_of_memory(work, throughput_results, monkeypatch):
    figure = load(ROOT / "paper_figs" / "fig7_e2e_throughput.py")
    doc = read_results(throughput_results[0])
    oom = {k: doc["records"][1][k] for k in ("model", "world_size", "fsdp", "batch_size", "seq_len", "compile",
                                             "compile_mode", "config")}
    oom |= {"recipe": "adahop", "error": "out of memory", "failed_at": "in step 2 (untimed)", "message": "CUDA out of memory."}
    path = work / "results" / "throughput" / "tiny_cpu_out_of_memory.json"
    write_results(path, [*doc["records"], oom], config=doc["provenance"]["config"])
    drawn = {}

    def keep(fig, args, docs):
        drawn["labels"] = [t.get_text() for t in fig.axes[0].get_yticklabels()]
        drawn["memory"] = [p.get_width() for p in fig.axes[3].patches]

    monkeypatch.setattr(figure.common, "save", keep)
    figure.main(["--out", str(work / "out" / "fig7_out_of_memory"), str(path)])
    assert not any("adahop" in label for label in drawn["labels"])
    assert drawn["memory"] == pytest.approx([r["peak_mem_gib"] for r in doc["records"]])


def test_far_out_flags_only_a_value_beyond_tukeys_far_out_fences():
    common = load(ROOT / "paper_figs" / "common.py")
    near = {"bf16": 3.06, "mxfp4": 3.11, "tseng": 3.07, "adahop": 3.10, "uniform-iht": 3.09}
    assert common.far_out(near) == set()
    assert common.far_out({**near, "hot": 5.43}) == {"hot"}
    assert common.far_out({**near, "broken": -2.0, "nan": float("nan")}) == {"broken"}
    assert common.far_out({"a": 1.0, "b": 9.0, "c": 1.0}) == set()  # under four values: no quartiles to trust
    assert common.far_out(dict.fromkeys("abcde", 2.0) | {"f": 3.0}) == set()  # no spread among the rest


def test_loss_figures_draw_a_recipe_far_off_the_rest_at_the_edge_with_its_value(work, monkeypatch):
    # The committed 125m runs: hot ended 2.4 nats above bf16, the other recipes within 0.1 of it.
    runs = sorted((ROOT / "results" / "pretrain" / "gpu").glob("125m_*.json"))
    finals = {p.stem: read_results(p)["records"][0]["final_val_loss"] for p in runs}
    hot = [v for name, v in finals.items() if name.startswith("125m_hot_")]
    rest = [v for name, v in finals.items() if not name.startswith("125m_hot_")]
    assert hot and min(hot) > max(rest) + 1.0
    figure = load(ROOT / "paper_figs" / "fig3_loss.py")
    drawn = {}

    def keep(fig, args, docs):
        final = fig.axes[3]
        drawn["xlim"] = final.get_xlim()
        drawn["texts"] = [t.get_text() for t in final.texts]
        drawn["gap_texts"] = [t.get_text() for t in fig.axes[2].texts]

    monkeypatch.setattr(figure.common, "save", keep)
    figure.main(["--out", str(work / "out" / "fig3_committed"), *map(str, runs)])
    lo, hi = drawn["xlim"]
    assert lo <= min(rest) and max(rest) <= hi < min(hot)
    assert f"{np.mean(hot):.2f} →" in drawn["texts"]
    assert any(t.startswith("hot: off scale (above)") for t in drawn["gap_texts"])


def test_layer_figure_takes_each_variant_from_the_first_file_that_has_it_and_names_another_gpu():
    figure = load(ROOT / "paper_figs" / "fig4_throughput.py")
    frame = pd.DataFrame({"variant": ["iht", "mxfp4", "iht", "hot", "hot", "iht"],
                          "path": ["main", "main", "later", "later", "later", "same-gpu"]})
    kept = figure.first_file_per_variant(frame, {"main": "H200", "later": "H100", "same-gpu": "H200"})
    # iht from the first file only; hot from the later file, named with its GPU
    assert list(kept["variant"]) == ["iht", "mxfp4", "hot (H100)", "hot (H100)"]
    assert list(kept["path"]) == ["main", "main", "later", "later"]
