# End-to-end training throughput: tokens/s, MFU, peak memory and the GPU-busy share of wall time of
# each recipe of a run, measured one recipe after the other in one process (experiments/pretrain.py
# --throughput-only: random tokens, no eval, no checkpoints), so every recipe is timed beside its
# peers (adahop's recipes and torchao's float8 training). One results file per run. The runs of the
# profile's `throughput` section are one GPU each and part of `all`; those of `throughput_multi_gpu`
# (world_size > 1: one torchrun job, DDP or FSDP2, batch_size per rank) have their own target,
# `throughput_multi_gpu`, so that a one-GPU machine runs the profile. The script writes its file
# after each recipe, but Snakemake deletes the output of a failed job: --keep-incomplete keeps what
# a cut run measured.

THROUGHPUT = {run["name"]: run for run in config["throughput"]}
THROUGHPUT_MULTI_GPU = {run["name"]: run for run in config.get("throughput_multi_gpu") or []}
THROUGHPUT_RUNS = {**THROUGHPUT, **THROUGHPUT_MULTI_GPU}
_names = [r["name"] for r in config["throughput"] + (config.get("throughput_multi_gpu") or [])]
if len(THROUGHPUT_RUNS) < len(_names):
    raise WorkflowError(f"{CONFIG_FILE}: the throughput runs' names repeat: {_names}")
_several = sorted(name for name, run in THROUGHPUT.items() if run["world_size"] > 1)
if _several:
    logger.warning(f"{CONFIG_FILE}: throughput runs {_several} need several GPUs but are part of `all`; "
                   "throughput_multi_gpu keeps such runs apart")
# The script takes the pretrain section's settings as its defaults (precision, recipe_overrides,
# optimizer). Those a throughput run sets itself (the run's keys; no eval, checkpoints or token
# limit) are left out of the params, so that changing the training runs does not rerun these jobs.
THROUGHPUT_SETS = ("steps", "batch_size", "seq_len", "compile", "compile_mode", "fsdp", "max_tokens", "eval_interval",
                   "eval_batches", "checkpoint_interval", "keep_checkpoints", "log_interval")
THROUGHPUT_TRAIN_SETTINGS = {k: v for k, v in TRAIN_SETTINGS.items() if k not in THROUGHPUT_SETS}
# NVLink multicast stays off for a job over several GPUs (adahop.harness.train.MULTI_GPU_ENV says why).
MULTI_GPU_ENV = "NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1"

# Per run: python, or torchrun with one process per GPU on this node; the script's arguments
# (random tokens over the corpus's vocabulary size).
THROUGHPUT_LAUNCHER = {
    name: "python" if run["world_size"] == 1
    else f"env {MULTI_GPU_ENV} torchrun --standalone --nproc_per_node={run['world_size']}"
    for name, run in THROUGHPUT_RUNS.items()
}
THROUGHPUT_ARGS = {
    name: " ".join([
        f"--throughput-only --model {run['model']} --recipe {','.join(run['recipes'])}",
        "--compile" if run["compile"] else "--no-compile",
        *([f"--compile-mode {run['compile_mode']}"] if run.get("compile_mode") else []),
        f"--batch-size {run['batch_size']} --seq-len {run['seq_len']}",
        *([f"--grad-accum {run['grad_accum']}"] if run.get("grad_accum") else []),
        f"--steps {run['steps']} --untimed-steps {run['untimed_steps']}",
        f"--vocab-size {config['corpus']['vocab_size']}",
        *(["--fsdp"] if run.get("fsdp") else []),
        "--no-progress",
    ])
    for name, run in THROUGHPUT_RUNS.items()
}


rule throughput:
    input:
        script=stage_input("experiments/pretrain.py"),
    output:
        results_path("throughput", "{name}"),
    params:
        launcher=lambda wildcards: THROUGHPUT_LAUNCHER[wildcards.name],
        gpus=lambda wildcards: THROUGHPUT_RUNS[wildcards.name]["world_size"],
        args=lambda wildcards: THROUGHPUT_ARGS[wildcards.name],
        train=THROUGHPUT_TRAIN_SETTINGS,
    # Every local core: nothing else runs beside a timed run (Slurm: set-threads).
    threads: workflow.cores
    resources:
        gpu=lambda wildcards: THROUGHPUT_RUNS[wildcards.name]["world_size"],
    wildcard_constraints:
        name="|".join(THROUGHPUT_RUNS),
    log:
        log_path("throughput", "{name}"),
    shell:
        script_cmd("{input.script}", "{params.args} --results {output}", launcher="{params.launcher}",
                   gpus="{params.gpus}")


rule throughput_multi_gpu:
    input:
        [results_path("throughput", name) for name in THROUGHPUT_MULTI_GPU],
