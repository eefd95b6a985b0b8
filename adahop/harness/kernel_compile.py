"""Compile every kernel of ``adahop_kernels`` for Hopper (sm_90) as GPU launches would, without a GPU.

Why: the CPU tests run the kernels in Triton's interpreter, which never specializes arguments. A
GPU launch does: an int argument equal to 1 becomes a constexpr (a Python int, with no ``.to()``),
ints and pointers divisible by 16 get divisibility hints, the launchers pick their GPU tiles, and
every autotune config is its own compile. A kernel can pass every CPU test and fail to compile on
the GPU (an int argument used as a tensor compiles until a launch passes 1). This check replays
what the GPU compiles:

1. :func:`record`: call the public launchers with CPU tensors, in a process without the
   interpreter, while ``JITFunction.run`` and ``Autotuner.run`` record each launch (kernel,
   arguments, options; every config that survives the autotuner's ``early_config_prune``) instead
   of launching, and each kernel module's ``check_device`` accepts CPU tensors;
2. :func:`specialize`: type the arguments and specialize them as Triton's runtime does
   (``triton/runtime/jit.py``, ``create_function_from_signature``); :func:`variants` adds, for each
   int argument Triton may specialize, the variant where it is 1, since any of them can be 1 at run time;
3. :func:`compile_variants`: ``triton.compile`` each distinct variant for ``GPUTarget("cuda", 90, 32)``,
   down to the cubin (Triton ships ptxas).

``--quick`` (the test suite's) compiles every config at least once to the cubin and every flag
value and argument type of each kernel at least once to PTX (:func:`variants`); the other
variants go through Triton's front end and its GPU passes to TTGIR, the "=1" variants to TTIR,
where an int that became a constexpr, a block shape or a flag that does not type-check fails. Few
of the default variants then reach LLVM, which with ptxas costs most of a compile.

    python -m adahop.harness.kernel_compile             # default_cases()
    python -m adahop.harness.kernel_compile --quick     # default_cases(), most variants to PTX, TTGIR or TTIR
    python -m adahop.harness.kernel_compile --full      # full_cases(): every flag combination (long, see kernels/README.md)
    python -m adahop.harness.kernel_compile --only signs

Prints one line per kernel and each failure (kernel, case, the arguments set to 1, the error's
first lines); exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import importlib
import multiprocessing
import os
import pkgutil
import sys
import time
import types
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, NamedTuple
from unittest import mock

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton._C.libtriton import ir
from triton.compiler import ASTSource, make_backend
from triton.runtime.autotuner import Autotuner
from triton.runtime.jit import JITFunction

from adahop.backend import triton_interpreted

TARGET = GPUTarget("cuda", 90, 32)
H200_SMS = 132  # what torch.cuda.get_device_properties reports on the H200 (launchers size grids by it)

# torch dtype -> Triton's type name, as triton._C.libtriton.native_specialize_impl names them.
TRITON_TYPES = {
    torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64",
    torch.uint8: "u8", torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64",
    torch.float8_e4m3fn: "fp8e4nv", torch.float8_e5m2: "fp8e5",
}


class Case(NamedTuple):
    """A launcher call to record: ``name`` says which options it takes."""

    name: str
    call: Callable[[], Any]


@dataclass
class Launch:
    """One kernel launch as a GPU would make it. ``group`` numbers the launcher's call: the
    configs one autotuned call would compile share it."""

    case: str
    group: int
    fn: JITFunction
    args: dict[str, Any]
    options: dict[str, Any]
    config: tuple[tuple[str, Any], ...] | None = None  # the autotune config's kwargs, for autotuned launches


@dataclass(frozen=True)
class Variant:
    """One compile: what ``triton.compile`` gets. Equal variants compile to the same binary."""

    kernel: str
    signature: tuple[tuple[str, str], ...]
    constexprs: tuple[tuple[str, Any], ...]
    divisible: tuple[str, ...]  # arguments with Triton's 16-divisibility hint
    options: tuple[tuple[str, Any], ...]
    fn: JITFunction = field(compare=False)
    case: str = field(compare=False)
    ones: tuple[str, ...] = field(compare=False, default=())  # int arguments this variant sets to 1
    stage: str = field(compare=False, default="cubin")  # the last of Triton's stages compile_variant runs


@dataclass
class Result:
    variant: Variant
    seconds: float
    error: str | None


def kernel_name(fn: JITFunction) -> str:
    return f"{fn.module.rsplit('.', 1)[-1]}.{fn.fn.__name__}"


# ---------------------------------------------------------------------------------------------
# 1. Recording


def _kernel_modules() -> list[types.ModuleType]:
    import adahop_kernels

    return [importlib.import_module(f"adahop_kernels.{m.name}") for m in pkgutil.iter_modules(adahop_kernels.__path__)]


def _check_device_cpu(t: torch.Tensor, name: str) -> None:
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name} is on {t.device}; recording takes CPU (or CUDA) tensors")


def record(cases: Iterable[Case]) -> list[Launch]:
    """Call each case's launcher; return the launches a GPU would compile, none of them run.

    Raises RuntimeError under ``TRITON_INTERPRET=1`` (the launchers then pick the interpreter's tiles
    and the kernels are not JITFunctions) and ValueError for a case that launches nothing.
    """
    if triton_interpreted():
        raise RuntimeError("kernel_compile records GPU launches: run it with TRITON_INTERPRET unset or 0 "
                           "(set before anything imports triton)")
    launches: list[Launch] = []
    state = {"case": "", "group": 0, "autotuned": None, "config": None}

    def jit_run(fn, *args, grid, warmup, **kwargs):
        names = {p.name for p in fn.params}
        bound = fn.signature.bind(*args, **{k: v for k, v in kwargs.items() if k in names})
        bound.apply_defaults()
        group = state["autotuned"]
        if group is None:
            state["group"] += 1
            group = state["group"]
        options = {k: v for k, v in kwargs.items() if k not in names and v is not None}
        launches.append(Launch(state["case"], group, fn, dict(bound.arguments), options, state["config"]))

    def autotuner_run(tuner, *args, **kwargs):
        # Autotuner.run without the benchmark: every config it would time, each a compile.
        tuner.nargs = dict(zip(tuner.arg_names, args))
        configs = tuner.prune_configs(kwargs) if len(tuner.configs) > 1 else tuner.configs
        state["group"] += 1
        state["autotuned"] = state["group"]
        try:
            for config in configs:
                state["config"] = tuple(sorted(config.all_kwargs().items()))
                tuner.fn.run(*args, **kwargs, **config.all_kwargs())
        finally:
            state["autotuned"] = state["config"] = None
            tuner.nargs = None

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(JITFunction, "run", jit_run))
        stack.enter_context(mock.patch.object(Autotuner, "run", autotuner_run))
        # Every config the autotuner could pick, whatever the environment narrows a launch to; no
        # compiles ahead of the launch (their warm-ups would record each config twice).
        from adahop_kernels._common import KERNEL_CONFIG_ENV, PARALLEL_COMPILE_ENV

        stack.enter_context(mock.patch.dict(os.environ, {KERNEL_CONFIG_ENV: "tuned", PARALLEL_COMPILE_ENV: "0"}))
        stack.enter_context(mock.patch.object(torch.cuda, "get_device_properties",
                                              lambda *a, **k: types.SimpleNamespace(multi_processor_count=H200_SMS)))
        for module in _kernel_modules():
            if hasattr(module, "check_device"):
                stack.enter_context(mock.patch.object(module, "check_device", _check_device_cpu))
        for case in cases:
            state["case"] = case.name
            before = len(launches)
            case.call()
            if len(launches) == before:
                raise ValueError(f"case {case.name!r} launched no kernel")
    return launches


# ---------------------------------------------------------------------------------------------
# 2. Specialization


def _int_type(v: int) -> str:
    if -(2**31) <= v < 2**31:
        return "i32"
    if -(2**63) <= v < 2**63:
        return "i64"
    if v < 2**64:
        return "u64"
    raise ValueError(f"int argument {v} does not fit in 64 bits")


def specializable_ints(launch: Launch) -> list[str]:
    """The int arguments Triton would turn into a constexpr if they were 1 (not yet 1 here)."""
    return [p.name for p in launch.fn.params
            if not p.is_constexpr and not p.do_not_specialize
            and type(launch.args[p.name]) is int and launch.args[p.name] != 1]


def specialize(launch: Launch, ones: tuple[str, ...] = ()) -> Variant:
    """The compile a GPU launch of ``launch`` makes, with the int arguments ``ones`` set to 1.

    Triton's runtime rules (triton/runtime/jit.py, native_specialize_impl): constexpr parameters
    and None are constexprs; an int equal to 1 becomes constexpr 1 unless its parameter is in
    ``do_not_specialize``; other ints are i32, i64 or u64 by range, bools u1, floats fp32, tensors
    ``*<dtype>``; an int divisible by 16 and a pointer aligned to 16 bytes get the divisibility hint
    unless the parameter is in ``do_not_specialize`` or ``do_not_specialize_on_alignment``.
    """
    fn = launch.fn
    signature, constexprs, divisible = [], [], []
    for p in fn.params:
        v = 1 if p.name in ones else launch.args[p.name]
        if not p.is_constexpr and p.annotation_type:
            raise ValueError(f"{kernel_name(fn)}: the annotated parameter {p.name} is not modelled here "
                             "(Triton keeps its annotated type); extend specialize()")
        hint = not (p.do_not_specialize or p.do_not_specialize_on_alignment)
        if p.is_constexpr or v is None or (type(v) is int and v == 1 and not p.do_not_specialize):
            ty = "constexpr"
            constexprs.append((p.name, v))
        elif isinstance(v, bool):
            ty = "u1"
        elif isinstance(v, int):
            ty = _int_type(v)
            if hint and v % 16 == 0:
                divisible.append(p.name)
        elif isinstance(v, float):
            ty = "fp32"
        elif isinstance(v, torch.Tensor):
            if v.dtype not in TRITON_TYPES:
                raise ValueError(f"{kernel_name(fn)}: argument {p.name} has dtype {v.dtype}, not in TRITON_TYPES")
            ty = "*" + TRITON_TYPES[v.dtype]
            if hint and v.data_ptr() % 16 == 0:
                divisible.append(p.name)
        else:
            raise TypeError(f"{kernel_name(fn)}: argument {p.name} is a {type(v).__name__}, which a launch cannot take")
        signature.append((p.name, ty))
    return Variant(kernel_name(fn), tuple(signature), tuple(constexprs), tuple(divisible),
                   tuple(sorted(launch.options.items())), fn, launch.case, tuple(ones))


def features(v: Variant) -> set[tuple]:
    """What of a variant's compile its kernel's code branches on: each constexpr's value and each
    argument's type. (Not the divisibility hints, which change how loads vectorize: every config's
    cubin variant carries its launch's.)"""
    return {("=", k, repr(x)) for k, x in v.constexprs} | {(":", k, t) for k, t in v.signature}


