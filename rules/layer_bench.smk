# Layer benchmarks: forward + backward of one linear layer per recipe at real Llama shapes,
# against nn.Linear bf16 (and torchao float8 where importable) measured in the same run.


rule layer_bench:
    input:
        script=stage_input("experiments/layer_bench.py"),
    output:
        results_path("layer_bench", "layers"),
    params:
        layer_bench=config["layer_bench"],
    log:
        log_path("layer_bench"),
    shell:
        script_cmd("{input.script}", "--out {output}")
