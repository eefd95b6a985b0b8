"""experiments/kernel_tests.py: pytest's report of a test run, as a results file."""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from adahop.harness.provenance import REPO_ROOT

spec = importlib.util.spec_from_file_location("kernel_tests_script", REPO_ROOT / "experiments" / "kernel_tests.py")
kernel_tests = importlib.util.module_from_spec(spec)
sys.path.insert(0, str(REPO_ROOT / "experiments"))  # as when the script runs: it imports microbench
try:
    spec.loader.exec_module(kernel_tests)
finally:
    sys.path.remove(str(REPO_ROOT / "experiments"))

MODULE = textwrap.dedent('''
    import pytest

    @pytest.fixture
    def broken():
        raise RuntimeError("fixture broke")

    def test_pass():
        pass

    @pytest.mark.parametrize("n", [1, 2])
    def test_param(n):
        assert n == 1, "n is not 1"

    def test_skip():
        pytest.skip("no GPU here")

    @pytest.mark.xfail(reason="known")
    def test_xfail():
        assert False

    def test_error(broken):
        pass

    class TestGroup:
        def test_method(self):
            pass
''')


def test_every_outcome_becomes_a_record_with_its_node_id(tmp_path):
    tests = tmp_path / "suite" / "test_sample.py"
    tests.parent.mkdir()
    tests.write_text(MODULE)
    out = tmp_path / "tests.json"
    assert kernel_tests.main([str(tests), "--out", str(out)]) == 1  # pytest's: a test failed
    doc = json.loads(out.read_text())
    got = {r["test"].split("test_sample.py::")[1]: (r["outcome"], r["message"]) for r in doc["records"]}
    assert got == {
        "test_pass": ("passed", None),
        "test_param[1]": ("passed", None),
        "test_param[2]": ("failed", "AssertionError: n is not 1"),
        "test_skip": ("skipped", "no GPU here"),
        "test_xfail": ("skipped", "known"),
        "test_error": ("error", 'failed on setup with "RuntimeError: fixture broke"'),
        "TestGroup::test_method": ("passed", None),
    }
    assert all(r["duration_s"] >= 0 for r in doc["records"])
    prov = doc["provenance"]
    assert prov["pytest_exit_code"] == 1 and prov["config"] == {"paths": [str(tests)], "select": None, "kernel_configs": "first"}
    assert prov["pytest_interrupted_after_s"] is None


def test_a_run_without_tests_writes_nothing(tmp_path):
    tests = tmp_path / "test_none.py"
    tests.write_text("def test_a():\n    pass\n")
    out = tmp_path / "tests.json"
    assert kernel_tests.main([str(tests), "--select", "no_such_test", "--out", str(out)]) == 5  # pytest: none collected
    assert not out.exists()


@pytest.mark.parametrize("attrs, expected", [
    ({"file": "tests/kernels/test_x.py", "classname": "tests.kernels.test_x", "name": "test_a[1]"},
     "tests/kernels/test_x.py::test_a[1]"),
    ({"file": "tests/kernels/test_x.py", "classname": "tests.kernels.test_x.TestA.TestB", "name": "test_a"},
     "tests/kernels/test_x.py::TestA::TestB::test_a"),
    ({"classname": "tests.test_y", "name": "test_b"}, "tests.test_y::test_b"),
])
def test_node_id_of_a_junit_testcase(attrs, expected):
    assert kernel_tests.node_id(ET.Element("testcase", attrs)) == expected


def slow_tests(tmp_path: Path) -> Path:
    """A test file whose second test outlasts any budget or time limit of these tests; it leaves
    ``started`` beside the file when it begins, so test_fast is then done."""
    tests = tmp_path / "test_slow.py"
    tests.write_text(textwrap.dedent(f"""
        import pathlib
        import time

        def test_fast():
            pass

        def test_slow():
            pathlib.Path({str(tmp_path / "started")!r}).touch()
            time.sleep(120)

        def test_never():
            pass
    """))
    return tests


