"""adahop.harness.kernel_compile: every kernel compiles for sm_90 as GPU launches specialize it, checked on CPU.

Each test runs in a subprocess with ``TRITON_INTERPRET=0``: this process runs Triton's interpreter
(tests/conftest.py), where kernels are not JITFunctions and nothing is specialized.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
KERNEL_MODULES = sorted(p.stem for p in (REPO / "kernels").glob("*.py") if not p.stem.startswith("_"))


def run_python(code: str, path: Path | None = None) -> subprocess.CompletedProcess:
    """``python -c code`` without the interpreter; ``path`` goes first on PYTHONPATH."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(path), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=1200)


@pytest.mark.slow
def test_every_kernel_compiles_for_sm90():
    """default_cases() compile for sm_90 (about 100 s on 2 cores), and they launch every kernel module."""
    proc = run_python("import sys; from adahop.harness.kernel_compile import main; sys.exit(main())")
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


def test_specialization_is_tritons():
    """kernel_compile.specialize gives what Triton's own launch binder gives for every recorded launch
    and its "=1" variants."""
    proc = run_python(SPECIALIZATION_VS_TRITON)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "MISMATCH" not in proc.stdout, proc.stdout
    assert int(proc.stdout.split("checked")[1]) > 300


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
from adahop.harness import kernel_compile as kc
import broken_kernel

kc.default_cases = lambda: [kc.Case("xor", broken_kernel.launch)]
sys.exit(kc.main([]))
"""


@pytest.mark.parametrize("decorator, fails", [("", True), ('(do_not_specialize=["mix"])', False)],
                         ids=["mix-specialized", "mix-not-specialized"])
def test_an_int_argument_used_as_a_tensor_fails_unless_not_specialized(tmp_path, decorator, fails):
    """``mix.to()`` compiles for mix=7 but not for mix=1, which a launch turns into a Python int:
    a bug that passes every interpreter test. ``do_not_specialize`` fixes it; ``n`` stays specializable."""
    (tmp_path / "broken_kernel.py").write_text(BROKEN_KERNEL.format(decorator=decorator))
    proc = run_python(CHECK_BROKEN, path=tmp_path)
    out = proc.stdout
    if fails:
        assert proc.returncode == 1, out + proc.stderr[-3000:]
        assert "2 of 3 variants compiled" in out, out
        assert "FAILED broken_kernel._xor_kernel (xor; set to 1: mix):" in out, out
        assert "AttributeError(\"'int' object has no attribute 'to'\")" in out, out
    else:
        assert proc.returncode == 0, out + proc.stderr[-3000:]
        assert "2 of 2 variants compiled" in out and "FAILED" not in out, out
