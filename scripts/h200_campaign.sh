#!/usr/bin/env bash
# H200 campaign in pieces that fit one device call (10 minutes). Usage:
#   bash scripts/h200_campaign.sh STAGE [STAGE ...]
# Stages: tests (experiments/kernel_tests.py: tests/kernels and tests/test_formats.py compiled on the GPU,
#         $OUT/tests.json, one record per test), microbench, layers, memory, patterns (the gpu profile's pattern study: needs data/carry/full
#         carried), strategies (the strategy map of every adahop run, its calibration replayed; the
#         same carry; 353 s for the three 125m seeds on 2026-11-30, default limit 540 s), and throughput-RUN / profile-RUN for a RUN of config/gpu.yaml's
#         throughput sections (125m_compile, 125m_eager, 1b_compile, 3b_compile; on 2 GPUs the
#         throughput_multi_gpu runs 125m_compile_ddp2, 1b_compile_ddp2, 3b_compile_fsdp2): the command
#         rules/throughput.smk runs, writing $OUT/RUN.json; profile-RUN also writes torch.profiler tables of
#         3 more steps per recipe ($OUT/profile_<model>_<recipe>.txt). A run is stopped after
#         THROUGHPUT_TIMEOUT_S (default 560) and keeps the recipes it finished (the 2026-11-30 campaign
#         took 1-2 min per 125m recipe: 125m_compile's seven may not fit one call).
# Pretraining runs (train, export and lm-eval within one call): scripts/h200_pretrain.sh.
# Run two stage lists side by side on a 2-GPU machine with CUDA_VISIBLE_DEVICES=0 / =1.
# Each stage writes one results file (or log) under $OUT; the lead copies them into results/<stage>/gpu/
# (a throughput run's RUN.json and the profile tables into results/throughput/gpu/).
# Set ADAHOP_GIT_COMMIT / ADAHOP_GIT_DIRTY: the device's copy of the tree has no .git.
# STAGE_TIMEOUT_S overrides every stage's time limit (scripts/h200_queue.sh gives a stage the time left).
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/device_env.sh || exit 2
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
LOG="$OUT/campaign.log"
stage() { echo "=== $1 $(date -u +%T)" | tee -a "$LOG"; }
full_corpus() {  # the gpu profile's corpus, from the carried bundle
  [ -f data/full/train.bin ] || python3 experiments/build_corpus.py --from-bundle data/carry/full --out data/full \
    2>&1 | tail -3 | tee -a "$LOG"
}
for s in "$@"; do
  case "$s" in
    tests)
      stage tests
      # pytest is interrupted after TESTS_BUDGET_S (default 300), or 30 s before the stage's limit if
      # that comes first, and keeps the tests it finished: the full suite was never timed on the H200
      # (the queue's 240 s is a guess), and a queue's later items need the rest of the call.
      limit=${STAGE_TIMEOUT_S:-240}
      budget=$((limit > 60 ? limit - 30 : limit / 2))
      [ "$budget" -gt "${TESTS_BUDGET_S:-300}" ] && budget=${TESTS_BUDGET_S:-300}
      # The tests that passed on this GPU in the committed files (TESTS_DONE_DIR, default
      # results/kernel_tests/gpu: tests*.json) are left out, so that calls in several sessions cover
      # the suite; TESTS_DONE_DIR= runs them all.
      skip=()
      done_dir=${TESTS_DONE_DIR-results/kernel_tests/gpu}
      if [ -n "$done_dir" ]; then
        shopt -s nullglob
        done_files=("$done_dir"/tests*.json)
        shopt -u nullglob
        [ ${#done_files[@]} -gt 0 ] && skip=(--skip-passed "${done_files[@]}")
      fi
      timeout "$limit" python3 experiments/kernel_tests.py --budget-s "$budget" "${skip[@]}" \
        --out "$OUT/tests.json" 2>&1 | tail -25 | tee -a "$LOG" ;;
    microbench)
      stage microbench
      timeout "${STAGE_TIMEOUT_S:-300}" python3 experiments/microbench.py --config config/gpu.yaml --out "$OUT/kernels.json" 2>&1 | tail -8 | tee -a "$LOG" ;;
    layers)
      stage layers
      # The layer's peer on Hopper is torchao's float8 rowwise training; without it the records lose that
      # column silently (the 2026-11-30 session-7 run, which did not carry .whl). Refuse instead.
      if ! python3 -c 'import torchao' 2>/dev/null; then
        echo "layers: torchao is not importable: carry .whl (torchao's wheel, scripts/fetch_device_wheels.sh) or install it" \
          | tee -a "$LOG"
        exit 3
      fi
      timeout "${STAGE_TIMEOUT_S:-280}" python3 experiments/layer_bench.py --config config/gpu.yaml --out "$OUT/layers.json" 2>&1 | tail -8 | tee -a "$LOG" ;;
    memory)
      stage memory
      timeout "${STAGE_TIMEOUT_S:-540}" python3 experiments/memory.py --config config/gpu.yaml --out "$OUT/memory.json" 2>&1 | tail -30 | tee -a "$LOG" ;;
    patterns)
      stage patterns
      full_corpus
      timeout "${STAGE_TIMEOUT_S:-${PATTERNS_TIMEOUT_S:-540}}" python3 experiments/patterns.py --config config/gpu.yaml --data data/full \
        --out "$OUT/patterns.json.gz" --device cuda 2>&1 | tail -20 | tee -a "$LOG" ;;
    strategies)
      # Every calibrating run of the profile (adahop seeds): its calibration replayed, the strategy
      # map it fixes ($OUT/<run>.strategies.json; strategies.done once all are written).
      stage strategies
      full_corpus
      end=$((SECONDS + ${STAGE_TIMEOUT_S:-540})) failed=0
      runs=$(python3 -c 'import yaml; from adahop.recipes import get_recipe
p = yaml.safe_load(open("config/gpu.yaml"))["pretrain"]
print(*(f"{m}:{r}:{s}" for m in p["models"] for r in p["recipes"] if get_recipe(r).policy for s in p["seeds"]))' \
        2>>"$LOG") || runs=""
      [ -n "$runs" ] || { echo "strategies: no calibrating run listed from config/gpu.yaml" | tee -a "$LOG"; failed=1; }
      for run in $runs; do
        IFS=: read -r model recipe seed <<<"$run"
        # (timeout 0 would mean no limit)
        [ $((end - SECONDS)) -ge 10 ] || { echo "strategies: out of time before $run" | tee -a "$LOG"; failed=1; break; }
        timeout $((end - SECONDS)) python3 experiments/strategies.py --config config/gpu.yaml --data data/full \
          --model "$model" --recipe "$recipe" --seed "$seed" --device cuda \
          --out "$OUT/${model}_${recipe}_s${seed}.strategies.json" 2>&1 | tail -2 | tee -a "$LOG"
        [ "${PIPESTATUS[0]}" = 0 ] || failed=1
      done
      [ "$failed" = 0 ] && touch "$OUT/strategies.done" ;;
    throughput-*|profile-*)
      stage "$s"
      run=${s#*-}
      extra=(); [ "${s%%-*}" = profile ] && extra=(--profile "$OUT")
      # The run's launcher and settings from the profile, as rules/throughput.smk builds them.
      cmd=$(python3 - "$run" <<'PY'
import sys, yaml
p = yaml.safe_load(open("config/gpu.yaml"))
r = {r["name"]: r for r in p["throughput"] + (p.get("throughput_multi_gpu") or [])}[sys.argv[1]]
n = r["world_size"]
multi = "env NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 torchrun --standalone"
print("python3" if n == 1 else f"{multi} --nproc_per_node={n}", "experiments/pretrain.py",
      "--config config/gpu.yaml --throughput-only --model", r["model"], "--recipe", ",".join(r["recipes"]),
      "--compile" if r["compile"] else "--no-compile", "--batch-size", r["batch_size"], "--seq-len", r["seq_len"],
      "--steps", r["steps"], "--untimed-steps", r["untimed_steps"], "--vocab-size", p["corpus"]["vocab_size"],
      *(["--fsdp"] if r.get("fsdp") else []))
PY
) || { echo "no throughput run $run in config/gpu.yaml" | tee -a "$LOG"; continue; }
      # shellcheck disable=SC2086  # $cmd is words without spaces inside
      timeout "${STAGE_TIMEOUT_S:-${THROUGHPUT_TIMEOUT_S:-560}}" $cmd --device cuda --no-progress "${extra[@]}" \
        --results "$OUT/$run.json" 2>&1 | tail -12 | tee -a "$LOG" ;;
    *) echo "unknown stage $s" >&2; exit 2 ;;
  esac
done
