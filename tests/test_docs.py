"""The documentation holds together: DESIGN references resolve, README's paths exist, and no
comment or docstring cites a commit of this repository (history lives in git and in results
files' provenance, not in the code's comments)."""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
from pathlib import Path

import pytest

from adahop.harness.provenance import read_results

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "DESIGN.md"
README = ROOT / "README.md"
# "DESIGN §1", "DESIGN.md §3", "DESIGN §1, §3": the sections a reference names.
REFERENCE = re.compile(r"DESIGN(?:\.md)?\s+(§\s*\d+(?:\s*(?:,|and)\s*§\s*\d+)*)")
HEX = re.compile(r"(?<![0-9A-Za-z_])[0-9a-f]{7,40}(?![0-9A-Za-z_])")
COMMENTED = (".py", ".smk", ".yaml", ".yml", ".sh")


def tracked(*suffixes: str, names: tuple[str, ...] = ()) -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / f for f in out.split() if f.endswith(suffixes) or Path(f).name in names]


def design_sections() -> set[int]:
    return {int(m[1]) for m in re.finditer(r"^## §(\d+) ", DESIGN.read_text(), re.M)}


def design_references() -> list[tuple[str, int, int]]:
    """(file:line, section) of every DESIGN reference in a tracked text file."""
    refs = []
    for path in tracked(".py", ".smk", ".yaml", ".md", ".sh", ".toml", names=("Snakefile",)):
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for m in REFERENCE.finditer(line):
                for section in re.findall(r"§\s*(\d+)", m[1]):
                    refs.append((f"{path.relative_to(ROOT)}:{n}", int(section), m[0]))
    return refs


def test_design_has_numbered_sections():
    assert design_sections() >= {1, 2, 3, 4}


def test_every_design_reference_names_a_section_that_exists():
    refs = design_references()
    assert refs, "no DESIGN reference found: is the pattern right?"
    sections = design_sections()
    broken = [f"{where}: {text!r} (DESIGN.md has §{sorted(sections)})" for where, section, text in refs
              if section not in sections]
    assert not broken, "references to sections docs/DESIGN.md does not have:\n" + "\n".join(broken)


def test_the_reference_pattern_reads_lists_of_sections():
    found = [re.findall(r"§\s*(\d+)", m[1]) for m in REFERENCE.finditer("(DESIGN §1, §3) and DESIGN.md §7")]
    assert found == [["1", "3"], ["7"]]


# --------------------------------------------------------------------------- commit hashes in comments


def python_comments(text: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of a Python source."""
    out = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                out.append((tok.start[0], tok.string))
        tree = ast.parse(text)
    except (SyntaxError, tokenize.TokenError):
        return out
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                    and isinstance(body[0].value.value, str):
                for i, line in enumerate(body[0].value.value.splitlines()):
                    out.append((body[0].lineno + i, line))
    return out


def hash_comments(text: str) -> list[tuple[int, str]]:
    """(line, text) of every ``#`` comment of a shell, YAML or Snakemake file, and of the
    triple-quoted blocks (docstrings) of a Snakemake file."""
    out, in_doc = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if in_doc or line.lstrip().startswith(('"""', "'''")):
            out.append((n, line))
            quotes = line.count('"""') + line.count("'''")
            in_doc = in_doc != (quotes % 2 == 1)
            continue
        m = re.search(r"(?:^|\s)#.*$", line)
        if m:
            out.append((n, m[0]))
    return out


def comments(path: Path) -> list[tuple[int, str]]:
    text = path.read_text(errors="replace")
    return python_comments(text) if path.suffix == ".py" else hash_comments(text)


def commits_of_this_repo(candidates: set[str]) -> set[str]:
    """Those of ``candidates`` that name a commit in this repository's history."""
    if not candidates:
        return set()
    ordered = sorted(candidates)
    out = subprocess.run(["git", "cat-file", "--batch-check"], cwd=ROOT, capture_output=True, text=True, check=True,
                         input="".join(f"{c}^{{commit}}\n" for c in ordered)).stdout.splitlines()
    return {c for c, line in zip(ordered, out) if not line.endswith("missing") and " commit " in line}


def commented_hashes(paths: list[Path]) -> list[str]:
    """``file:line: hash`` for every commit of this repository named in a comment or docstring."""
    found = [(path, n, h) for path in paths for n, text in comments(path) for h in HEX.findall(text)]
    commits = commits_of_this_repo({h for _, _, h in found})
    return sorted(f"{shown(p)}:{n}: {h}" for p, n, h in found if h in commits)


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


@pytest.fixture(scope="module")
def history():
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True)
    if shallow.returncode != 0:
        pytest.skip("not a git checkout")
    if shallow.stdout.strip() == "true":
        pytest.skip("a shallow clone lacks the history the commits are looked up in")


