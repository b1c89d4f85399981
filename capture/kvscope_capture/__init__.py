"""kvscope_capture: write kvscope capture bundles (format v2) from a Python vLLM process.

The writer takes what the engine's RPCs return, as they are (torch.save bytes per rank and
per group), or tensors / numpy arrays; and the reference model's past_key_values as HF returns
them. See docs/bundle-format.md in the kvscope repository for the file format.
"""

from ._version import __version__
from .bundle_writer import BundleWriter
from .extract import (
    extract_hf_kv_caches_teacher_forced,
    extract_vllm_block_tables,
    extract_vllm_kv_cache_config,
    extract_vllm_kv_caches,
    generate_hf_logits_and_kv,
    make_kv_extract_fn,
)
from .from_shards import bundle_from_shards
from .hf_reference import extract_hf_mamba_states, extract_hf_mla_latents, hf_cache_layers
from .kv_cache_config import KvCacheConfig
from .shards import ShardSet, wait_for_shards

__all__ = [
    "__version__",
    "BundleWriter",
    "KvCacheConfig",
    "ShardSet",
    "bundle_from_shards",
    "extract_hf_mamba_states",
    "extract_hf_mla_latents",
    "extract_hf_kv_caches_teacher_forced",
    "extract_vllm_block_tables",
    "extract_vllm_kv_cache_config",
    "extract_vllm_kv_caches",
    "generate_hf_logits_and_kv",
    "hf_cache_layers",
    "wait_for_shards",
    "make_kv_extract_fn",
]
