#!/usr/bin/env bash
# Serve an NVFP4 checkpoint on one V100 with stock vLLM 0.19.1 + this plugin (pip install "vllm-volta-fp4[v100]").
#   MODEL=/models/Qwen3.8-27B-NVFP4 API_KEY=$(openssl rand -hex 16) bash examples/serve_v100.sh
# Differences from the seeds' command, and why:
#   --quantization volta_nvfp4  vLLM's own NVFP4 methods need compute capability 7.5 ('modelopt_fp4 requires
#                               capability 75'); the plugin's method serves the same files on sm_70.
#   --dtype half                V100 has no bf16; vLLM refuses bfloat16 below compute capability 8.0.
#   --host 127.0.0.1 --api-key  listen on this machine only and require a key; put a reverse proxy in front to
#                               expose it.
#   python -m vllm.entrypoints.openai.api_server  works wherever `vllm serve` does, and where it does not.
# Memory flags: `volta-fp4 plan "$MODEL" --gpu v100-32gb --max-model-len 32768` prints the ones that fit.
set -euo pipefail
MODEL=${MODEL:?set MODEL to the NVFP4 model directory}
API_KEY=${API_KEY:?set API_KEY, e.g. API_KEY=\$(openssl rand -hex 16)}
PORT=${PORT:-8000}
PYTHON=${PYTHON:-python}

volta-fp4 doctor "$MODEL"  # stops here (exit 1) when something would block serving

exec "$PYTHON" -m vllm.entrypoints.openai.api_server \
    --model "$MODEL" \
    --quantization volta_nvfp4 \
    --dtype half \
    --max-model-len "${MAX_MODEL_LEN:-32768}" \
    --max-num-seqs "${MAX_NUM_SEQS:-4}" \
    --gpu-memory-utilization "${GPU_MEMORY_UTILIZATION:-0.90}" \
    --enable-chunked-prefill --max-num-batched-tokens "${MAX_NUM_BATCHED_TOKENS:-2048}" \
    --host 127.0.0.1 --port "$PORT" \
    --api-key "$API_KEY"
