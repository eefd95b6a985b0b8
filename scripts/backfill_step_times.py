"""Add where the training time went (``adahop.train.step_times``: ``train_s``, ``step_s``,
``first_s``, ``calibration``) to committed pretraining results made before the records carried it,
from the run's own committed metrics log.

    python scripts/backfill_step_times.py [--profile gpu] [--dry-run]

For every ``results/pretrain/<profile>/*.json`` record without ``train_s``, the log is the one
``results/logs/*/<run>.metrics.jsonl[.gz]`` whose last step and last held-out loss are the record's
(a run tried in several sessions left one log per try; only the one that made the record matches
both). The recipe's calibration windows come from the record's recipe and the run's config
(``recipe_overrides``, its steps). The record gains the fields and the file's provenance a
``derived`` entry naming the log, this script and the commit it ran at; nothing else changes. A
record whose log is missing or ambiguous is left as it is, and said so.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

from adahop.provenance import REPO_ROOT, atomic_write_text, git_state
from adahop.recipes import get_recipe
from adahop.train import step_times


def read_metrics(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def matching_log(record: dict, logs: list[Path]) -> tuple[Path | None, str]:
    """The one log whose last step and last held-out loss are the record's, or None and why."""
    found = []
    for path in logs:
        rows = read_metrics(path)
        steps = [r["step"] for r in rows if "loss" in r]
        vals = [r["val_loss"] for r in rows if r.get("val_loss") is not None]
        if steps and vals and steps[-1] == record["steps"] and vals[-1] == record["final_val_loss"]:
            found.append(path)
    if len(found) == 1:
        return found[0], ""
    return None, (f"{len(found)} logs match" if found else f"no log of {len(logs)} matches") + " its last step and held-out loss"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", default="gpu")
    p.add_argument("--dry-run", action="store_true", help="say what would change, write nothing")
    args = p.parse_args(argv)
    commit, dirty = git_state()
    if commit is None or dirty:
        print("backfill_step_times: run it at a clean commit (the provenance names it)", file=sys.stderr)
        return 2
    left = 0
    for path in sorted((REPO_ROOT / "results" / "pretrain" / args.profile).glob("*.json")):
        doc = json.loads(path.read_text())
        changed = False
        for record in doc["records"]:
            if "train_s" in record:
                continue
            logs = sorted(REPO_ROOT.glob(f"results/logs/*/{record['name']}.metrics.jsonl*"))
            log, why = matching_log(record, logs)
            if log is None:
                print(f"left    {path.name}: {why}")
                left += 1
                continue
            config = doc["provenance"].get("config") or {}
            recipe = get_recipe(record["recipe"], **{"seed": config.get("seed", 0), **(config.get("recipe_overrides") or {})})
            times = step_times(read_metrics(log), recipe.calibration_windows(record["steps"]))
            record.update(times)
            doc["provenance"].setdefault("derived", []).append({
                "fields": sorted(times), "record": record["name"], "from": str(log.relative_to(REPO_ROOT)),
                "by": "scripts/backfill_step_times.py", "git_commit": commit})
            changed = True
            cal = times["calibration"]
            print(f"{'would add' if args.dry_run else 'added'}  {path.name}: train {times['train_s']:.0f} s, "
                  f"step {times['step_s']:.3f} s" + (f", calibration {cal['s']:.0f} s ({100 * cal['share']:.1f}%), "
                                                    f"step after {cal['after_s']:.0f} s" if cal else "")
                  + f" <- {log.relative_to(REPO_ROOT)}")
        if changed and not args.dry_run:
            atomic_write_text(path, json.dumps(doc, indent=1) + "\n")
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
