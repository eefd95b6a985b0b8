"""Issue-slot estimate of the quantize kernels without a GPU: compile for sm_90, count SASS.

    .venv/bin/python scripts/sass_count.py              # needs triton's bundled ptxas/nvdisasm only
    .venv/bin/python scripts/sass_count.py --steps      # the layer's quantize steps at every config
    .venv/bin/python scripts/sass_count.py --lines dY   # a step at its tuned config, by source line

Each kernel variant is compiled for Hopper (as a launch would specialise it: unit stride along K,
16-divisible sizes) and its straight-line SASS counted. A program executes every instruction
once per warp, so warp-instructions per value = instructions × warps / values in the tile. An
H200 issues 4 warp-instructions a cycle per SM (132 SMs, ~1.9 GHz): at 85% of the 4.28 TB/s copy
rate, with 2.53 B moved per bf16 value, the budget is ~0.73 warp-instructions a value; above it
the kernel is issue-bound. A proxy, not a timing: the GPU benchmarks have the last word.

Kernels with loops (the K loop of ``fp8_reencode``) are counted statically: one trip of each
loop, prologue and the rarely taken general path included, so those counts are upper bounds of
the per-value work. The quantize kernel has no rare path of its own (bad blocks are redone by
``_redo_kernel``, not counted here): its count is what every tile runs.

``--steps`` compiles the layer's three quantize steps (X, W, dY: ``STEPS``) at every autotuner
config that fits them, register caps included, and adds the local-memory (spill) instructions
and the ALU pipe's share (``ALU_PIPE``) to each count; the first config listed per step is the
one the H100 sweep chose. ``--lines STEP`` breaks that config's instructions down by kernel
source line (nvdisasm's line table): where the instructions a value go. Static counts track the
Nsight Compute figures of ``results/microbench/gpu/profile_quantize_16384x8192_h100.txt`` to
within a few percent.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import adahop_kernels.dequantize as dq
import adahop_kernels.fp8_reencode as fr
import adahop_kernels.hadamard_quantize as hq

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
TARGET = GPUTarget("cuda", 90, 32)
DIVISIBLE = ("stride_m", "M", "K")  # int arguments a launch sees as multiples of 16


def compile_sass(fn, args: dict, num_warps: int, maxnreg: int | None = None, lines: bool = False,
                 path: str = "/tmp/adahop_sass.cubin") -> tuple[str, int]:
    """(SASS text, registers per thread) of ``fn`` compiled for sm_90 with ``args``, nvdisasm's
    source-line comments included with ``lines``.

    ``args``: name -> a type string (``"*bf16"``, ``"i32"``) or a constexpr value.
    """
    sig, consts, attrs = {}, {}, {}
    for i, (name, v) in enumerate(args.items()):
        if isinstance(v, str):
            sig[name] = v
            if v.startswith("*") or name in DIVISIBLE:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "constexpr"
            consts[(i,)] = v
    options = {"num_warps": num_warps, **({"maxnreg": maxnreg} if maxnreg else {})}
    kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs), target=TARGET,
                            options=options)
    with open(path, "wb") as f:
        f.write(kernel.asm["cubin"])
    sass = subprocess.run([f"{BIN}/nvdisasm", "-c", *(["-g"] if lines else []), path], capture_output=True, text=True,
                          check=True).stdout
    usage = subprocess.run([f"{BIN}/cuobjdump", "--dump-resource-usage", path], capture_output=True, text=True).stdout
    regs = re.search(r"REG:(\d+)", usage)
    return sass, int(regs.group(1)) if regs else -1


INSTRUCTION = re.compile(r"\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)")


def opcodes(sass: str) -> collections.Counter:
    return collections.Counter(m.group(1) for line in sass.splitlines() if (m := INSTRUCTION.match(line)))


def sass_per_value(fn, args: dict, num_warps: int, values: int, maxnreg: int | None = None) -> tuple[float, int]:
    """(warp-instructions per value, registers per thread) of ``fn`` compiled with ``args``."""
    sass, regs = compile_sass(fn, args, num_warps, maxnreg)
    return sum(opcodes(sass).values()) * num_warps / values, regs


def quantize_args(dtype="*bf16", block_m=32, block_k=256, **flags) -> dict:
    constexprs = dict(ALONG_K=True, ALONG_M=False, HADAMARD=True, HADAMARD_T=False, HAS_SIGNS=False,
                      HAS_SIGNS_T=False, PACKED=True, PACKED_T=True, FP8=0, FP8_T=0, AMAX=False, AMAX_T=False,
                      HS=32, SR=False, DOT_FP32=False, BLOCK_M=block_m, BLOCK_K=block_k)
    constexprs.update(flags)
    side = {"codes_ptr": "*u8", "scales_ptr": "*u8", "fp8_ptr": "*u8", "fp8_scale_ptr": "*fp32",
            "amax_ptr": "*i32", "signs_ptr": "*fp32"}
    return {"x_ptr": dtype, "stride_m": "i32", "stride_k": 1, "M": "i32", "K": "i32", **side,
            **{k.replace("_ptr", "_t_ptr"): v for k, v in side.items()},
            "seed_ptr": "*i64", "c_hi": "fp32", "c_lo": "fp32", "flag_ptr": "*i32", **constexprs}


def quantize_variant(dtype="*bf16", block_m=32, block_k=256, num_warps=4, maxnreg=None, **flags) -> tuple[float, int]:
    return sass_per_value(hq._hadamard_quantize_kernel, quantize_args(dtype, block_m, block_k, **flags), num_warps,
                          block_m * block_k, maxnreg)


VARIANTS = {
    "along K, RNE, no Hadamard": dict(HADAMARD=False),
    "along K, RNE, H32": dict(),
    "along K, RNE, H32, signs": dict(HAS_SIGNS=True),
    "along K, RNE, H128": dict(HS=128),
    "along K, SR, H32": dict(SR=True),
    "along K, RNE, H32, fp16 in": dict(dtype="*fp16"),
    "along K, RNE, H32, fp32 in": dict(dtype="*fp32"),
    "along M, RNE, H32 (128x64)": dict(ALONG_K=False, ALONG_M=True, HADAMARD_T=True, block_m=128, block_k=64),
    "dual, RNE, H32 (128x64)": dict(ALONG_M=True, HADAMARD_T=True, block_m=128, block_k=64),
    "along K, RNE, H32, seg128 fp8 only": dict(PACKED=False, FP8=1, block_k=256),
}


# The layer's quantize steps (tests/bench/test_bench_quantize.py's flags) and the config the H100
# sweep chose for each (kernels/hadamard_quantize.py, _GPU_CONFIGS).
STEPS = {
    "X": (dict(ALONG_M=True, HADAMARD_T=True, PACKED=False, FP8=1), (32, 128, 4, 64)),
    "W": (dict(ALONG_M=True, HADAMARD_T=True, PACKED=False, PACKED_T=False, FP8=2, FP8_T=2), (128, 128, 8, 128)),
    "dY": (dict(ALONG_M=True, HADAMARD_T=True, PACKED=False, PACKED_T=False, FP8=1, FP8_T=1, SR=True),
           (128, 128, 16, 64)),
}
SPILLS = ("LDL", "STL")
# The opcodes Hopper issues to its ALU pipe (integer and logic, compares, selects, float min/max,
# packing conversions), which takes a warp's instruction in two cycles: half the issue rate. Nsight
# Compute found this pipe the busiest in the quantize steps (58-69% of cycles, issue 61-68%), so
# twice this count a value is the steps' other bound besides the total.
ALU_PIPE = re.compile(r"^(LOP3|LOP|PLOP3|IADD3|ISETP|FSETP|HSETP2|FMNMX|IMNMX|VIMNMX3?|HMNMX2|SEL|FSEL|SHF|PRMT|"
                      r"LEA|IABS|P2R|R2P|F2FP|SGXT|BMSK)$")


def alu_pipe(ops: collections.Counter) -> int:
    return sum(n for op, n in ops.items() if ALU_PIPE.match(op))


def step_configs(flags: dict, tuned: tuple) -> list[tuple[int, int, int, int | None]]:
    """The tuned config first, then every other config of the autotuner that fits the step."""
    kw = {**dict(ALONG_K=True, ALONG_M=False, HADAMARD=True, HADAMARD_T=False, HS=32, FP8=0, FP8_T=0), **flags}
    fitting = [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_K"], c.num_warps, c.maxnreg) for c in hq._GPU_CONFIGS
               if hq._config_fits(c, kw)]
    return [tuned] + [c for c in fitting if c != tuned]


def print_steps() -> None:
    for name, (flags, tuned) in STEPS.items():
        for bm, bk, warps, cap in step_configs(flags, tuned):
            sass, regs = compile_sass(hq._hadamard_quantize_kernel, quantize_args(block_m=bm, block_k=bk, **flags), warps, cap)
            ops = opcodes(sass)
            per_value = sum(ops.values()) * warps / (bm * bk)
            alu = alu_pipe(ops) * warps / (bm * bk)
            mark = " (tuned)" if (bm, bk, warps, cap) == tuned else ""
            print(f"{name:3s} {bm}x{bk}, {warps} warps, cap {cap}{mark}: {per_value:.3f} warp-instr/value "
                  f"(ALU pipe {alu:.3f}), {regs} regs, {sum(ops[o] for o in SPILLS)} spill instructions")


def print_lines(name: str, top: int = 30) -> None:
    # A cache of its own: a cached binary keeps the file names of the source it was built from
    # (scripts/kernel_ab.py builds the same source under another module name).
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="sass_lines_")
    flags, (bm, bk, warps, cap) = STEPS[name]
    sass, _ = compile_sass(hq._hadamard_quantize_kernel, quantize_args(block_m=bm, block_k=bk, **flags), warps, cap,
                           lines=True)
    source = {}
    counts, ops = collections.Counter(), collections.defaultdict(collections.Counter)
    where = None
    for line in sass.splitlines():
        if m := re.search(r'//## File "([^"]+)", line (\d+)', line):
            where = (os.path.basename(m.group(1)), int(m.group(2)))
        elif m := INSTRUCTION.match(line):
            counts[where] += 1
            ops[where][m.group(1)] += 1
    files = {os.path.basename(f): f for f in (hq.__file__, hq.__file__.replace("hadamard_quantize", "_common"))}
    total = sum(counts.values())
    print(f"{name}: {bm}x{bk}, {warps} warps, cap {cap}: {total} instructions a warp, {total * warps / (bm * bk):.3f} a value")
    for where, n in counts.most_common(top):
        text = ""
        if where and where[0] in files:
            if where[0] not in source:
                with open(files[where[0]]) as f:
                    source[where[0]] = f.read().splitlines()
            text = source[where[0]][where[1] - 1].strip()[:80]
        label = f"{where[0]}:{where[1]}" if where else "?"
        top_ops = ", ".join(f"{op} {c}" for op, c in ops[where].most_common(3))
        print(f"{n:5d}  {label:28s} {top_ops:34s} {text}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", action="store_true", help="the layer's quantize steps at every fitting config")
    p.add_argument("--lines", choices=sorted(STEPS), help="one step at its tuned config, by source line")
    args = p.parse_args()
    if args.steps:
        return print_steps()
    if args.lines:
        return print_lines(args.lines)
    for name, kwargs in VARIANTS.items():
        per_value, regs = quantize_variant(**kwargs)
        print(f"hadamard_quantize {name:32s} {per_value:.3f} warp-instr/value  {regs} regs")
    for name, (flags, (bm, bk, warps, cap)) in STEPS.items():
        per_value, regs = quantize_variant(block_m=bm, block_k=bk, num_warps=warps, maxnreg=cap, **flags)
        print(f"hadamard_quantize step {name} ({bm}x{bk}, {warps} warps, cap {cap}) {per_value:.3f} warp-instr/value  {regs} regs")
    for out in ("*bf16", "*fp16", "*fp32"):
        args = {"codes_ptr": "*u8", "scales_ptr": "*u8", "out_ptr": out, "n_rows": "i32", "K": "i32",
                "BLOCK_R": 8, "BLOCK_K": 512}
        per_value, regs = sass_per_value(dq._dequantize_kernel, args, 4, 8 * 512)
        print(f"dequantize -> {out[1:]:34s} {per_value:.3f} warp-instr/value  {regs} regs")
    # Budget at the copy rate: 1.56 B a value moved -> ~0.38 warp-instructions a value.
    args = {"codes_ptr": "*u8", "scales_ptr": "*u8", "fp8_ptr": "*u8", "row_scale_ptr": "*fp32", "M": "i32",
            "K": "i32", "BLOCK_M": 8, "BLOCK_K": 1024}
    per_value, regs = sass_per_value(fr._fp8_reencode_kernel, args, 4, 8 * 1024)
    print(f"fp8_reencode (8x1024, both paths)       <= {per_value:.3f} warp-instr/value  {regs} regs")
    args = {"codes_ptr": "*u8", "scales_ptr": "*u8", "fp8_ptr": "*u8", "group_scale_ptr": "*fp32", "M": "i32",
            "K": "i32", "GROUP_M": 128, "BLOCK_M": 128, "BLOCK_K": 256}
    per_value, regs = sass_per_value(fr._fp8_group_kernel, args, 8, 128 * 256)
    print(f"fp8_reencode tile128 (128x256, both paths) <= {per_value:.3f} warp-instr/value  {regs} regs")


if __name__ == "__main__":
    main()
