# Memory per recipe: bytes saved for backward per layer and peak memory of a training step.


rule memory:
    input:
        script=stage_input("experiments/memory.py"),
        # the map a run fixed (config memory.strategy_map), when the profile names one
        strategy_map=[stage_input(p) for p in [config["memory"].get("strategy_map")] if p],
    output:
        results_path("memory", "memory"),
    params:
        memory=config["memory"],
    resources:
        gpu=1,
    log:
        log_path("memory"),
    shell:
        script_cmd("{input.script}", "--out {output}", gpus=1)
