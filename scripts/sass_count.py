"""Issue-slot estimate of the quantize kernels without a GPU: compile for sm_90, count SASS.

    .venv/bin/python scripts/sass_count.py          # needs triton's bundled ptxas/nvdisasm only

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
"""

from __future__ import annotations

import os
import re
import subprocess

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import adahop_kernels.dequantize as dq
import adahop_kernels.fp8_reencode as fr
import adahop_kernels.hadamard_quantize as hq

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
TARGET = GPUTarget("cuda", 90, 32)
DIVISIBLE = ("stride_m", "M", "K")  # int arguments a launch sees as multiples of 16


def sass_per_value(fn, args: dict, num_warps: int, values: int, path: str = "/tmp/adahop_sass.cubin") -> tuple[float, int]:
    """(warp-instructions per value, registers per thread) of ``fn`` compiled with ``args``.

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
    kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs), target=TARGET,
                            options={"num_warps": num_warps})
    with open(path, "wb") as f:
        f.write(kernel.asm["cubin"])
    sass = subprocess.run([f"{BIN}/nvdisasm", "-c", path], capture_output=True, text=True, check=True).stdout
    n = sum(1 for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", line))
    usage = subprocess.run([f"{BIN}/cuobjdump", "--dump-resource-usage", path], capture_output=True, text=True).stdout
    regs = re.search(r"REG:(\d+)", usage)
    return n * num_warps / values, int(regs.group(1)) if regs else -1


def quantize_variant(dtype="*bf16", block_m=32, block_k=256, num_warps=4, **flags) -> tuple[float, int]:
    constexprs = dict(ALONG_K=True, ALONG_M=False, HADAMARD=True, HADAMARD_T=False, HAS_SIGNS=False,
                      HAS_SIGNS_T=False, PACKED=True, PACKED_T=True, FP8=0, FP8_T=0, AMAX=False, AMAX_T=False,
                      HS=32, SR=False, DOT_FP32=False, BLOCK_M=block_m, BLOCK_K=block_k)
    constexprs.update(flags)
    side = {"codes_ptr": "*u8", "scales_ptr": "*u8", "fp8_ptr": "*u8", "fp8_scale_ptr": "*fp32",
            "amax_ptr": "*i32", "signs_ptr": "*fp32"}
    args = {"x_ptr": dtype, "stride_m": "i32", "stride_k": 1, "M": "i32", "K": "i32", **side,
            **{k.replace("_ptr", "_t_ptr"): v for k, v in side.items()},
            "seed_ptr": "*i64", "c_hi": "fp32", "c_lo": "fp32", "flag_ptr": "*i32", **constexprs}
    return sass_per_value(hq._hadamard_quantize_kernel, args, num_warps, block_m * block_k)


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
    # The layer's steps (tests/bench/test_bench_quantize.py): X in the forward, W, dY in the backward.
    "X: K seg128 fp8 + M packed (128x128)": dict(ALONG_M=True, HADAMARD_T=True, PACKED=False, FP8=1,
                                                 block_m=128, block_k=128, num_warps=8),
    "W: K tile128 + M tile128 (128x128)": dict(ALONG_M=True, HADAMARD_T=True, PACKED=False, PACKED_T=False,
                                               FP8=2, FP8_T=2, block_m=128, block_k=128, num_warps=8),
    "dY: K seg128 + M seg128, SR (128x128)": dict(ALONG_M=True, HADAMARD_T=True, PACKED=False, PACKED_T=False,
                                                  FP8=1, FP8_T=1, SR=True, block_m=128, block_k=128, num_warps=8),
    "along K, RNE, H32, seg128 fp8 only": dict(PACKED=False, FP8=1, block_k=256),
}


def main() -> None:
    for name, kwargs in VARIANTS.items():
        per_value, regs = quantize_variant(**kwargs)
        print(f"hadamard_quantize {name:32s} {per_value:.3f} warp-instr/value  {regs} regs")
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