def variants(launches: list[Launch], quick: bool = False) -> list[Variant]:
    """The distinct compiles of ``launches`` (in order) and of each launcher call's "=1" variants.

    The "=1" variants of a call use one of its autotune configs (the n-th call's n-th, so the calls
    spread over the configs): they multiply the compiles by the number of int arguments.

    ``quick``: the first launch of each (kernel, config), the calls' chosen ones first, compiles to
    the cubin; of the other chosen ones (each call's config), as few as a greedy cover needs to bring
    each kernel every flag value and argument type (:func:`features`) that its cubin variants lack go
    to PTX, through LLVM's lowering, which is where a flag that type-checks fails to compile; the other
    chosen ones and configs stop at TTGIR, the "=1" variants at TTIR (their ``stage``; what an int
    turned constexpr breaks, the front end finds). So every flag value and argument type of a
    kernel reaches PTX, every config reaches ptxas at least once, and every variant passes Triton's
    front end. (ptxas costs about as much as all before it: running it on one variant of each
    config, not each call, halves the check. LLVM's lowering is most of the rest: lowering a flag
    value once, not each call that repeats it, as the safe path's ``_redo_kernel`` repeats the
    quantizer's, saves most of that.)
    """
    calls: dict[int, list[Launch]] = defaultdict(list)
    for launch in launches:
        calls[launch.group].append(launch)
    chosen = [group[n % len(group)] for n, group in enumerate(calls.values())]
    full: dict[Variant, None] = {}  # quick: to the cubin
    lowered: dict[Variant, None] = {}  # quick: to PTX
    if quick:
        configs: set[tuple[str, Any]] = set()
        for launch in [*chosen, *launches]:
            if (kernel_name(launch.fn), launch.config) not in configs:
                configs.add((kernel_name(launch.fn), launch.config))
                full.setdefault(specialize(launch))
        seen: dict[str, set[tuple]] = defaultdict(set)
        for v in full:
            seen[v.kernel] |= features(v)
        # Greedy cover: the chosen variant that brings its kernel the most features not lowered yet,
        # until none brings one (the calls' order breaks ties).
        rest = [v for v in dict.fromkeys(map(specialize, chosen)) if v not in full]
        while rest:
            best = max(rest, key=lambda v: len(features(v) - seen[v.kernel]))
            if not features(best) - seen[best.kernel]:
                break
            lowered.setdefault(best)
            seen[best.kernel] |= features(best)
            rest.remove(best)
    out: dict[Variant, None] = {}
    for group, pick in zip(calls.values(), chosen):
        for launch in group:
            out.setdefault(specialize(launch))
        for name in specializable_ints(pick):
            out.setdefault(specialize(pick, (name,)))
    if not quick:
        return list(out)
    return [v if v in full else dataclasses.replace(v, stage="ptx" if v in lowered else "ttir" if v.ones else "ttgir")
            for v in out]


