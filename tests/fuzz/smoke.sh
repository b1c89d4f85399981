#!/usr/bin/env bash
# A small capture from `kvscope synth`, mutated COUNT times and analysed: fails on any crash
# or hang (mutate_bundles.py keeps those files in OUT for reproduction).
# usage: smoke.sh KVSCOPE OUT COUNT
set -euo pipefail
kvscope=$1 out=$2 count=$3
mkdir -p "$out"
"$kvscope" synth "$out/seed.h5" --layers 2 --hidden 32 --query-heads 2 --kv-heads 2 --head-dim 8 --prompts 6 \
    --decode 3 --tp 2 >/dev/null
exec /usr/bin/python3 "$(dirname "$0")/mutate_bundles.py" "$kvscope" "$out/seed.h5" "$out" --count "$count" --jobs 2
