#!/usr/bin/env bash
# First look at the kernels on a GPU: environment, kernel tests compiled for the device, then the
# kernel microbenchmarks (gpu profile). Writes logs and results under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/device_env.sh || exit 2
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/env.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.version.cuda)' | tee -a "$OUT/env.txt"
timeout "${KERNEL_TEST_S:-180}" python3 -m pytest tests/kernels tests/test_formats.py -q -x -p no:cacheprovider 2>&1 | tail -40 | tee "$OUT/kernel_tests.log"
ADAHOP_BENCH_PROFILE=gpu timeout "${BENCH_S:-300}" python3 experiments/microbench.py --profile gpu \
  --out "$OUT/microbench-h200.json" 2>&1 | tail -60 | tee "$OUT/microbench.log"