# ---------------------------------------------------------------------------------------------
# 3. Compilation


def compile_variant(v: Variant) -> None:
    """Compile the variant for sm_90 down to its ``stage``; raises what the compiler raises.

    To the cubin through ``triton.compile`` (and Triton's cache); to an earlier stage through the
    same pipeline, run by hand as ``triton.compile`` runs it and stopped there, with no cache.
    """
    index = {p.name: p.num for p in v.fn.params}
    src = ASTSource(fn=v.fn, signature=dict(v.signature),
                    constexprs={(index[k],): value for k, value in v.constexprs},
                    attrs={(index[k],): [["tt.divisibility", 16]] for k in v.divisible})
    if v.stage == "cubin":
        kernel = triton.compile(src, target=TARGET, options=dict(v.options))
        if not kernel.asm.get("cubin"):
            raise RuntimeError("triton.compile returned no cubin")
        return
    backend = make_backend(TARGET)
    options = backend.parse_options(dict(v.options))
    stages: dict[str, Callable[[Any, dict], Any]] = {}
    backend.add_stages(stages, options, src.language)
    if v.stage not in stages:
        raise ValueError(f"stage {v.stage!r} is not one of Triton's for sm_90: {list(stages)}")
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = src.make_ir(TARGET, options, backend.get_codegen_implementation(options),
                         backend.get_module_map(), context)
    metadata = {"hash": src.hash(), "target": TARGET, **options.__dict__}
    names = list(stages)
    for name in names[names.index(src.ext):names.index(v.stage) + 1]:
        module = stages[name](module, metadata)


