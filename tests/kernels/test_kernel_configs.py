"""The autotuned kernels' configs: which ones ``$ADAHOP_KERNEL_CONFIG`` lets a launch use, and (on a
GPU) that every config gives the reference's bytes.

The kernel tests on a GPU run with one config per kernel variant (``experiments/kernel_tests.py``
sets ``first``): one compile each instead of one per config. The tile shape never changes a result
(the kernels' contract), and ``test_every_config_matches_the_reference`` holds every config to it.
"""

import collections

import pytest
import torch
import triton
import triton.language as tl

import adahop_kernels.dequantize as dq
import adahop_kernels.fp8_reencode as fr
import adahop_kernels.hadamard_quantize as hq
from adahop import ops
from adahop.formats import MXFP4Tensor, dequantize_mxfp4_ref, to_fp8_ref
import adahop_kernels._common as common
from adahop_kernels._common import KERNEL_CONFIG_ENV, PARALLEL_COMPILE_ENV, compile_threads, fitting_configs, kernel_config_choice
from adahop_kernels.hadamard_quantize import Side, quantize

# The launch flags of the layer's forward X step (tests/bench/test_bench_quantize.py).
X_STEP = dict(ALONG_K=True, ALONG_M=True, HADAMARD=True, HADAMARD_T=True, HAS_SIGNS=False, HAS_SIGNS_T=False,
              PACKED=False, PACKED_T=True, FP8=1, FP8_T=0, AMAX=False, AMAX_T=False, HS=32, SR=False, DOT_FP32=False)
TUNERS = {"hadamard_quantize": (hq._tuned_kernel, X_STEP), "fp8_reencode": (fr._tuned_kernel, {}),
          "fp8_reencode groups": (fr._tuned_group_kernel, {"GROUP_M": 128}), "dequantize": (dq._tuned_kernel, {})}


def pruned(tuner, kwargs):
    return tuner.early_config_prune(tuner.configs, {}, **kwargs)


@pytest.mark.parametrize("name", TUNERS)
def test_environment_narrows_the_configs(name, monkeypatch):
    tuner, kwargs = TUNERS[name]
    monkeypatch.delenv(KERNEL_CONFIG_ENV, raising=False)
    every = pruned(tuner, kwargs)
    assert len(every) > 1
    monkeypatch.setenv(KERNEL_CONFIG_ENV, "tuned")
    assert pruned(tuner, kwargs) == every
    monkeypatch.setenv(KERNEL_CONFIG_ENV, "first")
    assert pruned(tuner, kwargs) == every[:1]
    monkeypatch.setenv(KERNEL_CONFIG_ENV, str(len(every) + 1))  # modulo the count
    assert pruned(tuner, kwargs) == [every[1]]


def test_quantize_keeps_only_the_configs_its_flags_fit(monkeypatch):
    monkeypatch.delenv(KERNEL_CONFIG_ENV, raising=False)
    w_step = {**X_STEP, "PACKED_T": False, "FP8": 2, "FP8_T": 2}
    kept = pruned(hq._tuned_kernel, w_step)
    assert kept and all(c.kwargs["BLOCK_M"] % 128 == 0 and c.kwargs["BLOCK_K"] % 128 == 0 for c in kept)
    assert len(kept) < len(pruned(hq._tuned_kernel, X_STEP))


@pytest.mark.parametrize("value", ["fast", "-1", "1.5"])
def test_bad_choice_names_the_variable(value, monkeypatch):
    monkeypatch.setenv(KERNEL_CONFIG_ENV, value)
    with pytest.raises(ValueError, match=rf"\$ADAHOP_KERNEL_CONFIG must be 'tuned', 'first' or a config index, got '{value}'"):
        kernel_config_choice()


class _Kernel:
    """A stand-in for a ``triton.jit`` function: records each ``warmup`` and whether Triton's
    async-compile mode was active for it (its compiles then go to the thread pool)."""

    def __init__(self, fail: bool = False):
        self.warmups, self.fail = [], fail

    def warmup(self, *, grid, **kwargs):
        from triton.runtime._async_compile import active_mode

        self.warmups.append((kwargs, active_mode.get() is not None))
        if self.fail:
            raise RuntimeError("no such config")


def _prune_on_gpu(monkeypatch, kernel, **launch):
    monkeypatch.setattr(common, "INTERPRETED", False)  # what a GPU launch sees
    prune = fitting_configs(lambda c, kw: c.kwargs["BLOCK_M"] % 128 == 0, kernel)["early_config_prune"]
    return prune(hq._GPU_CONFIGS, {}, grid=lambda meta: (1,), warmup=False, **launch)


