#!/usr/bin/env bash
# Seed corpora for the fuzz targets: small valid inputs of every reader, made fresh (nothing
# binary is checked in). usage: make_seeds.sh KVSCOPE OUT  ->  OUT/<target>/...
set -euo pipefail
kvscope=$1 out=$2
rm -rf "$out"
mkdir -p "$out"/{fuzz_bundle,fuzz_safetensors,fuzz_kv_config,fuzz_analysis_json,fuzz_pt}
tiny=(--layers 2 --hidden 32 --query-heads 2 --kv-heads 2 --head-dim 8 --prompts 6 --decode 3)
"$kvscope" synth "$out/fuzz_bundle/sliding-tp2.h5" "${tiny[@]}" --tp 2 >/dev/null
"$kvscope" synth "$out/fuzz_bundle/full-tp4-replicated-two-way.h5" "${tiny[@]}" --tp 4 --spec full --two-way \
    --fault stale_block >/dev/null
exec /usr/bin/python3 - "$out" <<'PY'
import io, json, os, struct, sys
import h5py, numpy as np, torch

out = sys.argv[1]
rng = np.random.default_rng(7)

def save(folder, name, data):
    with open(os.path.join(out, folder, name), "wb") as f:
        f.write(data)

# KV cache configs: the bundles' own, and a few shapes of the engine's dict.
for bundle in sorted(os.listdir(os.path.join(out, "fuzz_bundle"))):
    with h5py.File(os.path.join(out, "fuzz_bundle", bundle), "r") as f:
        save("fuzz_kv_config", bundle + ".json", f["kv_cache_config"][0])
save("fuzz_kv_config", "hybrid.json", json.dumps({
    "num_blocks": 4096, "tp_size": 4, "total_num_kv_heads": 8, "dcp_size": 1, "pcp_size": 1,
    "groups": [{"layer_names": ["model.layers.0.self_attn"], "spec_type": "SlidingWindowSpec", "block_size": 16,
                "sliding_window": 128, "dtype": "torch.bfloat16", "num_kv_heads": 2, "head_size": 128},
               {"layer_names": ["model.layers.1.self_attn"], "spec_type": "FullAttentionSpec", "block_size": 16,
                "dtype": "float8_e4m3fn", "num_kv_heads": 2, "head_size": 128}]}).encode())

# safetensors: an 8-byte little-endian header length, the JSON header, the data.
def safetensors(tensors):
    header, data = {}, b""
    for name, (dtype, array) in tensors.items():
        raw = array.tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data

kv = rng.standard_normal((1, 2, 5, 8)).astype(np.float32)
save("fuzz_safetensors", "past_key_values.safetensors", safetensors({
    "past_key_values.0.key": ("BF16", (kv.view(np.uint32) >> 16).astype(np.uint16)),
    "past_key_values.0.value": ("F32", kv),
    "past_key_values.1.key": ("F16", kv.astype(np.float16)),
    "past_key_values.1.value": ("F8_E4M3", rng.integers(0, 255, kv.shape, dtype=np.uint8))}))
save("fuzz_safetensors", "logits.safetensors", safetensors({
    "logits": ("F32", rng.standard_normal((3, 11)).astype(np.float32)),
    "input_ids": ("I64", np.arange(6, dtype=np.int64))}))

# torch.save files (zip, pickle protocol 2), as an engine's RPC results are dumped.
def torch_bytes(value):
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()

k = torch.randn(3, 2, 4, 8, dtype=torch.bfloat16)
save("fuzz_pt", "kv_caches.pt", torch_bytes({"model.layers.0.self_attn": (k, k.clone()),
                                               "model.layers.1.self_attn": (k.float(), k.half())}))
save("fuzz_pt", "block_table.pt", torch_bytes({"block_table": torch.tensor([[3, 1, -1]], dtype=torch.int32),
                                                 "seq_lens": [10, 4], "note": "x"}))
save("fuzz_pt", "tensor.pt", torch_bytes(torch.arange(12, dtype=torch.int64).reshape(3, 4)))

# The analysis JSON target builds its input from any bytes.
for i in range(4):
    save("fuzz_analysis_json", f"bytes{i}", rng.integers(0, 256, 64 + 64 * i, dtype=np.uint8).tobytes())
PY