def _summary(e: BaseException) -> str:
    """The error's first lines, and its last ones when it is long: a CompilationError quotes up to 12
    source lines before the cause."""
    lines = [line for line in f"{type(e).__name__}: {e}".splitlines() if line.strip()]
    return "\n".join(lines if len(lines) <= 10 else lines[:4] + ["..."] + lines[-5:])


_pending: list[Variant] = []  # what forked workers compile, by index


def _compile_one(i: int) -> tuple[float, str | None]:
    t0 = time.perf_counter()
    try:
        compile_variant(_pending[i])
        error = None
    except Exception as e:  # any compiler error is this variant's result
        error = _summary(e)
    return time.perf_counter() - t0, error


def compile_variants(vs: list[Variant], jobs: int = 1) -> list[Result]:
    """Compile every variant (``jobs`` forked processes: the compiler holds the GIL); never raises on a
    compile error, which goes into its :class:`Result`."""
    global _pending
    _pending = vs
    if jobs <= 1:
        return [Result(v, *_compile_one(i)) for i, v in enumerate(vs)]
    results = []
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
        futures = [pool.submit(_compile_one, i) for i in range(len(vs))]
        for v, f in zip(vs, futures):
            try:
                results.append(Result(v, *f.result()))
            except concurrent.futures.process.BrokenProcessPool as e:
                results.append(Result(v, 0.0, f"the compiling process died ({e}); compile this variant alone to see why"))
    return results


def check(cases: Iterable[Case], jobs: int = 1, quick: bool = False) -> list[Result]:
    """Record ``cases``, compile their variants for sm_90; one :class:`Result` per distinct variant."""
    return compile_variants(variants(record(cases), quick), jobs)


