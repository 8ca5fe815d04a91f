# Sourced by the run_*_gpu.sh scripts: README's serve line as written, in vLLM's default mode, on a tiny NVFP4
# checkpoint made here: readme_serve SITE LOG. Two things differ from a V100 and are the kit's, not the product's:
# the kit's vLLM lacks its compiled custom ops (custom_ops none: Inductor writes them) and the `vllm` script (run as
# a module), and on the H200 the Volta attention backend must be forced (on compute capability 7.x it is the
# default). One completion is asked for over HTTP; the CUDA graph lines of vLLM's log are printed.
readme_serve() {
  local site=$1 log=$2 model=/tmp/readme-qwen3-nvfp4 port=8765 server ok=1
  [[ -d $model ]] || python3 -c "from vllm_volta_fp4.testing.tiny_model import make_tiny_checkpoint as m; m('$model', 'qwen3', 'modelopt-nvfp4')"
  VLLM_VOLTA_FP4_ATTENTION=force PYTHONPATH=$site:$PYTHONPATH VLLM_HOST_IP=127.0.0.1 HF_HUB_OFFLINE=1 \
    TVM_FFI_DISABLE_TORCH_C_DLPACK=1 setsid python3 -m vllm.entrypoints.cli.main serve "$model" \
    --quantization volta_nvfp4 --dtype half --host 127.0.0.1 --port $port \
    --compilation-config '{"custom_ops": ["none"]}' > "$log" 2>&1 & server=$!
  for _ in $(seq 240); do
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2> /dev/null \
      && { ok=0; break; }
    kill -0 $server 2> /dev/null || break
    sleep 1
  done
  if (( ok == 0 )); then
    python3 - "$port" "$model" <<'PY' || ok=1
import json, sys, urllib.request
body = {"model": sys.argv[2], "prompt": "The cat", "max_tokens": 16, "temperature": 0}
request = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
reply = json.load(urllib.request.urlopen(request, timeout=60))
print("serve: HTTP completion", repr(reply["choices"][0]["text"]), reply["usage"])
PY
  fi
  grep -iE "cudagraph|cuda graph|graph capturing|compil" "$log" | grep -v Warning | tail -6
  (( ok == 0 )) || { echo "serve: FAILED"; tail -30 "$log"; }
  kill -- -$server 2> /dev/null; wait $server 2> /dev/null
  return $ok
}
