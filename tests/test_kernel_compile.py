"""adahop.harness.kernel_compile: every kernel compiles for sm_90 as GPU launches specialize it, checked on CPU.

Each check runs in a subprocess with ``TRITON_INTERPRET=0``: this process runs Triton's interpreter
(tests/conftest.py), where kernels are not JITFunctions and nothing is specialized. The short checks
share one subprocess (:func:`checks`): importing torch, Triton and the kernels costs each one more
than the check itself.
"""

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
KERNEL_MODULES = sorted(p.stem for p in (REPO / "kernels").glob("*.py") if not p.stem.startswith("_"))


def run_python(code: str, *args: str) -> subprocess.CompletedProcess:
    """``python -c code args`` without the interpreter."""
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env={**os.environ, "TRITON_INTERPRET": "0"},
                          capture_output=True, text=True, timeout=1200)


# Runs each check's code in a namespace of its own, its sys.path first on sys.path, and writes each
# one's exit code (SystemExit's; 1 for an exception), stdout and traceback as JSON.
RUN_CHECKS = """
import contextlib, io, json, sys, traceback
checks, results = json.loads(open(sys.argv[1]).read()), {}
for name, check in checks.items():
    sys.path[:0] = check["path"]
    sys.modules.pop("broken_kernel", None)
    out, rc, err = io.StringIO(), 0, ""
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(check["code"], name, "exec"), {"__name__": "__main__"})
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else int(e.code is not None)
    except BaseException:
        rc, err = 1, traceback.format_exc()
    finally:
        del sys.path[:len(check["path"])]
    results[name] = {"returncode": rc, "stdout": out.getvalue(), "stderr": err}
open(sys.argv[2], "w").write(json.dumps(results))
"""


@pytest.mark.slow
def test_every_kernel_compiles_for_sm90():
    """default_cases() compile for sm_90 (--quick: about a minute on 2 cores from an empty Triton
    cache), and they launch every kernel module."""
    proc = run_python("import sys; from adahop.harness.kernel_compile import main; sys.exit(main(['--quick']))")
    assert proc.returncode == 0, f"kernels that do not compile for sm_90:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    compiled = {line.split(".", 1)[0] for line in proc.stdout.splitlines() if " variants compiled" in line}
    missing = [m for m in KERNEL_MODULES if m not in compiled]
    assert not missing, f"no case of adahop.harness.kernel_compile.default_cases() launches {missing}:\n{proc.stdout}"


SPECIALIZATION_VS_TRITON = """
from triton.compiler import make_backend
from triton.runtime.jit import create_function_from_signature
from adahop.harness import kernel_compile as kc

backend = make_backend(kc.TARGET)
n = 0
for launch in kc.record(kc.default_cases()):
    fn = launch.fn
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    index = {p.name: p.num for p in fn.params}
    for ones in [()] + [(name,) for name in kc.specializable_ints(launch)]:
        v = kc.specialize(launch, ones)
        bound, specialization, options = binder(**{**launch.args, **dict.fromkeys(ones, 1)})
        _, signature, constexprs, attrs = fn._pack_args(backend, dict(launch.options), bound, specialization, options)
        attrs = {k: a for k, a in attrs.items() if a}  # Triton lists [] for arguments without attributes
        ours = (dict(v.signature), {(index[k],): x for k, x in v.constexprs},
                {(index[k],): [["tt.divisibility", 16]] for k in v.divisible})
        if ours != (signature, constexprs, attrs):
            print("MISMATCH", launch.case, ones, ours, (signature, constexprs, attrs))
        n += 1
print("checked", n)
"""


def test_specialization_is_tritons(checks):
    """kernel_compile.specialize gives what Triton's own launch binder gives for every recorded launch
    and its "=1" variants."""
    proc = checks["specialization"]
    assert proc["returncode"] == 0, proc["stderr"][-3000:]
    assert "MISMATCH" not in proc["stdout"], proc["stdout"]
    assert int(proc["stdout"].split("checked")[1]) > 300


BROKEN_KERNEL = '''
import torch
import triton
import triton.language as tl


@triton.jit{decorator}
def _xor_kernel(out_ptr, n, mix, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(out_ptr + i, (i.to(tl.uint32) ^ mix.to(tl.uint32)).to(tl.float32), mask=i < n)


def launch():
    _xor_kernel[(1,)](torch.empty(64), 64, 7, BLOCK=64)
'''

CHECK_BROKEN = """
import sys
from unittest import mock
from adahop.harness import kernel_compile as kc
import broken_kernel

with mock.patch.object(kc, "default_cases", lambda: [kc.Case("xor", broken_kernel.launch)]):
    sys.exit(kc.main({argv}))
"""


ARGVS = {"cubin": [], "quick": ["--quick"]}
DECORATORS = {"mix-specialized": "", "mix-not-specialized": '(do_not_specialize=["mix"])'}


@pytest.mark.parametrize("argv", ARGVS)
@pytest.mark.parametrize("decorator, fails", [("mix-specialized", True), ("mix-not-specialized", False)],
                         ids=list(DECORATORS))
