"""Results files: provenance, atomic writes, no silent overwrite of another configuration."""

import gzip
import json
import subprocess
import sys

import pytest
import torch

import adahop.harness.provenance as provenance_module
from adahop.harness.provenance import ResultsConflict, read_results, write_results

# Every behaviour of a results file holds for plain and for gzip-compressed JSON.
suffixes = pytest.mark.parametrize("suffix", [".json", ".json.gz"], ids=["json", "json-gz"])


def test_write_results_carries_provenance(tmp_path):
    path = tmp_path / "stage" / "r.json"
    write_results(path, [{"op": "x", "value": 1.5}], config={"size": 8}, seed=3)
    doc = read_results(path)
    prov = doc["provenance"]
    assert doc["records"] == [{"op": "x", "value": 1.5}]
    assert prov["config"] == {"size": 8} and prov["seed"] == 3
    for key in ("git_commit", "git_dirty", "date", "versions", "device"):
        assert key in prov
    assert prov["versions"]["torch"]


def test_versions_are_the_installed_ones_read_without_importing_the_libraries(monkeypatch):
    """A results file records the installed triton, transformers, lm_eval and torchao, and writing
    one imports none of the last three where the process had not (each import cost a
    results-writing process seconds)."""
    import builtins
    import importlib.metadata

    libraries = ("transformers", "lm_eval", "torchao")
    for name in [m for m in sys.modules if m.split(".")[0] in libraries]:
        monkeypatch.delitem(sys.modules, name)
    real_import = builtins.__import__

    def no_library_import(name, *args, **kwargs):
        if name.split(".")[0] in libraries:
            raise AssertionError(f"provenance() imported {name}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_library_import)
    versions = provenance_module.provenance()["versions"]
    monkeypatch.undo()
    installed = {m: importlib.metadata.version(m) for m in ("triton", *libraries)}
    assert {m: versions[m] for m in installed} == installed


def test_a_loaded_module_gives_its_own_version_and_an_absent_one_none(monkeypatch):
    import types

    monkeypatch.setitem(sys.modules, "adahop_test_lib", types.SimpleNamespace(__version__="1.2.3"))
    assert provenance_module._version("adahop_test_lib") == "1.2.3"
    assert provenance_module._version("adahop_no_such_library") is None
    assert provenance_module._version("torch") == torch.__version__


def test_compile_cache_files_counts_what_each_compiler_cached(tmp_path, monkeypatch):
    triton_dir, inductor_dir = tmp_path / "triton", tmp_path / "inductor"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(triton_dir))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(inductor_dir))
    assert provenance_module.compile_cache_files() == {"triton": None, "inductor": None}  # no folder yet
    (triton_dir / "HASH").mkdir(parents=True)
    inductor_dir.mkdir()
    assert provenance_module.compile_cache_files() == {"triton": 0, "inductor": 0}  # a cold start
    (triton_dir / "HASH" / "k.cubin").write_bytes(b"")
    (triton_dir / "HASH" / "k.json").write_text("{}")
    (inductor_dir / "fxgraph").mkdir()
    (inductor_dir / "fxgraph" / "entry").write_text("")
    assert provenance_module.compile_cache_files() == {"triton": 2, "inductor": 1}


def test_compile_seconds_since_names_the_phases_of_a_compile_after_a_snapshot():
    before = provenance_module.compile_seconds()
    assert provenance_module.compile_seconds_since(before, floor_s=0.0) == {}  # nothing compiled since

    @torch.compile(backend="eager", fullgraph=True)
    def f(x):
        return torch.sin(x) + 1

    f(torch.ones(3))
    spent = provenance_module.compile_seconds_since(before, floor_s=0.0)
    assert spent and all(t > 0 for t in spent.values())
    assert list(spent.values()) == sorted(spent.values(), reverse=True)  # longest first
    # Dynamo traced the function: its compile phase is among them, and no longer than the whole.
    assert "_compile.compile_inner" in spent
    assert spent["_compile.compile_inner"] <= sum(spent.values())
    assert provenance_module.compile_seconds_since(provenance_module.compile_seconds(), floor_s=0.0) == {}


@suffixes
def test_rerun_with_same_config_replaces(tmp_path, suffix):
    path = tmp_path / f"r{suffix}"
    write_results(path, [{"v": 1}], config={"a": 1})
    write_results(path, [{"v": 2}], config={"a": 1})
    assert read_results(path)["records"] == [{"v": 2}]