def test_a_new_key_compiles_its_configs_together_first(monkeypatch):
    monkeypatch.delenv(KERNEL_CONFIG_ENV, raising=False)
    monkeypatch.setenv(PARALLEL_COMPILE_ENV, "4")
    kernel = _Kernel()
    kept = _prune_on_gpu(monkeypatch, kernel, x_ptr="x", M=256)
    assert len(kept) > 1 and all(c.kwargs["BLOCK_M"] % 128 == 0 for c in kept)
    # One warmup per kept config, with the launch's arguments (not the autotuner's grid and flag)
    # and the config's, all inside Triton's async-compile mode.
    assert [w[0] for w in kernel.warmups] == [{"x_ptr": "x", "M": 256, **c.all_kwargs()} for c in kept]
    assert all(active for _, active in kernel.warmups)


def test_compile_failures_are_left_to_the_autotuner(monkeypatch):
    monkeypatch.delenv(KERNEL_CONFIG_ENV, raising=False)
    monkeypatch.setenv(PARALLEL_COMPILE_ENV, "2")
    kernel = _Kernel(fail=True)
    kept = _prune_on_gpu(monkeypatch, kernel, M=256)
    assert len(kernel.warmups) == len(kept) > 1


@pytest.mark.parametrize("env", [{PARALLEL_COMPILE_ENV: "1"}, {PARALLEL_COMPILE_ENV: "0"}, {KERNEL_CONFIG_ENV: "first"}])
def test_one_thread_or_one_config_compiles_nothing_ahead(env, monkeypatch):
    monkeypatch.delenv(KERNEL_CONFIG_ENV, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    kernel = _Kernel()
    _prune_on_gpu(monkeypatch, kernel, M=256)
    assert kernel.warmups == []


def test_the_interpreter_compiles_nothing_ahead(monkeypatch):
    monkeypatch.delenv(KERNEL_CONFIG_ENV, raising=False)
    monkeypatch.setattr(common, "INTERPRETED", True)
    kernel = _Kernel()
    fitting_configs(None, kernel)["early_config_prune"](hq._GPU_CONFIGS, {}, M=256)
    assert kernel.warmups == []


@pytest.mark.parametrize("value", ["many", "-2", "1.5"])
def test_bad_thread_count_names_the_variable(value, monkeypatch):
    monkeypatch.setenv(PARALLEL_COMPILE_ENV, value)
    with pytest.raises(ValueError, match=rf"\$ADAHOP_COMPILE_THREADS must be a non-negative int, got '{value}'"):
        compile_threads()


def test_default_thread_count_is_the_usable_cpus(monkeypatch):
    monkeypatch.delenv(PARALLEL_COMPILE_ENV, raising=False)
    assert 1 <= compile_threads() <= 16


@pytest.mark.skipif(not torch.cuda.is_available() or hq.INTERPRETED, reason="compiles for a GPU")
def test_the_autotuner_times_the_configs_compiled_ahead(monkeypatch):
    """On a GPU: a new key's configs are compiled by the warm-ups, keyed as the timing launches key
    them, so no timing launch compiles again; and the result is the reference's."""
    from triton import knobs

    monkeypatch.delenv(KERNEL_CONFIG_ENV, raising=False)
    monkeypatch.setenv(PARALLEL_COMPILE_ENV, "4")
    fn = hq._hadamard_quantize_kernel
    # Forget what this process compiled and tuned, so the launch below is a new key.
    monkeypatch.setattr(fn, "device_caches", collections.defaultdict(fn.create_binder))
    monkeypatch.setattr(hq._tuned_kernel, "cache", {})
    compiles = []

    def hook(*, fn, is_manual_warmup, **_):
        if fn.name.endswith("_hadamard_quantize_kernel"):
            compiles.append(is_manual_warmup)
        return False

    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", hook)
    x = torch.randn(256, 512, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    side = Side(True, None, packed=False, fp8="tile128")
    out, _ = quantize(x.cuda(), side, side)
    timed = hq._tuned_kernel.configs_timings  # the configs the autotuner timed for this key
    assert len(timed) > 1 and compiles == [True] * len(timed), compiles
    fp8, scale = to_fp8_ref(ops.hadamard_quantize_ref(x, True), "tile128")
    assert torch.equal(_u8(out.fp8), _u8(fp8)) and torch.equal(out.fp8_scale.cpu(), scale)


def _each_config(tuner, monkeypatch):
    """Index i of the tuner's configs, with its choices forgotten: the next launch uses the i-th
    config that fits (modulo their count), so every fitting config runs, whatever the launch's flags."""
    for i in range(len(tuner.configs)):
        monkeypatch.setenv(KERNEL_CONFIG_ENV, str(i))
        tuner.cache.clear()
        yield i
    tuner.cache.clear()


def _u8(t):
    return t.view(torch.uint8).cpu()


@pytest.mark.skipif(not torch.cuda.is_available() or hq.INTERPRETED, reason="configs are GPU launches (the interpreter tiles by its own rule)")
def test_every_config_matches_the_reference(monkeypatch):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(256, 512, generator=g) * torch.exp2(torch.randn(256, 512, generator=g) * 3)).to(torch.bfloat16)
    steps = {"X": (Side(True, None, packed=False, fp8="seg128"), Side(True, None)),
             "W": (Side(True, None, packed=False, fp8="tile128"), Side(True, None, packed=False, fp8="tile128"))}
    for name, sides in steps.items():
        for i in _each_config(hq._tuned_kernel, monkeypatch):
            outs = quantize(x.cuda(), *sides)
            for out, side, xo in zip(outs, sides, (x, x.t())):
                q = ops.hadamard_quantize_ref(xo, True)
                if side.packed:
                    assert torch.equal(out.codes.cpu(), q.codes) and torch.equal(out.scales.cpu(), q.scales), (name, i)
                if side.fp8:
                    fp8, scale = to_fp8_ref(q, side.fp8)
                    assert torch.equal(_u8(out.fp8), _u8(fp8)) and torch.equal(out.fp8_scale.cpu(), scale), (name, i)
    q = ops.hadamard_quantize_ref(x, True)
    t = MXFP4Tensor(q.codes.cuda(), q.scales.cuda())
    for i in _each_config(dq._tuned_kernel, monkeypatch):
        assert torch.equal(dq.dequantize(t, torch.float32).cpu(), dequantize_mxfp4_ref(q, torch.float32)), i
    for layout, tuner in (("row", fr._tuned_kernel), ("tile128", fr._tuned_group_kernel), ("seg128", fr._tuned_group_kernel)):
        fp8_ref, scale_ref = to_fp8_ref(q, layout)
        for i in _each_config(tuner, monkeypatch):
            fp8, scale = fr.fp8_reencode(t, layout)
            assert torch.equal(_u8(fp8), _u8(fp8_ref)) and torch.equal(scale.cpu(), scale_ref), (layout, i)


@triton.jit
def _scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def _scale_tuner():
    configs = [triton.Config({"BLOCK": b}) for b in (16, 32, 64)]
    return common.autotune(_scale_kernel, configs, key=["n"])


def _launch(tuner, x):
    out = torch.empty_like(x)
    tuner[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, out, x.numel())
    return out


def test_a_traced_launch_takes_the_config_an_eager_launch_picked(monkeypatch):
    """``torch.compile`` traces a launch with fake tensors; the autotuner's eager pick for the same
    key (Triton's own cache, filled by an eager launch) is then the one config Inductor compiles."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    tuner = _scale_tuner()
    x = torch.arange(64, dtype=torch.float32)
    monkeypatch.setenv(KERNEL_CONFIG_ENV, "1")  # the eager launch "picks" the second config, no timing
    assert torch.equal(_launch(tuner, x), x * 2)
    assert list(tuner.cache.values()) == [tuner.configs[1]]
    monkeypatch.delenv(KERNEL_CONFIG_ENV)
    prune = tuner.early_config_prune
    mode = FakeTensorMode()
    fake, half = mode.from_tensor(x), mode.from_tensor(x.half())
    with mode:
        assert prune(tuner.configs, {"x_ptr": fake, "out_ptr": fake, "n": 64}) == [tuner.configs[1]]
        # Another key (no eager launch had it), or another dtype: every config, as before.
        assert prune(tuner.configs, {"x_ptr": fake, "out_ptr": fake, "n": 32}) == tuner.configs
        assert prune(tuner.configs, {"x_ptr": half, "out_ptr": half, "n": 64}) == tuner.configs
    # An eager launch's own pruning is untouched by the cache: the autotuner times every config.
    assert prune(tuner.configs, {"x_ptr": x, "out_ptr": x, "n": 64}) == tuner.configs
    assert common.eager_pick(tuner, {"x_ptr": x, "out_ptr": x, "n": 64}) is None