def test_an_int_argument_used_as_a_tensor_fails_unless_not_specialized(checks, decorator, fails, argv):
    """``mix.to()`` compiles for mix=7 but not for mix=1, which a launch turns into a Python int:
    a bug that passes every interpreter test. ``do_not_specialize`` fixes it; ``n`` stays specializable.
    ``--quick`` compiles the "=1" variants to TTIR only, and finds it as well."""
    proc = checks[f"broken {decorator} {argv}"]
    out = proc["stdout"]
    if fails:
        assert proc["returncode"] == 1, out + proc["stderr"][-3000:]
        assert "2 of 3 variants compiled" in out, out
        assert "FAILED broken_kernel._xor_kernel (xor; set to 1: mix):" in out, out
        assert "AttributeError(\"'int' object has no attribute 'to'\")" in out, out
    else:
        assert proc["returncode"] == 0, out + proc["stderr"][-3000:]
        assert "2 of 2 variants compiled" in out and "FAILED" not in out, out


QUICK_COVERS = """
from collections import defaultdict
from adahop.harness import kernel_compile as kc

launches = kc.record(kc.default_cases())
every, quick = kc.variants(launches), kc.variants(launches, quick=True)
assert every == quick, "--quick compiles other variants"
assert {v.stage for v in every} == {"cubin"} and {v.stage for v in quick} == {"cubin", "ptx", "ttgir", "ttir"}
assert all(v.stage != "ttir" or v.ones for v in quick), "a variant of a recorded launch stops at TTIR"
cubin = {v for v in quick if v.stage == "cubin"}
lowered = cubin | {v for v in quick if v.stage == "ptx"}
calls, configs, every_feature, lowered_features = defaultdict(set), defaultdict(set), defaultdict(set), defaultdict(set)
for launch in launches:
    calls[launch.group].add(kc.specialize(launch))
    configs[kc.kernel_name(launch.fn), launch.config].add(kc.specialize(launch))
def features(v):  # each constexpr's value, each argument's type: our own, not kc.features, the rule under test
    return {("=", k, repr(x)) for k, x in v.constexprs} | {(":", k, t) for k, t in v.signature}
for v in every:
    if not v.ones:
        every_feature[v.kernel] |= features(v)
for v in lowered:
    lowered_features[v.kernel] |= features(v)
missing = {k: fs - lowered_features[k] for k, fs in every_feature.items() if fs - lowered_features[k]}
assert not missing, f"flag values or argument types that no variant compiles to PTX: {missing}"
assert all(vs & cubin for vs in configs.values()), "a config that no variant compiles to the cubin"
assert any(config is not None for _, config in configs), "no autotuned launch recorded its config"
print("cubin", len(cubin), "of", len(quick), "ptx", len(lowered) - len(cubin), "calls", len(calls))
"""


def test_quick_compiles_every_flag_value_to_ptx_and_every_config_to_the_cubin(checks):
    """--quick keeps the variants; the ones it stops before the cubin leave every flag value and
    argument type of each kernel (but the "=1" ints, which the front end checks) with a variant
    that reaches PTX (LLVM's lowering), and every autotune config with one that reaches ptxas;
    fewer launcher calls reach PTX than there are."""
    proc = checks["quick covers"]
    assert proc["returncode"] == 0, proc["stdout"] + proc["stderr"][-3000:]
    words = proc["stdout"].split()
    cubin, total, ptx, calls = int(words[1]), int(words[3]), int(words[5]), int(words[7])
    assert 0 < cubin < total, proc["stdout"]
    assert 0 < ptx < calls, proc["stdout"]


@pytest.fixture(scope="session")
def checks(tmp_path_factory) -> dict[str, dict]:
    """Every short check's result (:data:`RUN_CHECKS`), from one subprocess per test run: under
    pytest-xdist the first worker to ask runs it, the others read its results."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    # Under xdist each worker's base temp lies in one folder of this run; alone, our own.
    root = tmp_path_factory.getbasetemp().parent if worker else tmp_path_factory.getbasetemp()
    results = root / "kernel_compile_checks.json"
    with open(root / "kernel_compile_checks.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not results.exists():
            todo = {"specialization": {"code": SPECIALIZATION_VS_TRITON, "path": []},
                    "quick covers": {"code": QUICK_COVERS, "path": []}}
            for name, decorator in DECORATORS.items():
                folder = root / f"kernel_compile_{name}"
                folder.mkdir(exist_ok=True)
                (folder / "broken_kernel.py").write_text(BROKEN_KERNEL.format(decorator=decorator))
                for argv_name, argv in ARGVS.items():
                    todo[f"broken {name} {argv_name}"] = {"code": CHECK_BROKEN.format(argv=argv), "path": [str(folder)]}
            (root / "kernel_compile_checks_todo.json").write_text(json.dumps(todo))
            proc = run_python(RUN_CHECKS, str(root / "kernel_compile_checks_todo.json"), str(results) + ".tmp")
            assert proc.returncode == 0, f"the checks' subprocess failed:\n{proc.stdout}\n{proc.stderr[-3000:]}"
            os.replace(str(results) + ".tmp", results)
    return json.loads(results.read_text())
