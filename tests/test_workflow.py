"""The Snakemake workflow: lint, the DAG of every profile, the config schema, committed results,
a pretraining job cut by SIGTERM and resumed.

Each test runs snakemake (dry runs, and one tiny CPU pretraining job) in a copy of the workflow's
files in a temporary folder, so outputs already present in the repository (a smoke run,
committed GPU results) never change what a test sees.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
# Every figure script in paper_figs/ is one `figure` job of the workflow (both profiles calibrate,
# so both draw the strategy map).
N_FIGURES = len(list(ROOT.joinpath("paper_figs").glob("fig*.py")))
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
WORKFLOW_FILES = ("Snakefile", "rules", "config", "profiles", "experiments", "paper_figs", "tests/bench",
                  "adahop/harness/paper_reference.yaml", "adahop/harness/quality.py", "adahop/harness/study.py")
PROFILES = ("smoke", "gpu")
STAGE_RULES = ("corpus", "microbench", "layer_bench", "memory", "patterns", "pretrain", "throughput", "eval",
               "strategies")
GPU_RULES = ("microbench", "layer_bench", "memory", "patterns", "pretrain", "eval", "strategies")
CLAIM = "python experiments/claim_gpus.py {} -- "  # how a GPU stage's command starts
# The one lint left on purpose: software comes from setup.sh's virtual environment (README), not
# from a conda environment or container per rule.
ACCEPTED_LINTS = ("Specify a conda environment or container for each rule.",)


def stage_scripts() -> list[str]:
    """Every script a rule calls (the shell commands name them as inputs)."""
    text = "".join(p.read_text() for p in sorted((ROOT / "rules").glob("*.smk")))
    return sorted(set(re.findall(r"stage_input\(\"(experiments/[a-z_]+\.py)\"\)", text)))


def test_every_script_a_rule_calls_exists():
    # A missing stage script fails here (and in every dry run below), never skips a test.
    scripts = stage_scripts()
    assert scripts, "no rule names a stage script (stage_input(...)): the pattern above no longer matches"
    assert [s for s in scripts if not (ROOT / s).exists()] == []


def snakemake(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """Run snakemake; ``.output`` holds stdout and stderr together (its log goes to either)."""
    out = subprocess.run([str(SNAKEMAKE), *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    out.output = out.stdout + out.stderr
    return out


def job_counts(out: str) -> dict[str, int]:
    """The first "Job stats" table of snakemake's output as {rule: count}."""
    table = out.split("Job stats:", 1)[1].split("total", 1)[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", table, re.M)}


@pytest.fixture
def workflow(tmp_path: Path) -> Path:
    """A copy of the workflow's files (no results, no data, no .snakemake metadata)."""
    for name in WORKFLOW_FILES:
        src, dst = ROOT / name, tmp_path / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "out"))
        elif src.exists():
            shutil.copy2(src, dst)
    return tmp_path


def profile(name: str) -> dict:
    return yaml.safe_load((ROOT / "config" / f"{name}.yaml").read_text())


# --------------------------------------------------------------------------- lint and DAG


def test_lint_has_no_warnings_that_matter(workflow):
    out = snakemake(workflow, "--lint")
    titles = re.findall(r"^\s+\* (.+?):?$", out.output, re.M)
    assert titles, "snakemake --lint printed nothing: did it run?\n" + out.output[-2000:]
    assert [t for t in titles if t not in ACCEPTED_LINTS] == []


def planned_runs(name: str) -> int:
    """The pretraining runs profile ``name`` plans: models × (recipes × seeds + ablations)."""
    runs = profile(name)["pretrain"]
    ablations = runs.get("ablations", {"recipes": [], "seeds": []})
    return len(runs["models"]) * (len(runs["recipes"]) * len(runs["seeds"])
                                  + len(ablations["recipes"]) * len(ablations["seeds"]))


