"""The kernel developer scripts refuse bad arguments clearly (their GPU work is exercised on a GPU)."""

import argparse
import importlib.util
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def load(name):
    spec = importlib.util.spec_from_file_location(f"script_{name}", REPO_ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("text,match", [("16384", "must be ROWSxCOLS"), ("axb", "must be ROWSxCOLS"),
                                        ("100x256", "positive multiples of 128"), ("0x256", "positive multiples of 128")])
def test_quantize_steps_refuses_a_bad_shape(text, match):
    with pytest.raises(argparse.ArgumentTypeError, match=match):
        load("quantize_steps").parse_shape(text)


def test_quantize_steps_reads_a_shape():
    assert load("quantize_steps").parse_shape("16384x8192") == (16384, 8192)


@pytest.mark.parametrize("argv,match", [
    (["--steps", "X,Q"], r"--steps: unknown \['Q'\]"),
])
def test_quantize_steps_refuses_unknown_steps(argv, match, capsys):
    with pytest.raises(SystemExit):
        load("quantize_steps").main(argv)
    assert match.replace("\\", "") in capsys.readouterr().err


@pytest.mark.parametrize("script,argv,match", [
    ("kernel_ab", ["--baseline", "nowhere.py", "--out", "x.json"], "needs a CUDA GPU"),
    ("compile_ab", ["--out", "x.json"], "needs a CUDA GPU"),
    ("compile_ab", ["--out", "x.json", "--threads", "1,many"], "--threads must be comma-separated ints, got '1,many'"),
    ("compile_ab", ["--out", "x.json", "--threads", "1,-4"], "--threads must be non-negative, got '1,-4'"),
    ("compile_ab", ["--out", "x.json", "--shape", "100x256"], "positive multiples of 128"),
])
def test_ab_scripts_refuse_bad_arguments_and_a_missing_gpu(script, argv, match, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        load(script).main(argv)
    assert match in capsys.readouterr().err


def test_kernel_ab_refuses_a_missing_baseline_and_unknown_shapes(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    ab = load("kernel_ab")
    with pytest.raises(SystemExit):
        ab.main(["--baseline", str(tmp_path / "none.py"), "--out", str(tmp_path / "x.json")])
    assert "no such file" in capsys.readouterr().err
    base = tmp_path / "base.py"
    base.write_text("")
    with pytest.raises(SystemExit):
        ab.main(["--baseline", str(base), "--out", str(tmp_path / "x.json"), "--shapes", "huge"])
    assert "--shapes: unknown ['huge']" in capsys.readouterr().err


def test_quantize_sweep_refuses_without_a_gpu_and_unknown_shapes(tmp_path, capsys, monkeypatch):
    import torch

    sweep = load("quantize_sweep")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        sweep.main(["--out", str(tmp_path / "x.json")])
    assert "needs a CUDA GPU" in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(SystemExit):
        sweep.main(["--out", str(tmp_path / "x.json"), "--shapes", "huge"])
    assert "--shapes: unknown ['huge']" in capsys.readouterr().err


def test_quantize_sweep_candidates_fit_some_layer_step():
    # Every candidate config must be timed at one step at least (a config no step can use is a typo).
    sweep = load("quantize_sweep")
    import triton

    steps = [sweep.tile_flags(k, m) for _, k, m, _, _ in sweep.LAYER_STEPS]
    for bm, bk, warps, maxnreg in sweep.CANDIDATES:
        config = triton.Config({"BLOCK_M": bm, "BLOCK_K": bk}, num_warps=warps, maxnreg=maxnreg)
        assert any(sweep.hq._config_fits(config, flags) for flags in steps), (bm, bk)


@pytest.mark.parametrize("argv,match", [
    (["--dims", "1024", "--out", "x.json"], "--dims must be IN,OUT"),
    (["--dims", "1000,1024", "--out", "x.json"], "positive multiples of 16"),
    (["--tokens", "100", "--out", "x.json"], "positive multiple of 32"),
    (["--recipes", "hot,bf16", "--out", "x.json"], "not quantized recipes"),
    ([], "--out is required"),
])
def test_hash_ops_ab_refuses_bad_arguments(argv, match, capsys):
    with pytest.raises(SystemExit):
        load("hash_ops_ab").main(argv)
    assert match in capsys.readouterr().err


def test_sass_count_steps_are_tuned_configs_of_the_autotuner():
    sass_count = load("sass_count")
    import adahop_kernels.hadamard_quantize as hq

    configs = {(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_K"], c.num_warps, c.maxnreg) for c in hq._GPU_CONFIGS}
    for name, (flags, tuned) in sass_count.STEPS.items():
        listed = sass_count.step_configs(flags, tuned)
        assert listed[0] == tuned and tuned in configs, name
        assert len(set(listed)) == len(listed) and set(listed) <= configs
        # tile128 (W) needs 128-row tiles: no config below that is listed for it.
        assert name != "W" or all(bm % 128 == 0 and bk % 128 == 0 for bm, bk, _, _ in listed)


def test_sass_count_alu_pipe_counts_integer_logic_and_min_max_not_fma_or_memory():
    import collections

    sass_count = load("sass_count")
    sass = "\n".join(f"        /*{i:04x}*/                   {op} R1, R2, R3 ;" for i, op in enumerate(
        ["LOP3.LUT", "FMNMX", "VIMNMX", "@P0 SEL", "F2FP.SATFINITE.E4M3.F32.PACK_AB", "FFMA", "IMAD", "FADD", "STG.E",
         "SHFL.BFLY", "HGMMA.64x32x16.F32.BF16"]))
    ops = sass_count.opcodes(sass)
    assert sum(ops.values()) == 11
    assert sass_count.alu_pipe(ops) == 5
    assert sass_count.alu_pipe(collections.Counter({"FFMA": 3, "HMUL2": 2})) == 0


@pytest.mark.parametrize("name,expected", [
    ("nvjet_sm90_qqtst_128x128_128x6_1x2_h_bz_coopA_algo2_Ablk128_Bvec128_TNN", "gemm"),
    ("_hadamard_quantize_kernel", "quantize"), ("_redo_kernel", "quantize"), ("adahop::quantize", "quantize"),
    ("_fp8_group_kernel", "re-encode"),
    ("triton_poi_fused__to_copy_quantize_9", "copy"), ("Memcpy DtoD (Device -> Device)", "copy"),
    ("aten::mm", "gemm"), ("aten::_scaled_mm", "gemm"),
    ("triton_poi_fused___rshift___add_bitwise_and_bitwise_xor_mul_quantize_silu_silu_backward", "other"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16", "other"),
])
def test_profile_layer_sorts_kernels_into_kinds(name, expected):
    """Names as the committed GPU profiles (results/throughput/gpu/profiles/) and a CPU profile show them."""
    assert load("profile_layer").kind(name) == expected


@pytest.mark.parametrize("text,match", [("4096x4096", "must be TOKENSxINxOUT"), ("256x100x256", "positive multiples of 128")])
def test_profile_layer_refuses_a_bad_shape(text, match):
    with pytest.raises(argparse.ArgumentTypeError, match=match):
        load("profile_layer").parse_shape(text)


def test_profile_layer_writes_each_layers_time_by_kind(tmp_path):
    import json

    out = tmp_path / "profile.json"
    assert load("profile_layer").main(["--shape", "256x256x256", "--steps", "1", "--warmup", "1", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["provenance"]["config"]["times"] == "operator self CPU time"
    by_layer = {}
    for r in doc["records"]:
        by_layer.setdefault(r["layer"], []).append(r)
        assert r["us_per_step"] == pytest.approx(sum(k["us_per_step"] for k in r["kernels"]))
    assert set(by_layer) == {"uniform-iht", "nn.Linear-bf16"}
    for recs in by_layer.values():
        assert sum(r["share"] for r in recs) == pytest.approx(1.0)
    assert {"quantize", "gemm"} <= {r["kind"] for r in by_layer["uniform-iht"]}
    assert all(r["wall_us_per_step"] > 0 for r in doc["records"])


def test_profile_layer_cut_by_its_budget_keeps_the_layers_it_profiled(tmp_path, monkeypatch):
    import json
    import time

    script = load("profile_layer")
    real = script.profile_layer

    def slow_profile(*args):  # the first layer uses up the budget; the second is never started
        out = real(*args)
        time.sleep(0.3)
        return out

    monkeypatch.setattr(script, "profile_layer", slow_profile)
    out = tmp_path / "profile.json"
    out.write_text("{}")  # an earlier file stays as it is
    assert script.main(["--shape", "256x256x256", "--steps", "1", "--warmup", "1", "--out", str(out),
                        "--budget-s", "0.2"]) == 2
    assert out.read_text() == "{}"
    doc = json.loads((tmp_path / "profile-partial.json").read_text())
    assert {r["layer"] for r in doc["records"]} == {"uniform-iht"}
    assert doc["provenance"]["interrupted_by"] == "budget"
    assert doc["provenance"]["not_measured"] == ["nn.Linear-bf16"]


def test_profile_layer_host_record_sums_every_operator_and_lists_the_largest():
    script = load("profile_layer")
    times = {f"op{i}": (2 * i, 10.0 * i) for i in range(1, script.HOST_OPS + 6)}  # over 2 steps
    rec = script.host_record("iht", times, 2, 900.0)
    assert rec["kind"] == "host" and rec["wall_us_per_step"] == 900.0
    assert rec["us_per_step"] == pytest.approx(sum(us for _, us in times.values()) / 2)
    assert len(rec["ops"]) == script.HOST_OPS and rec["ops"][0] == {
        "name": f"op{script.HOST_OPS + 5}", "calls_per_step": script.HOST_OPS + 5, "us_per_step": 5.0 * (script.HOST_OPS + 5)}


def test_host_cost_writes_a_call_time_for_each_step_it_times(tmp_path):
    import json

    out = tmp_path / "host.json"
    assert load("host_cost").main(["--shape", "128x128x128", "--calls", "1", "--repeats", "1", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    # On a CPU: the layer, compiled and eager, three operators (the kernels' launches are a GPU's)
    # and the bf16 peer (torchao's float8 training needs a GPU)
    names = [r["name"] for r in doc["records"]]
    assert names[:7] == ["layer-compiled", "layer-eager", "op-quantize", "eager-quantize", "op-fp8_encode", "op-fp8_mm",
                         "peer-bf16-compiled"]
    assert all(r["us_per_call"] > 0 for r in doc["records"])
    assert doc["provenance"]["config"]["shape"] == [128, 128, 128]


def test_host_cost_cut_by_a_signal_writes_what_it_measured_and_exits_2(tmp_path, monkeypatch):
    import json
    import os
    import signal

    script = load("host_cost")
    timed = []

    def fake_per_call_us(fn, calls, repeats, on_cuda):  # the third timing is cut by a job's time limit
        timed.append(fn)
        if len(timed) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return 1.0

    monkeypatch.setattr(script, "per_call_us", fake_per_call_us)
    out = tmp_path / "host.json"
    handler = signal.getsignal(signal.SIGTERM)
    assert script.main(["--shape", "128x128x128", "--out", str(out)]) == 2
    doc = json.loads(out.read_text())
    assert [r["name"] for r in doc["records"]] == ["layer-compiled", "layer-eager"]
    assert doc["provenance"]["interrupted_by"] == "SIGTERM"
    assert doc["provenance"]["not_measured"][:2] == ["op-quantize", "eager-quantize"]
    assert signal.getsignal(signal.SIGTERM) is handler and len(timed) == 3


@pytest.mark.parametrize("shape", ["100x128x128", "128x128", "axbxc"])
def test_host_cost_refuses_a_bad_shape(tmp_path, shape):
    with pytest.raises(SystemExit):
        load("host_cost").main(["--shape", shape, "--out", str(tmp_path / "h.json")])
