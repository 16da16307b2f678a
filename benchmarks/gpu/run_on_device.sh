#!/usr/bin/env bash
# Every GPU figure of the engine in one run, for a machine with one NVIDIA GPU and
# PyTorch (the engine's pure-Python dependencies may come as wheels in .whl/).
# Writes each script's JSON line and log under $OUT (default: ./gpu-results).
#   bash benchmarks/gpu/run_on_device.sh
set -u
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
$PY -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' >> "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
run() {  # name, seconds, script args...
  local name=$1 limit=$2
  shift 2
  local began=$SECONDS
  timeout "$limit" $PY "$@" > "$OUT/$name.json" 2> "$OUT/$name.log"
  echo "$name: exit $? in $((SECONDS - began)) s"
  cat "$OUT/$name.json"
  grep -v -i -e psutil -e "^ " -e "^$" -e "^==" -e "ncalls" -e "Ordered by" -e "List reduced" \
    "$OUT/$name.log" | tail -5
}
run greedy 120 benchmarks/gpu/greedy_matches_reference.py
# The decodes' attention both ways, one after the other on the same card: the torch path
# (gathers and SDPA; with transformers' generate_batch beside it) and the Triton kernel
# reading the pool in place. PROFILE=1: where each run's Python side spends, in the logs.
run decode 200 benchmarks/gpu/decode_throughput.py --batches 1 32 128 256 \
  ${PROFILE:+--profile --skip-generate-batch}
run decode_triton 150 benchmarks/gpu/decode_throughput.py --batches 1 32 128 256 \
  --decode-kernel triton --skip-generate-batch ${PROFILE:+--profile}
