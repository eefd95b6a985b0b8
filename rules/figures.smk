# The paper figures: one seaborn script per figure in paper_figs/, reading only results/, writing
# paper_figs/out/<profile>/<figure>.png and .pdf.
#
# With `results_from: committed` the figures are drawn from results/ as committed (e.g. the GPU
# campaign's) without running any stage here: the stage rules' inputs are ancient (common.smk),
# so nothing upstream of a present results file reruns, and a results file that is missing is an
# error rather than a GPU stage started on this machine (results_inputs, common.smk).

import glob

FIGURE_DIR = f"paper_figs/out/{PROFILE}"
# Throughput files kept under names of their own beside the configured runs (a recipe measured
# later, another GPU) are drawn with them in figure 7, as the report lists every file of the stage.
THROUGHPUT_EXTRA = sorted(set(glob.glob(f"results/throughput/{PROFILE}/*.json"))
                          - {results_path("throughput", name) for name in THROUGHPUT})
# Likewise layer files beside layers.json in figure 4 (a variant layers.json lacks).
LAYER_EXTRA = sorted(set(glob.glob(f"results/layer_bench/{PROFILE}/*.json")) - {results_path("layer_bench", "layers")})
FIGURE_INPUTS = {
    "fig1_patterns": [results_path("patterns", "patterns")],
    "fig2_pair_error": [results_path("patterns", "patterns")],
    "fig3_loss": [results_path("pretrain", run) for run in RUNS],
    "fig4_throughput": [results_path("microbench", "kernels"), results_path("layer_bench", "layers")] + LAYER_EXTRA,
    "fig5_memory": [results_path("memory", "memory")],
    "fig6_lm_eval": [results_path("eval", run) for run in RUNS],
    "fig7_e2e_throughput": [results_path("throughput", name) for name in THROUGHPUT] + THROUGHPUT_EXTRA,
    "fig9_train_time": [results_path("pretrain", run) for run in RUNS],
    "fig10_paired_gaps": [results_path(stage, run) for stage in ("pretrain", "eval") for run in RUNS],
}
if CALIBRATING_RUNS:  # a profile without adahop has no strategy map to draw
    FIGURE_INPUTS["fig8_strategy_map"] = [results_path("strategies", run) for run in CALIBRATING_RUNS]
# Figures of per-run results (pretraining, lm-eval, throughput runs): with committed results, drawn
# from the runs committed so far while a campaign is under way (common.smk, results_inputs).
PER_RUN_FIGURES = ("fig3_loss", "fig6_lm_eval", "fig7_e2e_throughput", "fig8_strategy_map", "fig9_train_time",
                   "fig10_paired_gaps")
# Read beside the results: the paper's own numbers, each citing its table.
FIGURE_REFERENCES = {"fig6_lm_eval": ["adahop/harness/paper_reference.yaml"]}
# Library code a figure computes with (a change there redraws it): figure 3's gap to bf16 is
# adahop.harness.quality's, the same points the quality table lists; figure 9's means are its train_time;
# figure 10's differences its paired section.
FIGURE_CODE = {"fig3_loss": ["adahop/harness/quality.py"], "fig9_train_time": ["adahop/harness/quality.py"],
               "fig10_paired_gaps": ["adahop/harness/quality.py"]}
ALL_RESULTS = results_inputs(
    sorted({path for paths in FIGURE_INPUTS.values() for path in paths} | {rules.corpus.output.results})
)
TABLES = [rules.eval_table.output.md, rules.eval_table.output.csv, rules.quality_table.output.md,
          rules.quality_table.output.json, rules.pattern_tables.output.md, rules.pattern_tables.output.json]
FIGURES = expand(f"{FIGURE_DIR}/{{figure}}.{{ext}}", figure=FIGURE_INPUTS, ext=("png", "pdf"))


# With committed results, a per-run figure none of whose runs is committed yet waits: `figures`
# skips it with a warning (`all` still asks for it).
WAITING = [f for f in PER_RUN_FIGURES if f in FIGURE_INPUTS and none_committed(FIGURE_INPUTS[f])]
for figure in WAITING:
    logger.warning(f"results_from: committed: none of the {len(FIGURE_INPUTS[figure])} results files {figure} "
                   f"reads is there yet; `figures` skips it")
FIGURES_NOW = expand(f"{FIGURE_DIR}/{{figure}}.{{ext}}", figure=[f for f in FIGURE_INPUTS if f not in WAITING],
                     ext=("png", "pdf"))


rule figure:
    input:
        script="paper_figs/{figure}.py",
        common="paper_figs/common.py",  # the shared look and palette: a change redraws every figure
        results=lambda wildcards: results_inputs(
            FIGURE_INPUTS[wildcards.figure], partial=wildcards.figure in PER_RUN_FIGURES
        )(wildcards),
        references=lambda wildcards: FIGURE_REFERENCES.get(wildcards.figure, []),
        code=lambda wildcards: FIGURE_CODE.get(wildcards.figure, []),
    output:
        png=f"{FIGURE_DIR}/{{figure}}.png",
        pdf=f"{FIGURE_DIR}/{{figure}}.pdf",
    params:
        figures=config["figures"],
        stem=lambda wildcards, output: output.png[: -len(".png")],
    wildcard_constraints:
        figure="|".join(FIGURE_INPUTS),
    log:
        log_path("figure", "{figure}"),
    shell:
        script_cmd("{input.script}", "--out {params.stem} {input.results}")


rule figures:
    input:
        FIGURES_NOW,
        TABLES,