@pytest.mark.parametrize("name", PROFILES)
def test_dry_run_resolves_every_stage(workflow, name):
    out = snakemake(workflow, "-n", "all", "--configfile", f"config/{name}.yaml")
    assert out.returncode == 0, out.output[-3000:]
    assert "Using workflow specific profile profiles/default" in out.output
    counts = job_counts(out.output)
    runs = profile(name)["pretrain"]
    n_runs = planned_runs(name)
    calibrating = yaml.safe_load((ROOT / "config" / "schema.yaml").read_text())["$defs"]["calibrating_recipe"]["enum"]
    n_calibrating = len(runs["models"]) * sum(r in calibrating for r in runs["recipes"]) * len(runs["seeds"])
    assert counts == {**{r: 1 for r in STAGE_RULES}, "pretrain": n_runs, "eval": n_runs, "eval_table": 1, "quality_table": 1, "pattern_tables": 1, "figure": N_FIGURES, "report": 1,
                      "throughput": len(profile(name)["throughput"]), "strategies": n_calibrating, "all": 1}


def shell_commands(out: str) -> list[str]:
    """The shell commands a dry run prints (printshellcmds, profiles/default)."""
    return re.findall(r"^Shell command: (.+)$", out, re.M)


@pytest.mark.parametrize("name", PROFILES)
def test_throughput_runs_call_torchrun_only_for_several_processes(workflow, name):
    out = snakemake(workflow, "-n", "all", "--configfile", f"config/{name}.yaml")
    assert out.returncode == 0, out.output[-3000:]
    commands = {re.search(r"--results (\S+)", c)[1]: c for c in shell_commands(out.output) if "--throughput-only" in c}
    runs = profile(name)["throughput"]
    assert sorted(commands) == sorted(f"results/throughput/{name}/{run['name']}.json" for run in runs)
    for run in runs:
        command = commands[f"results/throughput/{name}/{run['name']}.json"]
        n = run["world_size"]
        launcher = f"torchrun --standalone --nproc_per_node={n} " if n > 1 else "python "
        assert command.startswith(CLAIM.format(n) + launcher + "experiments/pretrain.py --config "), command
        assert ("torchrun" in command) == (n > 1)
        for arg in (f"--model {run['model']}", f"--recipe {','.join(run['recipes'])}", f"--steps {run['steps']}",
                    f"--untimed-steps {run['untimed_steps']}", f"--batch-size {run['batch_size']}",
                    f"--seq-len {run['seq_len']}", "--compile" if run["compile"] else "--no-compile",
                    f"--vocab-size {profile(name)['corpus']['vocab_size']}", "--no-progress"):
            assert f"{arg} " in command, (arg, command)
        # A run's compile_mode reaches the script; a run without one takes the script's default.
        mode = run.get("compile_mode")
        assert (f"--compile-mode {mode} " in command) if mode else ("--compile-mode" not in command), command


@pytest.mark.parametrize("name", PROFILES)
def test_gpu_stages_claim_their_gpus_and_only_they(workflow, name):
    # Each GPU stage asks for GPUs (the gpu resource, which the default profile bounds at one in
    # all) and runs on as many that no other job holds; no other stage claims any.
    out = snakemake(workflow, "-n", "all", "--configfile", f"config/{name}.yaml")
    assert out.returncode == 0, out.output[-3000:]
    jobs = re.findall(r"^rule (\w+):\n(.*?)^Shell command: ([^\n]+)$", out.output, re.M | re.S)
    assert {rule for rule, _, _ in jobs} >= set(GPU_RULES) | {"corpus", "figure"}
    for rule, block, command in jobs:
        gpus = re.search(r"resources: .*\bgpu=(\d+)", block)
        assert bool(gpus) == (rule in GPU_RULES + ("throughput",)), (rule, block)
        assert command.startswith(CLAIM.format(gpus[1])) if gpus else "claim_gpus" not in command, command
    default = yaml.safe_load((ROOT / "profiles" / "default" / "config.yaml").read_text())
    assert default["resources"] == ["gpu=1"]


