"""The operators of adahop.library: schema, fake implementations and dispatch (torch.library.opcheck),
on both backends, and one operator call for both orientations agreeing with the reference."""

from __future__ import annotations

import ast
from types import SimpleNamespace

import pytest
import torch

from adahop import library
from adahop.backend import resolve_backend, triton_interpreted
from adahop.formats import MXFP4Tensor, dequantize_mxfp4_ref, to_fp8_ref

# (device, backend) pairs this process runs: CPU tensors through the reference and, under Triton's
# interpreter (the CPU test suite), the kernels; on a GPU machine CUDA tensors through both.
CASES = ([("cpu", "reference")] + ([("cpu", "triton")] if triton_interpreted() else [])
         + ([("cuda", "reference"), ("cuda", "triton")] if torch.cuda.is_available() else []))


def runnable(backend: str, device: str = "cpu") -> str:
    # The triton backend on CPU tensors runs under the interpreter (conftest sets TRITON_INTERPRET).
    resolve_backend(device, backend)
    return backend


def seed(device: str = "cpu") -> torch.Tensor:
    return torch.tensor([7], dtype=torch.int64, device=device)


BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (NaN included)."""
    def bits(t):
        return t.view(BITS[t.element_size()]) if t.dtype.is_floating_point else t

    return a.dtype == b.dtype and torch.equal(bits(a), bits(b))


@pytest.mark.parametrize("device, backend", CASES)
@pytest.mark.parametrize("request_k, request_m, rounding", [
    ("packed", "", "rne"),
    ("hadamard,fp8=seg128,amax", "hadamard,packed", "rne"),
    ("hadamard,fp8=seg128", "hadamard,fp8=tile128", "sr"),
    ("packed,fp8=row", "packed,fp8=row,amax", "rne"),
], ids=["packed", "fwd-x", "grad-sr", "rowwise"])
def test_quantize_opcheck(device, backend, request_k, request_m, rounding):
    x = torch.randn(128, 256, dtype=torch.bfloat16, device=device)
    torch.library.opcheck(torch.ops.adahop.quantize.default, (x, None, None, seed(device), request_k, request_m, 32,
                                                              rounding, "propagate", runnable(backend, device)))


@pytest.mark.parametrize("backend", [b for d, b in CASES if d == "cpu"])
def test_quantize_outputs_match_the_reference_encodings(backend):
    x = torch.randn(128, 256)
    outs = library.quantize(x, None, None, None, "hadamard,packed,fp8=seg128,amax", "packed,fp8=tile128", 32,
                            "rne", "propagate", runnable(backend))
    ref = library.quantize(x, None, None, None, "hadamard,packed,fp8=seg128,amax", "packed,fp8=tile128", 32,
                           "rne", "propagate", "reference")
    for got, want in zip(outs, ref):
        assert got.shape == want.shape and got.stride() == want.stride() and got.dtype == want.dtype
        assert torch.equal(got.view(torch.uint8) if got.dtype == torch.float8_e4m3fn else got,
                           want.view(torch.uint8) if want.dtype == torch.float8_e4m3fn else want)
    codes, scales, fp8, fp8_scale, amax = outs[:5]
    from adahop.formats import MXFP4Tensor

    assert torch.equal(fp8.view(torch.uint8), to_fp8_ref(MXFP4Tensor(codes, scales), "seg128")[0].view(torch.uint8))
    assert torch.equal(amax, x.abs().amax(1))  # before the transform


@pytest.mark.parametrize("device, backend", CASES)
def test_fp8_encode_dequantize_row_absmax_opcheck(device, backend):
    backend = runnable(backend, device)
    x = torch.randn(128, 256, device=device)
    codes, scales = library.quantize(x, None, None, None, "packed", "", 32, "rne", "propagate", "reference")[:2]
    for layout in ("row", "seg128", "tile128"):
        torch.library.opcheck(torch.ops.adahop.fp8_encode.default, (codes, scales, layout, backend))
    torch.library.opcheck(torch.ops.adahop.dequantize.default, (codes, scales, torch.bfloat16, backend))
    torch.library.opcheck(torch.ops.adahop.row_absmax.default, (x, backend))
    from adahop.formats import MXFP4Tensor

    assert torch.equal(library.dequantize(codes, scales, torch.float32, backend),
                       dequantize_mxfp4_ref(MXFP4Tensor(codes, scales)))


@pytest.mark.parametrize("device, backend", CASES)
@pytest.mark.parametrize("rows_scaled", [False, True])
def test_hot_round_opcheck(device, backend, rows_scaled):
    backend = runnable(backend, device)
    t = torch.randn(64, 48, device=device)
    scale = (t.abs().amax(1, keepdim=True) if rows_scaled else t.abs().amax().reshape(1, 1)) / 7
    for draw in (None, seed(device)):
        torch.library.opcheck(torch.ops.adahop.hot_round.default, (t, scale, draw, 7, backend))


@pytest.mark.parametrize("device", sorted({d for d, _ in CASES}))
def test_int8_mm_opcheck(device):
    a = torch.randint(-127, 128, (32, 64), dtype=torch.int8, device=device)
    b = torch.randint(-127, 128, (64, 24), dtype=torch.int8, device=device)
    for b_layout in (b, b.t().contiguous().t()):
        torch.library.opcheck(torch.ops.adahop.int8_mm.default, (a, b_layout))
    assert torch.equal(library.int8_mm(a.t().contiguous().t(), b).cpu(), a.cpu().int() @ b.cpu().int())


@pytest.mark.parametrize("device, backend", CASES)
def test_signs_from_seed_opcheck_and_equal_on_both_backends(device, backend):
    backend = runnable(backend, device)
    torch.library.opcheck(torch.ops.adahop.signs_from_seed.default, (96, seed(device), torch.bfloat16, backend))
    assert torch.equal(library.signs_from_seed(96, seed(device), torch.float32, backend),
                       library.signs_from_seed(96, seed(device), torch.float32, "reference"))


# These three operators are the kernels alone (adahop.ops holds their references): they run where
# the kernels do, CUDA tensors on a GPU machine and CPU ones under the interpreter.
KERNEL_DEVICES = [d for d, b in CASES if b == "triton"]


@pytest.mark.parametrize("device", KERNEL_DEVICES)
def test_pattern_statistics_and_signs_opcheck(device):
    x = torch.randn(64, 96, device=device)
    torch.library.opcheck(torch.ops.adahop.abs_median.default, (x,))
    torch.library.opcheck(torch.ops.adahop.scaled_mean_squares.default, (x, None, None))
    torch.library.opcheck(torch.ops.adahop.random_signs.default, (96, 12345, torch.device(device), torch.float32))
    torch.library.opcheck(torch.ops.adahop.signs_from_seed.default, (96, seed(device), torch.float32, "triton"))


def test_unknown_request_flags_and_layouts_are_refused():
    with pytest.raises(ValueError, match="unknown flag 'hadamrd'"):
        library.parse_request("hadamrd,packed")
    with pytest.raises(ValueError, match="unknown FP8 layout 'tile64'"):
        library.parse_request("packed,fp8=tile64")
    with pytest.raises(ValueError, match="asks for no output"):
        library.parse_request("hadamard")


FP8_MM_DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", FP8_MM_DEVICES)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_fp8_mm_opcheck_and_equal_to_the_dequantized_product(device, out_dtype):
    # Row layouts at K = 768 (the 125m model's width; N = 200 takes the padding to a multiple of
    # 16), blockwise (bf16 output only) at K = 1536: 12 K-blocks, whole groups of four.
    cases = [("row", "row", 768)] + ([("seg128", "tile128", 1536)] if out_dtype is torch.bfloat16 else [])
    for la, lb, k in cases:
        x, w = torch.randn(256, k, device=device), torch.randn(200 if lb == "row" else 256, k, device=device)
        a = library.quantize(x, None, None, None, f"packed,fp8={la}", "", 32, "rne", "propagate", "reference")
        b = library.quantize(w, None, None, None, f"packed,fp8={lb}", "", 32, "rne", "propagate", "reference")
        args = (a[2], a[3], la, b[2], b[3], lb, out_dtype)
        # test_schema is left out: its mutation check multiplies the inputs, which the CPU cannot
        # do for float8 tensors ("mul_cpu_reduced_float" not implemented); the fake, the autograd
        # registration and the traced (AOT) call are checked.
        torch.library.opcheck(torch.ops.adahop.fp8_mm.default, args,
                              test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))
        got = library.fp8_mm(*args).float()
        want = (dequantize_mxfp4_ref(MXFP4Tensor(a[0], a[1])).double()
                @ dequantize_mxfp4_ref(MXFP4Tensor(b[0], b[1])).double().t()).to(out_dtype).float()
        assert torch.allclose(got, want, rtol=2e-2 if out_dtype is torch.bfloat16 else 1e-5, atol=1e-3), (la, lb)


@pytest.mark.parametrize("device", FP8_MM_DEVICES)
def test_mm_reference_opcheck_and_equal_to_the_reference_product(device):
    from adahop.ops import mxfp4_mm_ref

    x, w = torch.randn(64, 96, device=device), torch.randn(48, 96, device=device)
    a = library.quantize(x, None, None, None, "packed", "", 32, "rne", "propagate", "reference")
    b = library.quantize(w, None, None, None, "packed", "", 32, "rne", "propagate", "reference")
    args = (a[0], a[1], b[0], b[1], torch.bfloat16)
    torch.library.opcheck(torch.ops.adahop.mm_reference.default, args)
    assert torch.equal(library.mm_reference(*args),
                       mxfp4_mm_ref(MXFP4Tensor(a[0], a[1]), MXFP4Tensor(b[0], b[1]), torch.bfloat16))


@pytest.mark.parametrize("device", FP8_MM_DEVICES)
def test_dense_mm_and_select_rows_opcheck_and_values(device):
    a = torch.randn(64, 96, dtype=torch.bfloat16, device=device)
    b = torch.randn(48, 96, dtype=torch.bfloat16, device=device)
    idx = torch.tensor([3, 17, 40], device=device)
    torch.library.opcheck(torch.ops.adahop.dense_mm.default, (a, b, torch.float32))
    torch.library.opcheck(torch.ops.adahop.select_rows.default, (a.float(), idx))
    assert torch.equal(library.dense_mm(a, b, torch.float32), (a @ b.t()).float())
    rows = library.select_rows(a.float(), idx)
    assert rows.dtype is torch.bfloat16 and torch.equal(rows, a[idx])


def test_blockwise_fp8_mm_needs_k_in_whole_groups_of_four_blocks():
    from adahop import ops
    from adahop.linear.gemm import GemmConfig
    from adahop.ops import GemmPath

    a = library.quantize(torch.randn(128, 768), None, None, None, "fp8=seg128", "", 32, "rne", "propagate", "reference")
    b = library.quantize(torch.randn(128, 768), None, None, None, "fp8=tile128", "", 32, "rne", "propagate", "reference")
    with pytest.raises(ValueError, match=r"needs K a multiple of 512, got fa of shape \(128, 768\)"):
        ops.fp8_mm(a[2], a[3], "seg128", b[2], b[3], "tile128", torch.bfloat16)
    config = GemmConfig(GemmPath.FP8_ROWWISE, "triton", blockwise=True)
    assert config.layouts(4096, 768, 768, torch.bfloat16) == ("row", "row")
    assert config.layouts(4096, 768, 2048, torch.bfloat16) == ("seg128", "tile128")
    assert config.layouts(4096, 768, 2048, torch.float32) == ("row", "row")


def test_fp8_mm_is_one_opaque_operator_in_a_compiled_graph():
    # Inductor must not lower the scaled GEMM itself (its templates read a scaling recipe from the
    # scales' shapes): the compiled graph calls the operator, and no aten._scaled_mm.
    from adahop import ops

    x, w = torch.randn(128, 256), torch.randn(64, 256)
    a = library.quantize(x, None, None, None, "fp8=row", "", 32, "rne", "propagate", "reference")
    b = library.quantize(w, None, None, None, "fp8=row", "", 32, "rne", "propagate", "reference")
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm

    torch._dynamo.reset()
    f = torch.compile(lambda fa, sa, fb, sb: ops.fp8_mm(fa, sa, "row", fb, sb, "row", torch.bfloat16), backend=backend,
                      fullgraph=True)
    out = f(a[2], a[3], b[2], b[3])
    assert torch.equal(out, ops.fp8_mm(a[2], a[3], "row", b[2], b[3], "row", torch.bfloat16))
    targets = [str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    assert any("adahop.fp8_mm" in t for t in targets), targets
    assert not any("_scaled_mm" in t for t in targets), targets


@pytest.mark.parametrize("draws", ["hot_round", "signs_from_seed"])
def test_counter_hash_draws_are_one_operator_in_a_compiled_graph(draws):
    # Traced, the lowbias32 hash is a deep int64 expression whose every value is read twice, which
    # Inductor's lowering expands before CSE (kernels/README): the graph must call the operator.
    from adahop import hot
    from adahop.linear.seeds import signs_from_seed

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm

    if draws == "hot_round":
        fn, args = (lambda t, s: hot.quantize_int(t, 4, "tensor", s).values), (torch.randn(64, 32), seed())
    else:
        fn, args = (lambda s: signs_from_seed(96, s, torch.float32)), (seed(),)
    torch._dynamo.reset()
    out = torch.compile(fn, backend=backend, fullgraph=True)(*args)
    assert torch.equal(out, fn(*args))
    targets = [str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    assert any(f"adahop.{draws}" in t for t in targets), targets
    assert not any("bitwise_xor" in t or "xor" in t.split(".")[-1] for t in targets), targets


@pytest.mark.parametrize("value", ["yes", "2", "true"])
def test_inductor_launches_switch_refuses_a_value_it_does_not_know(monkeypatch, value):
    monkeypatch.setenv(library.INDUCTOR_LAUNCHES_ENV, value)
    x = torch.randn(64, 64)
    with pytest.raises(ValueError, match="ADAHOP_INDUCTOR_LAUNCHES must be 0 or 1"):
        library.quantize(x, None, None, None, "packed", "", 32, "rne", "propagate", "reference")


def test_inductor_launches_switch_is_off_unless_set_to_1(monkeypatch):
    monkeypatch.delenv(library.INDUCTOR_LAUNCHES_ENV, raising=False)
    assert not library.inductor_launches()
    for value, on in (("", False), ("1", True), ("0", False)):
        monkeypatch.setenv(library.INDUCTOR_LAUNCHES_ENV, value)
        assert library.inductor_launches() is on, value


def test_eager_calls_on_plain_tensors_skip_the_dispatcher_and_give_the_operators_outputs():
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(128, 256)
    args = (x, None, None, None, "packed,fp8=tile128", "fp8=seg128", 32, "rne", "propagate", "reference")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        direct = library.quantize(*args)
        fp8 = library.fp8_encode(direct[0], direct[1], "row", "reference")
    names = {e.key for e in prof.key_averages()}
    assert "adahop::quantize" not in names and "adahop::fp8_encode" not in names, names
    assert all(map(bitwise_equal, direct, torch.ops.adahop.quantize(*args)))
    assert all(map(bitwise_equal, fp8, torch.ops.adahop.fp8_encode(direct[0], direct[1], "row", "reference")))


def test_only_plain_eager_tensors_skip_the_dispatcher():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.overrides import TorchFunctionMode

    class Passthrough(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    x = torch.randn(64, 64)
    assert library._plain_eager(x, None)
    assert not library._plain_eager(x, torch.empty(4, device="meta"))
    with Passthrough():
        assert not library._plain_eager(x)
    with FakeTensorMode() as mode:
        assert not library._plain_eager(mode.from_tensor(x))
    assert not torch.func.vmap(lambda t: torch.tensor(library._plain_eager(t)))(x).any()
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm

    torch._dynamo.reset()
    torch.compile(lambda t: library.quantize(t, None, None, None, "packed", "", 32, "rne", "propagate", "reference"),
                  backend=record, fullgraph=True)(x)
    targets = [str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    assert any("adahop.quantize" in t for t in targets), targets


def test_inductor_launches_switch_leaves_cpu_tensors_to_the_opaque_operators(monkeypatch):
    """On a CPU the kernels run under the interpreter, which Inductor cannot launch: with the switch
    on, the operators still call their opaque twins, and compile to the eager results."""
    monkeypatch.setenv(library.INDUCTOR_LAUNCHES_ENV, "1")
    x = torch.randn(64, 128)
    fn = lambda t: library.quantize(t, None, None, None, "hadamard,packed,fp8=seg128", "packed", 32, "rne",  # noqa: E731
                                    "propagate", "reference")
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)(x)
    assert all(map(bitwise_equal, compiled, fn(x)))


def test_launched_twins_pass_opcheck_and_answer_as_the_operators_off_a_gpu():
    """The ``*_launched`` triton_ops hand anything but a CUDA tensor on the Triton backend to the
    operators they stand for: the same schema, fake and results."""
    x = torch.randn(128, 256)
    args = (x, None, None, seed("cpu"), "hadamard,packed,fp8=seg128", "packed,fp8=tile128", 32, "rne", "propagate",
            "reference")
    torch.library.opcheck(torch.ops.adahop.quantize_launched.default, args)
    assert all(map(bitwise_equal, torch.ops.adahop.quantize_launched(*args), torch.ops.adahop.quantize(*args)))
    codes, scales = torch.ops.adahop.quantize(*args)[:2]
    torch.library.opcheck(torch.ops.adahop.fp8_encode_launched.default, (codes, scales, "tile128", "reference"))


def test_a_traced_launch_runs_the_eager_kernels_once_on_real_stand_ins_first(monkeypatch, caplog):
    """``tune_before_tracing``: under ``torch.compile``'s fake tensors, the eager kernels run once per
    distinct call on real tensors of the same layout (so that Triton's autotuner has picked the
    config the traced launch then keeps); an eager call, or a repeated one, runs nothing."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    monkeypatch.setattr(library, "_TUNED", set())
    installs = []
    monkeypatch.setattr(library, "cache_kernel_analysis", lambda: installs.append(1))  # not torch's, in a test
    monkeypatch.setattr(library, "keep_register_caps", lambda: installs.append(2))
    calls = []

    def run(x, codes, seed, flags):
        calls.append((type(x), tuple(x.shape), x.stride(), x.dtype, bool(torch.isfinite(x.float()).all()),
                      int(codes.min()) >= 118 and int(codes.max()) < 136, int(seed), flags))

    mode = FakeTensorMode()
    x = mode.from_tensor(torch.empty(8, 4, dtype=torch.bfloat16).t())
    codes, seed_t = mode.from_tensor(torch.empty(4, 2, dtype=torch.uint8)), mode.from_tensor(torch.ones((), dtype=torch.int64))
    with mode:
        for flags in ("hadamard", "hadamard", "packed"):
            library.tune_before_tracing(run, (x, codes, seed_t, flags))
    assert calls == [(torch.Tensor, (4, 8), (1, 4), torch.bfloat16, True, True, 0, "hadamard"),
                     (torch.Tensor, (4, 8), (1, 4), torch.bfloat16, True, True, 0, "packed")]
    assert installs == [1, 2] * 3  # each traced call installs the analysis cache and the caps (idempotent)
    library.tune_before_tracing(run, (torch.zeros(4, 8), torch.zeros(4, 2, dtype=torch.uint8), torch.zeros(()), "x"))
    assert len(calls) == 2 and len(installs) == 6
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    dynamic = FakeTensorMode(shape_env=ShapeEnv())
    sym = dynamic.from_tensor(torch.empty(8, 4, dtype=torch.bfloat16), symbolic_context=StatelessSymbolicContext(
        dynamic_sizes=[DimDynamic.DYNAMIC] * 2))
    with dynamic:  # symbolic sizes (dynamic shapes): no stand-ins
        library.tune_before_tracing(run, (sym, dynamic.from_tensor(torch.empty(4, 2, dtype=torch.uint8)),
                                          dynamic.from_tensor(torch.ones((), dtype=torch.int64)), "amax"))
    assert len(calls) == 2

    def fails(*args):
        raise RuntimeError("no such device")

    with mode, caplog.at_level("WARNING", logger="adahop.library"):  # a stand-in that cannot run: Inductor tunes
        library.tune_before_tracing(fails, (x, codes, seed_t, "hadamard"))
    assert "no such device" in caplog.text