def test_no_comment_or_docstring_cites_a_commit(history):
    hits = commented_hashes(tracked(*COMMENTED, names=("Snakefile",)))
    assert not hits, ("comments and docstrings say why, in the present tense; history lives in git and in results "
                      "files' provenance. Commits cited:\n" + "\n".join(hits))


def test_the_commit_check_finds_a_commit_in_a_comment_and_not_elsewhere(history, tmp_path):
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout[:9]
    src = tmp_path / "m.py"
    src.write_text(f'"""Module doc, measured at {head}."""\n\nX = "{head}"  # not a comment hash: deadbeef1\n'
                   f"# fixed at {head}\n")
    (tmp_path / "c.yaml").write_text(f"key: {head}   # measured at {head}\n")
    found = commented_hashes([src, tmp_path / "c.yaml"])
    assert found == [f"c.yaml:1: {head}", f"m.py:1: {head}", f"m.py:4: {head}"]


# --------------------------------------------------------------------------- README


def test_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= 300, f"README.md has {n} lines; keep it to what a user needs first (details: docs/)"


def test_readme_paths_and_images_exist():
    text = README.read_text()
    links = re.findall(r"\]\(([^)#\s]+)[^)]*\)", text)
    paths = re.findall(r"`((?:scripts|experiments|config|profiles|rules|docs|paper_figs|adahop|kernels|tests)/[\w./-]+)`", text)
    missing = sorted({p for p in [*links, *paths] if not p.startswith("http") and "<" not in p
                      and not (ROOT / p).exists()})
    assert not missing, f"README.md names paths that do not exist: {missing}"
    assert "docs/RESULTS.md" in links and "docs/DESIGN.md" in links


def test_docs_name_no_path_that_does_not_exist():
    missing = []
    for doc in (ROOT / "docs").glob("*.md"):
        for p in re.findall(r"`((?:scripts|experiments|rules|profiles|kernels)/[\w./-]+)`", doc.read_text()):
            if not (ROOT / p).exists():
                missing.append(f"{doc.name}: {p}")
    assert not missing, missing


def words(path: Path) -> str:
    """The file's text with every run of whitespace one space: prose quoted across line breaks."""
    return " ".join(path.read_text().split())


def test_kernels_readme_compile_times_are_the_results_file():
    """The hash operators' paragraph quotes results/microbench/cpu/hash-ops-ab.json."""
    text = words(ROOT / "kernels" / "README.md")
    for device in ("cpu", "gpu"):
        records = read_results(ROOT / "results" / "microbench" / device / "hash-ops-ab.json")["records"]
        by = {(r["recipe"], r["variant"]): r for r in records}
        for recipe in ("hot", "tseng"):
            op, traced = by[(recipe, "op")], by[(recipe, "traced")]
            for r in (op, traced):
                assert f"{r['first_compiled_step_s']:.1f} s" in text and f"`{recipe}`" in text, (device, recipe)
        if device == "gpu":
            op, traced = by[("hot", "op")], by[("hot", "traced")]
            for r in (op, traced):
                assert f"{r['layer_fwd_bwd_s'] * 1e3:.1f} ms" in text, r["variant"]
                assert f"{r['layer_peak_bytes'] / 2**20:.0f} MiB" in text, r["variant"]
            op, traced = by[("tseng", "op")], by[("tseng", "traced")]
            assert f"{op['compiled_step_s']:.3f} s against {traced['compiled_step_s']:.3f} s" in text


