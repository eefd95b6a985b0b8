# The outlier-pattern study: operands of every linear layer captured over a short training run,
# labelled row/col/none per GEMM orientation, and the output error of each strategy per pair.


rule patterns:
    input:
        script=stage_input("experiments/patterns.py"),
        corpus=[stage_input(f"{CORPUS_DIR}/{name}") for name in CORPUS_FILES],
    output:
        results_path("patterns", "patterns"),
    params:
        patterns=config["patterns"],
    log:
        log_path("patterns"),
    shell:
        script_cmd("{input.script}", f"--data {CORPUS_DIR} --out {{output}}")