def test_inductor_keeps_the_register_cap_of_a_config_that_has_one(monkeypatch):
    """``keep_register_caps``: the config Inductor writes into its generated code, and reads back,
    keeps ``maxnreg``, and the options it compiles a config with pass it to Triton; a config without
    a cap is written and compiled as before."""
    import triton
    from torch._inductor.runtime import triton_heuristics as th

    # Restored after the test: the wrappers are installed on torch's own functions.
    monkeypatch.setattr(th, "config_to_dict", th.config_to_dict)
    monkeypatch.setattr(th.CachingAutotuner, "_create_compile_options", th.CachingAutotuner._create_compile_options)
    plain_dict, plain_options = th.config_to_dict, th.CachingAutotuner._create_compile_options
    capped = triton.Config({"BLOCK_M": 32, "BLOCK_K": 128}, num_warps=4, maxnreg=64)
    uncapped = triton.Config({"BLOCK_M": 32, "BLOCK_K": 128}, num_warps=4)
    assert "maxnreg" not in plain_dict(capped)  # what the installed torch does unaided
    library.keep_register_caps()
    library.keep_register_caps()  # idempotent: one wrapper each
    assert th.config_to_dict.__wrapped__ is plain_dict
    assert th.CachingAutotuner._create_compile_options.__wrapped__ is plain_options
    written = th.config_to_dict(capped)
    assert written == {**plain_dict(capped), "maxnreg": 64}
    assert th.config_from_dict(written).maxnreg == 64 and th.config_from_dict(written).kwargs == capped.kwargs
    assert th.config_to_dict(uncapped) == plain_dict(uncapped)

    autotuner = SimpleNamespace(device_props=SimpleNamespace(type="cuda", cc=90), inductor_meta={})
    meta = {"num_warps": 4, "num_stages": 1, "debug": False}
    options = th.CachingAutotuner._create_compile_options(autotuner, capped, dict(meta))
    assert options == {**plain_options(autotuner, capped, dict(meta)), "maxnreg": 64}
    assert th.CachingAutotuner._create_compile_options(autotuner, uncapped, dict(meta)) == plain_options(
        autotuner, uncapped, dict(meta))