def test_design_hot_speed_and_memory_figures_are_the_results_files():
    """DESIGN's HOT paragraphs quote the memory, layer, throughput and profile files they name."""
    text = words(DESIGN)
    res = ROOT / "results"

    def span(values, fmt="{:.2f}"):
        return f"{fmt.format(min(values))}–{fmt.format(max(values))}"

    mem = read_results(res / "memory" / "gpu" / "memory-hot-layers.json")["records"]
    hot = [r for r in mem if r["recipe"] == "hot"]
    fixed = [r["bf16_over_peak_bytes"] for r in hot if r["phase"] == "fixed"]
    calibrating = [r["bf16_over_peak_bytes"] for r in hot if r["phase"] == "calibrating"]
    saved = {round(r["bf16_over_saved_activation_bytes"], 1) for r in hot if r["phase"] == "fixed"}
    # bf16_over_peak_bytes is bf16's peak over the recipe's: below 1, the recipe's layer peaks higher.
    assert f"bf16's layer peak is {span(fixed)}× of HOT's fixed layer's" in text
    assert f"and {span(calibrating)}× of its calibrating layer's" in text
    before = [r["bf16_over_peak_bytes"] for r in read_results(res / "memory" / "gpu" / "memory.json")["records"]
              if r["recipe"] == "hot" and r["what"] == "layer"]
    assert f"(bf16's layer peak {span(before)}× of theirs)" in text
    assert len(saved) == 1 and f"{saved.pop():.1f}× fewer activation bytes" in text

    layers = read_results(res / "layer_bench" / "gpu" / "layers-hot.json")["records"]
    ratios = [r["ratio_to_peers"]["nn.Linear-bf16"] for r in layers
              if r["op"].endswith("[hot]") and "host-overhead" not in r["test"]]
    assert f"{span(ratios)}× of `nn.Linear` bf16" in text

    tput = {r["recipe"]: r["tokens_per_s"] for r in
            read_results(res / "throughput" / "gpu" / "125m_cudagraphs_hot.json")["records"]}
    assert f"{tput['hot'] / tput['bf16']:.2f}× bf16 under CUDA graphs where adahop trains at " \
           f"{tput['adahop'] / tput['bf16']:.2f}×" in text

    profile = (res / "throughput" / "gpu" / "profiles" / "profile_125m_cudagraphs_hot.txt").read_text()
    by_gpu = profile.split("== sorted by self_cuda_time_total")[1].split("== sorted by")[0]

    def share(kernel):
        line = next(ln for ln in by_gpu.splitlines() if kernel in ln)
        return float(re.findall(r"([\d.]+)%", line)[2])  # Self CPU %, CPU total %, Self CUDA %

    assert f"{share('i161616gemm_s8_forwardCompat'):.0f}% of HOT's GPU time" in text
    assert f"the rounding operator ({share('_hot_round_kernel'):.0f}%)" in text
    tput = {r["recipe"]: r["tokens_per_s"] for r in
            read_results(res / "throughput" / "gpu" / "125m_cudagraphs_hot_int8mm.json")["records"]}
    assert f"trains at {tput['hot'] / tput['bf16']:.2f}× bf16 under CUDA graphs (`results/throughput/gpu/" \
           "125m_cudagraphs_hot_int8mm.json`)" in text


GPU_THROUGHPUT = ROOT / "results" / "throughput" / "gpu"


