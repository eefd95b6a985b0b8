"""The suite's kernels as PyTorch operators (``torch.ops.adahop.*``), one operator per kernel.

Each operator runs on every device: its ``backend`` argument (``"triton"`` or ``"reference"``,
resolved by the caller through :func:`adahop.backend.resolve_backend`) picks the Triton kernel of
``kernels/`` (compiled on a GPU, interpreted on CPU under ``TRITON_INTERPRET=1``) or the
pure-PyTorch reference. Every operator has a fake (meta) implementation, so ``torch.compile``
traces through it without running it, and ``torch.library.opcheck`` passes for each
(``tests/test_library.py``). Operators take and return plain tensors; :mod:`adahop.ops` wraps
them in the checked public functions, and the layer calls them inside its autograd Function, so a
converted model compiles as one graph.

The two on the layer's path, ``quantize`` and ``fp8_encode``, each have a ``*_launched`` twin, a
``torch.library.triton_op``: under ``torch.compile`` on a GPU its kernel launches and allocations
become part of the generated code (no call back into Python a layer step). :func:`quantize` and
:func:`fp8_encode` call the twin where ``ADAHOP_INDUCTOR_LAUNCHES=1`` (:func:`inductor_launches`).

Request strings. :func:`quantize` takes one request per orientation of ``x (M, K)``: ``""`` (not
wanted) or comma-separated flags: ``hadamard`` (block-Hadamard first), ``packed`` (write packed
E2M1 codes + E8M0 scales), ``fp8=row|seg128|tile128`` (write the exact FP8 E4M3 GEMM operand with
fp32 scales per row, per 1×128 segment along the quantized dimension, or per 128×128 tile) and
``amax`` (fp32 ``max |x|`` of each output row, before any transform: what outlier selection
ranks). Strings, since an operator's schema takes no structured arguments; they are parsed once
each (cached).
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
from typing import NamedTuple

import torch

from adahop.formats import (
    BLOCK_SIZE,
    FP8_GROUP,
    FP8_LAYOUTS,
    MXFP4Tensor,
    dequantize_mxfp4_ref,
    quantize_mxfp4_ref,
    to_fp8_ref,
)
from adahop.hadamard import block_hadamard_ref



class Request(NamedTuple):
    """One orientation's request, parsed from its string (see the module docstring)."""

    hadamard: bool
    packed: bool
    fp8: str | None
    amax: bool


@functools.lru_cache(maxsize=None)
def parse_request(text: str) -> Request | None:
    """The :class:`Request` a request string names, or None for ``""``; ValueError on an unknown flag."""
    if not text:
        return None
    flags = text.split(",")
    fp8 = None
    rest = []
    for f in flags:
        if f.startswith("fp8="):
            fp8 = f[4:]
            if fp8 not in FP8_LAYOUTS:
                raise ValueError(f"unknown FP8 layout {fp8!r} in request {text!r}; choose from {FP8_LAYOUTS}")
        elif f in ("hadamard", "packed", "amax"):
            rest.append(f)
        else:
            raise ValueError(f"unknown flag {f!r} in quantize request {text!r}")
    req = Request("hadamard" in rest, "packed" in rest, fp8, "amax" in rest)
    if not (req.packed or req.fp8 or req.amax):
        raise ValueError(f"quantize request {text!r} asks for no output")
    return req


def request(hadamard: bool, packed: bool = True, fp8: str | None = None, amax: bool = False) -> str:
    """The request string for these flags (inverse of :func:`parse_request`)."""
    flags = [f for f, on in (("hadamard", hadamard), ("packed", packed), ("amax", amax)) if on]
    if fp8:
        flags.append(f"fp8={fp8}")
    return ",".join(flags)


