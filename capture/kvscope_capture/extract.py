"""The seed tool's extraction API, so that existing capture scripts port with few changes.

vLLM side: through `llm.collective_rpc`, whose worker RPCs return, per TP rank,
  get_kv_cache_config -> dict
  get_kv_caches       -> {layer_name: torch.save({'k': k, 'v': v}) bytes}
  get_block_tables    -> [torch.save(int32 tensor [batch, max_blocks]) bytes per group]
HF side: any model with the HF call interface
  model(input_ids=..., past_key_values=..., use_cache=True) -> object with .logits, .past_key_values
"""

from .hf_reference import hf_cache_layers
from .stages import merge_stage_caches, merge_stage_configs
from .tensors import load_torch_bytes


def extract_vllm_kv_cache_config(llm):
    """The KV cache config: rank 0's, with the layers of every pipeline stage (with pipeline
    parallelism each worker reports only its own stage's layers)."""
    configs = llm.collective_rpc("get_kv_cache_config")
    if configs[0].get("pp_size", 1) > 1:
        return merge_stage_configs(configs)
    return configs[0]


def extract_vllm_kv_caches(llm, kv_cache_config=None):
    """Per TP rank, {layer_name: kv} decoded from the RPC's torch.save bytes: (k, v), or the dict
    with the scales and block ids when there are any. Pipeline stages are merged per TP rank."""
    per_worker = llm.collective_rpc("get_kv_caches")
    tp_size = kv_cache_config["tp_size"] if kv_cache_config else len(per_worker)
    per_rank = []
    for r, caches in enumerate(merge_stage_caches(per_worker, tp_size)):
        layers = {}
        for layer, data in caches.items():
            value = load_torch_bytes(data, f"rank {r}, layer {layer}") if isinstance(data, (bytes, bytearray)) else data
            if isinstance(value, dict) and set(value) <= {"k", "v"}:
                value = (value["k"], value["v"])
            layers[layer] = value if isinstance(value, dict) else tuple(value)
        if kv_cache_config is not None:
            names = {n for g in kv_cache_config["groups"] for n in g["layer_names"]}
            unknown = sorted(set(layers) - names)
            if unknown:
                raise ValueError(f"rank {r}: layer {unknown[0]!r} is not in the KV cache config")
        per_rank.append(layers)
    return per_rank


def extract_vllm_block_tables(llm):
    """One tensor [batch, max_blocks] per KV cache group (rank 0's; all ranks share them)."""
    tables = llm.collective_rpc("get_block_tables")[0]
    return [load_torch_bytes(t, f"block table of group {g}") if isinstance(t, (bytes, bytearray)) else t
            for g, t in enumerate(tables)]




def generate_hf_logits_and_kv(model, input_ids, num_tokens):
    """Greedy generation of `num_tokens` tokens. Returns (logits [num_tokens, vocab], kv): kv holds
    every position up to and including the last generated token (one extra forward pass adds its KV)."""
    import torch

    ids = torch.as_tensor(input_ids).reshape(1, -1)
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        logits = [out.logits[0, -1]]
        past = out.past_key_values
        for _ in range(num_tokens - 1):
            token = logits[-1].argmax().reshape(1, 1)
            out = model(input_ids=token, past_key_values=past, use_cache=True)
            logits.append(out.logits[0, -1])
            past = out.past_key_values
        token = logits[-1].argmax().reshape(1, 1)
        past = model(input_ids=token, past_key_values=past, use_cache=True).past_key_values
    return torch.stack(logits), hf_cache_layers(past)


def extract_hf_kv_caches_teacher_forced(model, input_ids, teacher_tokens, return_logits=False):
    """One forward pass over prompt + teacher tokens. Returns kv, or (logits, kv) with the logits
    of the generated positions [len(teacher_tokens), vocab] (step g predicts prompt_len + g)."""
    import torch

    prompt = torch.as_tensor(input_ids).reshape(-1)
    teacher = torch.as_tensor(teacher_tokens).reshape(-1)
    ids = torch.cat([prompt, teacher]).reshape(1, -1)
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
    kv = hf_cache_layers(out.past_key_values)
    if not return_logits:
        return kv
    start = prompt.numel() - 1
    return out.logits[0, start:start + teacher.numel()], kv


def make_kv_extract_fn(llm, writer, prompt_id, keep_only_referenced=True):
    """A `kv_extract_fn(seq_len)` for a teacher-forced logit-validation loop: each call records one
    engine snapshot of `prompt_id` in `writer` (validated_until is derived from the divergences
    given to writer.set_divergence, see BundleWriter.close)."""
    try:  # upstream vLLM with KvscopeWorkerExtension: keep the block tables of finished requests
        llm.collective_rpc("enable_block_table_snapshots")
    except Exception:  # the Neuron worker snapshots its block tables by itself
        pass
    config = writer.kv_cache_config

    def kv_extract_fn(seq_len):
        writer.add_engine_snapshot(prompt_id, extract_vllm_kv_caches(llm, config), extract_vllm_block_tables(llm),
                                   int(seq_len), keep_only_referenced=keep_only_referenced)
        return None
    return kv_extract_fn
