#!/usr/bin/env bash
# vLLM's quantised caches, synthesised as vLLM quantises them (nvfp4, int4_per_token_head,
# fp8_per_token_head, int8_per_token_head): a clean capture gives no suspect (each cache judged
# against its own quantisation floor), and a scale fault in layer 2 is found at layer 2.
set -u
kvscope=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
small=(--layers 4 --head-dim 32 --prompts 12,20 --decode 8)
suspects() {  # the suspects' first layers, one a line
  /usr/bin/python3 -c 'import json, sys; [print(s["first_layer"]) for s in json.load(open(sys.argv[1]))["suspects"]]' "$1"
}
status=0
for dtype in nvfp4 int4_per_token_head fp8_per_token_head int8_per_token_head; do
  "$kvscope" synth "$dir/clean.h5" --kv-dtype "$dtype" "${small[@]}" >/dev/null || { echo "$dtype: synth failed"; exit 2; }
  "$kvscope" analyze "$dir/clean.h5" --json "$dir/clean.json" >/dev/null || { echo "$dtype: analyze failed"; exit 2; }
  found=$(suspects "$dir/clean.json")
  if [ -n "$found" ]; then
    echo "$dtype, clean: suspects at $found"; status=1
  fi
  "$kvscope" synth "$dir/fault.h5" --kv-dtype "$dtype" "${small[@]}" --fault fp8_scale --fault-layer 2 >/dev/null ||
    { echo "$dtype: synth failed"; exit 2; }
  "$kvscope" analyze "$dir/fault.h5" --json "$dir/fault.json" >/dev/null || { echo "$dtype: analyze failed"; exit 2; }
  first=$(suspects "$dir/fault.json" | head -n 1)
  if [ "$first" != "model.layers.2.self_attn" ]; then
    echo "$dtype, fp8_scale in layer 2: first suspect at '$first'"; status=1
  fi
  echo "$dtype: clean (no suspect), fp8_scale found at $first"
done
# int4's rotation spreads a RoPE fault over the head, still found at its layer.
"$kvscope" synth "$dir/rope.h5" --kv-dtype int4_per_token_head "${small[@]}" --fault rope_offset --fault-layer 2 >/dev/null || exit 2
"$kvscope" analyze "$dir/rope.h5" --json "$dir/rope.json" >/dev/null || exit 2
first=$(suspects "$dir/rope.json" | head -n 1)
[ "$first" = "model.layers.2.self_attn" ] || { echo "int4_per_token_head, rope_offset in layer 2: first suspect at '$first'"; status=1; }
# The vLLM names are refused where they cannot apply.
if "$kvscope" synth "$dir/x.h5" --kv-dtype nvfp4 --head-dim 8 >/dev/null 2>&1; then
  echo "nvfp4 with head_dim 8 was not refused"; status=1
fi
exit $status
