# Kernel microbenchmarks: pytest tests/bench --benchmark-only (the profile's microbench.select
# leaves the layer benchmarks to layer_bench), each figure beside the ceilings measured in the same
# run (copy bandwidth, cuBLAS bf16, cuBLAS fp8). The benchmark files are inputs: editing one reruns.

BENCH_FILES = sorted(str(p) for p in Path("tests/bench").glob("*.py"))


rule microbench:
    input:
        script=stage_input("experiments/microbench.py"),
        bench=[stage_input(p) for p in BENCH_FILES],
    output:
        results_path("microbench", "kernels"),
    params:
        microbench=config["microbench"],
    # Every local core: nothing else runs beside a timed benchmark (Slurm: set-threads).
    threads: workflow.cores
    resources:
        gpu=1,
    log:
        log_path("microbench"),
    shell:
        script_cmd("{input.script}", "--out {output}", gpus=1)
