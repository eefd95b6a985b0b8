"""experiments/report.py: docs/RESULTS.md and README's headline block, from the results files alone."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("report", ROOT / "experiments" / "report.py")
report = importlib.util.module_from_spec(_spec)
sys.modules["report"] = report
_spec.loader.exec_module(report)

COMMITTED = report.profile_files("gpu")
needs_committed = pytest.mark.skipif(not COMMITTED, reason="no committed gpu results in this checkout")


def gpu_report(files=None, root: Path = ROOT, figures: Path | None = None) -> str:
    res = report.Results(files if files is not None else COMMITTED, root=root)
    return report.report(res, "gpu", figures or root / "paper_figs" / "out" / "gpu", root / "docs" / "RESULTS.md")


@needs_committed
def test_committed_results_md_is_what_the_committed_results_give():
    # Regenerate with: .venv/bin/python experiments/report.py --config config/gpu.yaml --out docs/RESULTS.md --readme README.md
    assert (ROOT / "docs" / "RESULTS.md").read_text() == gpu_report(), \
        "docs/RESULTS.md is stale: regenerate it from results/ (see the comment above)"


@needs_committed
def test_readme_headline_is_what_the_committed_results_give():
    text = (ROOT / "README.md").read_text()
    block = report.readme_block(report.Results(COMMITTED))
    assert block in text, "README.md's headline block is stale: rerun experiments/report.py with --readme README.md"


@needs_committed
def test_every_table_names_its_source_and_commit():
    text = gpu_report()
    tables = [chunk for chunk in text.split("\n\n") if chunk.startswith("| ") and "|---|" in chunk]
    after = text.split("\n\n")
    assert tables
    for i, chunk in enumerate(after):
        if chunk.startswith("| ") and "|---|" in chunk and "the paper (" not in chunk:
            following = "\n".join(after[i + 1:i + 4])
            assert "Source: `results/" in following and "(commit " in following, chunk.splitlines()[0]


@needs_committed
def test_figures_are_embedded_from_paper_figs(tmp_path):
    text = gpu_report()
    for name in report.FIGURES:
        assert f"](../paper_figs/out/gpu/{name}.png)" in text
    # a figure not drawn is said so, not linked
    assert "not drawn for this profile" in gpu_report(figures=tmp_path)


def copy_results(tmp_path: Path) -> Path:
    for path in COMMITTED:
        dst = tmp_path / path.relative_to(ROOT)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dst)
    return tmp_path


@needs_committed
def test_the_headline_numbers_are_read_from_the_files(tmp_path):
    root = copy_results(tmp_path)
    quality = root / "results" / "quality" / "gpu" / "quality.json"
    doc = json.loads(quality.read_text())
    for rec in doc["records"]:
        if rec["recipe"] == "adahop":
            rec["paired"]["bf16"]["final_val_loss"]["mean"] = 0.123456
    quality.write_text(json.dumps(doc))
    throughput = root / "results" / "throughput" / "gpu" / "125m_eager.json"
    doc = json.loads(throughput.read_text())
    for rec in doc["records"]:
        rec["tokens_per_s"] = 1000.0 if rec["recipe"] == "bf16" else 4321.0
    throughput.write_text(json.dumps(doc))
    res = report.Results(report.profile_files("gpu", root), root=root)
    block = report.readme_block(res)
    assert "AdaHOP +0.123" in block and "125m_eager 4.32×" in block
    assert "AdaHOP +0.123" not in report.readme_block(report.Results(COMMITTED))


def test_history_files_are_not_read(tmp_path):
    from adahop.harness.provenance import write_results

    write_results(tmp_path / "results" / "memory" / "gpu" / "memory.json", [{"what": "layer"}])
    write_results(tmp_path / "results" / "memory" / "gpu" / "history" / "memory-2026-01-01.json", [{"what": "layer"}])
    assert report.profile_files("gpu", tmp_path) == [tmp_path / "results" / "memory" / "gpu" / "memory.json"]


def test_a_partial_file_is_read_only_where_no_complete_file_is_beside_it(tmp_path):
    from adahop.harness.provenance import write_results

    folder = tmp_path / "results" / "throughput" / "gpu"
    for name in ("3b.json", "3b-partial.json", "1b-partial.json"):
        write_results(folder / name, [{"what": "run"}])
    assert report.profile_files("gpu", tmp_path) == [folder / "1b-partial.json", folder / "3b.json"]


def test_a_profile_without_results_gives_a_report_that_says_so(tmp_path):
    text = report.report(report.Results([], root=tmp_path), "empty", tmp_path, tmp_path / "docs" / "RESULTS.md")
    assert "No quality table in this profile's results." in text and "No memory results in this profile." in text
    assert "| what |" in text  # the headline's header, with no rows


def test_readme_without_a_headline_block_is_refused():
    with pytest.raises(ValueError, match="README has no headline block"):
        report.replace_readme_block("# a README\n", "block")


def test_readme_block_is_replaced_and_the_rest_kept():
    text = f"intro\n{report.HEADLINE_BEGIN}\nold\n{report.HEADLINE_END}\nrest\n"
    new = report.replace_readme_block(text, f"{report.HEADLINE_BEGIN}\nnew\n{report.HEADLINE_END}")
    assert new == f"intro\n{report.HEADLINE_BEGIN}\nnew\n{report.HEADLINE_END}\nrest\n"


def test_config_without_a_profile_is_refused(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("figures: {dpi: 100}\n")
    with pytest.raises(ValueError, match="sets no `profile`"):
        report.main(["--config", str(config), "--out", str(tmp_path / "R.md")])


def test_a_cuda_graph_peak_that_held_an_earlier_pool_is_marked_as_a_bound():
    from adahop.harness.train import peak_is_shared

    def rec(recipe, mode="reduce-overhead", **kw):
        return {"recipe": recipe, "compile_mode": mode, "peak_mem_gib": 40.0, **kw}

    old = [rec("bf16"), rec("adahop"), rec("float8-tensorwise"), rec("hot")]
    # The first recipe's pool is its own; a calibrating recipe resets compilation when it fixes
    # its strategies; a peer after bf16 kept bf16's pool reserved.
    assert [peak_is_shared(old, i) for i in range(4)] == [False, False, True, False]
    new = [rec("bf16", memory_at_start={}), rec("float8-tensorwise", memory_at_start={})]
    assert not peak_is_shared(new, 1)  # written after the stage reset between recipes
    assert not peak_is_shared([rec("bf16", "default"), rec("mxfp4", "default")], 1)  # no graphs, no pool


def test_a_recipe_out_of_memory_is_a_row_that_says_where_and_no_ratio(tmp_path):
    root = copy_results(tmp_path)
    throughput = root / "results" / "throughput" / "gpu" / "125m_eager.json"
    doc = json.loads(throughput.read_text())
    adahop = next(r for r in doc["records"] if r["recipe"] == "adahop")
    adahop.clear()
    adahop.update(recipe="adahop", model="125m", compile=False, compile_mode=None, world_size=1, batch_size=32,
                  error="out of memory", failed_at="in step 2 (untimed)", message="CUDA out of memory.")
    throughput.write_text(json.dumps(doc))
    res = report.Results(report.profile_files("gpu", root), root=root)
    rows = [line for line in report.throughput_section(res) if line.startswith("| 125m_eager ")]
    assert "| adahop | out of memory in step 2 (untimed) | — | — | — | — |" in next(r for r in rows if "| adahop |" in r)
    e2e = next(line for line in report.readme_block(res).splitlines() if line.startswith("| end to end"))
    ratios = e2e.split(" | ")[3].split("; ")
    assert "1b_compile" in e2e and not any(r.startswith("125m_eager ") for r in ratios)  # no adahop to divide


@pytest.mark.parametrize("fresh,n_shapes,eager", [(True, 9, False), (False, 9, True), (False, 8, False)],
                         ids=["fresh-caches", "shared-caches-past-the-limit", "shared-caches-within-it"])
def test_layer_table_says_when_its_benchmarks_ran_eagerly(tmp_path, fresh, n_shapes, eager):
    from adahop.harness.provenance import write_results
    recs = [{"test": f"test_layer_fwd_bwd[iht-s{i}]", "op": "linear fwd+bwd [iht]", "shape": [16, 32, 32 * (i + 1)],
             "ratio_to_peers": {"nn.Linear-bf16": 1.5, "torchao-float8-rowwise": 1.1},
             **({"compile_caches": "fresh"} if fresh else {})} for i in range(n_shapes)]
    layers = tmp_path / "results" / "layer_bench" / "gpu" / "layers.json"
    other = layers.with_name("layers-more.json")
    write_results(layers, recs)
    write_results(other, [{**recs[0], "ratio_to_peers": {"nn.Linear-bf16": 0.5, "torchao-float8-tensorwise": 0.25}}])
    text = "\n".join(report.layer_section(report.Results([other, layers], root=tmp_path)))
    # every file, the every-variant one first, each cell its same-run peers
    assert text.index("`layers`:") < text.index("`layers-more`:")
    assert "| s0 (16, 32, 32) | 1.50× / 1.10× |" in text and "| s0 (16, 32, 32) | 0.50× / 0.25× |" in text
    assert "over `nn.Linear` bf16 / over torchao float8 tensorwise (compiled)" in text
    assert text.count("the timings are eager ones") == eager


def test_layer_table_shows_the_replayed_speedups_where_a_record_has_them(tmp_path):
    from adahop.harness.provenance import write_results
    base = {"op": "linear fwd+bwd [iht]", "shape": [16, 32, 32], "compile_caches": "fresh",
            "ratio_to_peers": {"nn.Linear-bf16": 0.5, "torchao-float8-tensorwise": 0.25}}
    recs = [{**base, "test": "test_layer_fwd_bwd[iht-a]", "replayed": None},
            {**base, "test": "test_layer_fwd_bwd[iht-b]",
             "replayed": {"ratio_to_peers": {"nn.Linear-bf16": 1.25, "torchao-float8-tensorwise": 0.75}}},
            {**base, "test": "test_layer_fwd_bwd[iht-c]", "replayed": {"error": "RuntimeError: capture failed"}}]
    layers = tmp_path / "results" / "layer_bench" / "gpu" / "layers.json"
    write_results(layers, recs)
    text = "\n".join(report.layer_section(report.Results([layers], root=tmp_path)))
    assert "| a (16, 32, 32) | 0.50× / 0.25× |" in text
    assert "| b (16, 32, 32) | 0.50× / 0.25× (graphs: 1.25× / 0.75×) |" in text
    assert "| c (16, 32, 32) | 0.50× / 0.25× (graphs: failed) |" in text
    assert text.count("replayed from a CUDA graph") == 1


def test_layer_profiles_are_read_and_tabulated(tmp_path):
    from adahop.harness.provenance import write_results

    def rec(layer, kind, us, **extra):
        return {"layer": layer, "kind": kind, "us_per_step": us, "layer_us_per_step": 100.0,
                "wall_us_per_step": 250.0, **extra}

    path = tmp_path / "results" / "layer_bench" / "gpu" / "profiles" / "q-o.json"
    write_results(path, [rec("uniform-iht", "gemm", 60.0), rec("uniform-iht", "quantize", 40.0),
                         rec("uniform-iht", "host", 400.0, ops=[{"name": "adahop::quantize", "calls_per_step": 3,
                                                                 "us_per_step": 120.0},
                                                                {"name": "aten::empty", "calls_per_step": 9,
                                                                 "us_per_step": 30.0}])],
                  config={"shape": [16, 32, 64]})
    write_results(tmp_path / "results" / "layer_bench" / "gpu" / "layers.json", [])
    files = report.profile_files("gpu", tmp_path)
    assert path in files and len(files) == 2
    res = report.Results(files, root=tmp_path)
    assert set(res.stage("layer_bench")) == {"layers"} and set(res.stage("layer_bench/profiles")) == {"q-o"}
    text = "\n".join(report.layer_profile_section(res))
    assert "| (16, 32, 64) | uniform-iht | 250 | 100 | 60 | 40 | — | — | — | 120 |" in text
    assert "results/layer_bench/gpu/profiles/q-o.json" in text


def test_committed_report_tabulates_the_layer_profiles():
    text = (ROOT / "docs" / "RESULTS.md").read_text()
    res = report.Results(COMMITTED)
    assert res.stage("layer_bench/profiles") and "\n".join(report.layer_profile_section(res)) in text


def test_throughput_rows_give_each_recipe_its_startup():
    res = report.Results(COMMITTED)
    rows = report.throughput_section(res)
    checked = 0
    for path in COMMITTED:
        if path.parent != ROOT / "results" / "throughput" / "gpu":  # the stage's files, not its profiles
            continue
        for r in json.loads(path.read_text())["records"]:
            if "error" in r:
                continue
            cell = "—" if r.get("untimed_s") is None else f"{r['untimed_s']:.0f} s"
            row = next(line for line in rows if line.startswith(f"| {path.stem} |") and f"| {r['recipe']} |" in line)
            assert row.split(" | ")[-2] == cell, row
            checked += cell != "—"
    assert checked > 0
