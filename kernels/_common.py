"""Pieces shared by the MXFP4 kernels: exact powers of two, E2M1 values, launch checks.

Triton picks interpreter or compiler when a kernel module is imported (``TRITON_INTERPRET=1``
must be set before the first ``import triton``), so :data:`INTERPRETED` is read once, here.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import torch
import triton
import triton.language as tl

from adahop.checks import check_float_matrix

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
# Which of an autotuned kernel's fitting configs a launch may use (read at each new autotune key).
KERNEL_CONFIG_ENV = "ADAHOP_KERNEL_CONFIG"


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` of host ints. ``triton.cdiv`` is a constexpr function in Triton 3.9, and each
    call from Python goes through its wrapper: 1.9 µs against 0.03 µs for this (best of nine runs on
    a 2-core CPU), and a quantize call made five (its flags, its two grids). A ``tl.constexpr``
    module constant (``REGION``) is unwrapped, as ``triton.cdiv`` does: an int goes on to a launch."""
    a, b = getattr(a, "value", a), getattr(b, "value", b)
    return -(-a // b)


def _as_is(kernel):
    return kernel


def launcher(launch=None):
    """What a kernel handle is launched through: ``launch`` (``torch.library.wrap_triton`` inside a
    ``torch.library.triton_op``, so that ``torch.compile`` sees the launch and makes it itself) on a
    GPU; the handle as it is under the interpreter or without ``launch``."""
    return launch if launch is not None and not INTERPRETED else _as_is


def kernel_config_choice() -> int | None:
    """The config index ``$ADAHOP_KERNEL_CONFIG`` asks for: None where unset or ``tuned`` (the
    autotuner times every config that fits), 0 for ``first``, n for an index n (the n-th config
    that fits, modulo their count), with no timing. One compile per kernel variant instead of one
    per config: the kernel tests on a GPU use it, and a test of their own runs every config."""
    value = os.environ.get(KERNEL_CONFIG_ENV, "tuned")
    if value in ("", "tuned"):
        return None
    if value == "first":
        return 0
    if not value.isdigit():
        raise ValueError(f"${KERNEL_CONFIG_ENV} must be 'tuned', 'first' or a config index, got {value!r}")
    return int(value)


def fitting_configs(fits=None, kernel=None, tuner=None):
    """The autotuner's ``prune_configs_by``: the configs ``fits(config, launch kwargs)`` keeps (all
    without ``fits``), narrowed to one by :func:`kernel_config_choice`. With ``kernel`` (the autotuned
    ``triton.jit`` function), a new autotune key compiles the kept configs in parallel first
    (:func:`precompile`). With ``tuner`` (a one-item list that will hold the autotuner), a launch
    traced by ``torch.compile`` keeps only the config the autotuner picked for the same key in an
    eager launch (:func:`eager_pick`), where it made one."""

    def early_config_prune(configs, nargs, **kwargs):
        launch = {**nargs, **kwargs}
        kept = [c for c in configs if fits is None or fits(c, kwargs)]
        choice = kernel_config_choice()
        kept = kept if choice is None or not kept else [kept[choice % len(kept)]]
        if tuner and len(kept) > 1:
            picked = eager_pick(tuner[0], launch)
            kept = [picked] if picked is not None and picked in kept else kept
        if kernel is not None and len(kept) > 1 and not INTERPRETED and not _traced(launch):
            precompile(kernel, kept, launch)
        return kept

    return {"early_config_prune": early_config_prune}


def _traced(args: dict) -> bool:
    """Whether a launch's tensors are ``torch.compile``'s stand-ins (:func:`traced`)."""
    return traced([v for v in args.values() if isinstance(v, torch.Tensor)])


def traced(tensors: list) -> bool:
    """Whether ``tensors`` are ``torch.compile``'s stand-ins: fake (Dynamo), functional over fake
    (AOT's trace of a ``triton_op``) or meta. Real tensors are not, even inside a trace (the
    stand-ins of ``adahop.library.tune_before_tracing``)."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor

    return any(isinstance(t, (FakeTensor, FunctionalTensor)) or t.is_meta for t in tensors)


def eager_pick(tuner, args: dict):
    """The config ``tuner`` (a ``triton.autotune`` Autotuner) picked in an eager launch with the
    same autotune key as a launch with ``args``, for a launch traced by ``torch.compile``; None for
    an eager launch, or where no eager launch had that key.

    Otherwise Inductor compiles every config of a traced launch and times them again in the
    compiled code, in each graph. The eager launch with the same key is
    ``adahop.library.tune_before_tracing``'s, on stand-ins of the traced operands, or any earlier
    one. The key is the autotuner's own: the key arguments' values, then every tensor argument's
    dtype in argument order (``triton.runtime.autotuner.Autotuner.run``)."""
    if tuner is None or not _traced(args):
        return None
    named = {k: v for k, v in args.items() if k in tuner.arg_names}
    key = [named[k] for k in tuner.keys if k in named]
    key += [str(v.dtype) for v in named.values() if hasattr(v, "dtype")]
    return tuner.cache.get(tuple(key))


def autotune(kernel, configs: list, key: list[str], fits=None):
    """``triton.autotune`` of ``kernel`` over ``configs`` with :func:`fitting_configs`; a launch
    traced by ``torch.compile`` takes the config an eager launch picked (:func:`eager_pick`)."""
    tuner: list = []
    tuned = triton.autotune(configs, key=key, prune_configs_by=fitting_configs(fits, kernel, tuner))(kernel)
    tuner.append(tuned)
    return tuned


PARALLEL_COMPILE_ENV = "ADAHOP_COMPILE_THREADS"


def compile_threads() -> int:
    """Threads that compile an autotune key's configs: ``$ADAHOP_COMPILE_THREADS`` (0 or 1: one by
    one, as the autotuner alone does), by default the CPUs this process may use, at most 16."""
    value = os.environ.get(PARALLEL_COMPILE_ENV, "")
    if value == "":
        return min(16, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    if not value.isdigit():
        raise ValueError(f"${PARALLEL_COMPILE_ENV} must be a non-negative int, got {value!r}")
    return int(value)


def precompile(kernel, configs: list, launch: dict) -> None:
    """Compile ``kernel`` for each of ``configs`` as a launch with ``launch`` arguments would, in
    parallel threads, without running it: the autotuner then times configs already compiled.

    Triton's compile releases the GIL in its MLIR and LLVM passes and runs ptxas as a subprocess,
    so threads overlap. Triton's ``AsyncCompileMode`` is its own hook for this: inside it a
    ``warmup`` submits the compile to the executor and keys the result as the launch will. A config
    that fails to compile is left to the autotuner's own launch, which reports it as before.
    """
    threads = compile_threads()
    if threads < 2:
        return
    try:
        from triton.runtime._async_compile import AsyncCompileMode, active_mode
    except ImportError:  # a Triton without it: the autotuner compiles one by one
        return
    if active_mode.get() is not None:
        return
    args = {k: v for k, v in launch.items() if k not in ("grid", "warmup")}
    with ThreadPoolExecutor(min(threads, len(configs))) as pool, AsyncCompileMode(pool, ignore_errors=True):
        for config in configs:
            try:
                kernel.warmup(grid=(1,), **args, **config.all_kwargs())
            except Exception:  # noqa: BLE001 - the autotuner's launch of this config raises it again
                pass


def check_device(t: torch.Tensor, name: str) -> None:
    """Raise a ValueError unless ``t`` can run here: a CUDA tensor, or a CPU one under the interpreter."""
    if t.device.type == "cuda" or (t.device.type == "cpu" and INTERPRETED):
        return
    if t.device.type == "cpu":
        raise ValueError(
            f"{name} is on the CPU but adahop_kernels was imported without TRITON_INTERPRET=1; "
            "set it before anything imports triton, or use the reference backend"
        )
    raise ValueError(f"{name} is on {t.device}; the Triton kernels take CUDA tensors (or CPU ones under the interpreter)")


def check_line_input(x: torch.Tensor, splits: int | None, empty_rows: str) -> None:
    """The checks of a per-row reduction split along its rows (``row_absmax``, ``abs_median``): a float
    matrix this machine can run, rows that are not empty (``empty_rows`` says why they must not be),
    ``splits`` None or a positive int."""
    check_float_matrix(x)
    check_device(x, "x")
    if x.shape[1] == 0:
        raise ValueError(f"x of shape {tuple(x.shape)} has empty rows: {empty_rows}")
    if splits is not None and (isinstance(splits, bool) or not isinstance(splits, int) or splits < 1):
        raise ValueError(f"splits must be a positive int, got {splits!r}")


def split_lines(x: torch.Tensor, block_l: int, block_n: int, splits: int | None, min_tiles: int) -> tuple[int, int]:
    """``(n_per_split, splits)`` for a kernel whose programs take ``block_l`` rows of ``x (L, N)`` and
    one of ``splits`` stretches of N. Default ``splits``: enough for about four programs per SM, so a
    few long rows still fill the GPU, but at least ``min_tiles`` tiles of ``block_n`` per stretch (one
    stretch under the interpreter). ``n_per_split`` is a multiple of ``block_n``; ``splits`` is
    recomputed from it (no empty stretch)."""
    lines, n = x.shape
    if splits is None:
        splits = 1
        if not INTERPRETED:
            want = 4 * torch.cuda.get_device_properties(x.device).multi_processor_count
            splits = max(1, min(cdiv(want, cdiv(lines, block_l)), cdiv(n, min_tiles * block_n)))
    n_per_split = cdiv(cdiv(n, splits), block_n) * block_n
    return n_per_split, cdiv(n, n_per_split)


@triton.jit
def exp2_int(e):
    """fp32 ``2**e`` for int32 ``e`` in [-149, 127], exact (subnormals built from their bit pattern).

    Bit construction rather than ``tl.exp2``: the GPU's ex2.approx is not exact and flushes subnormals.
    """
    normal = (tl.maximum(e + 127, 1) << 23).to(tl.float32, bitcast=True)
    subnormal = (1 << tl.minimum(tl.maximum(e + 149, 0), 22)).to(tl.float32, bitcast=True)
    return tl.where(e >= -126, normal, subnormal)


@triton.jit
def e2m1_value(code):
    """fp32 value of each E2M1 code (int32 0..15): ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}, built from bits."""
    idx = code & 7
    # Codes 2..7 are normal, exponent (idx >> 1) - 1 and mantissa idx & 1: fp32 bits (idx + 252) << 22.
    # Code 1 is 0.5 (0x3F000000), code 0 is 0.
    bits = tl.where(idx >= 2, (idx + 252) << 22, idx * 0x3F000000)
    return (bits | ((code & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def to_fp32(x):
    """Exact upcast to fp32; bf16 by its bits (the interpreter's bf16->fp32 cast drops subnormals)."""
    if x.dtype == tl.bfloat16:
        return (x.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    return x.to(tl.float32)


@triton.jit
def flip_sign(x, neg):
    """``x`` with the sign flipped where ``neg``: exact, by the sign bit (the interpreter has no bf16 arithmetic)."""
    if x.dtype.primitive_bitwidth == 16:
        bits = x.to(tl.int16, bitcast=True) ^ (neg.to(tl.int16) << 15)
    else:
        bits = x.to(tl.int32, bitcast=True) ^ (neg.to(tl.int32) << 31)
    return bits.to(x.dtype, bitcast=True)


# ---- E4M3 encoding of E2M1 codes (the exact FP8 operand of DESIGN §3) ----------------------------


@triton.jit
def e4m3_bits_of_e2m1(code, t):
    """E4M3 byte of ``e2m1(code) * 2**(t - 8)`` (int32 ``code`` 0..15, int32 ``t <= 14``), RNE.

    Integer arithmetic instead of a float->fp8 cast: the value in units of E4M3's smallest
    subnormal (2^-9) is ``n << t`` with ``n = 2|q|`` in {0,1,2,3,4,6,8,12}. For ``t >= 0`` (a block
    at most 14 binades below its group's largest: the exact case) that is an integer with at most
    two significant bits; for ``t < 0`` it is rounded to the subnormal grid, ties to even, as the
    reference's cast rounds. A GPU cast would round the same way, but Triton's interpreter neither
    rounds to nearest-even nor keeps NaN.
    """
    idx = code & 7
    # n = 2|q|: codes 0..3 -> 0,1,2,3; 4..7 -> 4,6,8,12.
    n = tl.where(idx < 2, idx, (2 + (idx & 1)) << tl.maximum((idx >> 1) - 1, 0))
    exact = n << tl.minimum(tl.maximum(t, 0), 14)
    # t < 0: shift right by s (values >= 2^5 below the grid round to 0 for every n <= 12).
    s = tl.minimum(tl.maximum(-t, 1), 5)
    kept = n >> s
    rem = n - (kept << s)
    half = 1 << (s - 1)
    up = (rem > half) | ((rem == half) & ((kept & 1) == 1))
    units = tl.where(t >= 0, exact, kept + up.to(tl.int32))
    # units < 8: subnormal, bits = units. Else exponent p = floor(log2 units) from the fp32 bits
    # (exact below 2^24), biased exponent p - 2, three mantissa bits below the leading one.
    p = (units.to(tl.float32).to(tl.int32, bitcast=True) >> 23) - 127
    normal = (((p - 2) << 3) | ((units >> tl.maximum(p - 3, 0)) - 8)) & 0x7F
    bits = tl.where(units < 8, units, normal)
    return bits | ((code >> 3) << 7)


@triton.jit
def _spread_nibbles(x):
    """The four nibbles of the low 16 bits of int32 ``x``, one a byte, nibble i in byte i."""
    x = (x | (x << 8)) & 0x00FF00FF
    return (x | (x << 4)) & 0x0F0F0F0F


@triton.jit
def e4m3_words_fast(c, t):
    """E4M3 bytes of four E2M1 codes (one a byte of int32 ``c``) in a block with ``t = e - R + 14 >= 3``.

    There every nonzero value is a normal E4M3 number: |q| = 2^(E-1)(1 + m/2) for code
    idx = 2E + m >= 2 has exponent field E - 1 + (t - 8) + 7 and mantissa m << 2, i.e. bits
    (idx + 2t - 4) << 2; idx 1 (0.5) has field t - 2, bits (2t - 4) << 2; idx 0 is 0. Byte-wise
    (SWAR), no carries: idx + 2t - 4 <= 31 for t <= 14 (larger t only in NaN blocks, overwritten),
    and a block with t < 3 gives the right bytes only where all its codes are ±0.
    """
    a = c & 0x07070707
    nonzero = ((a + 0x07070707) >> 3) & 0x01010101  # 1 in a byte: idx >= 1
    ge2 = (((c & 0x06060606) + 0x06060606) >> 3) & 0x01010101  # 1 in a byte: idx >= 2
    v = a + ge2 + nonzero * (2 * t - 5)
    return (v << 2) | ((c & 0x08080808) << 4)


@triton.jit
def e4m3_words_of_code_words(words, t, ROWS: tl.constexpr, WORDS: tl.constexpr):
    """``(ROWS, 2·WORDS)`` int32 words of four E4M3 bytes from ``(ROWS, WORDS)`` words of eight E2M1
    codes (code i in nibble i), each word's block offset ``t`` (broadcastable) ``>= 3`` (see
    :func:`_e4m3_words_fast`; other blocks need :func:`e4m3_bits_of_e2m1`)."""
    lo = e4m3_words_fast(_spread_nibbles(words & 0xFFFF), t)
    hi = e4m3_words_fast(_spread_nibbles((words >> 16) & 0xFFFF), t)
    return tl.reshape(tl.join(lo, hi), (ROWS, 2 * WORDS))


@triton.jit
def group_max(e, ROWS: tl.constexpr, BLOCKS: tl.constexpr, GROUP_ROWS: tl.constexpr, GROUP_BLOCKS: tl.constexpr):
    """Max of ``e (ROWS, BLOCKS)`` over groups of ``GROUP_ROWS`` rows × ``GROUP_BLOCKS`` blocks:
    ``(ROWS // GROUP_ROWS, BLOCKS // GROUP_BLOCKS)``."""
    g = tl.reshape(e, (ROWS // GROUP_ROWS, GROUP_ROWS, BLOCKS // GROUP_BLOCKS, GROUP_BLOCKS))
    return tl.max(tl.max(g, axis=3), axis=1)


@triton.jit
def group_broadcast(r, ROWS: tl.constexpr, BLOCKS: tl.constexpr, GROUP_ROWS: tl.constexpr, GROUP_BLOCKS: tl.constexpr):
    """Inverse shape of :func:`group_max`: each group's value at each of its ``(ROWS, BLOCKS)`` places."""
    g = tl.broadcast_to(r[:, None, :, None], (ROWS // GROUP_ROWS, GROUP_ROWS, BLOCKS // GROUP_BLOCKS, GROUP_BLOCKS))
    return tl.reshape(g, (ROWS, BLOCKS))
