"""The engine's KV cache config (what get_kv_cache_config returns), validated as kvscope reads it."""

import re

from .tensors import DTYPES, FOUR_BIT, INT4_TOKEN_HEAD, NVFP4, canonical_dtype

def model_order(names):
    """Layer names by the first number in the name (layers.2 before layers.10), as kvscope orders them."""
    def key(name):
        m = re.search(r"\d+", name)
        return (int(m.group()) if m else -1, name)
    return sorted(names, key=key)


COMPARED = ("FullAttentionSpec", "SlidingWindowSpec", "ChunkedLocalAttentionSpec", "MLAAttentionSpec")
# Groups kvscope lists but does not compare, and what their layers are (as kvscope's reader says).
NOT_COMPARED = {"MambaSpec": "state-space layers", "CrossAttentionSpec": "encoder layers",
                "EncoderOnlyAttentionSpec": "encoder layers"}
# fp8_ds_mla (FlashMLA): per token kv_lora_rank e4m3 values, an fp32 scale per 128 of them, then
# qk_rope_head_dim bf16 values.
DS_MLA = "fp8_ds_mla"
DS_MLA_GROUP = 128


class KvCacheConfig:
    def __init__(self, cfg):
        if not isinstance(cfg, dict):
            raise ValueError("kv_cache_config: must be a dict")
        self.raw = cfg

        def integer(obj, key, where, lo=1, hi=1 << 30):
            if key not in obj:
                raise ValueError(f"kv_cache_config.{where}{key}: missing")
            value = obj[key]
            if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
                raise ValueError(f"kv_cache_config.{where}{key}: must be an integer in [{lo}, {hi}], got {value!r}")
            return value

        self.num_blocks = integer(cfg, "num_blocks", "", hi=1 << 26)
        self.tp_size = integer(cfg, "tp_size", "", hi=4096)
        self.total_num_kv_heads = integer(cfg, "total_num_kv_heads", "", hi=4096)
        def optional(key):
            value = cfg.get(key)
            if value is not None and (type(value) is not int or not 0 <= value <= 4096):
                raise ValueError(f"kv_cache_config.{key}: must be an integer in [0, 4096], got {value!r}")
            return max(1, value or 1)

        if optional("pcp_size") > 1:
            raise ValueError(f"kv_cache_config.pcp_size: prefill context parallelism ({cfg['pcp_size']}) is not supported")
        # Decode context parallelism: consecutive groups of dcp_size ranks holding one head split its
        # positions, in runs of cp_kv_cache_interleave_size (vLLM's slot mapping).
        self.dcp_size = optional("dcp_size")
        self.cp_interleave = optional("cp_kv_cache_interleave_size")
        if self.tp_size % self.dcp_size:
            raise ValueError(f"kv_cache_config.dcp_size: {self.dcp_size} does not divide tp_size {self.tp_size} "
                             "(DCP groups are made of TP ranks)")
        tp = self.tp_size

        groups = cfg.get("groups")
        if not isinstance(groups, list) or not groups:
            raise ValueError("kv_cache_config.groups: must be a non-empty list")
        self.groups = []
        self.not_compared = []
        seen = set()
        for g, group in enumerate(groups):
            where = f"groups[{g}]."
            if not isinstance(group, dict):
                raise ValueError(f"kv_cache_config.groups[{g}]: must be an object")
            names = group.get("layer_names")
            if not isinstance(names, list) or not names:
                raise ValueError(f"kv_cache_config.{where}layer_names: must be a non-empty list")
            for name in names:
                if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
                    raise ValueError(f"kv_cache_config.{where}layer_names: {name!r} cannot be an HDF5 name")
                if name in seen:
                    raise ValueError(f"kv_cache_config.{where}layer_names: layer {name!r} appears in more than one place")
                seen.add(name)
            spec = group.get("spec_type")
            if not isinstance(spec, str):
                raise ValueError(f"kv_cache_config.{where}spec_type: missing or not a string")
            if "not_compared" in group:  # marked by the capture side: no KV to compare
                what = group["not_compared"]
                if not isinstance(what, str) or not what:
                    raise ValueError(f"kv_cache_config.{where}not_compared: must say what the layers are, as a string")
                self.not_compared.append({"layer_names": list(names), "spec_type": spec})
                self.groups.append({"layer_names": list(names), "spec_type": spec, "compared": False})
                continue
            if spec in NOT_COMPARED:
                self.not_compared.append({"layer_names": list(names), "spec_type": spec})
                self.groups.append({"layer_names": list(names), "spec_type": spec, "compared": False})
                continue
            if spec not in COMPARED:
                raise ValueError(f"kv_cache_config.{where}spec_type: {spec!r} is not supported (compared: "
                                 f"{', '.join(COMPARED)}; listed, not compared: {', '.join(NOT_COMPARED)})")
            window = group.get("sliding_window")
            if window is not None and (not isinstance(window, int) or isinstance(window, bool) or not 1 <= window <= 1 << 30):
                raise ValueError(f"kv_cache_config.{where}sliding_window: must be a positive integer up to {1 << 30}, "
                                 f"or None, got {window!r}")
            if spec == "SlidingWindowSpec" and not window:
                raise ValueError(f"kv_cache_config.{where}sliding_window: SlidingWindowSpec needs a sliding_window")
            chunk = None  # also on FullAttentionSpec when vLLM's hybrid manager is off
            if spec == "ChunkedLocalAttentionSpec" or group.get("attention_chunk_size") is not None:
                chunk = integer(group, "attention_chunk_size", where)
            mla = spec == "MLAAttentionSpec"
            ds_mla = mla and group.get("dtype") == DS_MLA
            dtype = "float8_e4m3fn" if ds_mla else canonical_dtype(group.get("dtype"))
            if dtype is None:
                raise ValueError(f"kv_cache_config.{where}dtype: unsupported dtype {group.get('dtype')!r} "
                                 f"(supported: {', '.join(DTYPES)})")
            entry = {
                "layer_names": list(names),
                "spec_type": spec,
                "block_size": integer(group, "block_size", where, hi=1 << 16),
                "num_kv_heads": integer(group, "num_kv_heads", where, hi=4096),
                "head_size": integer(group, "head_size", where, hi=1 << 14),
                "sliding_window": window,
                "attention_chunk_size": chunk,
                "dtype": dtype,
                "compared": True,
                "mla": mla,
                "ds_mla": ds_mla,
            }
            # A bundle keeps an MLA latent's c_kv as the layer's K and k_pe as its V.
            entry["part_widths"] = (entry["head_size"],) * 2
            entry["part_names"] = ("k", "v")
            entry["part_dtypes"] = (dtype, dtype)
            if group.get("v_dtype") is not None:  # V's format where it differs from K's
                v_dtype = canonical_dtype(group["v_dtype"])
                if v_dtype is None:
                    raise ValueError(f"kv_cache_config.{where}v_dtype: unsupported dtype {group['v_dtype']!r} "
                                     f"(supported: {', '.join(DTYPES)})")
                if mla:
                    raise ValueError(f"kv_cache_config.{where}v_dtype: an MLA latent has one dtype")
                entry["part_dtypes"] = (dtype, v_dtype)
            for part, part_dtype in zip("kv", entry["part_dtypes"]):
                field = f"{where}{'v_dtype' if part == 'v' and group.get('v_dtype') is not None else 'dtype'}"
                if mla and part_dtype in FOUR_BIT:
                    raise ValueError(f"kv_cache_config.{field}: {part_dtype} is not read for MLA latents")
                if part_dtype == NVFP4 and entry["head_size"] % 16:
                    raise ValueError(f"kv_cache_config.{field}: nvfp4 needs head_size a multiple of 16 (a block "
                                     f"scale per 16 values), got {entry['head_size']}")
                size = entry["head_size"]
                if part_dtype == INT4_TOKEN_HEAD and size & (size - 1):
                    raise ValueError(f"kv_cache_config.{field}: int4_per_token_head needs head_size a power of two "
                                     f"(its Hadamard rotation), got {size}")
            if mla:
                rank = integer(group, "kv_lora_rank", where, hi=1 << 14)
                rope = integer(group, "qk_rope_head_dim", where, lo=2, hi=1 << 14)
                if rank + rope != entry["head_size"]:
                    raise ValueError(f"kv_cache_config.{where}head_size: {entry['head_size']} is not kv_lora_rank "
                                     f"{rank} + qk_rope_head_dim {rope}")
                if rope % 2:
                    raise ValueError(f"kv_cache_config.{where}qk_rope_head_dim: {rope} is odd (rotary pairs)")
                if ds_mla and rank % DS_MLA_GROUP:
                    raise ValueError(f"kv_cache_config.{where}kv_lora_rank: fp8_ds_mla needs a multiple of "
                                     f"{DS_MLA_GROUP}, got {rank}")
                entry.update(kv_lora_rank=rank, qk_rope_head_dim=rope, part_widths=(rank, rope),
                             part_names=("c_kv", "k_pe"), part_dtypes=(dtype, "bfloat16" if ds_mla else dtype))
                # The latent is one vector per token on every rank (TP replicates it).
                self.total_num_kv_heads = 1
            for g in self.groups:
                if g["compared"] and g["mla"] and mla and (g["kv_lora_rank"], g["qk_rope_head_dim"], g["ds_mla"]) != \
                        (entry["kv_lora_rank"], entry["qk_rope_head_dim"], ds_mla):
                    raise ValueError(f"kv_cache_config.{where}kv_lora_rank: this MLA group's split differs from another "
                                     f"MLA group's (kv_lora_rank {g['kv_lora_rank']}"
                                     f"{', fp8_ds_mla' if g['ds_mla'] else ''})")
            if any(g["compared"] and g["mla"] != mla for g in self.groups):
                raise ValueError(f"kv_cache_config.{where}spec_type: {spec} beside other attention: a config mixing "
                                 "MLA and other attention is not supported")
            # The group's heads over all ranks: its own total_num_kv_heads (layers of another KV head
            # count than the model's), else the config's; one latent for MLA.
            own = group.get("total_num_kv_heads") is not None and not mla
            total = 1 if mla else integer(group, "total_num_kv_heads", where, hi=4096) if own else self.total_num_kv_heads
            field = f"{where}total_num_kv_heads" if own else "total_num_kv_heads"
            if total >= tp and total % tp:
                raise ValueError(f"kv_cache_config.{field}: {total} heads cannot be partitioned over tp_size {tp}")
            if total < tp and tp % total:
                raise ValueError(f"kv_cache_config.{field}: {total} heads cannot be replicated over tp_size {tp}")
            entry["total_kv_heads"], entry["heads_per_rank"] = total, max(1, total // tp)
            if entry["num_kv_heads"] != entry["heads_per_rank"]:
                raise ValueError(f"kv_cache_config.{where}num_kv_heads: {entry['num_kv_heads']} per rank disagrees with "
                                 f"total_num_kv_heads {total} over tp_size {tp} (expected {entry['heads_per_rank']})")
            if self.dcp_size > 1:
                # vLLM bounds dcp_size by tp_size / total_num_kv_heads: DCP splits a head's copies.
                copies = tp // total if total < tp else 1
                if copies % self.dcp_size:
                    raise ValueError(f"kv_cache_config.dcp_size: {self.dcp_size} needs each KV head on a multiple of "
                                     f"{self.dcp_size} TP ranks; they are on {copies} of tp_size {tp}")
                if entry["block_size"] % self.cp_interleave:
                    raise ValueError(f"kv_cache_config.cp_kv_cache_interleave_size: {self.cp_interleave} does not "
                                     f"divide {where}block_size {entry['block_size']}")
            self.groups.append(entry)
        self.layer_to_group = {name: g for g, group in enumerate(self.groups) for name in group["layer_names"]}
        if not self.layer_names():
            raise ValueError("kv_cache_config.groups: no group kvscope compares (only "
                             f"{', '.join(g['spec_type'] for g in self.not_compared)})")

    def layer_names(self):
        """Every compared layer in model order."""
        return model_order(n for n, g in self.layer_to_group.items() if self.groups[g]["compared"])

    def all_layer_names(self):
        """Every layer of the config, compared or not, in model order (HF caches list them all)."""
        return model_order(self.layer_to_group)

    def is_compared(self, layer):
        return self.groups[self.layer_to_group[layer]]["compared"]

    def group_of(self, layer):
        if layer not in self.layer_to_group:
            raise ValueError(f"layer {layer!r} belongs to no group of the KV cache config")
        return self.groups[self.layer_to_group[layer]]
