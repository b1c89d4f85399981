"""One vLLM worker's KV caches as kvscope reads them: the KV cache config in kvscope's form, each
layer's layout and format (from its spec, see spec_layout.py; older vLLM: from its attention
backend, backend_layout.py), its scales, and blocks read out on request.

Built from what a GPU worker holds (vllm/v1/worker/gpu_model_runner.py and, Model Runner V2,
vllm/v1/worker/gpu/model_runner.py): the KVCacheConfig (kv_cache_groups[g].layer_names /
.kv_cache_spec, num_blocks), the per-layer cache tensors (the dict a KV connector's
register_kv_caches gets, or `static_forward_context[name].kv_cache`), and the attention layer
modules (their backend and `_k_scale` / `_v_scale`)."""

from ..kv_cache_config import model_order
from .backend_layout import detect_layout
from .mamba_state import MambaStateLayout, hf_text_config
from .spec_layout import FP8_FORMATS, SpecLayout, is_mla_spec, platform_fp8, spec_describes_layout

NOT_READ = ("MambaSpec", "EncoderOnlyAttentionSpec")
# Spec types that hold something kvscope does not compare, listed with what they hold.
NOT_COMPARED = {"HiddenStateCacheSpec": "hidden-state cache layers (extract_hidden_states)",
                "SlidingWindowMLASpec": "sliding-window MLA layers"}
# Formats whose per-tensor scales are the attention layer's _k_scale / _v_scale.
PER_TENSOR_SCALED = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "int8")


def _mla_widths(model_config):
    """The MLA latent's (kv_lora_rank, qk_rope_head_dim) from the model's HF config (DeepSeek,
    Kimi K2), or None when it has none."""
    hf = getattr(model_config, "hf_text_config", None) or getattr(model_config, "hf_config", None)
    rank, rope = getattr(hf, "kv_lora_rank", None), getattr(hf, "qk_rope_head_dim", None)
    return (int(rank), int(rope)) if rank is not None and rope is not None else None


def layer_format(spec, cache_dtype, what):
    """How kvscope's config names `spec`'s stored format, and its SpecLayout (None for older vLLM,
    whose layers all have the engine's --kv-cache-dtype: `auto` stores the spec's dtype)."""
    if spec_describes_layout(spec) and getattr(spec, "head_size", 0):
        layout = SpecLayout(spec, cache_dtype, what)
        return layout.dtype, layout
    dtype = str(getattr(spec, "dtype", None))
    # A float spec dtype is stored as is, whatever --kv-cache-dtype says (a skipped layer):
    # vLLM allocates quantised caches as bytes.
    if cache_dtype in (None, "auto") or dtype.replace("torch.", "") in ("bfloat16", "float16", "float32"):
        return dtype, None
    return platform_fp8({**FP8_FORMATS, "int8": "int8"}.get(cache_dtype, cache_dtype)), None


def _group_entries(group, cache_dtype, mla_widths=None):
    """kvscope config groups for one vLLM KV cache group, with each layer's SpecLayout (None for
    older vLLM): one group, or one per distinct layer spec when the group holds per-layer specs
    (UniformTypeKVCacheSpecs: same type, other head sizes or formats). mla_widths:
    (kv_lora_rank, qk_rope_head_dim), which an MLAAttentionSpec does not carry."""
    spec = group.kv_cache_spec
    per_layer = getattr(spec, "kv_cache_specs", None)
    specs = ([(name, per_layer[name]) for name in group.layer_names] if per_layer
             else [(name, spec) for name in group.layer_names])
    entries, layouts = [], {}
    for name, layer_spec in specs:
        entry = {
            "spec_type": type(layer_spec).__name__,
            "block_size": int(layer_spec.block_size),
            "num_kv_heads": int(getattr(layer_spec, "num_kv_heads", 0) or 0),
            "head_size": int(getattr(layer_spec, "head_size", 0) or 0),
            "sliding_window": getattr(layer_spec, "sliding_window", None),
            "dtype": str(getattr(layer_spec, "dtype", None)),
        }
        chunk = getattr(layer_spec, "attention_chunk_size", None)
        if chunk is not None:
            entry["attention_chunk_size"] = int(chunk)
        if entry["spec_type"] in NOT_COMPARED:
            entry["not_compared"] = NOT_COMPARED[entry["spec_type"]]
        elif is_mla_spec(layer_spec):
            if mla_widths is None:
                raise ValueError(f"layer {name}: an MLA cache, but the model config gives no kv_lora_rank and "
                                 "qk_rope_head_dim (the widths of c_kv and k_pe)")
            if entry["head_size"] != sum(mla_widths):
                # DeepSeek-V3.2's sparse-attention indexer keeps its keys in MLAAttentionSpec layers
                # of another width (132 bytes): not a latent, listed and not read.
                entry["not_compared"] = "sparse-attention indexer keys"
            else:
                entry["kv_lora_rank"], entry["qk_rope_head_dim"] = mla_widths
        if entry["spec_type"] not in NOT_READ and entry["head_size"] and not entry.get("not_compared"):
            entry["dtype"], layouts[name] = layer_format(layer_spec, cache_dtype, f"layer {name}")
        for same in entries:
            if all(same[k] == v for k, v in entry.items()):
                same["layer_names"].append(name)
                break
        else:
            entries.append(dict(entry, layer_names=[name]))
    return entries, layouts


