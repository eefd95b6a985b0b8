# Strategy maps: for every run of a calibrating recipe (adahop, adahop-measured), the per-layer
# strategies its calibration fixes, replayed from the run's settings by experiments/strategies.py
# (its first calibration_steps steps; the map equals the run's strategies.json, tested). A replay
# rather than a copy of the run folder, so runs trained on a machine that is gone (the GPU
# campaign's) get their maps from a short job (about 2 min per 125m seed on an H200). Which recipes calibrate: config/schema.yaml.

with open(Path(workflow.basedir) / "config" / "schema.yaml") as f:
    CALIBRATING = yaml.safe_load(f)["$defs"]["calibrating_recipe"]["enum"]
CALIBRATING_RECIPES = [r for r in PRETRAIN["recipes"] if r in CALIBRATING]
CALIBRATING_RUNS = expand(RUN, model=PRETRAIN["models"], recipe=CALIBRATING_RECIPES, seed=PRETRAIN["seeds"])


rule strategies:
    input:
        script=stage_input("experiments/strategies.py"),
        corpus=[stage_input(p) for p in rules.corpus.output.data],
    output:
        results_path("strategies", RUN),
    params:
        train=lambda wildcards: run_settings(TRAIN_SETTINGS, wildcards.recipe),
    resources:
        gpu=1,
    log:
        log_path("strategies", RUN),
    shell:
        script_cmd(
            "{input.script}",
            "--model {wildcards.model} --recipe {wildcards.recipe} --seed {wildcards.seed}",
            f"--data {CORPUS_DIR} --out {{output}}",
            gpus=1,
        )