@suffixes
def test_different_config_is_refused_and_file_kept(tmp_path, suffix):
    path = tmp_path / f"r{suffix}"
    write_results(path, [{"v": 1}], config={"a": 1})
    with pytest.raises(ResultsConflict, match="different configuration"):
        write_results(path, [{"v": 2}], config={"a": 2})
    assert read_results(path)["records"] == [{"v": 1}]
    write_results(path, [{"v": 2}], config={"a": 2}, overwrite=True)
    assert read_results(path)["records"] == [{"v": 2}]


@suffixes
def test_failed_write_leaves_old_file_and_no_temp(tmp_path, suffix):
    path = tmp_path / f"r{suffix}"
    write_results(path, [{"v": 1}], config={})

    class Unserialisable:
        def __repr__(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        write_results(path, [{"v": Unserialisable()}], config={})
    assert read_results(path)["records"] == [{"v": 1}]
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_non_results_file_is_rejected(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"records": []}))
    with pytest.raises(ValueError, match="not a results file"):
        read_results(path)


def test_commit_from_environment_wins_over_git(tmp_path, monkeypatch):
    # A GPU machine's copy of the tree can hold a stale .git; the commit it was told is the truth.
    monkeypatch.setenv("ADAHOP_GIT_COMMIT", "0" * 40)
    monkeypatch.setenv("ADAHOP_GIT_DIRTY", "0")
    prov = write_results(tmp_path / "r.json", [{"a": 1}])["provenance"]
    assert prov["git_commit"] == "0" * 40 and prov["git_dirty"] is False


@pytest.mark.parametrize("commit", ["b2d30a4b", "efbcdb119a124836b5f627c3b94bfef1d1871b6", "E" * 40])
def test_a_commit_from_the_environment_must_be_a_full_hash(tmp_path, monkeypatch, commit):
    monkeypatch.setenv("ADAHOP_GIT_COMMIT", commit)
    with pytest.raises(ValueError, match=f"ADAHOP_GIT_COMMIT must be a full 40-hex commit.*{commit!r}"):
        write_results(tmp_path / "r.json", [{"a": 1}])
    assert not (tmp_path / "r.json").exists()


# --------------------------------------------------------------------------- gzip-compressed (.json.gz)


@pytest.fixture
def fixed_provenance(monkeypatch):
    """Provenance without a clock: two writes of the same records are the same document."""
    monkeypatch.setattr(provenance_module, "provenance",
                        lambda config, seed, device: {"git_commit": "0" * 40, "config": config, "seed": seed})


def test_json_gz_round_trip_is_gzip_of_the_plain_json(tmp_path, fixed_provenance):
    records = [{"layer": f"blocks.{i}.mlp", "rel_error": 0.1 * i, "labels": ["row", "none"]} for i in range(50)]
    gz, plain = tmp_path / "r.json.gz", tmp_path / "r.json"
    doc = write_results(gz, records, config={"a": 1}, seed=0)
    write_results(plain, records, config={"a": 1}, seed=0)
    data = gz.read_bytes()
    assert data[:2] == b"\x1f\x8b"  # gzip magic
    assert gzip.decompress(data) == plain.read_bytes()  # the same JSON text inside
    assert read_results(gz) == read_results(plain) == doc
    assert len(data) < plain.stat().st_size


def test_json_gz_rerun_is_byte_identical(tmp_path, fixed_provenance):
    path = tmp_path / "r.json.gz"
    write_results(path, [{"v": 1.5}], config={"a": 1}, seed=0)
    first = path.read_bytes()
    write_results(path, [{"v": 1.5}], config={"a": 1}, seed=0)
    assert path.read_bytes() == first
    assert first[4:8] == b"\0\0\0\0"  # gzip header mtime


@pytest.mark.parametrize("content", [b'{"provenance": {}, "records": []}', b"\x1f\x8b\x08\x00garbage"],
                         ids=["plain-json-named-gz", "corrupt-gzip"])
def test_json_gz_that_is_not_gzip_json_is_refused(tmp_path, content):
    path = tmp_path / "r.json.gz"
    path.write_bytes(content)
    with pytest.raises(ResultsConflict, match="not a results file"):
        write_results(path, [{"v": 1}], config={})
    assert path.read_bytes() == content
    with pytest.raises((OSError, EOFError)):
        read_results(path)


