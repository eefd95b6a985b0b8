"""The kernel tests on this machine's device, kept as a results file: ``results/kernel_tests/``.

    python experiments/kernel_tests.py --out results/kernel_tests/gpu/tests.json
    python experiments/kernel_tests.py --select pattern_stats --out /tmp/tests.json   # a subset

CI has no GPU: there the kernels run in Triton's interpreter (tests/conftest.py), so whether they
compile and agree with their references on a real GPU is only known from a run on one. This runs
``pytest tests/kernels tests/test_formats.py`` (or the given paths) in a subprocess, with
``--junitxml`` (pytest's own report), and writes one record per test through
:func:`adahop.harness.provenance.write_results`: ``test`` (its pytest node id), ``outcome`` (passed,
failed, error or skipped; an xfail counts as skipped), ``duration_s`` and ``message`` (the failure's
or skip's first line, else None). The provenance adds pytest's command and exit code and the GPUs'
state before and after (the device the kernels compiled for is the provenance's ``device``).

``--skip-passed FILE...``: leave out the tests that passed in earlier results files of this kind of
device (same device type and name; a pass elsewhere says nothing here), so that a suite too slow for
one job's time limit is covered over several: each job's file holds the tests it ran, the earlier files
the rest (its provenance ``config.skip_passed`` names them). A pass is taken at the commit it was
made at (each file's provenance names it): after a kernel changes, run its tests again without
``--skip-passed``.

``--configs``: the autotuned kernels launch with the first config that fits each variant
(``first``, the default: one compile per variant instead of one per config, and no timing;
``tests/kernels/test_kernel_configs.py`` runs every config against the reference), or autotune
each launch as training does (``tuned``). The choice is in the provenance's ``config``.

``--budget-s``: pytest is interrupted then (SIGINT, as Ctrl-C) and still reports the tests it
finished: the file keeps them (not the one it stopped in, nor those after), its provenance says
``pytest_interrupted_by: budget`` and ``pytest_interrupted_after_s``, and pytest's exit code is 2.
SIGTERM or SIGINT to this script (``timeout``, Ctrl-C) interrupts it the same way
(``pytest_interrupted_by: SIGTERM``). Give it a job's time limit less a margin, so a slow suite
still leaves a record of what ran.

Exit status: pytest's (a failing test fails the stage) once the file is written; 1 without any
test report (pytest could not start, or was killed: nothing is written then).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

import microbench  # experiments/ is on sys.path when this script runs
from adahop.harness.provenance import device_description, read_results, write_results
from adahop_kernels._common import KERNEL_CONFIG_ENV

DEFAULT_PATHS = ["tests/kernels", "tests/test_formats.py"]
# junit elements of a test that did not pass, worst first: a test with an error in its teardown
# after a failed call is an error.
OUTCOMES = (("error", "error"), ("failure", "failed"), ("skipped", "skipped"))


def node_id(case: ET.Element) -> str:
    """The pytest node id of a junit ``testcase`` (xunit1: ``file``, ``classname``, ``name``):
    the file, then the class path (``classname`` past the file's module path), then the name."""
    file = case.get("file")
    classname, name = case.get("classname", ""), case.get("name", "")
    if not file:
        return f"{classname}::{name}" if classname else name
    module = file[:-3].replace("/", ".") if file.endswith(".py") else file.replace("/", ".")
    classes = classname[len(module):].lstrip(".") if classname.startswith(module) else ""
    return "::".join([file, *classes.split(".")] if classes else [file]) + f"::{name}"


def records_from_junit(xml_text: str) -> list[dict[str, Any]]:
    """One record per ``testcase`` of a pytest junit report (``-o junit_family=xunit1``). An interrupted
    run reports the test it stopped in as a nameless, outcome-less ``testcase``: it is left out."""
    records = []
    for case in ET.fromstring(xml_text).iter("testcase"):
        if not case.get("name"):
            continue
        outcome, message = "passed", None
        for tag, name in OUTCOMES:
            element = case.find(tag)
            if element is not None:
                outcome = name
                text = element.get("message") or element.text or ""
                message = text.strip().splitlines()[0] if text.strip() else None
                break
        records.append({"test": node_id(case), "outcome": outcome,
                        "duration_s": float(case.get("time") or 0.0), "message": message})
    return records


def passed_before(files: list[Path], device: dict[str, Any]) -> list[str]:
    """The node ids that passed in the results ``files``, each of which must come from a device of
    ``device``'s type and name."""
    ids: set[str] = set()
    for path in files:
        if not path.is_file():
            raise FileNotFoundError(f"--skip-passed {path}: no such results file")
        doc = read_results(path)
        theirs = doc["provenance"].get("device") or {}
        if (theirs.get("type"), theirs.get("name")) != (device["type"], device["name"]):
            raise ValueError(f"--skip-passed {path}: its tests ran on {theirs.get('name')!r} ({theirs.get('type')}), "
                             f"this machine's device is {device['name']!r} ({device['type']}): a pass there "
                             "says nothing here")
        ids.update(r["test"] for r in doc["records"] if r["outcome"] == "passed")
    return sorted(ids)


def run_tests(paths: list[str], select: str | None, junit: Path, budget_s: float | None = None,
              deselect: list[str] = (), configs: str = "first") -> tuple[int, list[str], dict, str | None]:
    """pytest over ``paths`` with a junit report (:func:`microbench.run_pytest`), less the
    ``deselect`` node ids; ``configs``: the autotuned kernels' ``$ADAHOP_KERNEL_CONFIG``."""
    args = [*paths, "-q", "-rfEs", "-p", "no:cacheprovider", f"--junitxml={junit}", "-o", "junit_family=xunit1"]
    if select:
        args += ["-k", select]
    for node in deselect:
        args += ["--deselect", node]
    return microbench.run_pytest("kernel_tests", args, env={KERNEL_CONFIG_ENV: configs}, interrupt_after_s=budget_s)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("paths", nargs="*", default=DEFAULT_PATHS,
                   help=f"test files or folders, relative to the repo root (default: {' '.join(DEFAULT_PATHS)})")
    p.add_argument("--select", help="pytest -k expression")
    p.add_argument("--configs", default="first", choices=["first", "tuned"],
                   help="autotuned kernels: one config per variant (default; tests/kernels/test_kernel_configs.py "
                        "runs every config), or each launch autotuned as in training (a compile per config)")
    p.add_argument("--out", type=Path, required=True, help="results file (e.g. results/kernel_tests/gpu/tests.json)")
    p.add_argument("--overwrite", action="store_true", help="replace a results file of another selection")
    microbench.add_budget_argument(p, "tests")
    p.add_argument("--skip-passed", type=Path, nargs="+", default=[], metavar="FILE",
                   help="leave out the tests that passed in these results files (of this kind of device)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    skip = passed_before(args.skip_passed, device_description())
    if skip:
        print(f"kernel_tests: leaving out {len(skip)} tests that passed in {', '.join(map(str, args.skip_passed))}")
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        rc, cmd, gpu, interrupted = run_tests(args.paths, args.select, junit, args.budget_s, deselect=skip,
                                              configs=args.configs)
        if not junit.exists():
            print(f"kernel_tests: pytest exited {rc} without a report; nothing written", file=sys.stderr)
            return rc or 1
        records = records_from_junit(junit.read_text())
    if not records:
        print(f"kernel_tests: pytest exited {rc} and ran no test; nothing written", file=sys.stderr)
        return rc or 1
    config = {"paths": args.paths, "select": args.select, "kernel_configs": args.configs}
    if args.skip_passed:
        config["skip_passed"] = {"files": [str(p) for p in args.skip_passed], "tests": len(skip)}
    write_results(args.out, records, config=config,
                  overwrite=args.overwrite, extra_provenance={
                      "pytest_command": cmd[1:], "pytest_exit_code": rc, "gpu_state": gpu,
                      **microbench.interruption(interrupted, args.budget_s)})
    counts = Counter(r["outcome"] for r in records)
    print(f"kernel_tests: {len(records)} tests ({', '.join(f'{n} {o}' for o, n in sorted(counts.items()))}) "
          f"-> {args.out} ({microbench.how_pytest_ended(rc, interrupted)})")
    return rc


if __name__ == "__main__":
    sys.exit(main())
