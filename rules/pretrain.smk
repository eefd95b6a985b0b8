# Pretraining: one run per (model size, recipe, seed) on the profile's corpus.
#
# The run folder is an output as a whole, so a rerun (changed settings, changed script) starts
# from scratch instead of resuming from checkpoints written with other settings. A run that was
# interrupted outside Snakemake resumes by calling the script by hand with the same --out.

PRETRAIN = config["pretrain"]
# Keys of the pretrain section that choose which runs exist; the others are training settings
# (fields of adahop.train.TrainConfig) that the script reads, and the params every run shares.
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
        run=directory(f"runs/{PROFILE}/{RUN}"),
    params:
        train=TRAIN_SETTINGS,
    log:
        log_path("pretrain", RUN),
    shell:
        script_cmd(
            "{input.script}",
            "--model {wildcards.model} --recipe {wildcards.recipe} --seed {wildcards.seed}",
            f"--data {CORPUS_DIR} --out {{output.run}} --results {{output.results}} --no-progress",
        )
