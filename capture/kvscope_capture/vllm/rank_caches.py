"""One vLLM worker's KV caches as kvscope reads them: the KV cache config in kvscope's form, each
layer's layout (detected, see layout.py), its fp8 scales, and blocks read out on request.

Built from what a GPU worker holds (vllm/v1/worker/gpu_model_runner.py): the KVCacheConfig
(kv_cache_groups[g].layer_names / .kv_cache_spec, num_blocks), the per-layer cache tensors
(`static_forward_context[name].kv_cache`, or the dict a KV connector's register_kv_caches gets),
and the attention layer modules (their backend and `_k_scale` / `_v_scale`)."""

from ..kv_cache_config import model_order
from .layout import detect_layout

# vLLM's --kv-cache-dtype names, as kvscope's config spells the stored format. "auto" stores the
# model's dtype (the spec's). Anything else (fp8_ds_mla, which the writer takes for MLA layers;
# per-token-head modes, NVFP4) is passed through, and the writer refuses what it does not know by name.
NOT_READ = ("MambaSpec", "EncoderOnlyAttentionSpec")
CACHE_DTYPES = {"fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "fp8_inc": "float8_e4m3fn",
                "fp8_e5m2": "float8_e5m2", "int8": "int8"}


def _plain(value):
    """A spec field as JSON: torch dtypes as their names."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _mla_widths(model_config):
    """The MLA latent's (kv_lora_rank, qk_rope_head_dim) from the model's HF config (DeepSeek,
    Kimi K2), or None when it has none."""
    hf = getattr(model_config, "hf_text_config", None) or getattr(model_config, "hf_config", None)
    rank, rope = getattr(hf, "kv_lora_rank", None), getattr(hf, "qk_rope_head_dim", None)
    return (int(rank), int(rope)) if rank is not None and rope is not None else None


def _group_entries(group, cache_dtype, mla_widths=None):
    """kvscope config groups for one vLLM KV cache group: one, or one per distinct layer spec when
    the group holds per-layer specs (UniformTypeKVCacheSpecs: same type, other head sizes).
    mla_widths: (kv_lora_rank, qk_rope_head_dim), which an MLAAttentionSpec does not carry."""
    spec = group.kv_cache_spec
    per_layer = getattr(spec, "kv_cache_specs", None)
    specs = ([(name, per_layer[name]) for name in group.layer_names] if per_layer
             else [(name, spec) for name in group.layer_names])
    entries = []
    for name, layer_spec in specs:
        entry = {
            "spec_type": type(layer_spec).__name__,
            "block_size": int(layer_spec.block_size),
            "num_kv_heads": int(getattr(layer_spec, "num_kv_heads", 0) or 0),
            "head_size": int(getattr(layer_spec, "head_size", 0) or 0),
            "sliding_window": getattr(layer_spec, "sliding_window", None),
            "dtype": (str(getattr(layer_spec, "dtype", None)) if cache_dtype in (None, "auto")
                      else CACHE_DTYPES.get(cache_dtype, cache_dtype)),
        }
        chunk = getattr(layer_spec, "attention_chunk_size", None)
        if chunk is not None:
            entry["attention_chunk_size"] = int(chunk)
        if entry["spec_type"].startswith("MLA"):
            if mla_widths is None:
                raise ValueError(f"layer {name}: an MLA cache, but the model config gives no kv_lora_rank and "
                                 "qk_rope_head_dim (the widths of c_kv and k_pe)")
            if entry["head_size"] != sum(mla_widths):
                # DeepSeek-V3.2's sparse-attention indexer keeps its keys in MLAAttentionSpec layers
                # of another width (132 bytes): not a latent, listed and not read.
                entry["not_compared"] = "sparse-attention indexer keys"
            else:
                entry["kv_lora_rank"], entry["qk_rope_head_dim"] = mla_widths
        for same in entries:
            if all(same[k] == v for k, v in entry.items()):
                same["layer_names"].append(name)
                break
        else:
            entries.append(dict(entry, layer_names=[name]))
    return entries


class RankCaches:
    """kv_cache_config: vLLM's KVCacheConfig; vllm_config: its VllmConfig; caches: {layer: tensor};
    layers: {layer: attention module} (for the backend and the scales; may be empty);
    tp_rank, pp_rank: this worker's place."""

    def __init__(self, kv_cache_config, vllm_config, caches, layers, tp_rank, pp_rank):
        self.vllm_config = vllm_config
        self.tp_rank, self.pp_rank = tp_rank, pp_rank
        parallel = vllm_config.parallel_config
        cache_dtype = getattr(vllm_config.cache_config, "cache_dtype", "auto")
        groups = []
        for g, group in enumerate(kv_cache_config.kv_cache_groups):
            for entry in _group_entries(group, cache_dtype, _mla_widths(vllm_config.model_config)):
                entry["vllm_group"] = g  # the block table this group reads
                groups.append(entry)
        total = int(vllm_config.model_config.get_total_num_kv_heads())
        tp = int(parallel.tensor_parallel_size)
        for entry in groups:
            # Layers of another KV head count than the model's (per-layer GQA, e.g. DeciLM / Nemotron-NAS):
            # vLLM's spec gives heads per rank; over TP they are partitioned unless one per rank.
            if (entry["num_kv_heads"] and not entry["spec_type"].startswith("MLA")
                    and entry["num_kv_heads"] != max(1, total // tp)):
                entry["total_num_kv_heads"] = entry["num_kv_heads"] * tp
        self.config = {
            "num_blocks": int(kv_cache_config.num_blocks),
            "tp_size": tp,
            "pp_size": int(getattr(parallel, "pipeline_parallel_size", 1)),
            "total_num_kv_heads": total,
            "dcp_size": int(getattr(parallel, "decode_context_parallel_size", 1) or 1),
            "pcp_size": int(getattr(parallel, "prefill_context_parallel_size", 1) or 1),
            "cp_kv_cache_interleave_size": int(getattr(parallel, "cp_kv_cache_interleave_size", 1) or 1),
            "cache_dtype": cache_dtype,
            "groups": groups,
        }
        self.caches = {}
        self.layouts = {}
        self.scales = {}
        self.aliases = {}
        for entry in groups:
            # State-space (Mamba) layers hold no KV per token; encoder-only layers no cache at all.
            if not entry["head_size"] or entry["spec_type"] in NOT_READ or entry.get("not_compared"):
                continue
            for name in entry["layer_names"]:
                if name not in caches:
                    raise ValueError(f"layer {name}: in the KV cache config but no cache tensor was registered")
                tensor = caches[name]
                if isinstance(tensor, (list, tuple)):  # older vLLM: one per virtual engine
                    tensor = tensor[0]
                module = layers.get(name)
                backend = None
                if module is not None:
                    backend = getattr(module, "attn_backend", None)
                    if backend is None and hasattr(module, "get_attn_backend"):
                        backend = module.get_attn_backend()
                heads = entry["num_kv_heads"] or 1
                width = entry["head_size"]
                if entry["dtype"] == "fp8_ds_mla":
                    # FlashMLA's bytes a token (656 for DeepSeek): kv_lora_rank e4m3 values, an fp32
                    # scale per 128 of them, qk_rope_head_dim bf16 values. Its backend reports that
                    # width whatever the head size asked, so the layout comes from the tensor.
                    rank, rope = entry["kv_lora_rank"], entry["qk_rope_head_dim"]
                    width, backend = rank + 4 * (rank // 128) + 2 * rope, None
                self.layouts[name] = detect_layout(tensor.shape, self.config["num_blocks"], entry["block_size"],
                                                   heads, width, backend=backend,
                                                   mla=entry["spec_type"].startswith("MLA"),
                                                   cache_dtype_str=cache_dtype or "auto", what=f"layer {name}")
                self.caches[name] = tensor
                # Layers that share another layer's cache hold its bytes. (Equal data pointers do
                # not tell: the hybrid allocator gives layer i of every group one buffer.)
                target = getattr(module, "kv_sharing_target_layer_name", None) if module is not None else None
                if target:
                    self.aliases[name] = target
                if entry["dtype"] in CACHE_DTYPES.values() and module is not None:
                    self.scales[name] = (getattr(module, "_k_scale", None), getattr(module, "_v_scale", None))
        if self.aliases:
            self.config["kv_sharing"] = dict(self.aliases)

    def layer_names(self):
        return model_order(self.caches)

    def read(self, block_ids):
        """{layer: {'k', 'v', 'block_ids'[, 'k_scale', 'v_scale']}} (MLA: {'latent', 'block_ids'}) of the
        given KV cache blocks, on the CPU, in kvscope's order [n, heads, block_size, head_size]."""
        ids = sorted({int(b) for b in block_ids})
        out, done = {}, {}
        for name in self.layer_names():
            source = self.aliases.get(name, name) if self.aliases.get(name) in self.caches else name
            if source not in done:
                done[source] = self.layouts[source].read_blocks(self.caches[source], ids)
            blocks = done[source]
            entry = {"block_ids": ids}
            if self.layouts[name].is_mla:
                entry["latent"] = blocks
            else:
                entry["k"], entry["v"] = blocks
            if name in self.scales:
                k_scale, v_scale = self.scales[name]
                entry["k_scale"] = k_scale.detach().float().cpu() if hasattr(k_scale, "detach") else k_scale
                entry["v_scale"] = v_scale.detach().float().cpu() if hasattr(v_scale, "detach") else v_scale
            out[name] = entry
        return out


def block_tables(config, requests):
    """One int32 table [len(requests), max_blocks] per kvscope group, -1 for the null block.
    requests: list of per-vLLM-group block id lists (tuple[list[int], ...]) in batch order. vLLM's
    null block (id 0) stands in for blocks a sliding window or chunk has freed."""
    import torch

    tables = []
    for entry in config["groups"]:
        rows = [list(r[entry["vllm_group"]]) for r in requests]
        width = max([1] + [len(r) for r in rows])
        table = torch.full((len(rows), width), -1, dtype=torch.int32)
        for i, row in enumerate(rows):
            if row:
                ids = torch.as_tensor(row, dtype=torch.int32)
                table[i, :len(row)] = torch.where(ids == 0, torch.full_like(ids, -1), ids)
        tables.append(table)
    return tables
