# Source on a GPU machine that has torch/triton but no network and no `pip install -e`:
#   . scripts/device_env.sh
# Makes `adahop` and `adahop_kernels` importable from this checkout (kernels/ is imported under
# that name, as pyproject.toml maps it) and installs the carried wheels, if any, of the folders in
# ADAHOP_WHEEL_DIRS (default ".whl .whl_eval": torchao; lm-eval and its missing dependencies).
# The commit results are stamped with, when given, is a full hash (a short or typed one cannot be
# checked here: the device's copy of the tree has no history).
if [ -n "${ADAHOP_GIT_COMMIT:-}" ] && ! [[ "$ADAHOP_GIT_COMMIT" =~ ^[0-9a-f]{40}$ ]]; then
  echo "ADAHOP_GIT_COMMIT must be a full 40-hex commit (git rev-parse HEAD), got '$ADAHOP_GIT_COMMIT'" >&2
  return 2 2>/dev/null || exit 2
fi
ADAHOP_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
_adahop_site=${ADAHOP_SITE:-/tmp/adahop_site}
mkdir -p "$_adahop_site"
ln -sfn "$ADAHOP_ROOT/kernels" "$_adahop_site/adahop_kernels"
_adahop_wheels=()
for _d in ${ADAHOP_WHEEL_DIRS-.whl .whl_eval}; do
  for _w in "$ADAHOP_ROOT/$_d"/*.whl; do
    [ -f "$_w" ] && _adahop_wheels+=("$_w")
  done
done
if [ ${#_adahop_wheels[@]} -gt 0 ]; then
  PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$_adahop_site/wheels" "${_adahop_wheels[@]}"
fi
export PYTHONPATH="$ADAHOP_ROOT:$_adahop_site:$_adahop_site/wheels${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