def fp8_scale_shape(rows: int, n: int, layout: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """Shape and strides of the fp32 scales of an FP8 operand ``(rows, n)`` in ``layout``.

    ``row``: ``(rows, 1)``; ``seg128``: ``(rows, n/128)`` stored outer-dimension-major (strides
    ``(1, rows)``), as cuBLAS's blockwise A operand wants; ``tile128``: ``(rows/128, n/128)``
    contiguous (its transpose is cuBLAS's B scale layout).
    """
    if layout == "row":
        return (rows, 1), (1, 1)
    if layout == "seg128":
        return (rows, n // FP8_GROUP), (1, rows)
    return (rows // FP8_GROUP, n // FP8_GROUP), (n // FP8_GROUP, 1)


def _empty(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(0, dtype=dtype, device=x.device)


def _absent(x: torch.Tensor) -> list[torch.Tensor]:
    return [_empty(x, torch.uint8), _empty(x, torch.uint8), _empty(x, torch.float8_e4m3fn),
            _empty(x, torch.float32), _empty(x, torch.float32)]


# ---------------------------------------------------------------------------------------------
# quantize: block-Hadamard + MXFP4 (+ FP8 operand), one or two orientations from one read


def _fp8_of(q: MXFP4Tensor, layout: str, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    if backend == "triton":
        from adahop_kernels.fp8_reencode import fp8_reencode

        return fp8_reencode(q, layout=layout)
    return to_fp8_ref(q, layout)


def _side_outputs(x: torch.Tensor, q: MXFP4Tensor | None, req: Request | None, amax: torch.Tensor | None,
                  backend: str) -> list[torch.Tensor]:
    if req is None:
        return _absent(x)
    out = _absent(x)
    if q is not None:
        if req.packed:
            out[0], out[1] = q.codes, q.scales
        if req.fp8:
            out[2], out[3] = _fp8_of(q, req.fp8, backend)
    if amax is not None:
        out[4] = amax
    return out


def _seed_int(seed: torch.Tensor | None) -> int | None:
    # The reference draws from a torch.Generator, which takes a host int.
    return None if seed is None else int(seed.reshape(-1)[0].item())


def _quantize_reference(x, signs_k, signs_m, seed, rk, rm, hadamard_size, rounding, nan_policy):
    s = _seed_int(seed) if rounding == "sr" else None
    outs = []
    for t, req, signs in ((x, rk, signs_k), (x.t(), rm, signs_m)):
        if req is None:
            outs.append((None, None))
            continue
        q = None
        if req.packed or req.fp8:
            xt = block_hadamard_ref(t, hadamard_size, signs).float() if req.hadamard else t
            gen = None if s is None else torch.Generator(device=x.device).manual_seed(s)
            q = quantize_mxfp4_ref(xt, rounding, gen, nan_policy)
        amax = t.abs().amax(dim=1).float() if req.amax else None
        outs.append((q, amax))
    return outs


def _quantize_triton(x, signs_k, signs_m, seed, rk, rm, hadamard_size, rounding, nan_policy, launch=None):
    from adahop_kernels import hadamard_quantize as hq

    def side(req, signs):
        return None if req is None else hq.Side(req.hadamard, signs, req.packed, req.fp8, req.amax)

    return hq.quantize(x, side(rk, signs_k), side(rm, signs_m), hadamard_size=hadamard_size, rounding=rounding,
                       seed=seed, nan_policy=nan_policy, launch=launch)


INDUCTOR_LAUNCHES_ENV = "ADAHOP_INDUCTOR_LAUNCHES"


def inductor_launches() -> bool:
    """``$ADAHOP_INDUCTOR_LAUNCHES``: ``1`` lets ``torch.compile`` launch the quantize and re-encode
    kernels and call cuBLAS's scaled GEMM from its generated code (:func:`quantize`,
    :func:`fp8_encode`, :func:`fp8_mm`); ``0`` (the default) keeps each behind its opaque operator, a
    call back into Python a layer step. On, a compiled layer costs less host time, but a whole
    model compiles far longer and, at 1b under CUDA graphs on one H100, trained slower than through
    the operators (DESIGN §6 gives the figures and their files). Its GPU tests:
    ``tests/test_compile.py`` and ``tests/test_library.py``, ``-k "launches or launched"``."""
    value = os.environ.get(INDUCTOR_LAUNCHES_ENV, "0")
    if value not in ("", "0", "1"):
        raise ValueError(f"${INDUCTOR_LAUNCHES_ENV} must be 0 or 1, got {value!r}")
    return value == "1"


def _gpu_kernels(x: torch.Tensor, backend: str) -> bool:
    """A CUDA tensor on the Triton backend: what Inductor can launch (not the interpreter's kernels;
    and the reference stays opaque, so that its results do not depend on how Inductor would fuse it)."""
    return backend == "triton" and x.device.type == "cuda"


def _launched(x: torch.Tensor, backend: str) -> bool:
    """Whether a Triton-backed operator call goes to its ``*_launched`` twin, whose kernels
    ``torch.compile`` launches itself: :func:`inductor_launches` on and :func:`_gpu_kernels`."""
    return inductor_launches() and _gpu_kernels(x, backend)


def _plain_eager(*tensors: torch.Tensor | None) -> bool:
    """Whether an operator call may run its implementation directly, without the dispatcher: eager
    (not traced by ``torch.compile``, no dispatch or function mode active) on plain CPU or CUDA
    tensors (not meta; no subclass such as FakeTensor or DTensor, no functorch transform). The
    operator's dispatch adds nothing there but host time, tens of microseconds a call
    (``scripts/host_cost.py``: ``op-quantize`` against ``kernels-quantize``); every other caller
    goes through the operator."""
    if (torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack()
            or torch._C._is_torch_function_mode_enabled()):
        return False
    return all(t is None or (type(t) is torch.Tensor and t.device.type in ("cpu", "cuda")
                             and not torch._C._functorch.is_functorch_wrapped_tensor(t))
               for t in tensors)


def quantize(*args) -> tuple[torch.Tensor, ...]:
    """``torch.ops.adahop.quantize`` (its arguments, positional), or ``quantize_launched`` where
    :func:`_launched` says so and the call reads nothing on the host (``nan_policy="propagate"``, a
    seed for the stochastic rounding); eager on plain tensors (:func:`_plain_eager`), the operator's
    implementation called directly."""
    if len(args) != 10:
        raise TypeError(f"quantize takes the 10 arguments of adahop::quantize, positional ones; got {len(args)}")
    x, signs_k, signs_m, seed, _, _, _, rounding, nan_policy, backend = args
    launched = _launched(x, backend)  # reads (and checks) the switch whatever the path
    if _plain_eager(x, signs_k, signs_m, seed):
        return _quantize(*args)
    if launched and nan_policy == "propagate" and (seed is not None or rounding != "sr"):
        return torch.ops.adahop.quantize_launched(*args)
    return torch.ops.adahop.quantize(*args)


def _quantize(
    x: torch.Tensor,
    signs_k: torch.Tensor | None,
    signs_m: torch.Tensor | None,
    seed: torch.Tensor | None,
    request_k: str,
    request_m: str,
    hadamard_size: int,
    rounding: str,
    nan_policy: str,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
           torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x (M, K)`` quantized along K (``request_k``) and along M (``request_m``), from one read.

    Returns ten tensors, five per orientation: packed codes ``(rows, n/2)`` uint8, E8M0 scales
    ``(rows, n/32)`` uint8, FP8 values ``(rows, n)`` float8_e4m3fn, FP8 scales (fp32, shape by
    layout: :func:`fp8_scale_shape`), row amax ``(rows,)`` fp32; ``rows, n = M, K`` along K and
    ``K, M`` along M; an output not requested is an empty tensor. ``seed``: int64 ``(1,)`` on x's
    device, the stochastic rounding's draw (read only under ``rounding="sr"``).

    Equivalent to ``quantize_mxfp4_ref(block_hadamard_ref(x or x.T))`` and its FP8 re-encodings.
    """
    rk, rm = parse_request(request_k), parse_request(request_m)
    if backend == "triton":
        outs = _quantize_triton(x, signs_k, signs_m, seed, rk, rm, hadamard_size, rounding, nan_policy)
        return tuple(_kernel_outputs(x, outs[0]) + _kernel_outputs(x, outs[1]))
    (qk, ak), (qm, am) = _quantize_reference(x, signs_k, signs_m, seed, rk, rm, hadamard_size, rounding, nan_policy)
    return tuple(_side_outputs(x, qk, rk, ak, backend) + _side_outputs(x, qm, rm, am, backend))


_quantize_op = torch.library.custom_op("adahop::quantize", _quantize, mutates_args=())


def _quantize_launched(*args):
    """``adahop::quantize`` as a ``triton_op`` (the same schema): under ``torch.compile`` on a GPU its
    two kernel launches and its allocations become the generated code's, instead of a call back into
    this Python each layer step (whose dispatch, checks and Triton launches cost more host time than
    the kernels take on the device at most of a layer's shapes: ``scripts/host_cost.py``). Anything
    but a CUDA tensor on the Triton backend goes to ``adahop::quantize``."""
    x, signs_k, signs_m, seed, request_k, request_m, hadamard_size, rounding, nan_policy, backend = args
    if not _gpu_kernels(x, backend):
        return torch.ops.adahop.quantize(*args)
    tune_before_tracing(_quantize_eager, args)
    outs = _quantize_triton(x, signs_k, signs_m, seed, parse_request(request_k), parse_request(request_m),
                            hadamard_size, rounding, nan_policy, torch.library.wrap_triton)
    return tuple(_kernel_outputs(x, outs[0]) + _kernel_outputs(x, outs[1]))


def _quantize_eager(x, signs_k, signs_m, seed, request_k, request_m, hadamard_size, rounding, nan_policy, backend):
    _quantize_triton(x, signs_k, signs_m, seed, parse_request(request_k), parse_request(request_m), hadamard_size,
                     rounding, nan_policy)


_quantize_launched.__signature__ = quantize.__signature__ = inspect.signature(_quantize)
torch.library.triton_op("adahop::quantize_launched", _quantize_launched, mutates_args=())


def _kernel_outputs(x: torch.Tensor, out) -> list[torch.Tensor]:
    if out is None:
        return _absent(x)
    fields = (out.codes, out.scales, out.fp8, out.fp8_scale, out.amax)
    return [t if t is not None else e for t, e in zip(fields, _absent(x))]


def _fake_side(x: torch.Tensor, rows: int, n: int, req: Request | None) -> list[torch.Tensor]:
    out = _absent(x)
    if req is None:
        return out
    if req.packed:
        out[0] = x.new_empty((rows, n // 2), dtype=torch.uint8)
        out[1] = x.new_empty((rows, n // BLOCK_SIZE), dtype=torch.uint8)
    if req.fp8:
        out[2] = x.new_empty((rows, n), dtype=torch.float8_e4m3fn)
        shape, stride = fp8_scale_shape(rows, n, req.fp8)
        out[3] = x.new_empty_strided(shape, stride, dtype=torch.float32)
    if req.amax:
        out[4] = x.new_empty((rows,), dtype=torch.float32)
    return out


@_quantize_op.register_fake
def _(x, signs_k, signs_m, seed, request_k, request_m, hadamard_size, rounding, nan_policy, backend):
    m, k = x.shape
    return tuple(_fake_side(x, m, k, parse_request(request_k)) + _fake_side(x, k, m, parse_request(request_m)))


# ---------------------------------------------------------------------------------------------
# fp8_encode: packed MXFP4 -> exact FP8 GEMM operand (the copies saved for backward)


def fp8_encode(codes: torch.Tensor, scales: torch.Tensor, layout: str, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.ops.adahop.fp8_encode``, or ``fp8_encode_launched`` where :func:`_launched` says so;
    eager on plain tensors (:func:`_plain_eager`), the operator's implementation called directly."""
    launched = _launched(codes, backend)  # reads (and checks) the switch whatever the path
    if _plain_eager(codes, scales):
        return _fp8_encode_impl(codes, scales, layout, backend)
    op = torch.ops.adahop.fp8_encode_launched if launched else torch.ops.adahop.fp8_encode
    return op(codes, scales, layout, backend)


def _fp8_encode_impl(codes: torch.Tensor, scales: torch.Tensor, layout: str, backend: str
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 E4M3 ``(rows, K)`` and fp32 scales (by ``layout``) of packed MXFP4 ``(rows, K)``.

    Equivalent to :func:`adahop.formats.to_fp8_rowwise_ref` (``row``) or ``to_fp8_ref(t, layout)``.
    """
    return _fp8_of(MXFP4Tensor(codes, scales), layout, backend)


_fp8_encode = torch.library.custom_op("adahop::fp8_encode", _fp8_encode_impl, mutates_args=())


@torch.library.triton_op("adahop::fp8_encode_launched", mutates_args=())
def _fp8_encode_launched(codes: torch.Tensor, scales: torch.Tensor, layout: str, backend: str
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """``adahop::fp8_encode`` as a ``triton_op``, for the reason ``adahop::quantize_launched`` is one."""
    if not _gpu_kernels(codes, backend):
        return torch.ops.adahop.fp8_encode(codes, scales, layout, backend)
    from adahop_kernels.fp8_reencode import fp8_reencode

    tune_before_tracing(lambda c, s, lay: fp8_reencode(MXFP4Tensor(c, s), lay), (codes, scales, layout))
    return fp8_reencode(MXFP4Tensor(codes, scales), layout, launch=torch.library.wrap_triton)


# torch's analyses of a user-defined Triton kernel: which of its tensors it reads and writes.
_ANALYSES = ("identify_accessed_tensors", "identify_mutated_tensors")


def cache_kernel_analysis() -> None:
    """Let torch analyse each of this suite's kernel variants once per process, not once per launch.

    For every launch that ``torch.compile`` traces through ``torch.library.wrap_triton``, torch
    finds the tensors the kernel writes by generating its TTIR (``identify_accessed_tensors`` in
    ``torch/_higher_order_ops/triton_kernel_wrap.py``; ``identify_mutated_tensors`` in older
    releases), with no cache, in each pass that functionalizes or lowers the graph: a model's step
    traces hundreds of launches of a few variants. The answer depends on the kernel and on its
    arguments' values and element types, not on the tensors themselves, so it is kept per
    :func:`_analysis_key`. Kernels other than ``adahop_kernels``', and launches whose arguments have
    no plain key (symbolic sizes), go to torch's analysis as before. Idempotent."""
    from torch._higher_order_ops import triton_kernel_wrap as tkw

    for name in _ANALYSES:
        analyse = getattr(tkw, name, None)
        if analyse is not None and not getattr(analyse, "adahop_cached", False):
            setattr(tkw, name, _cached_analysis(analyse))


def _cached_analysis(analyse):
    import copy

    kept: dict = {}

    @functools.wraps(analyse)
    def cached(kernel, kwargs, *rest):
        key = _analysis_key(kernel, kwargs, rest)
        if key is None:
            return analyse(kernel, kwargs, *rest)
        if key not in kept:
            kept[key] = analyse(kernel, kwargs, *rest)
        return copy.deepcopy(kept[key])  # the caller's own copy, as a fresh analysis would be

    cached.adahop_cached = True
    return cached


def _analysis_key(kernel, kwargs: dict, rest: tuple):
    """What torch's kernel analysis depends on: the kernel (its ``triton.jit`` function and the
    configs it is wrapped with), every argument's name with its value (a plain number, flag or
    string) or its element type (a tensor, or Inductor's buffer), and the rest of the call; None
    where an argument has neither (a symbolic size) or the kernel is not this suite's."""
    fn = source = getattr(kernel, "fn", kernel)  # an autotuner's triton.jit function
    while hasattr(source, "fn"):  # down to the Python function, whose module says whose it is
        source = source.fn
    if not getattr(source, "__module__", "").startswith("adahop_kernels"):
        return None
    items = []
    for name, value in kwargs.items():
        if value is None or isinstance(value, (bool, int, float, str)):
            items.append((name, type(value).__name__, value))
        elif getattr(value, "is_Integer", False):  # sympy's, from Inductor's lowering
            items.append((name, "int", int(value)))
        elif isinstance(value, torch.Tensor):
            items.append((name, "tensor", str(value.dtype)))
        elif callable(getattr(value, "get_dtype", None)):
            try:
                items.append((name, "buffer", str(value.get_dtype())))
            except (AttributeError, NotImplementedError):
                return None
        else:
            return None
    configs = tuple(str(c) for c in getattr(kernel, "configs", ()))
    return fn, configs, repr(rest), tuple(sorted(items))


def keep_register_caps() -> None:
    """Let Inductor compile this suite's kernels with their configs' register caps (``maxnreg``).

    The quantize kernels' configs cap the registers a thread (``kernels/hadamard_quantize.py``),
    which buys the occupancy their speed rests on. Inductor drops the cap for the Triton kernels it
    launches from its generated code: it writes each config into that code through
    ``config_to_dict``, which keeps the config's arguments, warps and stages only, and compiles
    each with ``CachingAutotuner._create_compile_options``, which passes no ``maxnreg`` to Triton
    (``torch/_inductor/runtime/triton_heuristics.py``). Both are wrapped here to carry a cap where a
    config has one; configs without one (every kernel of Inductor's own) are written and compiled
    as before. Where the installed torch lacks either, neither is wrapped, the caps are lost and a
    warning says so.
    Idempotent."""
    try:
        from torch._inductor.runtime import triton_heuristics as th
    except ImportError:  # no Inductor: nothing launches these kernels but Triton
        return
    to_dict = getattr(th, "config_to_dict", None)
    autotuner = getattr(th, "CachingAutotuner", None)
    options = getattr(autotuner, "_create_compile_options", None)
    if to_dict is None or options is None:
        logging.getLogger(__name__).warning(
            "this torch's Inductor has no config_to_dict or CachingAutotuner._create_compile_options: "
            "the kernels it launches compile without their register caps")
        return
    if not getattr(to_dict, "adahop_caps", False):
        th.config_to_dict = _dict_with_cap(to_dict)
    if not getattr(options, "adahop_caps", False):
        autotuner._create_compile_options = _options_with_cap(options)


def _dict_with_cap(to_dict):
    @functools.wraps(to_dict)
    def with_cap(config):
        out = to_dict(config)
        if getattr(config, "maxnreg", None) is not None:
            out["maxnreg"] = config.maxnreg  # config_from_dict takes it back as the Config's cap
        return out

    with_cap.adahop_caps = True
    return with_cap


def _options_with_cap(create):
    @functools.wraps(create)
    def with_cap(self, cfg, compile_meta):
        out = create(self, cfg, compile_meta)
        if getattr(cfg, "maxnreg", None) is not None and "maxnreg" not in out:
            out["maxnreg"] = cfg.maxnreg
        return out

    with_cap.adahop_caps = True
    return with_cap


_TUNED: set = set()


def tune_before_tracing(run, args) -> None:
    """Where ``torch.compile`` traces a ``*_launched`` twin (its tensors fake), run the eager kernels
    once on real stand-ins of the same shapes, dtypes and arguments first: Triton's autotuner then
    times the configs for the launch's key, and the traced launch keeps only its pick
    (``adahop_kernels._common.eager_pick``), so Inductor compiles one config per launch and times
    none. Left to Inductor, every config of every launch shape is compiled and timed again in each
    compiled graph. Once per distinct call; symbolic sizes, or a stand-in that cannot be made (a
    fake device, no memory), leave the choice to Inductor. A traced launch also installs
    :func:`cache_kernel_analysis` and :func:`keep_register_caps` (eager calls leave torch as it is)."""
    from torch.utils._python_dispatch import _disable_current_modes

    from adahop_kernels._common import traced

    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not traced(tensors):
        return
    cache_kernel_analysis()
    keep_register_caps()
    if not all(type(n) is int for t in tensors for n in (*t.shape, *t.stride())):
        return  # symbolic sizes (dynamic shapes): nothing to make stand-ins of
    key = (run.__code__, *((tuple(a.shape), tuple(a.stride()), a.dtype, str(a.device)) if isinstance(a, torch.Tensor)
                           else a for a in args))
    if key in _TUNED:
        return
    _TUNED.add(key)
    try:
        with _disable_current_modes(), torch.no_grad():
            run(*(_stand_in(a) if isinstance(a, torch.Tensor) else a for a in args))
    except Exception as err:  # noqa: BLE001 - only the config choice rests on it: Inductor then tunes
        logging.getLogger(__name__).warning("tuning a traced launch on stand-ins failed (%s: %s); "
                                            "Inductor will time its configs", type(err).__name__, err)


def _stand_in(t: torch.Tensor) -> torch.Tensor:
    """A real tensor laid out like ``t`` (fake), with data a launch can time: normal values, E8M0
    scales and E2M1 code bytes of finite values, zero seeds."""
    out = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=t.device)
    if out.dtype == torch.uint8:
        return out.random_(118, 136)
    if out.dtype.is_floating_point:
        return out.copy_(torch.randn(out.shape, device=out.device)) if out.dtype.itemsize == 1 else out.normal_()
    return out.zero_()


@_fp8_encode.register_fake
def _(codes, scales, layout, backend):
    rows, n = codes.shape[0], codes.shape[1] * 2
    shape, stride = fp8_scale_shape(rows, n, layout)
    return (codes.new_empty((rows, n), dtype=torch.float8_e4m3fn),
            codes.new_empty_strided(shape, stride, dtype=torch.float32))


# ---------------------------------------------------------------------------------------------
# dequantize, row_absmax, the native MXFP4 GEMM, the pattern statistics, the sign vectors


@torch.library.custom_op("adahop::dequantize", mutates_args=())
def dequantize(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype, backend: str) -> torch.Tensor:
    """Packed MXFP4 ``(..., K)`` to ``dtype``. Equivalent to :func:`adahop.formats.dequantize_mxfp4_ref`."""
    t = MXFP4Tensor(codes, scales)
    if backend == "triton":
        from adahop_kernels.dequantize import dequantize as kernel

        return kernel(t, dtype)
    return dequantize_mxfp4_ref(t, dtype)


@dequantize.register_fake
def _(codes, scales, dtype, backend):
    return codes.new_empty((*codes.shape[:-1], codes.shape[-1] * 2), dtype=dtype)


@torch.library.custom_op("adahop::row_absmax", mutates_args=())
def row_absmax(x: torch.Tensor, backend: str) -> torch.Tensor:
    """fp32 ``max |x|`` of each row of ``x (M, K)`` (NaN for a row holding NaN). Equivalent to
    ``x.abs().amax(1).float()``."""
    if backend == "triton":
        from adahop_kernels.outliers import row_absmax as kernel

        return kernel(x)
    return x.abs().amax(dim=1).float()


@row_absmax.register_fake
def _(x, backend):
    return x.new_empty((x.shape[0],), dtype=torch.float32)


@torch.library.custom_op("adahop::mm_dot_scaled", mutates_args=())
def mm_dot_scaled(codes_a: torch.Tensor, scales_a: torch.Tensor, codes_b: torch.Tensor, scales_b: torch.Tensor,
                  out_dtype: torch.dtype) -> torch.Tensor:
    """``A · Bᵀ`` of packed MXFP4 operands through Triton's ``tl.dot_scaled`` (native FP4 GPUs)."""
    from adahop_kernels.mxfp4_mm import mxfp4_mm_dot_scaled

    return mxfp4_mm_dot_scaled(MXFP4Tensor(codes_a, scales_a), MXFP4Tensor(codes_b, scales_b), out_dtype)


@mm_dot_scaled.register_fake
def _packed_mm_fake(codes_a, scales_a, codes_b, scales_b, out_dtype):
    return codes_a.new_empty((codes_a.shape[0], codes_b.shape[0]), dtype=out_dtype)


@torch.library.custom_op("adahop::mm_reference", mutates_args=())
def mm_reference(codes_a: torch.Tensor, scales_a: torch.Tensor, codes_b: torch.Tensor, scales_b: torch.Tensor,
                 out_dtype: torch.dtype) -> torch.Tensor:
    """``A · Bᵀ`` of packed MXFP4 operands, :func:`adahop.ops.mxfp4_mm_ref` (fp64 from the dequantized
    operands): the layer's GEMM where no faster path exists (a CPU). An operator like every other GEMM
    of the layer, so that a compiled graph holds the same calls on a CPU as on a GPU, not the reference's
    dequantization traced and fused into it."""
    from adahop.ops import mxfp4_mm_ref

    return mxfp4_mm_ref(MXFP4Tensor(codes_a, scales_a), MXFP4Tensor(codes_b, scales_b), out_dtype)


mm_reference.register_fake(_packed_mm_fake)


def fp8_mm(fa: torch.Tensor, sa: torch.Tensor, layout_a: str, fb: torch.Tensor, sb: torch.Tensor, layout_b: str,
           out_dtype: torch.dtype) -> torch.Tensor:
    """``torch.ops.adahop.fp8_mm``, or on a GPU where :func:`inductor_launches` is on, its cuBLAS
    calls traced as they are: compiled, the generated code then calls cuBLAS itself (Inductor's
    lowering of ``aten._scaled_mm`` outside max-autotune), where the operator is a call back into
    Python a GEMM."""
    if inductor_launches() and fa.device.type == "cuda":
        return _fp8_mm_cuda(fa, sa, layout_a, fb, sb, layout_b, out_dtype)
    return torch.ops.adahop.fp8_mm(fa, sa, layout_a, fb, sb, layout_b, out_dtype)


@torch.library.custom_op("adahop::fp8_mm", mutates_args=())
def _fp8_mm_op(fa: torch.Tensor, sa: torch.Tensor, layout_a: str, fb: torch.Tensor, sb: torch.Tensor, layout_b: str,
               out_dtype: torch.dtype) -> torch.Tensor:
    """``A · Bᵀ`` of exact FP8 operands: cuBLAS's scaled GEMM (``torch._scaled_mm``) on a GPU, the
    product of the fp32 values elsewhere (a CPU's ``_scaled_mm`` takes per-tensor scales only in
    some torch releases).

    An operator, so that ``torch.compile`` calls cuBLAS as the eager layer does whatever the compile
    mode: under max-autotune Inductor may lower ``aten._scaled_mm`` to its own templates (a scaling
    recipe read from the scales' shapes).

    The checked entry point is :func:`adahop.ops.fp8_mm`: it refuses bad layouts and output dtypes,
    and blockwise operands whose K is not a multiple of 512.
    """
    if fa.device.type != "cuda":
        return _fp8_mm_values(fa, sa, layout_a, fb, sb, layout_b, out_dtype)
    return _fp8_mm_cuda(fa, sa, layout_a, fb, sb, layout_b, out_dtype)


def _fp8_mm_cuda(fa, sa, layout_a, fb, sb, layout_b, out_dtype) -> torch.Tensor:
    if (layout_a, layout_b) == ("seg128", "tile128"):
        # cuBLAS layouts: B column-major (K, N) is the transpose of row-major Bᵀ (N, K); its tile
        # scales (K/128, N/128) likewise.
        return torch._scaled_mm(fa, fb.t(), scale_a=sa, scale_b=sb.t(), out_dtype=torch.bfloat16)
    n = fb.shape[0]
    # _scaled_mm wants N (and K) multiples of 16; K is (a multiple of 32). Zero rows pad N.
    pad = -n % 16
    if pad:
        fb = torch.cat((fb, fb.new_zeros(pad, fb.shape[1])))
        sb = torch.cat((sb, sb.new_ones(pad, 1)))
    if out_dtype is torch.bfloat16:
        c = torch._scaled_mm(fa, fb.t(), scale_a=sa.contiguous(), scale_b=sb.reshape(1, -1).contiguous(),
                             out_dtype=torch.bfloat16)
    else:
        # Rowwise scaling guarantees a bf16 output only: unit scales, an fp32 product, then the
        # power-of-two row and column scales (exact multiplications).
        one = torch.ones((), dtype=torch.float32, device=fa.device)
        c = torch._scaled_mm(fa, fb.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
        c = (c * sa * sb.reshape(1, -1)).to(out_dtype)
    return c[:, :n].contiguous() if pad else c


def _fp8_mm_values(fa, sa, layout_a, fb, sb, layout_b, out_dtype) -> torch.Tensor:
    """The FP8 GEMM off a GPU: each operand's values times its scales in fp32 (exact: a
    power-of-two scale times an E4M3 value), one fp32 product."""
    def values(f: torch.Tensor, s: torch.Tensor, layout: str) -> torch.Tensor:
        if layout == "row":
            return f.float() * s
        if layout == "seg128":
            return f.float() * s.repeat_interleave(FP8_GROUP, dim=1)
        return f.float() * s.repeat_interleave(FP8_GROUP, dim=0).repeat_interleave(FP8_GROUP, dim=1)

    return (values(fa, sa, layout_a) @ values(fb, sb, layout_b).t()).to(out_dtype)


@_fp8_mm_op.register_fake
def _(fa, sa, layout_a, fb, sb, layout_b, out_dtype):
    return fa.new_empty((fa.shape[0], fb.shape[0]), dtype=out_dtype)


@torch.library.custom_op("adahop::dense_mm", mutates_args=())
def dense_mm(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``A · Bᵀ`` in the operands' own precision: a GEMM of the layer's that runs unquantized (a
    BF16 strategy, the outlier rows of OE). An operator so that the layer's forward reads its
    inputs through operators only (:class:`adahop.linear.function.QuantLinearFunction` says why)."""
    return (a @ b.t()).to(out_dtype)


@dense_mm.register_fake
def _(a, b, out_dtype):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)


@torch.library.custom_op("adahop::int8_mm", mutates_args=())
def int8_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``A · B`` of int8 ``a (M, K)`` and ``b (K, N)``, exact in int32 (``torch._int_mm``: M > 16,
    K and N multiples of 8), with A row-major and B column-major: the one layout ("TN") that
    cuBLASLt's INT8 tensor-core kernels take; any other falls back to an sm80 WMMA kernel many
    times slower on Hopper. An operator so that the layout holds under ``torch.compile``: Inductor
    chooses the strides of a traced ``.contiguous()`` copy itself (it laid A out column-major)."""
    return torch._int_mm(a.contiguous(), b.t().contiguous().t())


@int8_mm.register_fake
def _(a, b):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=torch.int32)


@torch.library.custom_op("adahop::select_rows", mutates_args=())
def select_rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """BF16 copies of the rows ``idx`` of ``x`` (the outlier rows OE computes in high precision);
    an operator for the reason :func:`dense_mm` is one."""
    return x.index_select(0, idx).to(torch.bfloat16)


@select_rows.register_fake
def _(x, idx):
    return x.new_empty((idx.shape[0], x.shape[1]), dtype=torch.bfloat16)


@torch.library.custom_op("adahop::abs_median", mutates_args=())
def abs_median(x: torch.Tensor) -> torch.Tensor:
    """Lower median of ``|x|`` along each row (the radix-select kernel). Equivalent to
    :func:`adahop.ops.abs_median_ref`."""
    from adahop_kernels.pattern_stats import abs_median as kernel

    return kernel(x)


@abs_median.register_fake
def _(x):
    return x.new_empty((x.shape[0],), dtype=torch.float32)


@torch.library.custom_op("adahop::scaled_mean_squares", mutates_args=())
def scaled_mean_squares(x: torch.Tensor, col_div: torch.Tensor | None,
                        row_div: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row and column mean squares of ``x`` scaled by the divisors, and its non-finite count (the
    kernel). Equivalent to :func:`adahop.ops.scaled_mean_squares_ref`."""
    from adahop_kernels.pattern_stats import scaled_mean_squares as kernel

    return kernel(x, col_div, row_div)


@scaled_mean_squares.register_fake
def _(x, col_div, row_div):
    m, k = x.shape
    return (x.new_empty((m,), dtype=torch.float32), x.new_empty((k,), dtype=torch.float32),
            x.new_empty((), dtype=torch.int64))


@torch.library.custom_op("adahop::random_signs", mutates_args=())
def random_signs(n: int, mix: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The ±1 vector of :func:`adahop.hadamard.random_signs` for the hashed seed ``mix``, in one
    launch (the kernel)."""
    from adahop_kernels.signs import random_signs as kernel

    return kernel(n, mix, device, dtype)


@random_signs.register_fake
def _(n, mix, device, dtype):
    return torch.empty(n, dtype=dtype, device=device)


# ---------------------------------------------------------------------------------------------
# hot_round: HOT's integer rounding (adahop.hot.quantize_int's one whole-tensor pass)


@torch.library.custom_op("adahop::hot_round", mutates_args=())
def hot_round(t: torch.Tensor, scale: torch.Tensor, seed: torch.Tensor | None, qmax: int, backend: str) -> torch.Tensor:
    """int8 ``clamp(t / scale, ±qmax)`` of fp32 ``t (rows, K)``, rounded to nearest (``seed`` None)
    or stochastically from the int64 ``seed (1,)``; ``scale`` fp32 ``(rows, 1)`` or ``(1, 1)``.
    ``backend="triton"`` runs the kernel of ``kernels/hot_round.py``, ``"reference"``
    :func:`adahop.hot.round_int_ref`; the two give the same bits.

    An operator, not traced PyTorch: the reference's counter hash is a long int64 expression that
    Inductor would generate anew for each shape and that eager PyTorch runs as a dozen
    whole-tensor temporaries.
    """
    if backend == "triton":
        from adahop_kernels.hot_round import hot_round as kernel

        return kernel(t, scale, qmax, seed)
    from adahop.hot import round_int_ref  # adahop.hot imports this module

    return round_int_ref(t, scale, qmax, seed)


@hot_round.register_fake
def _(t, scale, seed, qmax, backend):
    return t.new_empty(t.shape, dtype=torch.int8)


@torch.library.custom_op("adahop::signs_from_seed", mutates_args=())
def signs_from_seed(n: int, seed: torch.Tensor, dtype: torch.dtype, backend: str) -> torch.Tensor:
    """The ±1 vector ``(n,)`` of ``dtype`` for the int64 ``seed (1,)``, on its device (the signs
    kernel, or :func:`adahop.linear.seeds.signs_from_seed_ref`). An operator for the reason
    :func:`hot_round` is one: the hash, traced, is an expression Inductor generates slowly."""
    if backend == "triton":
        from adahop_kernels.signs import signs_from_seed as kernel

        return kernel(n, seed, dtype)
    from adahop.linear.seeds import signs_from_seed_ref  # adahop.linear imports this module

    return signs_from_seed_ref(n, seed, dtype)


@signs_from_seed.register_fake
def _(n, seed, dtype, backend):
    return seed.new_empty((n,), dtype=dtype)
