#!/usr/bin/env bash
# Pretraining runs queued per GPU, carried on over several device calls of one session. Usage, from
# the repo root on the GPU machine:
#
#   ADAHOP_GIT_COMMIT=<full sha: git rev-parse HEAD> ADAHOP_GIT_DIRTY=0 bash scripts/h200_queue.sh "RECIPE:SEED ..." ["RECIPE:SEED ..."]
#
# An item may also be stage:tests, stage:microbench, stage:layers, stage:memory, stage:patterns,
# stage:strategies or stage:throughput-RUN (RUN: a one-GPU run of config/gpu.yaml's throughput
# section, e.g. 125m_eager): that stage of scripts/h200_campaign.sh, given the time left (a stage
# cannot resume; its results file, under stages/ in the archive, marks it done; a throughput run
# cut off keeps the recipes it finished).
# One argument per GPU (CUDA_VISIBLE_DEVICES=0, 1, ...; see RUNS_PER_GPU): the runs it works through in order,
# each by scripts/h200_pretrain.sh with the time left in this call. A run resumes from its checkpoint
# (a warm machine keeps them between calls); one that cannot finish is stopped at the deadline by
# SIGTERM, which checkpoints its last step; its lm-eval starts only with EVAL_MIN_S seconds left,
# else the next call does it (default 200). With NO_NEW_RUNS=1 (the last call: there is no next one,
# and a deferred eval is lost with the machine, as 125m_adahop-exact-bf16_s0's was in session 9 with
# 191 s left) the default is 130: lm-eval took 110-176 s on the H200 (results/logs/h200-*), and an
# eval that runs out costs only time no later call could use. A run whose eval result exists is
# skipped, so the same command, called again while the machine is warm, continues where the last
# call stopped.
#
# Everything the runs wrote so far (QUEUE_DIR, kept on the machine) comes back as one archive,
# $OUT/queue.tar.gz (a call brings back at most 8 files), beside $OUT/queue.log: per run
# <run>.pretrain.json, .eval.json, .metrics.jsonl and .log as scripts/h200_pretrain.sh describes.
#
# Environment (all optional but the first two):
#   ADAHOP_GIT_COMMIT, ADAHOP_GIT_DIRTY  the commit the results are stamped with (required)
#   DEADLINE_S    seconds from the start by which every run has stopped (default 550, for a 600 s call:
#                 room for a stopped run's checkpoint and the archive)
#   NO_NEW_RUNS=1 only continue runs that have a checkpoint (the session's last call: a run started
#                 then is lost when the machine goes back); stages still start (see STAGE_MIN_S)
#   EVAL_MIN_S    (default 200, 130 with NO_NEW_RUNS=1: see above)
#   KILL_AFTER_S (default 20), PRETRAIN_CONFIG, RUNS_DIR, ...: passed to h200_pretrain.sh
#   QUEUE_DIR     where the runs' files collect (default /tmp/adahop_queue)
#   MIN_LEFT_S    a GPU starts its next run only with this many seconds left (default 60)
#   RUNS_PER_GPU  queues that share one GPU (default 1): queue i runs on GPU i / RUNS_PER_GPU. Meant
#                 to fill the idle GPU time of the host-bound eager runs, but measured slower (session
#                 6: 152k tokens/s of two runs on one GPU against 191k for one alone, lm-eval 360 s
#                 instead of ~140 s; without MPS the GPU time-slices the processes). Each run's results
#                 record it (provenance backend_env ADAHOP_RUNS_PER_GPU): their tokens/s are not
#                 one-GPU rates. Logs stay per queue (gpu<i>.txt: i is the queue).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
  sed -n '2,16p' "$0" >&2
  exit 2
fi
: "${ADAHOP_GIT_COMMIT:?set ADAHOP_GIT_COMMIT and ADAHOP_GIT_DIRTY: the results are stamped with them}"
: "${ADAHOP_GIT_DIRTY:?set ADAHOP_GIT_DIRTY (0 or 1)}"
[[ "$ADAHOP_GIT_COMMIT" =~ ^[0-9a-f]{40}$ ]] || {
  echo "ADAHOP_GIT_COMMIT must be a full 40-hex commit (git rev-parse HEAD), got '$ADAHOP_GIT_COMMIT'" >&2; exit 2; }
DEADLINE_S=${DEADLINE_S:-550}
RUNS_PER_GPU=${RUNS_PER_GPU:-1}
[[ "$RUNS_PER_GPU" =~ ^[1-9][0-9]*$ ]] || { echo "RUNS_PER_GPU must be a positive integer, got '$RUNS_PER_GPU'" >&2; exit 2; }
QUEUE_DIR=${QUEUE_DIR:-/tmp/adahop_queue}
OUT=${OUT:-/tmp/out}
START=$SECONDS
if [ -z "${EVAL_MIN_S:-}" ]; then  # see the header
  EVAL_MIN_S=200
  [ "${NO_NEW_RUNS:-0}" = 1 ] && EVAL_MIN_S=130
fi
# A campaign stage an item may name, and the results file that marks it done.
declare -A STAGE_FILE=([tests]=tests.json [microbench]=kernels.json [layers]=layers.json [memory]=memory.json [patterns]=patterns.json.gz
  [strategies]=strategies.done)
