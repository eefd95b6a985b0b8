"""Two benchmark results files side by side: the same tests, their figures and ratios, old → new.

    python experiments/compare_bench.py OLD.json NEW.json [--select REGEX] [--out FILE.md]

For results of ``experiments/microbench.py`` or ``experiments/layer_bench.py`` (records with
``test``, ``figure``, ``unit``, ``ratio`` to the run's ceiling and ``ratio_to_peers``): e.g. your
GPU's run against the committed H200 one, or a re-measure against the run it replaces. Records are
matched by test id. Each row: the figure in both runs and new/old, the ratio to each run's own
ceiling, and the ratio to every peer both runs measured. Cross-run figures differ with the device
and its state; the ratios to same-run ceilings and peers are what compare across runs. Tests in one
file only are listed after the table. Writes Markdown to stdout, or atomically to ``--out``.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path
from typing import Any

from adahop.harness.provenance import atomic_write_text, read_results

REQUIRED = ("test", "figure", "unit")


def bench_records(path: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``(provenance, {test id: record})`` of a benchmark results file; a clear error otherwise."""
    doc = read_results(path)
    records = {}
    for i, r in enumerate(doc["records"]):
        missing = [k for k in REQUIRED if k not in r]
        if missing:
            raise ValueError(f"{path}: record {i} lacks {missing}: not a benchmark results file "
                             "(experiments/microbench.py or experiments/layer_bench.py)")
        if r["test"] in records:
            raise ValueError(f"{path}: test {r['test']!r} appears twice")
        records[r["test"]] = r
    return doc["provenance"], records


def _f(x: float | None, digits: int = 2) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _figure(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"


def _label(prov: dict[str, Any]) -> str:
    commit = (prov.get("git_commit") or "?")[:7] + (" (dirty)" if prov.get("git_dirty") else "")
    return f"{(prov.get('device') or {}).get('name', '?')}, commit {commit}, {prov.get('date', '?')}"


def compare(old: Path, new: Path, select: str | None = None) -> str:
    """The Markdown comparison of two benchmark results files (see the module docstring)."""
    (old_prov, a), (new_prov, b) = bench_records(old), bench_records(new)
    pattern = re.compile(select) if select else None
    a = {t: r for t, r in a.items() if pattern is None or pattern.search(t)}
    b = {t: r for t, r in b.items() if pattern is None or pattern.search(t)}
    keep = [t for t in a if t in b]
    if not keep:
        raise ValueError(f"{old} and {new} share no test" + (f" matching {select!r}" if select else ""))
    peers = sorted({p for t in keep for p in a[t].get("ratio_to_peers", {}) if p in b[t].get("ratio_to_peers", {})})
    head = ["test", "unit", "old", "new", "new/old", "old ÷ ceiling", "new ÷ ceiling",
            *[f"{side} ÷ {p}" for p in peers for side in ("old", "new")]]
    lines = [f"# Benchmarks: {new} against {old}", "",
             f"- old: `{old}` ({_label(old_prov)})", f"- new: `{new}` ({_label(new_prov)})", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    quotients = []
    for t in keep:
        ra, rb = a[t], b[t]
        if ra["unit"] != rb["unit"]:
            raise ValueError(f"test {t!r} is in {ra['unit']} in {old} but {rb['unit']} in {new}")
        q = rb["figure"] / ra["figure"] if ra["figure"] else None
        if q is not None:
            quotients.append(q)
        cells = [f"`{t}`", ra["unit"], _figure(ra["figure"]), _figure(rb["figure"]), _f(q),
                 _f(ra.get("ratio")), _f(rb.get("ratio"))]
        for p in peers:
            cells += [_f(ra.get("ratio_to_peers", {}).get(p)), _f(rb.get("ratio_to_peers", {}).get(p))]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"{len(keep)} tests in both; new/old median {_f(statistics.median(quotients))}, "
                  f"range {_f(min(quotients))}–{_f(max(quotients))}." if quotients else f"{len(keep)} tests in both."]
    for name, only in (("old", [t for t in a if t not in b]), ("new", [t for t in b if t not in a])):
        if only:
            lines.append(f"Only in {name} ({len(only)}): " + ", ".join(f"`{t}`" for t in only) + ".")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old", type=Path, help="the baseline results file")
    p.add_argument("new", type=Path, help="the results file compared with it")
    p.add_argument("--select", help="only tests whose id matches this regular expression")
    p.add_argument("--out", type=Path, help="write the Markdown here instead of stdout")
    args = p.parse_args(argv)
    text = compare(args.old, args.new, args.select)
    if args.out:
        atomic_write_text(args.out, text)
        print(f"compare_bench: {args.out}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