def _aliases(read_layers, listed_layers, caches, modules):
    """{layer: the layer whose cache it shares} for layers that share another's cache
    (kv_sharing_target_layer_name). vLLM leaves them out of the config it hands connectors and
    registers them as the target's tensor; its runner's own config lists them."""
    aliases = {}
    for name, tensor in caches.items():
        target = getattr(modules.get(name), "kv_sharing_target_layer_name", None)
        if target is None and name not in listed_layers and _tensor(tensor) is not None:
            # Without the module's word, the one listed layer with the very same view. (Groups
            # overlay one region, so layer i of two groups may share a view: then it is unknown.)
            same = [other for other in read_layers
                    if other in caches and _same_view(_tensor(caches[other]), _tensor(tensor))]
            target = same[0] if len(same) == 1 else None
        if target:
            aliases[name] = target
    return aliases


def _tensor(value):
    """The cache tensor registered for a layer (older vLLM: a list of one per virtual engine), or
    None for what is not one tensor (a state-space layer's states)."""
    if isinstance(value, (list, tuple)):
        value = value[0] if len(value) else None
    return value if hasattr(value, "data_ptr") else None


def _same_view(a, b):
    return (a is not None and b is not None and a.data_ptr() == b.data_ptr() and tuple(a.shape) == tuple(b.shape)
            and a.stride() == b.stride() and a.dtype == b.dtype)


def _backend_of(module):
    if module is None:
        return None
    backend = getattr(module, "attn_backend", None)
    if backend is None and hasattr(module, "get_attn_backend"):
        backend = module.get_attn_backend()
    return backend


def _scale_value(scale):
    return scale.detach().float().cpu() if hasattr(scale, "detach") else scale