def describe_failure(r: Result) -> str:
    ones = f"; set to 1: {', '.join(r.variant.ones)}" if r.variant.ones else ""
    return f"{r.variant.kernel} ({r.variant.case}{ones}):\n    " + r.error.replace("\n", "\n    ")


# ---------------------------------------------------------------------------------------------
# The launch cases: every public launcher, with the options that change the compiled kernel


def _mxfp4(rows: int, k: int):
    from adahop.formats import MXFP4Tensor

    return MXFP4Tensor(torch.zeros((rows, k // 2), dtype=torch.uint8), torch.full((rows, k // 32), 127, dtype=torch.uint8))


_SHORT = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
SEED = 12345  # SR seeds reach the kernel as an int64 device tensor, whatever their value


def _quantize_case(dtype=torch.bfloat16, transpose: bool | None = False, hadamard=True, hadamard_t=True, hs=32,
                   signs=False, signs_t=False, rounding="rne", emit_fp8=False) -> Case:
    """``hadamard_quantize`` (``transpose`` False/True) or, with ``transpose=None``, ``hadamard_quantize_dual``
    of a ``(256, 512)`` x."""
    from adahop_kernels import hadamard_quantize as hq

    m, k = 256, 512
    fp8 = ", fp8" if emit_fp8 else ""

    def side(h, s):
        return (f"H{hs}" if h else "no H") + (" signs" if s else "")

    if transpose is None:
        name = (f"hadamard_quantize_dual({_SHORT[dtype]}, {side(hadamard, signs)} / {side(hadamard_t, signs_t)}, "
                f"{rounding}{fp8})")

        def call():
            hq.hadamard_quantize_dual(torch.zeros((m, k), dtype=dtype), hadamard=hadamard, hadamard_t=hadamard_t,
                                      hadamard_size=hs, signs=torch.ones(k) if signs else None,
                                      signs_t=torch.ones(m) if signs_t else None, rounding=rounding, seed=SEED,
                                      emit_fp8=emit_fp8, emit_fp8_t=emit_fp8)
    else:
        name = (f"hadamard_quantize({_SHORT[dtype]}, along {'M' if transpose else 'K'}, {side(hadamard, signs)}, "
                f"{rounding}{fp8})")

        def call():
            hq.hadamard_quantize(torch.zeros((m, k), dtype=dtype), transpose=transpose, hadamard=hadamard,
                                 hadamard_size=hs, signs=torch.ones(m if transpose else k) if signs else None,
                                 rounding=rounding, seed=SEED, emit_fp8=emit_fp8)
    return Case(name, call)


def _side_name(side) -> str:
    if side is None:
        return "-"
    parts = ["H" if side.hadamard else "no H"] + (["signs"] if side.signs is not None else [])
    parts += (["packed"] if side.packed else []) + ([side.fp8] if side.fp8 else []) + (["amax"] if side.amax else [])
    return " ".join(parts)


def _layer_case(what: str, along_k, along_m, rounding="rne", dtype=torch.bfloat16) -> Case:
    """``quantize`` of a ``(256, 512)`` x with the given sides (adahop_kernels.hadamard_quantize.Side)."""
    from adahop_kernels import hadamard_quantize as hq

    name = f"quantize({what}: {_SHORT[dtype]}, K {_side_name(along_k)} / M {_side_name(along_m)}, {rounding})"
    return Case(name, lambda: hq.quantize(torch.zeros((256, 512), dtype=dtype), along_k, along_m, rounding=rounding,
                                          seed=torch.tensor([SEED])))


def _layer_cases() -> list[Case]:
    """The training layer's quantize steps with in-kernel FP8: X in the forward (A operand, copy saved
    along tokens), W (Bᵀ of the forward and of dgrad), dY in the backward (both A operands, SR), each
    with and without the amax of the outlier selection, and signs."""
    from adahop_kernels.hadamard_quantize import Side

    ones = torch.ones(512)
    return [
        _layer_case("X", Side(True, None, packed=False, fp8="seg128"), Side(True, None)),
        _layer_case("X", Side(True, ones, packed=False, fp8="seg128", amax=True), Side(False, None, amax=True)),
        _layer_case("W", Side(True, None, packed=False, fp8="tile128"), Side(True, None, packed=False, fp8="tile128")),
        _layer_case("dY", Side(True, None, packed=False, fp8="seg128"), Side(True, None, packed=False, fp8="seg128"),
                    "sr"),
        _layer_case("dY", Side(False, None, packed=False, fp8="seg128", amax=True),
                    Side(True, torch.ones(256), fp8="seg128"), "sr"),
    ]


def _one_side_fp8_cases() -> list[Case]:
    """In-kernel FP8 of one orientation at the other input dtypes."""
    from adahop_kernels.hadamard_quantize import Side

    return [
        _layer_case("one side", Side(True, None, fp8="tile128", amax=True), None, dtype=torch.float32),
        _layer_case("one side", None, Side(True, None, packed=False, fp8="seg128"), "sr", dtype=torch.float16),
    ]


def _other_cases(dtypes: tuple[torch.dtype, ...]) -> list[Case]:
    """The launchers other than the quantizer, for each output/input dtype in ``dtypes``."""
    from adahop_kernels.dequantize import dequantize
    from adahop_kernels.fp8_reencode import fp8_reencode
    from adahop_kernels.hot_round import hot_round
    from adahop_kernels.mxfp4_mm import mxfp4_mm_dot_scaled
    from adahop_kernels.outliers import row_absmax
    from adahop_kernels.pattern_stats import abs_median, scaled_mean_squares
    from adahop_kernels.signs import random_signs, signs_from_seed

    cases = [Case(f"fp8_reencode({layout})", lambda layout=layout: fp8_reencode(_mxfp4(256, 512), layout))
             for layout in ("row", "seg128", "tile128")]
    seed = torch.full((1,), SEED, dtype=torch.int64)
    cases += [Case("hot_round(per tensor, to nearest)", lambda: hot_round(torch.zeros(256, 512), torch.ones(1, 1), 127, None)),
              Case("hot_round(per row, stochastic)", lambda: hot_round(torch.zeros(256, 512), torch.ones(256, 1), 7, seed))]
    for d in dtypes:
        s = _SHORT[d]
        cases += [
            Case(f"random_signs({s})", lambda d=d: random_signs(4096, 0x9E3779B9, torch.device("cpu"), d)),
            Case(f"signs_from_seed({s})", lambda d=d: signs_from_seed(4096, seed, d)),
            Case(f"dequantize(-> {s})", lambda d=d: dequantize(_mxfp4(256, 512), d)),
            Case(f"mxfp4_mm_dot_scaled(-> {s})", lambda d=d: mxfp4_mm_dot_scaled(_mxfp4(256, 512), _mxfp4(384, 512), d)),
            Case(f"row_absmax({s} rows)", lambda d=d: row_absmax(torch.zeros((256, 4096), dtype=d))),
            Case(f"row_absmax({s} columns, x.t())", lambda d=d: row_absmax(torch.zeros((4096, 256), dtype=d).t())),
            Case(f"abs_median({s} rows)", lambda d=d: abs_median(torch.zeros((256, 4096), dtype=d))),
            Case(f"abs_median({s} columns, x.t())", lambda d=d: abs_median(torch.zeros((4096, 256), dtype=d).t())),
            Case(f"scaled_mean_squares({s})", lambda d=d: scaled_mean_squares(torch.zeros((256, 512), dtype=d))),
            Case(f"scaled_mean_squares({s}, scaled)", lambda d=d: scaled_mean_squares(
                torch.zeros((256, 512), dtype=d), torch.ones(512), torch.ones(256))),
        ]
    return cases


def default_cases() -> list[Case]:
    """Every launcher, and every value of every option that changes a compiled kernel at least once.

    First quantizer calls that the training layer (adahop.linear) makes on the H200 under the built-in
    recipes (bf16 operands, Hadamard size 32, fp32 random signs, SR seeds below 2**31, FP8 operands),
    covering each orientation with and without Hadamard and both roundings: X and W go into one dual
    call (forward operand along K, copy saved along M) when both round to nearest, else into single
    calls; dY into one dual SR call unless dgrad or wgrad is bf16. Then the general launcher's
    in-kernel FP8 layouts and amax for the layer's steps (:func:`_layer_cases`), the other input
    dtypes and Hadamard sizes, and the other launchers at the output dtypes training uses.
    :func:`full_cases` holds every combination of the quantizer's flags.
    """
    q = _quantize_case
    return [
        q(emit_fp8=True),  # forward operand, iht (evaluation: nothing saved)
        q(hadamard=False, rounding="sr", emit_fp8=True),  # dY for an mxfp4 dgrad beside a bf16 wgrad
        q(transpose=True, signs=True, rounding="sr"),  # X or W saved along tokens by tseng / quartet-style
        q(transpose=True, hadamard=False),  # X saved plain beside a bf16 forward
        q(transpose=None, emit_fp8=True),  # X and W under uniform-iht
        q(transpose=None, hadamard_t=False, emit_fp8=True),  # X: iht forward, plain copy for a bf16 wgrad
        q(transpose=None, hadamard=False, rounding="sr", emit_fp8=True),  # dY: mxfp4 dgrad, iht wgrad
        q(transpose=None, hadamard=False, hadamard_t=False, emit_fp8=True),  # X and W under mxfp4
        q(transpose=None, signs=True, signs_t=True, rounding="sr", emit_fp8=True),  # dY under quartet-style
        *_layer_cases(),
        q(dtype=torch.float32, rounding="sr"),
        q(dtype=torch.float16, transpose=True, hs=16, signs=True),
        q(dtype=torch.float32, transpose=None, hs=64, signs=True),
        q(transpose=None, hs=128, signs_t=True),
        *_other_cases((torch.bfloat16, torch.float32)),
    ]


def full_cases() -> list[Case]:
    """:func:`default_cases`, every combination of the quantizer's flags at bf16 and Hadamard size 32
    (the training layer's among them), every input dtype x Hadamard size x orientation, SR with signs
    in each orientation, in-kernel FP8 of one orientation at fp32 and fp16 input, and the fp16
    outputs of the other launchers."""
    q = _quantize_case
    cases = default_cases()
    bools = (False, True)
    for transpose in (False, True):
        cases += [q(transpose=transpose, hadamard=h, signs=s, rounding=r)
                  for h in bools for s in bools for r in ("rne", "sr")]
    cases += [q(transpose=None, hadamard=h, hadamard_t=ht, signs=s, signs_t=st, rounding=r)
              for h in bools for ht in bools for s in bools for st in bools for r in ("rne", "sr")]
    cases += [q(dtype=d, transpose=t, hs=hs, signs=True, signs_t=True)
              for d in (torch.bfloat16, torch.float32, torch.float16) for hs in (16, 32, 64, 128)
              for t in (False, True, None)]
    cases += [q(transpose=t, signs=True, signs_t=True, rounding="sr") for t in (False, True, None)]
    cases += _one_side_fp8_cases()
    cases += _other_cases((torch.float16,))
    return list({c.name: c for c in cases}.values())


# ---------------------------------------------------------------------------------------------
# CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m adahop.harness.kernel_compile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="the cases of full_cases() (long)")
    parser.add_argument("--quick", action="store_true",
                        help="each config once to the cubin, each flag value and argument type of a kernel once to "
                             "PTX, the other variants to TTGIR, the \"=1\" variants to TTIR")
    parser.add_argument("--only", metavar="TEXT", help="only the kernels whose name holds TEXT (e.g. signs)")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    parser.add_argument("--jobs", type=int, default=cores, help="compiling processes (default: the usable cores)")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    vs = variants(record(full_cases() if args.full else default_cases()), args.quick)
    if args.only:
        vs = [v for v in vs if args.only in v.kernel]
        if not vs:
            parser.error(f"no kernel name holds {args.only!r}")
    results = compile_variants(vs, args.jobs)
    per_kernel: dict[str, list[Result]] = defaultdict(list)
    for r in results:
        per_kernel[r.variant.kernel].append(r)
    for kernel, rs in per_kernel.items():
        bad = sum(r.error is not None for r in rs)
        print(f"{kernel:45s} {len(rs) - bad:4d} variants compiled, {bad} failed, "
              f"{sum(r.seconds for r in rs):6.1f} s compiling")
    failures = [r for r in results if r.error is not None]
    partial = sum(r.variant.stage != "cubin" for r in results)
    print(f"{len(results) - len(failures)} of {len(results)} variants compiled for sm_90 in "
          f"{time.perf_counter() - t0:.0f} s ({args.jobs} processes)"
          + (f", {len(results) - partial} of them to the cubin, the others to PTX, TTGIR or TTIR" if partial else ""))
    for r in failures:
        print("FAILED " + describe_failure(r))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
