# The results report: every table of it read from the profile's results files, every figure
# embedded (experiments/report.py). The gpu profile's report is the committed docs/RESULTS.md;
# another profile's goes beside it as docs/RESULTS-<profile>.md (git-ignored), so a smoke run
# never overwrites the committed one.
#
# Redraw it from the committed GPU results on any machine:
#   .venv/bin/snakemake report --configfile config/gpu.yaml --workflow-profile profiles/committed

import glob

REPORT = "docs/RESULTS.md" if PROFILE == "gpu" else f"docs/RESULTS-{PROFILE}.md"
# Files of the profile beside the ones a rule writes (the GPU kernel tests, a measurement kept
# under its own name) are read too: the report reads every file directly under
# results/<stage>/<profile>/ and its profiles/ folder, and a predecessor kept in history/ is not one of them.
REPORT_EXTRA = sorted(p for pattern in ("*.json", "*.json.gz") for folder in ("", "profiles/")
                      for p in glob.glob(f"results/*/{PROFILE}/{folder}{pattern}"))

REPORT_RUNS = {path for name in PER_RUN_FIGURES if name in FIGURE_INPUTS for path in FIGURE_INPUTS[name]}


rule report:
    input:
        script="experiments/report.py",
        reference="adahop/harness/paper_reference.yaml",
        # Per-run files of a campaign that may be under way: those there are reported, the rest named
        # in a warning (as the per-run figures do); every other results file must be there.
        runs=results_inputs(sorted(REPORT_RUNS), partial=True),
        results=results_inputs(sorted((
            {path for paths in FIGURE_INPUTS.values() for path in paths}
            | {rules.corpus.output.results, rules.quality_table.output.json, rules.pattern_tables.output.json}
            | set(REPORT_EXTRA)
        ) - REPORT_RUNS)),
        figures=[f for f in FIGURES if f.endswith(".png")],
    output:
        REPORT,
    log:
        log_path("report"),
    shell:
        script_cmd("{input.script}", f"--out {{output}} --figures {FIGURE_DIR}")
