#!/usr/bin/env bash
# Capture the KV cache of `vllm serve` with kvscope's KV connector, then make a bundle and open it.
#   bash capture_vllm_serve.sh MODEL [PORT]
# Needs vLLM, transformers and kvscope_capture (pip install ./capture) in this environment, and
# kvscope on the PATH for the last step.
set -euo pipefail
model=${1:?usage: capture_vllm_serve.sh MODEL [PORT]}
port=${2:-8000}
shards=$(mktemp -d kv-shards.XXXX)

vllm serve "$model" --port "$port" --kv-transfer-config "{\"kv_connector\": \"KvscopeConnector\",
  \"kv_connector_module_path\": \"kvscope_capture.vllm.connector\", \"kv_role\": \"kv_producer\",
  \"kv_connector_extra_config\": {\"output_dir\": \"$shards\", \"max_requests\": 8}}" &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
until curl -sf "localhost:$port/health" >/dev/null; do sleep 2; done

for prompt in "The capital of France is" "def fibonacci(n):"; do
  curl -s "localhost:$port/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"model\": \"$model\", \"prompt\": \"$prompt\", \"max_tokens\": 64, \"temperature\": 0, \"ignore_eos\": true}" >/dev/null
done
sleep 2  # the shards of the last request are written in the engine's next step
kill $server; wait $server 2>/dev/null || true

python3 -m kvscope_capture bundle --shards "$shards" --model "$model" --out capture.h5
kvscope capture.h5
