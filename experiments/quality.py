"""The quality gap of every recipe to bf16: ``<out>.md`` and ``<out>.json`` from results files.

    python experiments/quality.py --out results/quality/<profile>/quality \\
        results/pretrain/<profile>/*.json results/eval/<profile>/<run>.json ...

Pretraining results (records with ``final_val_loss``) and lm-eval results (records with ``task``)
may come in any order and number: a campaign under way gives the runs done so far. The JSON
follows the results convention (its provenance lists each source file's commit); both files are
regenerated on every call (they derive from the sources alone). With ``--planned RUN,RUN,...``
(the workflow passes the profile's runs) the table ends with the plan's progress: which runs are
evaluated, trained only, or not run yet. See :mod:`adahop.harness.quality`.
"""

from __future__ import annotations

import sys

from adahop.harness.provenance import atomic_write_text, read_results, table_script_args, write_results
from adahop.harness.quality import markdown, progress, quality_rows, split_records


def main(argv: list[str] | None = None) -> int:
    def planned_option(p):
        p.add_argument("--planned", type=lambda s: [r for r in s.split(",") if r],
                       help="comma-separated run names the profile plans (<model>_<recipe>_s<seed>)")

    args = table_script_args(__doc__, "pretraining and lm-eval results files", argv, planned_option)
    docs = [(str(path), read_results(path)) for path in args.results]
    commits = {path: doc["provenance"].get("git_commit") for path, doc in docs}
    pretrain, evals = split_records(docs)
    rows = quality_rows(pretrain, evals)
    if not rows:
        print(f"quality: no pretraining or lm-eval records in {len(args.results)} file(s)", file=sys.stderr)
        return 1
    sources = [str(p) for p in args.results]
    state = progress(args.planned, pretrain, evals) if args.planned is not None else None
    config = {"sources": sources} | ({"planned": args.planned, "progress": state} if state is not None else {})
    write_results(args.out.with_suffix(".json"), rows, config=config, overwrite=True,
                  extra_provenance={"source_commits": commits})
    atomic_write_text(args.out.with_suffix(".md"), markdown(rows, sources, progress_state=state, commits=commits))
    print(f"quality: {len(rows)} rows -> {args.out}.md, {args.out}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
