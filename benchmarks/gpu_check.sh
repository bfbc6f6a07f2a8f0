#!/usr/bin/env bash
# Everything a GPU session checks, in one call (a lent GPU's time is short): the tests that
# need a GPU, then benchmarks/gpu.py (products, the chain, resnet50's convolutions staged and
# not, with async copies and not, the whole model against torch), then, with TUNE_SECONDS, a
# tuning run and what double buffering and async copies were worth in its records. About
# 8.5 minutes without tuning (2026-11-29: the tests 60 s, gpu.py 4-5 minutes; the staging
# sweep is 30 s longer since; the product sweep after them adds 70 s). Logs go to $OUT (the
# device tool's folder that comes back) or ./gpu-logs.
# Usage: bash benchmarks/gpu_check.sh [TUNE_SECONDS]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-logs}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OPFUSION_CACHE_DIR="${OPFUSION_CACHE_DIR:-/tmp/opfusion-gpu-cache}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
# The GPU tests: every light model and both transformer blocks against the reference (as
# CUDA graphs), inputs from torch tensors on the GPU, tuning on the GPU.
timeout 240 python3 -m pytest -q -p no:cacheprovider -rs \
  tests/backend/test_cuda_backend.py tests/autotune/test_gpu_runner.py \
  tests/backend/test_cuda_mma.py \
  -k "on_the_gpu or torch_tensors or needs_a_driver or tuning" 2>&1 | tee "$out/tests.log" | tail -8
# resnet50 in TF32 (tensor cores), the arithmetic of torch's default rows it is compared with,
# its operands truncated by the tensor cores as cuDNN's are (-tf32=fast): each tensor-core
# convolution staged and not, async and not (about 120 s), then the whole model, checked,
# and again with its operands rounded (-tf32=1)
timeout 450 python3 benchmarks/gpu.py --products --tf32 fast --staging 120 --profile 30 2>&1 \
  | tee "$out/bench.log"
# the 4096-square product in other tiles and pipelines (last: the first thing a 600 s call
# cuts)
timeout 80 python3 benchmarks/gpu.py --skip chain,resnet50 --tf32 fast --product-sweep 60 2>&1 \
  | tee "$out/products.log"
# a tuning run when asked for (seconds as the argument): the tuned model, and what double
# buffering was worth per layer in its search (ms, best with each)
if [ "${1:-0}" != 0 ]; then
  timeout 420 python3 benchmarks/gpu.py --tf32 fast --skip chain --no-check --profile 0 \
    --tune "$1" --records "$out/records.json" 2>&1 | tee "$out/tune.log"
  for knob in double_buffer async_stages; do
    python3 benchmarks/records_knobs.py "$out/records.json" "$knob" 2>&1
  done | tee "$out/knobs.log"
fi
