#!/usr/bin/env bash
# The seeds' benchmark protocol on one V100: for max-model-len 4096 and 8192, start the server, run
# `volta-fp4 bench` (512 prompt tokens, 256 generated, batch 1/4/8, 3 rounds each), stop the server.
#   MODEL=/models/Qwen3.8-27B-NVFP4 bash examples/benchmark.sh
# Results: bench-results/mml-4096/ and bench-results/mml-8192/ (results.md, results.csv, results.png).
# Needs the [bench] extra (matplotlib). `volta-fp4 bench --offline "$MODEL"` does the same without a server.
set -euo pipefail
MODEL=${MODEL:?set MODEL to the NVFP4 model directory}
PORT=${PORT:-8011}
PYTHON=${PYTHON:-python}
API_KEY=${API_KEY:-bench-$RANDOM$RANDOM}
OUT=${OUT:-bench-results}
STARTUP_TIMEOUT_S=${STARTUP_TIMEOUT_S:-1800}  # model load + first Triton compile on a V100 take minutes

for max_model_len in 4096 8192; do
    log="$OUT/server-$max_model_len.log"
    mkdir -p "$OUT"
    "$PYTHON" -m vllm.entrypoints.openai.api_server --model "$MODEL" --quantization volta_nvfp4 --dtype half \
        --max-model-len "$max_model_len" --max-num-seqs 8 --host 127.0.0.1 --port "$PORT" --api-key "$API_KEY" \
        >"$log" 2>&1 &
    server=$!
    trap 'kill "$server" 2>/dev/null || true' EXIT
    deadline=$(( $(date +%s) + STARTUP_TIMEOUT_S ))
    until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do
        if ! kill -0 "$server" 2>/dev/null; then echo "server exited; see $log" >&2; exit 1; fi
        if (( $(date +%s) > deadline )); then echo "server not up after $STARTUP_TIMEOUT_S s; see $log" >&2; exit 1; fi
        sleep 5
    done
    volta-fp4 bench --url "http://127.0.0.1:$PORT" --api-key "$API_KEY" --out "$OUT/mml-$max_model_len"
    kill "$server"
    wait "$server" || true
    trap - EXIT
done
