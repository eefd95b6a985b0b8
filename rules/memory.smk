# Memory per recipe: bytes saved for backward per layer and peak memory of a training step.


rule memory:
    input:
        script=stage_input("experiments/memory.py"),
    output:
        results_path("memory", "memory"),
    params:
        memory=config["memory"],
    log:
        log_path("memory"),
    shell:
        script_cmd("{input.script}", "--out {output}")
