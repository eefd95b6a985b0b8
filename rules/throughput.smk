# End-to-end training throughput: tokens/s, MFU and peak memory of each recipe of a run, measured
# one recipe after the other in one process (experiments/pretrain.py --throughput-only: random
# tokens, no eval, no checkpoints), so every recipe is timed beside its peers. One results file per
# run of the profile's throughput section; a run with world_size > 1 is one DDP job (torchrun,
# batch_size per rank). The script writes its file after each recipe, but Snakemake deletes the
# output of a failed job: --keep-incomplete keeps what a cut run measured.

THROUGHPUT = {run["name"]: run for run in config["throughput"]}
if len(THROUGHPUT) < len(config["throughput"]):
    raise WorkflowError(f"{CONFIG_FILE}: the throughput runs' names repeat: {[r['name'] for r in config['throughput']]}")
# The script takes the pretrain section's settings as its defaults (precision, recipe_overrides,
# optimizer). Those a throughput run sets itself (the run's keys; no eval, checkpoints or token
# limit) are left out of the params, so that changing the training runs does not rerun these jobs.
THROUGHPUT_SETS = ("steps", "batch_size", "seq_len", "compile", "max_tokens", "eval_interval", "eval_batches",
                   "checkpoint_interval", "keep_checkpoints", "log_interval")
THROUGHPUT_TRAIN_SETTINGS = {k: v for k, v in TRAIN_SETTINGS.items() if k not in THROUGHPUT_SETS}

# Per run: python, or torchrun with one process per GPU on this node; the script's arguments
# (random tokens over the corpus's vocabulary size).
THROUGHPUT_LAUNCHER = {
    name: "python" if run["world_size"] == 1 else f"torchrun --standalone --nproc_per_node={run['world_size']}"
    for name, run in THROUGHPUT.items()
}
THROUGHPUT_ARGS = {
    name: " ".join([
        f"--throughput-only --model {run['model']} --recipe {','.join(run['recipes'])}",
        "--compile" if run["compile"] else "--no-compile",
        f"--batch-size {run['batch_size']} --seq-len {run['seq_len']}",
        f"--steps {run['steps']} --untimed-steps {run['untimed_steps']}",
        f"--vocab-size {config['corpus']['vocab_size']} --no-progress",
    ])
    for name, run in THROUGHPUT.items()
}


rule throughput:
    input:
        script=stage_input("experiments/pretrain.py"),
    output:
        results_path("throughput", "{name}"),
    params:
        launcher=lambda wildcards: THROUGHPUT_LAUNCHER[wildcards.name],
        args=lambda wildcards: THROUGHPUT_ARGS[wildcards.name],
        train=THROUGHPUT_TRAIN_SETTINGS,
    # Every local core: nothing else runs beside a timed run (Slurm: set-threads).
    threads: workflow.cores
    resources:
        gpu=lambda wildcards: THROUGHPUT[wildcards.name]["world_size"],
    wildcard_constraints:
        name="|".join(THROUGHPUT),
    log:
        log_path("throughput", "{name}"),
    shell:
        script_cmd("{input.script}", "{params.args} --results {output}", launcher="{params.launcher}")