class RankCaches:
    """kv_cache_config: vLLM's KVCacheConfig; vllm_config: its VllmConfig; caches: {layer: tensor};
    layers: {layer: attention module} (for the backend and the scales; may be empty);
    tp_rank, pp_rank: this worker's place. Every layer's cache is checked against its spec here,
    so that what kvscope cannot read stops the engine at start-up."""

    def __init__(self, kv_cache_config, vllm_config, caches, layers, tp_rank, pp_rank):
        self.vllm_config = vllm_config
        self.tp_rank, self.pp_rank = tp_rank, pp_rank
        parallel = vllm_config.parallel_config
        cache_dtype = getattr(vllm_config.cache_config, "cache_dtype", "auto")
        groups, spec_layouts = [], {}
        for g, group in enumerate(kv_cache_config.kv_cache_groups):
            entries, layouts = _group_entries(group, cache_dtype, _mla_widths(vllm_config.model_config))
            spec_layouts.update(layouts)
            for entry in entries:
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
        read = [(entry, name) for entry in groups for name in entry["layer_names"]
                if entry["head_size"] and entry["spec_type"] not in NOT_READ and not entry.get("not_compared")]
        self.aliases = _aliases({name for _, name in read}, {n for e in groups for n in e["layer_names"]},
                                caches, layers)
        self.caches, self.layouts, self.scales = {}, {}, {}
        for entry, name in read:
            if name in self.aliases:
                continue
            if name not in caches:
                raise ValueError(f"layer {name}: in the KV cache config but no cache tensor was registered")
            tensor = _tensor(caches[name])
            module = layers.get(name)
            if spec_layouts.get(name) is not None:
                self.layouts[name] = spec_layouts[name].check(tensor, self.config["num_blocks"])
            else:
                self.layouts[name] = self._backend_layout(entry, name, tensor, module, cache_dtype)
            self.caches[name] = tensor
            if module is not None and entry["dtype"] in PER_TENSOR_SCALED + ("nvfp4",) \
                    and getattr(self.layouts[name], "kind", "") != "per_token_head":
                self.scales[name] = (_scale_value(getattr(module, "_k_scale", None)),
                                     _scale_value(getattr(module, "_v_scale", None)))
        for name, target in self.aliases.items():
            if target not in self.caches:
                raise ValueError(f"layer {name} shares layer {target}'s cache, which is not read")
            self.caches[name], self.layouts[name] = self.caches[target], self.layouts[target]
            if target in self.scales:
                self.scales[name] = self.scales[target]
        self._plan_states(kv_cache_config, vllm_config, caches, tp)
        if self.aliases:
            self.config["kv_sharing"] = dict(self.aliases)
            # Layers the connector's config leaves out are named where kvscope reads them.
            listed = {n for entry in groups for n in entry["layer_names"]}
            for name, target in self.aliases.items():
                if name not in listed:
                    entry = next(e for e in groups if target in e["layer_names"])
                    entry["layer_names"].append(name)

    def _plan_states(self, kv_cache_config, vllm_config, caches, tp):
        """The state-space layers (MambaSpec groups) whose recurrent state is read (mamba_state.py):
        state_layouts / state_caches per layer, state_groups {vLLM group: (block_size,
        mamba_cache_mode, [layers])}; states_not_captured says why the others are not."""
        self.state_layouts, self.state_caches, self.state_groups, self.states_not_captured = {}, {}, {}, []
        hf = hf_text_config(vllm_config.model_config)
        for g, group in enumerate(kv_cache_config.kv_cache_groups):
            per_layer = getattr(group.kv_cache_spec, "kv_cache_specs", None)
            for name in group.layer_names:
                spec = per_layer[name] if per_layer else group.kv_cache_spec
                if type(spec).__name__ != "MambaSpec":
                    continue
                layout = MambaStateLayout(spec, tp, self.tp_rank, hf, f"layer {name}")
                if layout.why_not:
                    self.states_not_captured.append(layout.why_not)
                    continue
                if name not in caches:
                    raise ValueError(f"layer {name}: a state-space layer of the KV cache config, but no cache was "
                                     "registered for it")
                layout.check(caches[name], self.config["num_blocks"])
                self.state_layouts[name], self.state_caches[name] = layout, caches[name]
                entry = self.state_groups.setdefault(g, (layout.block_size, layout.mode, []))
                entry[2].append(name)

    def read_states(self, marks):
        """{position: {layer: {part: t}}} (each t one block's state, this rank's rows, on the CPU) of
        marks [(vLLM group, block id, position)]."""
        out = {}
        by_group = {}
        for g, block, position in marks:
            if g in self.state_groups and int(block) > 0:  # 0: vLLM's null block
                by_group.setdefault(g, []).append((int(block), int(position)))
        for g, items in by_group.items():
            for name in self.state_groups[g][2]:
                states = self.state_layouts[name].read(self.state_caches[name], [b for b, _ in items])
                for i, (_, position) in enumerate(items):
                    out.setdefault(position, {})[name] = {part: t[i] for part, t in states.items()}
        return out

    def final_state_marks(self, block_ids, num_computed_tokens):
        """[(vLLM group, block, position)] of a finished request's latest state per state group."""
        from .mamba_state import final_slot

        marks = []
        for g, (block_size, _, _) in self.state_groups.items():
            if num_computed_tokens < 1 or g >= len(block_ids):
                continue
            slot = final_slot(block_size, num_computed_tokens)
            if slot < len(block_ids[g]) and block_ids[g][slot] > 0:
                marks.append((g, block_ids[g][slot], int(num_computed_tokens)))
        return marks

    def state_records(self, checkpoints):
        """{layer: {'kind', 'positions', 'parts': {part: (tensor [c, ...], units)}}} from
        read_states' {position: {layer: {part: t}}}."""
        import torch

        records = {}
        for name, layout in self.state_layouts.items():
            positions = sorted(p for p, layers in checkpoints.items() if name in layers)
            if not positions:
                continue
            parts = {part: (torch.stack([checkpoints[p][name][part] for p in positions]), list(units))
                     for part, units in layout.units.items()}
            records[name] = {"kind": layout.kind, "positions": positions, "parts": parts}
        return records

    def _backend_layout(self, entry, name, tensor, module, cache_dtype):
        """Older vLLM: the layout its attention backend reports."""
        heads = entry["num_kv_heads"] or 1
        width = entry["head_size"]
        backend = _backend_of(module)
        if entry["dtype"] == "fp8_ds_mla":
            # FlashMLA's bytes a token (656 for DeepSeek): kv_lora_rank e4m3 values, an fp32 scale
            # per 128 of them, qk_rope_head_dim bf16 values.
            rank, rope = entry["kv_lora_rank"], entry["qk_rope_head_dim"]
            width = rank + 4 * (rank // 128) + 2 * rope
        return detect_layout(tensor.shape, self.config["num_blocks"], entry["block_size"], heads, width,
                             backend=backend, mla=entry["spec_type"].startswith("MLA"),
                             cache_dtype_str=cache_dtype or "auto", what=f"layer {name}")

    def layer_names(self):
        return model_order(self.caches)

    def read(self, block_ids):
        """{layer: {'k', 'v', 'block_ids', scales...}} (MLA: {'latent', 'block_ids'}) of the given KV
        cache blocks, on the CPU, in kvscope's order [n, heads, block_size, head_size]: values as
        stored (codes of quantised formats) with what decodes them (docs/bundle-format.md)."""
        ids = sorted({int(b) for b in block_ids})
        out, done = {}, {}
        for name in self.layer_names():
            source = self.aliases.get(name, name)
            if source not in done:
                done[source] = self.layouts[source].read_blocks(self.caches[source], ids)
            blocks = done[source]
            entry = {"block_ids": ids}
            if isinstance(blocks, dict):
                entry.update(blocks)
            elif self.layouts[name].is_mla:
                entry["latent"] = blocks
            else:
                entry["k"], entry["v"] = blocks
            if name in self.scales:
                nvfp4 = getattr(self.layouts[name], "kind", "") == "nvfp4"
                for part, scale in zip("kv", self.scales[name]):
                    entry[f"{part}_global_scale" if nvfp4 else f"{part}_scale"] = scale
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