def test_design_cuda_graph_pool_figures_are_the_results_file():
    text = words(DESIGN)
    recs = {r["recipe"]: r for r in
            read_results(ROOT / "results" / "throughput" / "gpu" / "125m_cudagraphs_hot.json")["records"]}
    pools = [f"{recs[r]['memory_at_start']['reserved_gib']:.1f} GiB" for r in ("bf16", "adahop", "hot")]
    assert f"began with {pools[0]} reserved for bf16, {pools[1]} for adahop and {pools[2]} for hot" in text
    tensors = {f"{r['peak_allocated_gib']:.1f}" for r in recs.values()}
    assert len(tensors) == 1 and f"peaked at {tensors.pop()} GiB in each" in text
    compiled = {r["recipe"]: r["peak_mem_gib"] for r in
                read_results(ROOT / "results" / "throughput" / "gpu" / "125m_compile.json")["records"]}
    assert f"{compiled['adahop']:.1f} against {compiled['bf16']:.1f} GiB" in text

    recs = {r["recipe"]: r for r in
            read_results(GPU_THROUGHPUT / "history" / "125m_cudagraphs_adahop-2026-12-05-5af21ac.json")["records"]}

    def recording_peak(rec):
        """Tensors allocated at the step that recorded the graphs: the last untimed step above the
        level every replay holds."""
        steps = rec["untimed_peak_allocated_gib"]
        replay = steps[-1]
        return next(steps[i - 1] for i in range(1, len(steps)) if steps[i] <= replay + 0.05 < steps[i - 1])

    a, b = recs["adahop"], recs["bf16"]
    assert (f"allocated at most {recording_peak(a):.1f} GiB for adahop against {recording_peak(b):.1f} GiB for bf16"
            in text)
    assert (f"began with {a['memory_at_start']['reserved_gib']:.1f} against {b['memory_at_start']['reserved_gib']:.1f} "
            f"GiB reserved (peaks {a['peak_mem_gib']:.1f} against {b['peak_mem_gib']:.1f} GiB)") in text
    calibration = a["config"]["recipe_overrides"]["calibration_steps"]  # the untimed steps that calibrate, eagerly
    assert f"allocated up to {max(a['untimed_peak_allocated_gib'][:calibration]):.1f} GiB there" in text

    # With the chunked loss: adahop's calibration and timed peaks against bf16's, each in a process of its own.
    (a,) = read_results(GPU_THROUGHPUT / "125m_cudagraphs_adahop.json")["records"]
    (b,) = read_results(GPU_THROUGHPUT / "125m_cudagraphs_bf16_h100.json")["records"]
    assert (f"now allocates at most {max(a['untimed_peak_allocated_gib'][:calibration]):.1f} GiB "
            f"(`125m_cudagraphs_adahop.json`) against the {recording_peak(b):.1f} GiB of bf16's recording step") in text
    assert f"timed steps peak at {a['peak_mem_gib']:.1f} against {b['peak_mem_gib']:.1f} GiB" in text
    (new,), (old,) = (read_results(GPU_THROUGHPUT / "ab" / f"125m_compile_loss_{v}.json")["records"]
                      for v in ("chunked", "f_cross_entropy"))
    assert (f"bf16 at 125m ran {new['tokens_per_s']:,.0f} tokens/s with it and {old['tokens_per_s']:,.0f} with "
            f"`F.cross_entropy`") in text
    assert f"{new['peak_mem_gib']:.1f}" == f"{old['peak_mem_gib']:.1f}" and f"both peaking at {new['peak_mem_gib']:.1f} GiB" in text
    bf16, adahop = read_results(GPU_THROUGHPUT / "1b_cudagraphs_h100.json")["records"]
    assert (f"allocated up to {max(adahop['untimed_peak_allocated_gib']):.1f} GiB against bf16's "
            f"{max(bf16['untimed_peak_allocated_gib']):.1f}") in text
    assert (f"ran {adahop['tokens_per_s'] / bf16['tokens_per_s']:.2f}× bf16 with peaks of {adahop['peak_mem_gib']:.1f} "
            f"against {bf16['peak_mem_gib']:.1f} GiB") in text
    (oom_run,) = read_results(GPU_THROUGHPUT / "history" / "3b_cudagraphs_h100-bf16-adahop-oom-2026-12-06.json")["records"]
    assert f"({oom_run['params'] * 16 / 1e9:.1f} GB for its {oom_run['params']:,})" in text
    # 3b after the fix: adahop's eager calibration beside bf16's recording step, in one process.
    bf16, adahop = read_results(GPU_THROUGHPUT / "history" / "3b_cudagraphs_h100-2026-12-06.json")["records"]
    assert bf16["allocated_before_gib"] == adahop["allocated_before_gib"] == 0.0
    assert (f"allocates at most {max(adahop['untimed_peak_allocated_gib'][:calibration]):.1f} GiB against the "
            f"{recording_peak(bf16):.1f} GiB of bf16's graph-recording step") in text
    assert (f"run {adahop['tokens_per_s']:,.0f} against {bf16['tokens_per_s']:,.0f} tokens/s "
            f"({adahop['tokens_per_s'] / bf16['tokens_per_s']:.2f}×) with peaks of {adahop['peak_mem_gib']:.1f} against "
            f"{bf16['peak_mem_gib']:.1f} GiB") in text
    assert (f"took {adahop['untimed_s']:.0f} s against bf16's {bf16['untimed_s']:.0f}" in text
            and f"{adahop['untimed_step_s'][calibration]:.0f} s of them" in text)


def test_hot_round_docstring_figures_are_the_results_file():
    text = words(ROOT / "kernels" / "hot_round.py")
    recs = read_results(ROOT / "results" / "microbench" / "gpu" / "hot-round.json")["records"]

    def spans(rounding):
        rs = [r for r in recs if f"-{rounding}-" in r["test"]]
        copy = [r["ratio"] for r in rs]
        ref = [r["ratio_to_peers"]["reference"] for r in rs]
        return f"{min(copy):.2f}–{max(copy):.2f}", (min(ref), max(ref))

    (rne_copy, rne_ref), (sr_copy, sr_ref) = spans("rne"), spans("sr")
    assert f"{rne_copy} of the same-run copy bandwidth to nearest and {sr_copy} stochastically" in text
    assert f"{rne_ref[0]:.1f}–{rne_ref[1]:.1f}× and {sr_ref[0]:.0f}–{sr_ref[1]:.0f}× the speed" in text


