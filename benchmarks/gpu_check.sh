#!/usr/bin/env bash
# One call on a CUDA machine: the GPU tests, the attention and engine benchmarks, and the server on a dummy-weight
# Gemma 3 270M config, each logged under $OUT. Run from the repository root with the machine's own
# python3 (the venv is a CPU build); missing packages travel as wheels in .whl/ (`make gpu-wheels`).
#     OUT=/tmp/gpu bash benchmarks/gpu_check.sh
set -uo pipefail
OUT=${OUT:-/tmp/radixserve-gpu}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=".:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/gpu.txt"

# the files holding GPU tests only (the CPU suite's clients are not on that machine); no -x: every failure is news
# Each step has its own time limit (a lease is minutes long: one hang must not take the rest), and the
# tests spread over the machine's cores with pytest-xdist where it is installed (Triton compiles on the CPU).
# Eight workers of two CPU threads: on 2026-11-28 twelve workers of sixteen threads each starved the
# host side (transformers' CPU reference, Triton's cache key) until tests hit their time limit; eight
# of two ran all 165 GPU tests in about 75 s on an H200's 16 cores.
workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")
OMP_NUM_THREADS=2 timeout ${TEST_S:-240} python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --timeout 120 $workers \
  $(grep -rl --include='test_*.py' 'pytest.mark.gpu' tests) > "$OUT/test-gpu.log" 2>&1
echo "test-gpu rc $?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/test-gpu.log" | cut -c1-300 | tail -25
timeout ${ATTENTION_S:-60} python3 -m benchmarks.gpu_attention --json "$OUT/gpu_attention.json" > "$OUT/gpu_attention.log" 2>&1
echo "gpu_attention rc $?"; tail -20 "$OUT/gpu_attention.log" | cut -c1-200
timeout ${ENGINE_S:-150} python3 -m benchmarks.gpu_engine --eager --json "$OUT/gpu_engine.json" > "$OUT/gpu_engine.log" 2>&1
echo "gpu_engine rc $?"; tail -30 "$OUT/gpu_engine.log" | cut -c1-250

port=30111
python3 -m server --model benchmarks/configs/gemma3-270m --load-format dummy --device cuda --port $port \
  > "$OUT/serve.log" 2>&1 &
pid=$!
for _ in $(seq 90); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
{
  curl -s "http://127.0.0.1:$port/get_server_info"; echo
  curl -s "http://127.0.0.1:$port/generate" -H 'content-type: application/json' \
    -d '{"input_ids": [2, 100, 200, 300], "sampling_params": {"max_new_tokens": 32, "temperature": 0, "ignore_eos": true}}'
  echo
} > "$OUT/serve-check.json" 2>&1
kill $pid; wait $pid 2>/dev/null
tail -3 "$OUT/serve-check.json"
