"""scripts/backfill_step_times.py: a committed record's step times come from its own metrics log only."""

import gzip
import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("backfill_step_times", REPO / "scripts" / "backfill_step_times.py")
backfill = importlib.util.module_from_spec(spec)
spec.loader.exec_module(backfill)


def write_log(path: Path, steps: int, final_val: float) -> Path:
    rows = [{"step": s, "tokens": 100 * s, "loss": 1.0, "tokens_per_s": 100.0} for s in range(1, steps + 1)]
    rows[-1]["val_loss"] = final_val
    rows.append({"step": steps, "event": "stopped", "reason": "test"})
    text = "".join(json.dumps(r) + "\n" for r in rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def test_the_log_that_made_the_record_is_the_one_matching_its_last_step_and_loss(tmp_path):
    record = {"name": "125m_adahop_s0", "steps": 6, "final_val_loss": 3.25}
    cut_off = write_log(tmp_path / "s1" / "125m_adahop_s0.metrics.jsonl", 4, 3.5)  # a try cut off earlier
    other = write_log(tmp_path / "s2" / "125m_adahop_s0.metrics.jsonl.gz", 6, 3.27)  # a repeat: another loss
    made = write_log(tmp_path / "s3" / "125m_adahop_s0.metrics.jsonl.gz", 6, 3.25)
    assert backfill.matching_log(record, [cut_off, other, made]) == (made, "")
    assert backfill.read_metrics(made)[-2]["val_loss"] == 3.25  # gzip read as text
    log, why = backfill.matching_log(record, [cut_off, other])
    assert log is None and "no log of 2 matches" in why
    twin = write_log(tmp_path / "s4" / "125m_adahop_s0.metrics.jsonl", 6, 3.25)
    log, why = backfill.matching_log(record, [made, twin])
    assert log is None and "2 logs match" in why  # ambiguous: left as it is