def test_design_hot_pretraining_figures_are_the_results_files():
    text = words(DESIGN)
    runs = {p.stem: read_results(p)["records"][0] for p in (ROOT / "results" / "pretrain" / "gpu").glob("125m_*_s*.json")}
    hot, bf16 = runs["125m_hot_s0"], runs["125m_bf16_s0"]
    losses = {r: [f"{runs[f'125m_{r}_s{seed}']['final_val_loss']:.3f}" for seed in (0, 1, 2)] for r in ("hot", "bf16")}
    assert (f"end at held-out losses of {', '.join(losses['hot'][:2])} and {losses['hot'][2]} against "
            f"bf16's {', '.join(losses['bf16'][:2])} and {losses['bf16'][2]}") in text
    gaps = [r["final_val_loss"] - runs[f"125m_bf16_s{name.rsplit('_s', 1)[1]}"]["final_val_loss"]
            for name, r in runs.items() if r["recipe"] not in ("bf16", "hot")]
    assert gaps and max(gaps) < 0.06 and "every MXFP4 recipe of the suite ends within 0.06 of bf16" in text

    def val(run, step):
        return next(p["val_loss"] for p in run["val_curve"] if p["step"] == step)

    assert f"({val(hot, 100):.3f} against {val(bf16, 100):.3f} at step 100)" in text
    assert (f"HOT's held-out loss falls by {val(hot, 500) - hot['final_val_loss']:.3f}, bf16's by "
            f"{val(bf16, 500) - bf16['final_val_loss']:.3f}") in text


def test_design_launched_path_figures_are_the_results_files():
    """DESIGN §6's account of the launched path at model scale quotes its runs' files."""
    text = words(DESIGN)
    launched = read_results(GPU_THROUGHPUT / "ab" / "1b_cudagraphs_launches_h100.json")
    assert launched["provenance"]["backend_env"] == {"ADAHOP_INDUCTOR_LAUNCHES": "1"}
    bf16, ada = launched["records"]
    calibration = ada["config"]["recipe_overrides"]["calibration_steps"]
    assert (f"untimed steps took {ada['untimed_s']:.0f} s, {ada['untimed_step_s'][calibration]:.0f} s of them the first "
            f"compiled step after the {calibration} eager calibration steps") in text
    assert (f"ran {ada['tokens_per_s']:,.0f} against bf16's {bf16['tokens_per_s']:,.0f} tokens/s "
            f"({ada['tokens_per_s'] / bf16['tokens_per_s']:.2f}×), the GPU busy "
            f"{ada['gpu_busy']['busy_fraction']:.0%} of the time") in text
    op_bf16, op_ada = read_results(GPU_THROUGHPUT / "1b_cudagraphs_h100.json")["records"]
    assert (f"untimed steps took {op_ada['untimed_s']:.0f} s and it ran "
            f"{op_ada['tokens_per_s'] / op_bf16['tokens_per_s']:.2f}× bf16") in text
    phase = ada["compile_phase_s"]
    assert (f"AOT's metadata pass took {phase['aot_collect_metadata']:.1f} s and bytecode tracing "
            f"{phase['bytecode_tracing']:.1f} s; Inductor's scheduler ({phase['Scheduler.__init__']:.1f} s, its fusion "
            f"{phase['Scheduler.fused_nodes']:.1f} s) and code generation ({phase['GraphLowering.codegen']:.1f} s)") in text
    (stopped,) = [r for r in read_results(GPU_THROUGHPUT / "history" / "1b_cudagraphs_h100-launches-startup-2026-12-07.json")
                  ["records"] if r["recipe"] == "adahop"]
    phase = stopped["compile_phase_s"]
    assert (f"spent {phase['aot_collect_metadata']:.1f} s in AOT's metadata pass and {phase['bytecode_tracing']:.1f} s "
            f"in Dynamo's bytecode tracing, of which {phase['get_fake_value']:.1f} s fake-tensor propagation") in text
    # The register caps the launched path lost: each step's capped config against the same one uncapped.
    sweep = read_results(ROOT / "results" / "microbench" / "gpu" / "history" / "quantize-sweep-2026-12-05-h100.json")["records"]

    def figure(step, block_m, warps, cap):
        (r,) = [r for r in sweep if r["test"].startswith(step) and r["config"] == {
            "BLOCK_M": block_m, "BLOCK_K": 128, "num_warps": warps, "maxnreg": cap}]
        return r["figure"]

    gains = [figure(step, m, w, cap) / figure(step, m, w, None)
             for step, m, w, cap in (("X-forward", 32, 4, 64), ("W[", 128, 8, 128), ("dY-backward", 128, 16, 64))]
    assert f"ran {gains[0]:.2f}×, {gains[1]:.2f}× and {gains[2]:.2f}× their uncapped selves" in text
