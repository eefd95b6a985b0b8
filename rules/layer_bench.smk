# Layer benchmarks: forward + backward of one linear layer per recipe at real Llama shapes,
# against nn.Linear bf16 (and torchao float8 rowwise where importable) measured in the same run.
# experiments/layer_bench.py runs tests/bench/test_bench_layer.py through experiments/microbench.py.


rule layer_bench:
    input:
        script=stage_input("experiments/layer_bench.py"),
        runner=stage_input("experiments/microbench.py"),
        bench=[stage_input(p) for p in BENCH_FILES],
    output:
        results_path("layer_bench", "layers"),
    params:
        layer_bench=config["layer_bench"],
    # Every local core: nothing else runs beside a timed benchmark (Slurm: set-threads).
    threads: workflow.cores
    resources:
        gpu=1,
    log:
        log_path("layer_bench"),
    shell:
        script_cmd("{input.script}", "--out {output}", gpus=1)
