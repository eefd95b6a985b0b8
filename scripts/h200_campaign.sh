#!/usr/bin/env bash
# H200 campaign in pieces that fit one device call (10 minutes). Usage:
#   bash scripts/h200_campaign.sh STAGE [STAGE ...]
# Stages: tests, microbench, layers, memory, throughput125, throughput125-eager, throughput1b, profile125,
#         ddp125 (2 GPUs).
# Run two stage lists side by side on a 2-GPU machine with CUDA_VISIBLE_DEVICES=0 / =1.
# Each stage writes one results file (or log) under $OUT; the lead copies them into results/<stage>/gpu/.
# Set ADAHOP_GIT_COMMIT / ADAHOP_GIT_DIRTY: the device's copy of the tree has no .git.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/device_env.sh
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
LOG="$OUT/campaign.log"
stage() { echo "=== $1 $(date -u +%T)" | tee -a "$LOG"; }
for s in "$@"; do
  case "$s" in
    tests)
      stage tests
      timeout 240 python3 -m pytest tests/kernels tests/test_formats.py -q -x -p no:cacheprovider 2>&1 | tail -25 | tee -a "$LOG" ;;
    microbench)
      stage microbench
      timeout 300 python3 experiments/microbench.py --config config/gpu.yaml --out "$OUT/kernels.json" 2>&1 | tail -8 | tee -a "$LOG" ;;
    layers)
      stage layers
      timeout 280 python3 experiments/layer_bench.py --config config/gpu.yaml --out "$OUT/layers.json" 2>&1 | tail -8 | tee -a "$LOG" ;;
    memory)
      stage memory
      timeout 540 python3 experiments/memory.py --config config/gpu.yaml --out "$OUT/memory.json" 2>&1 | tail -30 | tee -a "$LOG" ;;
    throughput125|throughput125-eager)
      stage "$s"
      c=compile; [ "$s" = throughput125-eager ] && c=no-compile
      timeout 280 python3 experiments/pretrain.py --config config/gpu.yaml --throughput-only --model 125m \
        --recipe bf16,mxfp4,adahop --seq-len 2048 --batch-size 32 --$c --steps 30 --device cuda --no-progress \
        --results "$OUT/throughput_125m_$c.json" 2>&1 | tail -12 | tee -a "$LOG" ;;
    throughput1b)
      stage throughput1b
      timeout 300 python3 experiments/pretrain.py --config config/gpu.yaml --throughput-only --model 1b \
        --recipe bf16,adahop --seq-len 2048 --batch-size 8 --compile --steps 20 --device cuda --no-progress \
        --results "$OUT/throughput_1b.json" 2>&1 | tail -12 | tee -a "$LOG" ;;
    profile125)
      stage profile125
      timeout 240 python3 experiments/pretrain.py --config config/gpu.yaml --throughput-only --model 125m \
        --recipe bf16,adahop --seq-len 2048 --batch-size 32 --compile --steps 10 --device cuda --no-progress \
        --profile "$OUT" --results "$OUT/throughput_125m_profiled.json" 2>&1 | tail -12 | tee -a "$LOG" ;;
    ddp125)
      stage ddp125
      timeout 280 torchrun --standalone --nproc_per_node=2 experiments/pretrain.py --config config/gpu.yaml \
        --throughput-only --model 125m --recipe bf16,adahop --seq-len 2048 --batch-size 32 --compile --steps 20 \
        --device cuda --no-progress --results "$OUT/throughput_125m_ddp2.json" 2>&1 | tail -12 | tee -a "$LOG" ;;
    *) echo "unknown stage $s" >&2; exit 2 ;;
  esac
done