def test_multi_gpu_throughput_runs_have_their_own_target_and_keep_nvlink_multicast_off(workflow):
    runs = profile("gpu")["throughput_multi_gpu"]
    out = snakemake(workflow, "-n", "throughput_multi_gpu", "--configfile", "config/gpu.yaml")
    assert out.returncode == 0, out.output[-3000:]
    commands = {re.search(r"--results (\S+)", c)[1]: c for c in shell_commands(out.output) if "--throughput-only" in c}
    assert sorted(commands) == sorted(f"results/throughput/gpu/{run['name']}.json" for run in runs)
    for run in runs:
        command = commands[f"results/throughput/gpu/{run['name']}.json"]
        assert command.startswith(CLAIM.format(run["world_size"]) + "env NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 "
                                  f"NVSHMEM_DISABLE_NVLS=1 torchrun --standalone --nproc_per_node={run['world_size']} "), command
        assert ("--fsdp " in command) == bool(run.get("fsdp")), command
    assert any(run.get("fsdp") for run in runs) and any(not run.get("fsdp") for run in runs)
    # `all` (a one-GPU machine's run of the profile) asks for none of them.
    everything = snakemake(workflow, "-n", "all", "--configfile", "config/gpu.yaml")
    assert not any(run["name"] + ".json" in everything.output for run in runs)


def test_repeated_throughput_run_names_are_refused(workflow):
    bad = profile("smoke")
    bad["throughput"].append(dict(bad["throughput"][0]))
    (workflow / "config" / "bad.yaml").write_text(yaml.safe_dump(bad))
    out = snakemake(workflow, "-n", "all", "--configfile", "config/bad.yaml")
    assert out.returncode != 0
    assert "the throughput runs' names repeat" in out.output