def test_truncated_json_gz_is_refused(tmp_path):
    path = tmp_path / "r.json.gz"
    write_results(path, [{"v": i} for i in range(1000)], config={})
    cut = path.read_bytes()[:-20]
    path.write_bytes(cut)
    with pytest.raises(ResultsConflict, match="not a results file"):
        write_results(path, [{"v": 1}], config={})
    assert path.read_bytes() == cut


def test_dirty_means_the_code_not_the_results_it_writes(tmp_path, monkeypatch):
    # Snakemake deletes a job's tracked outputs before running it: that must not mark the job's results dirty.
    monkeypatch.delenv("ADAHOP_GIT_COMMIT", raising=False)
    monkeypatch.delenv("ADAHOP_GIT_DIRTY", raising=False)
    repo = tmp_path / "repo"
    for name in ("adahop/m.py", "results/q/t.json", "paper_figs/out/f.png"):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text("x\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "c"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    monkeypatch.setattr(provenance_module, "REPO_ROOT", repo)
    (repo / "results/q/t.json").unlink()
    (repo / "paper_figs/out/f.png").write_text("y\n")
    assert provenance_module.git_state()[1] is False
    (repo / "adahop/m.py").write_text("changed\n")
    assert provenance_module.git_state()[1] is True


FAKE_NVIDIA_SMI = """#!/bin/sh
case "$*" in
  *--query-gpu=index,*) printf '0, 1980, 1980, 2619, 41, 120.5, 0, 512\\n1, 1410, 1980, 2619, 83, 690.1, 100, 70000\\n' ;;
  *clocks_event_reasons*) echo "Field is not a valid field to query." >&2; exit 2 ;;
  *clocks_throttle_reasons*) printf '0x0000000000000000\\n0x0000000000000020\\n' ;;
  *--query-compute-apps*) printf '4242, 69000\\n' ;;
  *) exit 3 ;;
esac
"""


def test_gpu_state_reads_nvidia_smi_and_falls_back_on_the_old_reason_field(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_NVIDIA_SMI)
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    state = provenance_module.gpu_state()
    assert state["compute_processes"] == 1
    g0, g1 = state["gpus"]
    assert g0 == {"index": "0", "clocks.sm": "1980", "clocks.max.sm": "1980", "clocks.mem": "2619",
                  "temperature.gpu": "41", "power.draw": "120.5", "utilization.gpu": "0", "memory.used": "512",
                  "clock_reasons": "0x0000000000000000"}
    assert g1["clocks.sm"] == "1410" and g1["clock_reasons"] == "0x0000000000000020"


def test_gpu_state_is_none_without_nvidia_smi_or_with_a_failing_one(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert provenance_module.gpu_state() is None
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nexit 9\n")
    smi.chmod(0o755)
    assert provenance_module.gpu_state() is None


# --------------------------------------------------------------------------- history/ of replaced files


def stamped(monkeypatch, commit: str, date: str) -> None:
    """Provenance as if written at ``commit`` on ``date``."""
    monkeypatch.setattr(provenance_module, "provenance",
                        lambda config, seed, device: {"git_commit": commit, "date": date, "config": config})


@suffixes
def test_a_file_from_another_commit_is_kept_in_history_by_its_date(tmp_path, monkeypatch, suffix):
    path = tmp_path / f"layers{suffix}"
    stamped(monkeypatch, "a" * 40, "2026-11-30T10:00:00+00:00")
    write_results(path, [{"v": 1}], config={"a": 1})
    old = path.read_bytes()
    stamped(monkeypatch, "b" * 40, "2026-11-30T12:00:00+00:00")
    write_results(path, [{"v": 2}], config={"a": 1})
    assert read_results(path)["records"] == [{"v": 2}]
    kept = tmp_path / "history" / f"layers-2026-11-30{suffix}"
    assert kept.read_bytes() == old
    assert read_results(kept)["provenance"]["git_commit"] == "a" * 40


def test_a_file_from_another_day_is_kept_and_a_second_one_that_day_gets_a_number(tmp_path, monkeypatch):
    path = tmp_path / "kernels.json"
    for i, (commit, date) in enumerate([("c" * 40, "2026-11-29T09:00:00+00:00"), ("d" * 40, "2026-11-29T20:00:00+00:00"),
                                        ("d" * 40, "2026-11-30T08:00:00+00:00")]):
        stamped(monkeypatch, commit, date)
        write_results(path, [{"v": i}], config={}, overwrite=True)
    history = sorted(p.name for p in (tmp_path / "history").iterdir())
    assert history == ["kernels-2026-11-29-2.json", "kernels-2026-11-29.json"]
    assert read_results(tmp_path / "history" / "kernels-2026-11-29.json")["records"] == [{"v": 0}]
    assert read_results(tmp_path / "history" / "kernels-2026-11-29-2.json")["records"] == [{"v": 1}]
    assert read_results(path)["records"] == [{"v": 2}]


def test_a_rerun_at_the_same_commit_on_the_same_day_keeps_no_history(tmp_path, monkeypatch):
    path = tmp_path / "memory.json"
    stamped(monkeypatch, "d" * 40, "2026-12-01T01:00:00+00:00")
    write_results(path, [{"v": 1}], config={})
    stamped(monkeypatch, "d" * 40, "2026-12-01T05:00:00+00:00")
    write_results(path, [{"v": 2}], config={})
    assert read_results(path)["records"] == [{"v": 2}]
    assert not (tmp_path / "history").exists()


def test_a_refused_write_keeps_no_history(tmp_path, monkeypatch):
    path = tmp_path / "r.json"
    stamped(monkeypatch, "a" * 40, "2026-11-30T10:00:00+00:00")
    write_results(path, [{"v": 1}], config={"a": 1})
    stamped(monkeypatch, "b" * 40, "2026-12-01T10:00:00+00:00")
    with pytest.raises(ResultsConflict):
        write_results(path, [{"v": 2}], config={"a": 2})
    assert not (tmp_path / "history").exists()


@pytest.mark.parametrize("date", ["yesterday", "30-11-2026", ""])
def test_history_path_needs_an_iso_date(tmp_path, date):
    with pytest.raises(ValueError, match="date must start with YYYY-MM-DD"):
        provenance_module.history_path(tmp_path / "r.json", date)


def test_backend_env_records_the_switches_that_change_a_gpu_result(tmp_path, monkeypatch):
    """The kernel backend, the Inductor-launch switch and Inductor's static launcher for user Triton
    kernels are recorded where set, and only those."""
    for name in ("ADAHOP_BACKEND", "TRITON_INTERPRET", "ADAHOP_RUNS_PER_GPU"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ADAHOP_INDUCTOR_LAUNCHES", "0")
    monkeypatch.setenv("TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS", "1")
    monkeypatch.setenv("TORCHINDUCTOR_SOMETHING_ELSE", "1")
    out = tmp_path / "r.json"
    write_results(out, [{"a": 1}])
    assert read_results(out)["provenance"]["backend_env"] == {
        "ADAHOP_INDUCTOR_LAUNCHES": "0", "TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS": "1"}


def test_interruptible_turns_a_signal_or_the_budget_into_interrupted():
    import os
    import signal
    import time

    from adahop.harness.provenance import Interrupted, interruptible

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted, match="SIGTERM"):
        with interruptible():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises here, long before
    assert signal.getsignal(signal.SIGTERM) is before
    with interruptible(0.01) as budget:
        budget.check()
        time.sleep(0.02)
        with pytest.raises(Interrupted, match="budget"):
            budget.check()


def test_write_measured_keeps_a_complete_file_and_puts_a_cut_run_beside_it(tmp_path):
    from adahop.harness.provenance import write_measured

    out = tmp_path / "host.json"
    planned = ["a", "b"]
    # no file yet: written there
    assert write_measured(out, [{"name": "a"}], "budget", planned, "name", config={"n": 1}) == out
    assert read_results(out)["provenance"]["interrupted_by"] == "budget"
    assert write_measured(out, [{"name": "a"}, {"name": "b"}], None, planned, "name", config={"n": 1}) == out
    complete = out.read_text()
    assert write_measured(out, [], "SIGTERM", planned, "name", config={"n": 1}) is None
    got = write_measured(out, [{"name": "a"}], "SIGTERM", planned, "name", config={"n": 1})
    assert got == tmp_path / "host-partial.json" and out.read_text() == complete
    prov = read_results(got)["provenance"]
    assert prov["interrupted_by"] == "SIGTERM" and prov["not_measured"] == ["b"]
    gz = tmp_path / "p.json.gz"
    write_measured(gz, [{"name": "a"}], None, planned, "name", config={"n": 1})
    partial = write_measured(gz, [{"name": "a"}], "budget", planned, "name", config={"n": 1})
    assert partial == tmp_path / "p-partial.json.gz"
