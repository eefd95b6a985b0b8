# Pretraining: one run per (model size, recipe, seed) on the profile's corpus.
#
# The run folder runs/<profile>/<run>/ (checkpoints, metrics, the exported hf/ model) is a param,
# not an output: Snakemake deletes a job's outputs before it runs and when it fails, and a run cut
# at a wall-time limit (SIGTERM: checkpoint, exit 75) must keep its checkpoints, so that the next
# `snakemake` resumes it there. The results file, written once training ends, is the output that
# says the run is done. A run whose settings change meets checkpoints written with other settings:
# the script refuses it, naming the changed keys; delete its run folder to start it again.

PRETRAIN = config["pretrain"]
# Keys of the pretrain section that choose which runs exist; the others are training settings
# (fields of adahop.harness.train.TrainConfig) that the script reads, and the params of each run.
PRETRAIN_MATRIX_KEYS = ("models", "recipes", "seeds", "ablations")
TRAIN_SETTINGS = {k: v for k, v in PRETRAIN.items() if k not in PRETRAIN_MATRIX_KEYS}

RUN = "{model}_{recipe}_s{seed}"
RUNS = expand(RUN, model=PRETRAIN["models"], recipe=PRETRAIN["recipes"], seed=PRETRAIN["seeds"])
# Ablation runs (their own recipes and seeds) join the runs the tables and figures 3 and 6 read.
ABLATIONS = PRETRAIN.get("ablations", {})
RUNS += expand(RUN, model=PRETRAIN["models"], recipe=ABLATIONS.get("recipes", []), seed=ABLATIONS.get("seeds", []))
_twice = sorted({run for run in RUNS if RUNS.count(run) > 1})
if _twice:
    raise WorkflowError(f"pretrain.ablations repeats runs of pretrain.recipes × seeds: {_twice}")


wildcard_constraints:
    model="[a-z0-9]+",
    recipe="[a-z0-9-]+",
    seed=r"\d+",


rule pretrain:
    input:
        script=stage_input("experiments/pretrain.py"),
        corpus=[stage_input(p) for p in rules.corpus.output.data],
    output:
        results=results_path("pretrain", RUN),
    params:
        run=f"runs/{PROFILE}/{RUN}",
        train=lambda wildcards: run_settings(TRAIN_SETTINGS, wildcards.recipe),
    resources:
        gpu=1,
    log:
        log_path("pretrain", RUN),
    shell:
        script_cmd(
            "{input.script}",
            "--model {wildcards.model} --recipe {wildcards.recipe} --seed {wildcards.seed}",
            f"--data {CORPUS_DIR} --out {{params.run}} --results {{output.results}} --no-progress",
            gpus=1,
        )
