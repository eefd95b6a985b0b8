# The device benchmarks alone (kernels, the linear layer, memory), e.g. on your own GPU under a
# copy of config/gpu.yaml with another `profile:` name, to set beside the committed H200 results
# (README, "On your own GPU").
rule benchmarks:
    input:
        rules.microbench.output,
        rules.layer_bench.output,
        rules.memory.output,
