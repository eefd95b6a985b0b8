# Kernel microbenchmarks: pytest tests/bench --benchmark-only, each figure beside the ceilings
# measured in the same run (copy bandwidth, cuBLAS bf16, cuBLAS fp8).


rule microbench:
    input:
        script=stage_input("experiments/microbench.py"),
    output:
        results_path("microbench", "kernels"),
    params:
        microbench=config["microbench"],
    log:
        log_path("microbench"),
    shell:
        script_cmd("{input.script}", "--out {output}")