# The seconds a stage needs to finish: what it took on the H200 (results/logs/h200-2026-11-30*: patterns
# 416 s, strategies 353 s; h200-2026-12-01-s8: memory 370 s, before its run-map records, about 40 s
# more; h200-2026-12-01-s10*: microbench 180 and 186 s, layers 226 s) with a margin. A stage that cannot resume is
# not started with less, so it does not burn the GPU's time only to be cut off; it may start in a
# NO_NEW_RUNS call, since it leaves nothing behind for the next one. The items after a stage that
# waits still start (plan_queue.py puts stages first: a waiting stage would idle the rest of a call).
# tests: not yet run as a stage; tests/kernels/test_pattern_stats.py alone took 27 s on the H200 (session 11).
declare -A STAGE_MIN_S=([tests]=240 [microbench]=240 [layers]=280 [memory]=450 [patterns]=480 [strategies]=420)
# throughput-RUN, for the one-GPU runs of the file h200_campaign.sh reads (a DDP run needs its GPUs:
# run the campaign itself). 420 s is a guess: 60 steps of each of 7 recipes, eager ~0.3 s a step, plus
# each recipe's model, first step and (policies) calibration; no stage has timed a whole 125m_eager.
for run in $(python3 -c 'import yaml
print(*(r["name"] for r in yaml.safe_load(open("config/gpu.yaml")).get("throughput") or [] if r["world_size"] == 1))'); do
  STAGE_FILE[throughput-$run]=$run.json STAGE_MIN_S[throughput-$run]=420
done
for queue in "$@"; do
  for item in $queue; do
    if [[ "$item" =~ ^stage:(.*)$ ]]; then
      [ -n "${STAGE_FILE[${BASH_REMATCH[1]}]:-}" ] || { echo "unknown stage in '$item' (${!STAGE_FILE[*]})" >&2; exit 2; }
    elif ! [[ "$item" =~ ^[a-z0-9-]+:[0-9]+$ ]]; then
      echo "not RECIPE:SEED or stage:NAME: '$item'" >&2
      exit 2
    fi
  done
done
MODEL=$(python3 -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["pretrain"]["models"][0])' \
  "${PRETRAIN_CONFIG:-config/gpu.yaml}") || exit 2
mkdir -p "$QUEUE_DIR/out" "$QUEUE_DIR/stages" "$OUT"
QLOG="$QUEUE_DIR/queue.log"
note() { echo "=== queue $(date -u +%T) +$((SECONDS - START))s $*" | tee -a "$QLOG"; }

work() {  # queue index, its items
  local q=$1 item recipe seed run left
  local gpu=$((q / RUNS_PER_GPU))
  local who="gpu $gpu"
  [ "$RUNS_PER_GPU" -gt 1 ] && who="gpu $gpu queue $q"
  for item in $2; do
    left=$((DEADLINE_S - (SECONDS - START)))
    if [[ "$item" == stage:* ]]; then  # a whole campaign stage, in one go (it cannot resume)
      local stage=${item#stage:}
      [ -f "$QUEUE_DIR/stages/${STAGE_FILE[$stage]}" ] && continue
      if [ "$left" -lt "${STAGE_MIN_S[$stage]}" ]; then
        note "$who: ${left}s left, stage $stage needs ${STAGE_MIN_S[$stage]}s: it waits for the next call"
        continue  # the items after it may use the time: a run resumes in the next call, a shorter stage fits
      fi
      note "$who: stage $stage (${left}s left)"
      CUDA_VISIBLE_DEVICES=$gpu OUT="$QUEUE_DIR/stages" STAGE_TIMEOUT_S=$left \
        bash scripts/h200_campaign.sh "$stage" >>"$QUEUE_DIR/gpu$q.txt" 2>&1
      note "$who: stage $stage rc $? ($( [ -f "$QUEUE_DIR/stages/${STAGE_FILE[$stage]}" ] && echo wrote \
        "${STAGE_FILE[$stage]}" || echo 'no results file'))"
      continue
    fi
    recipe=${item%%:*} seed=${item##*:}
    run="${MODEL}_${recipe}_s${seed}"
    if [ -f "$QUEUE_DIR/out/$run.eval.json" ]; then
      continue
    fi
    if [ "$left" -lt "${MIN_LEFT_S:-60}" ]; then
      note "$who: ${left}s left, $run waits for the next call"
      break
    fi
    note "$who: $run (${left}s left)"
    CUDA_VISIBLE_DEVICES=$gpu ADAHOP_RUNS_PER_GPU=$RUNS_PER_GPU OUT="$QUEUE_DIR/out" DEADLINE_S=$left EVAL_RESERVE_S=0 \
      EVAL_MIN_S=$EVAL_MIN_S KILL_AFTER_S=${KILL_AFTER_S:-20} RESUME_ONLY=${NO_NEW_RUNS:-0} \
      bash scripts/h200_pretrain.sh "$recipe" "$seed" >>"$QUEUE_DIR/gpu$q.txt" 2>&1
    note "$who: $run rc $? ($(grep -h '^=== .* \(train\|eval\): rc' "$QUEUE_DIR/out/$run.log" | tail -2 \
      | sed 's/^=== [^ ]* [^ ]* +[0-9]*s //' | tr '\n' ' '))"
  done
}

note "start: $# queue(s), $RUNS_PER_GPU per GPU, deadline ${DEADLINE_S}s, lm-eval from ${EVAL_MIN_S}s left, commit $ADAHOP_GIT_COMMIT (dirty $ADAHOP_GIT_DIRTY)"
q=0
for queue in "$@"; do
  touch "$QUEUE_DIR/gpu$q.txt"
  work "$q" "$queue" &
  q=$((q + 1))
done
wait
done_runs=$(cd "$QUEUE_DIR/out" && ls -- *.eval.json 2>/dev/null | sed 's/\.eval\.json$//' | tr '\n' ' ')
note "end: evaluated so far: ${done_runs:-none}"
cp "$QLOG" "$OUT/queue.log"
(cd "$QUEUE_DIR" && tar -czf "$OUT/queue.tar.gz" out stages queue.log gpu*.txt)
