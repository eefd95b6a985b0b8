"""Print the autotuned launch config each quantize kernel variant picked on this GPU.

    python scripts/quantize_configs.py          # on a CUDA GPU (compiled Triton), bf16 inputs

Runs each variant of the microbenchmark (``tests/bench/test_bench_quantize.py``) once per
activation shape, which triggers the autotuner, then prints its choice per key, so a benchmark
result can be read against the tile shape and warps that produced it.
"""

from __future__ import annotations

import torch

from adahop import ops


SHAPES = ((8192, 8192), (16384, 2048), (16384, 4096), (16384, 8192), (16384, 14336))
VARIANTS = {
    "alongK-rne": dict(), "alongK-rne-nohadamard": dict(hadamard=False), "alongK-sr": dict(rounding="sr", seed=0),
    "alongM-rne": dict(transpose=True), "alongM-sr": dict(transpose=True, rounding="sr", seed=0),
    "alongK-rne-fp8": dict(emit_fp8=True),
}


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU: the autotuner only runs for compiled kernels")
    import adahop_kernels.fp8_reencode as fr
    import adahop_kernels.hadamard_quantize as hq

    for rows, cols in SHAPES:
        x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
        for kwargs in VARIANTS.values():
            ops.hadamard_quantize(x, backend="triton", **kwargs)
        for rounding in ("rne", "sr"):
            ops.hadamard_quantize_dual(x, rounding=rounding, seed=0, backend="triton")
    torch.cuda.synchronize()
    for name, tuner in (("hadamard_quantize", hq._tuned_kernel), ("fp8_reencode", fr._tuned_kernel)):
        for key, config in tuner.cache.items():
            print(f"{name} {key}: {config}")


if __name__ == "__main__":
    main()