def test_torch_analyses_each_kernel_variant_once_not_each_launch(monkeypatch):
    """``cache_kernel_analysis``: torch's per-launch TTIR analysis of which tensors a kernel writes
    runs once per kernel variant (kernel, configs, argument values and element types); other
    kernels, and arguments with no plain key, still go to torch's analysis every time."""
    from torch._higher_order_ops import triton_kernel_wrap as tkw

    import adahop_kernels.hadamard_quantize as hq

    calls = []

    def analyse(kernel, kwargs, tma):
        calls.append(sorted(kwargs))
        return {"writes": [n for n, v in kwargs.items() if isinstance(v, torch.Tensor)]}

    monkeypatch.setattr(tkw, "identify_accessed_tensors", analyse, raising=False)
    monkeypatch.setattr(tkw, "identify_mutated_tensors", analyse, raising=False)
    library.cache_kernel_analysis()
    library.cache_kernel_analysis()  # idempotent: one cache, not a cache of a cache
    cached = tkw.identify_accessed_tensors
    assert cached.adahop_cached and cached.__wrapped__ is analyse

    x, y = torch.empty(4, 4), torch.empty(8, 8)
    first = cached(hq._tuned_kernel, {"x_ptr": x, "M": 4, "FP8": 1}, {})
    again = cached(hq._tuned_kernel, {"x_ptr": y, "M": 4, "FP8": 1}, {})  # other tensors, same variant
    assert first == again == {"writes": ["x_ptr"]} and first is not again and len(calls) == 1
    cached(hq._tuned_kernel, {"x_ptr": x, "M": 4, "FP8": 2}, {})       # another constexpr
    cached(hq._tuned_kernel, {"x_ptr": x.half(), "M": 4, "FP8": 1}, {})  # another element type
    cached(hq._redo_kernel, {"x_ptr": x, "M": 4, "FP8": 1}, {})        # another kernel
    assert len(calls) == 4
    unknown = object()
    cached(hq._tuned_kernel, {"x_ptr": x, "M": unknown}, {})
    cached(hq._tuned_kernel, {"x_ptr": x, "M": unknown}, {})
    assert len(calls) == 6

    def foreign(x_ptr):  # a kernel outside adahop_kernels: torch's analysis each time
        pass

    cached(foreign, {"x_ptr": x}, {})
    cached(foreign, {"x_ptr": x}, {})
    assert len(calls) == 8