def test_a_budget_interrupts_pytest_and_keeps_the_tests_it_finished(tmp_path):
    tests = slow_tests(tmp_path)
    out = tmp_path / "tests.json"
    # as a batch job starts it: a background job of a non-interactive shell, SIGINT ignored. The
    # budget runs from pytest's start, which imports no torch here (no conftest above tmp_path):
    # test_slow begins about 1 s in on an idle machine, so 10 s holds under the suite's load.
    done = subprocess.run([sys.executable, str(REPO_ROOT / "experiments" / "kernel_tests.py"), str(tests),
                           "--budget-s", "10", "--out", str(out)], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=100, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]  # pytest's: interrupted
    doc = json.loads(out.read_text())
    # the test it stopped in is left out (pytest reports it as a nameless testcase), as are those after
    assert [(r["test"].split("::")[-1], r["outcome"]) for r in doc["records"]] == [("test_fast", "passed")]
    assert doc["provenance"]["pytest_interrupted_after_s"] == 10 and doc["provenance"]["pytest_exit_code"] == 2
    assert doc["provenance"]["pytest_interrupted_by"] == "budget"


def test_a_time_limits_sigterm_interrupts_pytest_and_keeps_the_tests_it_finished(tmp_path):
    """A job's time limit as ``timeout`` and Slurm deliver it: SIGTERM to the stage and its process
    group, here once test_slow has begun (a fixed delay would race the start-up of a loaded machine)."""
    tests = slow_tests(tmp_path)
    out = tmp_path / "tests.json"
    proc = subprocess.Popen([sys.executable, str(REPO_ROOT / "experiments" / "kernel_tests.py"), str(tests), "--out", str(out)],
                            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "started").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "test_slow never began"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGTERM)
        output, _ = proc.communicate(timeout=100)
    finally:
        proc.kill()
    assert proc.returncode == 2, output[-4000:]  # pytest's: interrupted
    doc = json.loads(out.read_text())
    assert [(r["test"].split("::")[-1], r["outcome"]) for r in doc["records"]] == [("test_fast", "passed")]
    prov = doc["provenance"]
    assert (prov["pytest_interrupted_by"], prov["pytest_interrupted_after_s"], prov["pytest_exit_code"]) == ("SIGTERM", None, 2)


def test_a_budget_must_be_positive(tmp_path):
    with pytest.raises(SystemExit):
        kernel_tests.main(["--budget-s", "0", "--out", str(tmp_path / "tests.json")])


def test_tests_that_passed_on_this_kind_of_device_are_left_out(tmp_path):
    tests = tmp_path / "test_two.py"
    tests.write_text("import pytest\n\n@pytest.mark.parametrize('n', [1, 2])\ndef test_a(n):\n    pass\n\n"
                     "def test_b():\n    pass\n")
    first = tmp_path / "first.json"
    kernel_tests.main([str(tests), "--select", "test_a", "--out", str(first)])
    doc = json.loads(first.read_text())
    # one of the two passes is forgotten, as if it had failed: only passes are left out
    doc["records"] = [r if r["test"].endswith("[1]") else {**r, "outcome": "failed"} for r in doc["records"]]
    first.write_text(json.dumps(doc))
    second = tmp_path / "second.json"
    assert kernel_tests.main([str(tests), "--skip-passed", str(first), "--out", str(second)]) == 0
    doc = json.loads(second.read_text())
    assert sorted(r["test"].split("::")[-1] for r in doc["records"]) == ["test_a[2]", "test_b"]
    assert doc["provenance"]["config"]["skip_passed"] == {"files": [str(first)], "tests": 1}


def test_passes_on_another_device_are_not_taken(tmp_path):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"provenance": {"device": {"type": "cuda", "name": "NVIDIA H200"}},
                                 "records": [{"test": "t.py::test_a", "outcome": "passed"}]}))
    with pytest.raises(ValueError, match=r"ran on 'NVIDIA H200' \(cuda\), this machine's device is .* a pass there says "
                                         "nothing here"):
        kernel_tests.main(["--skip-passed", str(other), "--out", str(tmp_path / "tests.json")])
    with pytest.raises(FileNotFoundError, match="no such results file"):
        kernel_tests.main(["--skip-passed", str(tmp_path / "missing.json"), "--out", str(tmp_path / "tests.json")])


@pytest.mark.parametrize("flag,value", [([], "first"), (["--configs", "tuned"], "tuned")])
def test_the_kernels_config_choice_reaches_pytest_and_the_provenance(flag, value, tmp_path):
    tests = tmp_path / "test_env.py"
    tests.write_text("import os\n\ndef test_choice():\n"
                     f"    assert os.environ['ADAHOP_KERNEL_CONFIG'] == {value!r}\n")
    out = tmp_path / "tests.json"
    assert kernel_tests.main([str(tests), *flag, "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [r["outcome"] for r in doc["records"]] == ["passed"]
    assert doc["provenance"]["config"]["kernel_configs"] == value
