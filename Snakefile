# adahop: `snakemake all` runs every stage of the profile and draws every figure.
# Profiles: config/smoke.yaml (default, CPU, minutes) and config/gpu.yaml (--configfile); see README.


configfile: "config/smoke.yaml"


include: "rules/common.smk"
include: "rules/corpus.smk"
include: "rules/microbench.smk"
include: "rules/layer_bench.smk"
include: "rules/memory.smk"
include: "rules/benchmarks.smk"
include: "rules/pretrain.smk"
include: "rules/strategies.smk"
include: "rules/throughput.smk"
include: "rules/patterns.smk"
include: "rules/eval.smk"
include: "rules/figures.smk"
include: "rules/report.smk"


rule all:
    input:
        ALL_RESULTS,
        TABLES,
        FIGURES,
        REPORT,
