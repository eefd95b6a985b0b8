# The outlier-pattern study: operands of every linear layer captured over short training runs
# (and a package-shipped pretrained model), labelled row/col/none per GEMM orientation, and the
# output error of each strategy per pattern pair. Its runs take the pretrain section's settings.
# Its results are megabytes of per-layer records: gzip-compressed JSON (COMPRESSED_STAGES, common.smk).


rule patterns:
    input:
        script=stage_input("experiments/patterns.py"),
        corpus=[stage_input(p) for p in rules.corpus.output.data + rules.corpus.output.text],
    output:
        results_path("patterns", "patterns"),
    params:
        patterns=config["patterns"],
        train=TRAIN_SETTINGS,
    resources:
        gpu=1,
    log:
        log_path("patterns"),
    shell:
        script_cmd("{input.script}", f"--data {CORPUS_DIR} --out {{output}}", gpus=1)


rule pattern_tables:
    input:
        script="experiments/pattern_tables.py",
        module="adahop/harness/study.py",  # the summaries' arithmetic: a change there regenerates them
        results=results_inputs([results_path("patterns", "patterns")]),
    output:
        md=f"results/pattern_summary/{PROFILE}/summary.md",
        json=f"results/pattern_summary/{PROFILE}/summary.json",
    log:
        log_path("pattern_tables"),
    shell:
        # The study's summaries (label distributions, stability, the table's agreement with the
        # lowest-error option, calibration drift) recomputed from its records (adahop.harness.study).
        script_cmd("{input.script}", f"--out results/pattern_summary/{PROFILE}/summary {{input.results}}")
