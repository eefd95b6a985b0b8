# adahop: `snakemake all` runs every stage of the profile and draws every figure.
# Profiles: config/smoke.yaml (default, CPU, minutes) and config/gpu.yaml (--configfile); see README.


configfile: "config/smoke.yaml"


include: "rules/common.smk"
include: "rules/corpus.smk"
include: "rules/microbench.smk"
include: "rules/layer_bench.smk"
include: "rules/memory.smk"
include: "rules/pretrain.smk"
include: "rules/strategies.smk"
include: "rules/throughput.smk"
include: "rules/patterns.smk"
include: "rules/eval.smk"
include: "rules/figures.smk"


rule all:
    input:
        ALL_RESULTS,
        TABLES,
        FIGURES,


# The device benchmarks alone (kernels, the linear layer, memory), e.g. on your own GPU under a
# copy of config/gpu.yaml with another `profile:` name, to set beside the committed H200 results
# (README, "On your own GPU").
rule benchmarks:
    input:
        rules.microbench.output,
        rules.layer_bench.output,
        rules.memory.output,