def test_quantize_refuses_the_wrong_number_of_arguments():
    with pytest.raises(TypeError, match="10 arguments"):
        library.quantize(torch.randn(64, 64), None, None, None, "packed", "", 32, "rne", "propagate")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("request_k, request_m, rounding", [
    ("hadamard,fp8=seg128", "hadamard,packed", "rne"),           # X in the forward: FP8 along in, saved along tokens
    ("hadamard,packed,fp8=tile128", "hadamard,packed,fp8=tile128", "rne"),  # W, both orientations
    ("hadamard,fp8=seg128,amax", "hadamard,fp8=tile128", "sr"),  # dY: stochastic rounding, the outliers' amax
    ("packed,fp8=row", "", "rne"),                               # the rowwise re-encode after the pass
])
def test_launched_quantize_compiled_equals_the_operator_bit_for_bit(monkeypatch, request_k, request_m, rounding):
    """With ``ADAHOP_INDUCTOR_LAUNCHES=1``, Inductor launches the kernels from its generated code: every
    output equals the eager operator's, bit for bit, and the saved packed operand re-encodes alike."""
    monkeypatch.setenv(library.INDUCTOR_LAUNCHES_ENV, "1")
    x = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
    x[3, 17] = float("nan")  # a block the redo kernel takes
    args = (None, None, seed("cuda"), request_k, request_m, 32, rounding, "propagate", "triton")

    def fn(t):
        outs = library.quantize(t, *args)
        encoded = library.fp8_encode(outs[5], outs[6], "tile128", "triton") if "packed" in request_m else ()
        return (*outs, *encoded)

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)(x)
    monkeypatch.setenv(library.INDUCTOR_LAUNCHES_ENV, "0")
    eager = fn(x)
    assert len(compiled) == len(eager)
    for i, (got, want) in enumerate(zip(compiled, eager)):
        assert got.shape == want.shape and got.stride() == want.stride(), f"output {i}: layout differs"
        assert bitwise_equal(got, want), f"output {i} differs"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_inductor_compiles_the_one_config_the_eager_autotuner_picked(monkeypatch):
    """A launched quantize under ``torch.compile``: each kernel in the generated code has one config
    (Triton's eager pick for its key, ``library.tune_before_tracing``), not every config to time,
    and the pick's register cap with it (``library.keep_register_caps``)."""
    from torch._inductor.utils import run_and_get_code

    import adahop_kernels.hadamard_quantize as hq

    monkeypatch.setenv(library.INDUCTOR_LAUNCHES_ENV, "1")
    monkeypatch.delenv("ADAHOP_KERNEL_CONFIG", raising=False)  # the autotuner's own choice
    x = torch.randn(1024, 2048, device="cuda", dtype=torch.bfloat16)
    args = (None, None, seed("cuda"), "hadamard,fp8=seg128", "hadamard,packed", 32, "rne", "propagate", "triton")
    torch._dynamo.reset()
    _, sources = run_and_get_code(torch.compile(lambda t: library.quantize(t, *args), fullgraph=True), x)
    configs = [part.split("configs=[", 1)[1].split("]", 1)[0] for src in sources for part in src.split("user_autotune(")[1:]]
    assert configs, "no user-defined kernel in the generated code"
    assert all(c.count("num_warps") == 1 for c in configs), configs
    caps = {(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_K"], c.num_warps): c.maxnreg for c in hq._tuned_kernel.cache.values()}
    written = [d for c in configs for d in ast.literal_eval(f"[{c}]") if "BLOCK_M" in d and "BLOCK_K" in d]
    assert written and all(d.get("maxnreg") == caps[d["BLOCK_M"], d["BLOCK_K"], d["num_warps"]] for d in written), (
        written, caps)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("layouts, out_dtype, n", [
    (("row", "row"), torch.bfloat16, 200),     # N padded to a multiple of 16
    (("row", "row"), torch.float32, 256),      # unit-scale product, scales after
    (("seg128", "tile128"), torch.bfloat16, 256),
])
def test_fp8_mm_with_inductor_launches_compiles_to_cublas_and_the_operator_bits(monkeypatch, layouts, out_dtype, n):
    """With ``ADAHOP_INDUCTOR_LAUNCHES=1`` the compiled graph calls ``aten._scaled_mm`` (from
    Inductor's generated code) and gives the operator's product bit for bit."""
    from adahop import ops

    la, lb = layouts
    x, w = torch.randn(512, 1024, device="cuda"), torch.randn(n, 1024, device="cuda")
    a = library.quantize(x, None, None, None, f"fp8={la}", "", 32, "rne", "propagate", "triton")
    b = library.quantize(w, None, None, None, f"fp8={lb}", "", 32, "rne", "propagate", "triton")
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return torch._inductor.compile(gm, example_inputs)

    monkeypatch.setenv(library.INDUCTOR_LAUNCHES_ENV, "1")
    torch._dynamo.reset()
    f = torch.compile(lambda fa, sa, fb, sb: ops.fp8_mm(fa, sa, la, fb, sb, lb, out_dtype), backend=record, fullgraph=True)
    got = f(a[2], a[3], b[2], b[3])
    targets = [str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    assert any("_scaled_mm" in t for t in targets) and not any("adahop.fp8_mm" in t for t in targets), targets
    want = torch.ops.adahop.fp8_mm(a[2], a[3], la, b[2], b[3], lb, out_dtype)
    assert got.shape == want.shape and bitwise_equal(got, want)
