"""kernels/ must not shadow the PyPI ``kernels`` package (transformers probes for it)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_from_root(code: str, extra_path: str | None = None) -> subprocess.CompletedProcess:
    env_path = [str(ROOT)] + ([extra_path] if extra_path else [])
    prog = f"import sys; sys.path[:0] = {env_path!r}\n{code}"
    return subprocess.run([sys.executable, "-c", prog], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_kernels_folder_is_not_a_regular_package():
    assert not (ROOT / "kernels" / "__init__.py").exists()


def test_transformers_does_not_mistake_our_kernels_folder_for_the_pypi_package():
    out = run_from_root(
        "from transformers.utils import import_utils as iu\n"
        "import adahop, adahop_kernels\n"
        "print(iu.is_kernels_available(), adahop_kernels.__name__)"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "adahop_kernels"]


def test_an_installed_kernels_package_wins_over_our_folder(tmp_path):
    fake = tmp_path / "site" / "kernels"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("__version__ = '0.9.0'\nORIGIN = 'installed'\n")
    out = run_from_root("import kernels, adahop_kernels\nprint(kernels.ORIGIN)", str(tmp_path / "site"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "installed"
