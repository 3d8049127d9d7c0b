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
python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --timeout 300 $(grep -rl --include='test_*.py' 'pytest.mark.gpu' tests) \
  2>&1 | tee "$OUT/test-gpu.log" | tail -25
python3 -m benchmarks.gpu_attention --json "$OUT/gpu_attention.json" 2>&1 | tee "$OUT/gpu_attention.log" | tail -20
python3 -m benchmarks.gpu_engine --eager --json "$OUT/gpu_engine.json" 2>&1 | tee "$OUT/gpu_engine.log" | tail -20

port=30111
python3 -m server --model benchmarks/configs/gemma3-270m --load-format dummy --device cuda --port $port \
  > "$OUT/serve.log" 2>&1 &
pid=$!
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
{
  curl -s "http://127.0.0.1:$port/get_server_info"; echo
  curl -s "http://127.0.0.1:$port/generate" -H 'content-type: application/json' \
    -d '{"input_ids": [2, 100, 200, 300], "sampling_params": {"max_new_tokens": 32, "temperature": 0, "ignore_eos": true}}'
  echo
} > "$OUT/serve-check.json" 2>&1
kill $pid; wait $pid 2>/dev/null
tail -3 "$OUT/serve-check.json"
