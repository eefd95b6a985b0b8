"""Packaging: kernels/ must not shadow the PyPI ``kernels`` package (transformers probes for it); a
wheel holds every module; ``import adahop`` loads the library alone (DESIGN §7, "Two layers")."""

import ast
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_from_root(code: str, extra_path: str | None = None) -> subprocess.CompletedProcess:
    env_path = [str(ROOT)] + ([extra_path] if extra_path else [])
    prog = f"import sys; sys.path[:0] = {env_path!r}\n{code}"
    return subprocess.run([sys.executable, "-c", prog], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_kernels_folder_is_not_a_regular_package():
    assert not (ROOT / "kernels" / "__init__.py").exists()


def test_transformers_does_not_mistake_our_kernels_folder_for_the_pypi_package():
    """transformers sees the PyPI ``kernels`` exactly when it is installed (some versions of the
    stack pull it in), never our folder in its place."""
    out = run_from_root(
        "import importlib.metadata as md, importlib.util\n"
        "from transformers.utils import import_utils as iu\n"
        "import adahop, adahop_kernels\n"
        "try:\n    md.version('kernels'); installed = True\n"
        "except md.PackageNotFoundError:\n    installed = False\n"
        "spec = importlib.util.find_spec('kernels')\n"
        "ours = spec is not None and spec.origin in (None, 'namespace')  # our folder: a namespace package\n"
        "print(installed, iu.is_kernels_available(), ours, adahop_kernels.__name__)"
    )
    assert out.returncode == 0, out.stderr
    installed, available, ours, name = out.stdout.split()
    assert available == installed, f"transformers says kernels available={available}, installed={installed}"
    assert ours == str(installed == "False"), "with the PyPI kernels installed, `import kernels` must find it"
    assert name == "adahop_kernels"


def test_an_installed_kernels_package_wins_over_our_folder(tmp_path):
    fake = tmp_path / "site" / "kernels"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("__version__ = '0.9.0'\nORIGIN = 'installed'\n")
    out = run_from_root("import kernels, adahop_kernels\nprint(kernels.ORIGIN)", str(tmp_path / "site"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "installed"


# ---------------------------------------------------------------------------- the wheel


def test_a_wheel_holds_every_module_and_the_package_data(tmp_path):
    # Built from a copy: a build in the checkout leaves build/, whose stale files a later wheel would ship.
    src = tmp_path / "src"
    for name in ("adahop", "kernels"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", ".",
                           "-w", str(tmp_path / "wheel")], cwd=src, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = (tmp_path / "wheel").glob("adahop-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"adahop/{p.relative_to(ROOT / 'adahop').as_posix()}" for p in (ROOT / "adahop").rglob("*.py")
                if "__pycache__" not in p.parts}
    expected |= {f"adahop_kernels/{p.name}" for p in (ROOT / "kernels").glob("*.py")}
    expected.add("adahop/harness/paper_reference.yaml")
    assert {"adahop/linear/__init__.py", "adahop/harness/train.py", "adahop_kernels/signs.py"} <= expected
    assert not expected - names, f"the wheel lacks {sorted(expected - names)}"


# ------------------------------------------------------------------- the library alone

HARNESS_DEPENDENCIES = ("transformers", "tokenizers", "lm_eval", "snakemake", "pandas", "seaborn", "matplotlib",
                        "torchao")


def test_import_adahop_loads_the_library_alone():
    out = run_from_root(
        "import json, adahop\n"
        "print(json.dumps({'modules': sorted(sys.modules), 'all': {n: type(getattr(adahop, n)).__name__ "
        "for n in adahop.__all__}}))"
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    modules = got["modules"]
    assert "adahop.linear" in modules and "adahop.recipes" in modules  # the list is the real one
    harness = [m for m in modules if m == "adahop.harness" or m.startswith("adahop.harness.")]
    assert not harness, f"import adahop loads the harness: {harness}"
    heavy = [m for m in modules if m.split(".")[0] in HARNESS_DEPENDENCIES]
    assert not heavy, f"import adahop loads harness dependencies: {sorted({m.split('.')[0] for m in heavy})}"
    assert set(got["all"]) >= {"convert", "on_optimizer_step", "get_recipe", "RECIPES", "QuantLinear"}
    assert got["all"]["QuantLinear"] == "type" and got["all"]["convert"] == "function"


def imported_modules(path: Path) -> set[str]:
    """Every module an ``import`` or ``from ... import`` of the file names (functions' bodies too;
    ``from adahop import x`` counts as ``adahop.x``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            raise AssertionError(f"{path}: relative import; the scan below reads absolute ones")
    return names


def library_files() -> list[Path]:
    return sorted([*(ROOT / "adahop").glob("*.py"), *(ROOT / "adahop" / "linear").glob("*.py"),
                   *(ROOT / "kernels").glob("*.py")])


def test_the_scan_sees_imports_of_the_harness(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from adahop import harness\n    import adahop.harness.train\n")
    assert {"adahop.harness", "adahop.harness.train"} <= imported_modules(probe)


def test_no_module_of_the_library_imports_the_harness():
    files = library_files()
    assert len(files) > 20 and ROOT / "adahop" / "linear" / "gemm.py" in files
    offenders = {str(p.relative_to(ROOT)): sorted(m for m in imported_modules(p)
                                                   if m == "adahop.harness" or m.startswith("adahop.harness."))
                 for p in files}
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, f"the library imports the harness: {offenders}"


def test_kernels_import_only_the_leaf_modules_of_the_library():
    leaves = {"adahop.formats", "adahop.checks", "adahop.hadamard"}
    wrong = {}
    for path in sorted((ROOT / "kernels").glob("*.py")):
        ours = {m for m in imported_modules(path) if m == "adahop" or m.startswith("adahop.")}
        # "from adahop.formats import X" also yields "adahop.formats.X": judge by the module part.
        bad = sorted(m for m in ours if not any(m == leaf or m.startswith(leaf + ".") for leaf in leaves))
        if bad:
            wrong[path.name] = bad
    assert not wrong, f"kernels/ imports more of adahop than formats, checks and hadamard: {wrong}"