def test_slurm_profile_gives_every_gpu_stage_one_gpu(workflow):
    # The plugin is in the workflow extra beside snakemake itself: missing, this fails.
    out = snakemake(workflow, "-n", "all", "--configfile", "config/gpu.yaml", "--workflow-profile", "profiles/slurm")
    assert out.returncode == 0, out.output[-3000:]
    text = out.output
    for rule in GPU_RULES:
        block = re.search(rf"^rule {rule}:\n(.*?)^\s*$", text, re.M | re.S)
        # The rule's gpu resource is the plugin's --gpus; a gres beside it the plugin refuses.
        assert block and re.search(r"\bgpu=1\b", block[1]) and "gres=" not in block[1], f"rule {rule}: {block}"
        assert "slurm_partition=gpu" in block[1], f"rule {rule} is not sent to the GPU partition"
    corpus = re.search(r"^rule corpus:\n(.*?)^\s*$", text, re.M | re.S)
    assert "gres" not in corpus[1]
    # A throughput run asks for its world_size in GPUs (the rule's gpu resource, --gpus=N).
    blocks = {re.search(r"output: (\S+)", b[1])[1]: b[1] for b in re.finditer(r"^rule throughput:\n(.*?)^\s*$", text, re.M | re.S)}
    for run in profile("gpu")["throughput"]:
        block = blocks[f"results/throughput/gpu/{run['name']}.json"]
        assert "slurm_partition=gpu" in block and re.search(rf"\bgpu={run['world_size']}\b", block), block


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize("name", PROFILES)
def test_profile_validates_against_the_schema(name):
    import jsonschema

    schema = yaml.safe_load((ROOT / "config" / "schema.yaml").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(profile(name))
    assert profile(name)["profile"] == name


@pytest.mark.parametrize(
    "edit, named",
    [
        (lambda c: c["pretrain"].update(recipes=["bf16", "fp8"]), "fp8"),
        (lambda c: c["pretrain"].update(stpes=10), "stpes"),
        (lambda c: c["eval"].update(limit=0), "limit"),
        (lambda c: c.pop("figures"), "figures"),
        (lambda c: c["throughput"][0].update(world_size=0), "world_size"),
        (lambda c: c["throughput"][0].pop("untimed_steps"), "untimed_steps"),
    ],
    ids=["unknown-recipe", "misspelt-key", "limit-zero", "missing-section", "throughput-no-processes",
         "throughput-run-incomplete"],
)
def test_bad_profile_is_refused_naming_the_problem(workflow, edit, named):
    bad = profile("smoke")
    edit(bad)
    (workflow / "config" / "bad.yaml").write_text(yaml.safe_dump(bad))
    out = snakemake(workflow, "-n", "all", "--configfile", "config/bad.yaml")
    assert out.returncode != 0
    assert "Error validating config file" in out.output and named in out.output


def test_ablations_that_repeat_a_run_are_refused(workflow):
    bad = profile("smoke")
    bad["pretrain"]["ablations"] = {"recipes": [bad["pretrain"]["recipes"][0]], "seeds": [bad["pretrain"]["seeds"][0]]}
    (workflow / "config" / "bad.yaml").write_text(yaml.safe_dump(bad))
    out = snakemake(workflow, "-n", "all", "--configfile", "config/bad.yaml")
    assert out.returncode != 0 and "pretrain.ablations repeats runs" in out.output
    run = f"{bad['pretrain']['models'][0]}_{bad['pretrain']['recipes'][0]}_s{bad['pretrain']['seeds'][0]}"
    assert run in out.output


def test_stage_settings_cannot_be_overridden_with_config(workflow):
    # The scripts read the profile file; a --config override would be seen by snakemake only.
    out = snakemake(workflow, "-n", "all", "--config", 'eval={"tasks": ["piqa"], "limit": 3}')
    assert out.returncode != 0
    assert "--config sets ['eval.limit', 'eval.tasks']" in out.output


def test_partial_profile_is_refused_naming_the_keys_it_lacks(workflow):
    partial = profile("gpu")
    del partial["eval"]["batch_size"]
    (workflow / "config" / "partial.yaml").write_text(yaml.safe_dump(partial))
    out = snakemake(workflow, "-n", "all", "--configfile", "config/partial.yaml")
    assert out.returncode != 0
    assert "does not set ['eval.batch_size']" in out.output


# --------------------------------------------------------------------------- committed results


def results_of(workflow: Path, name: str) -> list[str]:
    """The results files rule `all` asks for (from a dry run's summary of missing outputs)."""
    out = snakemake(workflow, "--summary", "all", "--configfile", f"config/{name}.yaml")
    assert out.returncode == 0, out.output[-3000:]
    return sorted({line.split("\t")[0] for line in out.stdout.splitlines() if line.startswith("results/")})


def write_empty_results(path: Path) -> None:
    """An empty results file at ``path``, gzip-compressed when it ends in ``.json.gz``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"provenance": {}, "records": []}).encode()
    path.write_bytes(gzip.compress(text, mtime=0) if path.name.endswith(".json.gz") else text)


def test_pattern_study_results_are_compressed_and_other_stages_plain(workflow):
    paths = results_of(workflow, "gpu")
    compressed = [p for p in paths if p.endswith(".gz")]
    plain = [p for p in paths if p.endswith(".json")]
    assert compressed == ["results/patterns/gpu/patterns.json.gz"]
    assert {p.split("/")[1] for p in plain} == {"corpus", "microbench", "layer_bench", "memory", "pretrain", "throughput",
                                                "eval", "quality", "pattern_summary", "strategies"}


def test_committed_pattern_results_are_all_compressed():
    # One convention within the stage: every committed file under results/patterns/ is gzip JSON.
    tracked = subprocess.run(["git", "ls-files", "results/patterns"], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    paths = tracked.stdout.split()
    assert all(p.endswith(".json.gz") for p in paths), paths
    for path in paths:
        with open(ROOT / path, "rb") as f:
            assert f.read(2) == b"\x1f\x8b", path


def test_committed_gpu_results_redraw_figures_only(workflow):
    # A fresh clone of committed GPU results: results present, no data/, no checkpoints, no
    # snakemake metadata, and scripts and profiles stamped *after* the results (git's order).
    for path in results_of(workflow, "gpu"):
        write_empty_results(workflow / path)
    later = time.time() + 60
    for path in [*workflow.joinpath("experiments").glob("*.py"), *workflow.joinpath("config").glob("*.yaml")]:
        os.utime(path, (later, later))

    committed = snakemake(workflow, "-n", "figures", "--configfile", "config/gpu.yaml", "--workflow-profile", "profiles/committed")
    assert committed.returncode == 0, committed.output[-3000:]
    # The figures and the eval table (both cheap, from the results alone) are redrawn; no stage runs.
    assert job_counts(committed.output) == {"figure": N_FIGURES, "eval_table": 1, "quality_table": 1, "pattern_tables": 1,
                                             "figures": 1}

    # A per-run figure none of whose runs is committed yet (the strategy maps before their GPU
    # replay) waits: `figures` draws the others and says so; `all` still asks for it.
    for path in (workflow / "results" / "strategies" / "gpu").glob("*.json"):
        path.unlink()
    waiting = snakemake(workflow, "-n", "figures", "--configfile", "config/gpu.yaml", "--workflow-profile", "profiles/committed")
    assert waiting.returncode == 0, waiting.output[-3000:]
    assert job_counts(waiting.output)["figure"] == N_FIGURES - 1 and "fig8_strategy_map reads is there yet" in waiting.output
    assert snakemake(workflow, "-n", "all", "--configfile", "config/gpu.yaml", "--workflow-profile",
                     "profiles/committed").returncode != 0

    # Without the switch the newer scripts would send every GPU stage to this machine.
    rerun = snakemake(workflow, "-n", "figures", "--configfile", "config/gpu.yaml")
    assert job_counts(rerun.output)["pretrain"] > 0


def test_committed_mode_names_a_missing_results_file(workflow):
    out = snakemake(workflow, "-n", "figures", "--configfile", "config/gpu.yaml", "--workflow-profile", "profiles/committed")
    assert out.returncode != 0
    assert "results_from: committed, but" in out.output and "results/" in out.output


def test_committed_mode_draws_one_figure_whose_results_are_there(workflow):
    for path in ("results/microbench/gpu/kernels.json", "results/layer_bench/gpu/layers.json"):
        write_empty_results(workflow / path)
    out = snakemake(workflow, "-n", "paper_figs/out/gpu/fig4_throughput.png", "--configfile", "config/gpu.yaml",
                    "--workflow-profile", "profiles/committed")
    assert out.returncode == 0, out.output[-3000:]
    assert job_counts(out.output) == {"figure": 1}


def test_committed_mode_draws_per_run_figures_from_the_runs_committed_so_far(workflow):
    # A campaign under way: two of the gpu profile's runs have pretraining and lm-eval results.
    runs = ["125m_bf16_s0", "125m_adahop_s0"]
    for run in runs:
        for stage in ("pretrain", "eval"):
            write_empty_results(workflow / f"results/{stage}/gpu/{run}.json")
    targets = ("paper_figs/out/gpu/fig3_loss.png", "paper_figs/out/gpu/fig6_lm_eval.png", "results/eval/gpu/table.md",
               "results/quality/gpu/quality.md")
    out = snakemake(workflow, "-n", *targets, "--configfile", "config/gpu.yaml", "--workflow-profile", "profiles/committed")
    assert out.returncode == 0, out.output[-3000:]
    assert job_counts(out.output) == {"figure": 2, "eval_table": 1, "quality_table": 1}
    assert f"2 of {planned_runs('gpu')} runs' results are there" in out.output and "results/pretrain/gpu/125m_mxfp4_s0.json" in out.output
    # `all` still wants every run
    out = snakemake(workflow, "-n", "all", "--configfile", "config/gpu.yaml", "--workflow-profile", "profiles/committed")
    assert out.returncode != 0 and "results_from: committed, but" in out.output


def test_committed_profile_finds_the_committed_gpu_throughput_files(workflow):
    # The committed runs of the gpu profile are under the name the rule writes; figure 7 draws from
    # them while a run not measured yet is named in a warning.
    paths = [f"results/throughput/gpu/{run['name']}.json" for run in profile("gpu")["throughput"]]
    committed = [p for p in paths if (ROOT / p).exists()]
    assert committed, f"no committed results for any of {paths}"
    target = ("paper_figs/out/gpu/fig7_e2e_throughput.png", "--configfile", "config/gpu.yaml",
              "--workflow-profile", "profiles/committed")
    out = snakemake(workflow, "-n", *target)
    assert out.returncode != 0 and all(p in out.output for p in paths), out.output[-3000:]
    for path in committed:
        (workflow / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / path, workflow / path)
    out = snakemake(workflow, "-n", *target)
    assert out.returncode == 0, out.output[-3000:]
    assert job_counts(out.output) == {"figure": 1}
    waiting = f"{len(committed)} of {len(paths)} runs' results are there"
    assert (waiting in out.output) == (len(committed) < len(paths)), out.output[-3000:]


# --------------------------------------------------------------------------- schema vs scripts


def script_keys() -> dict[str, set[str]]:
    """The keys each stage script accepts in its profile section, from the script itself."""
    import dataclasses
    import importlib.util

    def load(name):
        spec = importlib.util.spec_from_file_location(f"_schema_{name}", ROOT / "experiments" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(ROOT / "experiments"))
        try:
            spec.loader.exec_module(module)
        finally:
            sys.path.remove(str(ROOT / "experiments"))
        return module

    from adahop.harness.train import TrainConfig

    memory = load("memory")
    return {
        "corpus": set(load("build_corpus").DEFAULTS) - {"profile"},  # profile: the file's top-level key
        "memory": {"size", *memory.COMMON, *(k for size in memory.SIZES.values() for k in size)},
        "patterns": set(load("patterns").DEFAULTS),
        "eval": set(load("evaluate").DEFAULTS),
        # models × recipes × seeds (and ablations) choose the runs; the rest are TrainConfig fields.
        "pretrain": {"models", "recipes", "seeds", "ablations", *load("pretrain").SECTION_KEYS}
        | {f.name for f in dataclasses.fields(TrainConfig)} - {"model", "recipe", "seed"},
    }


def test_schema_sections_name_the_keys_each_script_reads():
    schema = yaml.safe_load((ROOT / "config" / "schema.yaml").read_text())
    for section, keys in script_keys().items():
        assert set(schema["properties"][section]["properties"]) == keys, section


def test_benchmarks_alone_under_a_renamed_gpu_profile(workflow):
    # README, "On your own GPU": a copy of the gpu profile under another name keeps our committed
    # results apart from yours; `benchmarks` runs the three device benchmark stages and nothing else.
    text = (workflow / "config" / "gpu.yaml").read_text()
    assert text.count("\nprofile: gpu\n") == 1
    (workflow / "config" / "mygpu.yaml").write_text(text.replace("\nprofile: gpu\n", "\nprofile: mygpu\n"))
    the_map = profile("gpu")["memory"]["strategy_map"]  # a committed gpu run's map, read, not remade
    (workflow / the_map).parent.mkdir(parents=True)
    shutil.copy2(ROOT / the_map, workflow / the_map)
    out = snakemake(workflow, "-n", "benchmarks", "--configfile", "config/mygpu.yaml")
    assert out.returncode == 0, out.output
    assert job_counts(out.output) == {"microbench": 1, "layer_bench": 1, "memory": 1, "benchmarks": 1}
    for path in ("results/microbench/mygpu/kernels.json", "results/layer_bench/mygpu/layers.json",
                 "results/memory/mygpu/memory.json"):
        assert path in out.output


# --------------------------------------------------------------------------- a cut run resumes


def job_processes(cwd: Path, script: str) -> list[int]:
    """Pids of the processes running ``script`` in folder ``cwd`` (read from /proc): the jobs of
    a snakemake started there, not its shell wrappers."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            inside = (proc / "cwd").resolve() == cwd.resolve()
        except (FileNotFoundError, PermissionError, ProcessLookupError, NotADirectoryError):
            continue
        if inside and argv[0].endswith(b"python") and script.encode() in argv:
            pids.append(int(proc.name))
    return pids


@pytest.mark.slow
def test_pretraining_cut_by_sigterm_keeps_its_run_folder_and_resumes_on_the_next_call(workflow, word_corpus):
    # A wall-time limit SIGTERMs the job: the script checkpoints the step and exits 75, Snakemake
    # fails the job and deletes its outputs; the run folder, not among them, keeps the checkpoint
    # from which the next `snakemake` call goes on.
    smoke = profile("smoke")
    smoke["pretrain"].update(recipes=["bf16"], seeds=[0], steps=30, batch_size=2, seq_len=32, eval_interval=0,
                             eval_batches=1, checkpoint_interval=0, log_interval=1, warmup_steps=2)
    (workflow / "config" / "smoke.yaml").write_text(yaml.safe_dump(smoke, sort_keys=False))
    # The corpus stage's outputs, newer than its script: present, not rebuilt (it downloads).
    data = workflow / "data" / smoke["corpus"]["name"]
    shutil.copytree(word_corpus(0, 40), data)
    (data / "manifest.json").write_text("{}")
    write_empty_results(workflow / "results" / "corpus" / "smoke" / f"{smoke['corpus']['name']}.json")
    run, target = workflow / "runs" / "smoke" / "tiny_bf16_s0", "results/pretrain/smoke/tiny_bf16_s0.json"
    assert snakemake(workflow, "-n", target).output.count("rule pretrain:") == 1  # only the run is to do

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen([str(SNAKEMAKE), target, "--cores", "1"], cwd=workflow, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not ((run / "metrics.jsonl").exists() and len((run / "metrics.jsonl").read_text().splitlines()) >= 3):
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()[0][-3000:]
            time.sleep(0.1)
        jobs = job_processes(workflow, "experiments/pretrain.py")
        assert len(jobs) == 1, jobs
        os.kill(jobs[0], signal.SIGTERM)
        output, _ = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert first.returncode != 0, output[-3000:]
    assert "exit status 75" in output, output[-3000:]
    assert not (workflow / target).exists()
    checkpoints = [c.name for c in (run / "checkpoints").iterdir()]
    assert len(checkpoints) == 1, checkpoints
    cut = int(checkpoints[0].removeprefix("step_").removesuffix(".pt"))
    assert 3 <= cut < smoke["pretrain"]["steps"], checkpoints

    second = snakemake(workflow, target, "--cores", "1")
    assert second.returncode == 0, second.output[-3000:]
    (record,) = json.loads((workflow / target).read_text())["records"]
    # One segment from step 0 and one from the checkpoint: resumed, not restarted.
    assert [s["from_step"] for s in record["segments"]] == [0, cut]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r and "event" not in r] == list(range(1, smoke["pretrain"]["steps"] + 1))
    assert {"step": cut, "event": "stopped", "reason": "signal SIGTERM"} in rows

    # A run's params are its own settings: naming another recipe in compile_recipes leaves it done;
    # naming its own flips its compile and reruns it (Snakemake's params trigger).
    smoke["pretrain"]["compile"] = True
    for only, to_do in ((["mxfp4"], 0), (["bf16"], 1)):
        smoke["pretrain"]["compile_recipes"] = only
        (workflow / "config" / "smoke.yaml").write_text(yaml.safe_dump(smoke, sort_keys=False))
        assert snakemake(workflow, "-n", target).output.count("rule pretrain:") == to_do, only
