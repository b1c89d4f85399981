"""A stand-in for vLLM's main branch of late 2026, after the KV cache layout refactor (#51718, merged
after 2026-08-19), written from its sources:
  vllm/v1/kv_cache_interface.py and vllm/v1/kv_cache_layout.py (vllm-project/vllm @ 14f7a27c and
  e78684ec; the refactored interface as in the copy of @ 71bbe391): specs with num_head_slots,
  state_content_bytes, kv_quant_mode; KVCacheTensor(size, layers, layer_stride, block_stride,
  offset) over one int8 buffer; create_kv_cache_views' [B, H, N, C] strided views;
  the backends' customize_spec (FlashInfer NVFP4, Triton per-token-head, ROCM_ATTN, MLA);
  vllm/v1/core/sched/output.py (@ fc79393b): NewRequestData, CachedRequestData with
  resumed_req_ids, SchedulerOutput;
  both model runners: vllm/v1/worker/gpu_model_runner.py (requests[id].block_ids) and Model Runner
  V2, vllm/v1/worker/gpu/model_runner.py (req_states and GPU block tables, no block ids per request
  in Python; resumed requests sent to it as new ones; registers its caches with the connector in
  initialize_kv_cache); each step's connector calls as both runners make them @ 00f4240e
  (kv_connector_model_runner_mixin.py, gpu/kv_connector.py): start_load_kv before the forward only
  when the step has synchronous loads (SchedulerOutput.has_sync_kv_loads), else after it, then
  wait_for_save and get_transfer_results; both handle_preemptions before the forward (the first
  runner's execute_model, c2057261), Model Runner V2 finish_forward after it;
  the engine core's KVCacheTensors (v1/core/kv_cache_utils.py, get_kv_cache_config_from_groups @
  e0698da6): one region that every group overlays from byte 0, a tensor per (group, distinct layer
  spec) at increasing offsets;
  request ids suffixed "-<8 hex>" (vllm/v1/engine/input_processor.py, assign_request_id), the
  scheduler's Request keeping only that id, parallel-sampling children "<index>_<id>";
  layers sharing another's cache left out of the connector's config and registered as the
  target's tensor;
  the scheduler's admission, chunked prefill, speculative rollback and preemption (vllm/v1/core/
  sched/scheduler.py, the tree of 2026-08-19 c2057261 and the copy @ 157ad7e7): the block-aligned
  local hit handed to get_num_new_matched_tokens, request.prefill_stats (v1/metrics/stats.py
  PrefillStats, 2026-08-19) set before update_state_after_alloc, an async load parked until
  finished_recving and a full hit leaving its last token to compute (_update_waiting_for_remote_kv),
  build_connector_meta before num_computed_tokens advances, rejected drafts rolled back in
  update_from_output, _preempt_request (num_computed_tokens 0, num_preemptions + 1);
  KVCacheBlocks.get_unhashed_block_ids_all_groups as NixlConnector's pull scheduler uses it.
State-space layers (hybrid models, #56): MambaSpec with mamba_cache_mode and its page of states
(conv, ssm) per block, bound by MambaBase.bind_kv_cache's unpacking of the [num_blocks, 1, 1, page
bytes] int8 view (vllm/model_executor/layers/mamba/abstract.py, vllm/v1/worker/gpu/attn_utils.py),
MambaMixer2's state shapes and TP sharding (mamba_utils.py mamba2_state_shape,
extra_groups_for_head_shards; conv state "SD" (d_conv - 1, conv_dim / tp)), the states a step
writes per mode (mamba_mixer2.py conv_ssm_forward), the scheduler's Mamba block freeing
(MambaManager.get_num_skipped_tokens) and align mode's block-aligned prefill chunks
(_mamba_block_aligned_split): vllm-project/vllm as mirrored in IwakuraRein/vllm @ c2057261
(2026-08-19), checked against vllm-project/vllm's mamba_utils.py @ 02d71083 and
mamba2/mamba_mixer2.py @ 2e0714af, and the newer MambaSpec fields (num_prefill_checkpoint_blocks,
num_heads, tokens_per_state, tp_replicated) of the kv_cache_interface.py copy that matches
LingHangwangxianjiui/vllm @ 71bbe391; Gated DeltaNet's shapes (recurrent (heads / tp, head_v_dim,
head_k_dim)) and q | k | v conv sharding from mamba_utils.py gated_delta_net_state_shape and
gdn/qwen_gdn_linear_attn.py of the same tree. The states are a small Mamba2's or Gated DeltaNet's
(tests/mamba2_standin.py).
The KV is written into the caches the way the kernels write it (reshape_and_cache, the per-token-
head, int4 and NVFP4 kernels), by code written here, independently of kvscope_capture's reading.
TP ranks are simulated; one pipeline stage."""

import copy
import enum
import os
import sys
import types
import uuid
from dataclasses import dataclass, field, replace

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "standin_vllm"))

from vllm.distributed import parallel_state  # noqa: E402  (the stand-in)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.v1.attention.ops.triton_quant_kv._hadamard import _get_rht_signs  # noqa: E402
from mamba2_standin import GdnDims, Mamba2Dims, gdn_rank_units, rank_units  # noqa: E402


# --- vllm/v1/kv_cache_interface.py ------------------------------------------------------------------
class KVQuantMode(enum.IntEnum):
    NONE = 0
    FP8_PER_TENSOR = 1
    INT8_PER_TOKEN_HEAD = 2
    FP8_PER_TOKEN_HEAD = 3
    INT4_PER_TOKEN_HEAD = 4
    NVFP4 = 5
    TURBOQUANT_K8V4 = 6
    TURBOQUANT_4BIT_NC = 7
    TURBOQUANT_K3V4_NC = 8
    TURBOQUANT_3BIT_NC = 9
    NVFP4_DS_MLA = 10


def get_kv_quant_mode(kv_cache_dtype):
    if kv_cache_dtype in ("int4_per_token_head", "int8_per_token_head", "fp8_per_token_head"):
        return KVQuantMode[kv_cache_dtype.upper()]
    if kv_cache_dtype == "nvfp4_ds_mla":
        return KVQuantMode.NVFP4_DS_MLA
    if kv_cache_dtype.startswith("nvfp4"):
        return KVQuantMode.NVFP4
    if kv_cache_dtype.startswith("turboquant_"):
        return KVQuantMode[kv_cache_dtype.upper()]
    if kv_cache_dtype.startswith("fp8"):
        return KVQuantMode.FP8_PER_TENSOR
    return KVQuantMode.NONE


@dataclass(frozen=True, kw_only=True)
class AttentionSpec:
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype
    head_size_v: int = None
    kv_quant_mode: KVQuantMode = KVQuantMode.NONE
    page_size_padded: int = None
    num_head_slots: int = None
    state_content_bytes: int = None
    tokens_per_state: int = 1

    def __post_init__(self):
        if self.head_size_v is None:
            object.__setattr__(self, "head_size_v", self.head_size)

    @property
    def num_heads(self):
        return self.num_head_slots if self.num_head_slots is not None else self.num_kv_heads

    @property
    def state_content_size_bytes(self):
        if self.state_content_bytes is not None:
            return self.state_content_bytes
        return (self.head_size + self.head_size_v) * torch.tensor([], dtype=self.dtype).element_size()

    def get_num_kernel_states(self, kernel_block_size):
        return kernel_block_size // self.tokens_per_state

    @property
    def unpadded_page_size_bytes(self):
        return self.num_heads * self.get_num_kernel_states(self.block_size) * self.state_content_size_bytes

    @property
    def page_size_bytes(self):
        return self.page_size_padded if self.page_size_padded is not None else self.unpadded_page_size_bytes


@dataclass(frozen=True, kw_only=True)
class FullAttentionSpec(AttentionSpec):
    sliding_window: int = None
    attention_chunk_size: int = None


@dataclass(frozen=True, kw_only=True)
class SlidingWindowSpec(AttentionSpec):
    sliding_window: int


@dataclass(frozen=True, kw_only=True)
class MLAAttentionSpec(FullAttentionSpec):
    """alignment (DeepSeek V4's): the page padded up to a multiple of it (_apply_alignment_padding)."""
    cache_dtype_str: str = None
    alignment: int = None
    model_version: str = None

    def __post_init__(self):
        if self.head_size_v is None:
            object.__setattr__(self, "head_size_v", 0)  # one latent, no separate V
        if self.alignment is not None:
            page = self.unpadded_page_size_bytes
            if page % self.alignment:
                object.__setattr__(self, "page_size_padded", -(-page // self.alignment) * self.alignment)


@dataclass(frozen=True)
class UniformTypeKVCacheSpecs:
    """Layers of one type whose specs differ (e.g. their KV head counts): one spec per layer."""
    block_size: int
    kv_cache_specs: dict

    def __hash__(self):
        return id(self)


class MambaAttentionBackendEnum(enum.Enum):
    """vllm/v1/attention/backends/registry.py: a Mamba layer's kind (values: the backends' classes)."""
    MAMBA1 = "vllm.v1.attention.backends.mamba1_attn.Mamba1AttentionBackend"
    MAMBA2 = "vllm.v1.attention.backends.mamba2_attn.Mamba2AttentionBackend"
    GDN_ATTN = "vllm.v1.attention.backends.gdn_attn.GDNAttentionBackend"


@dataclass(frozen=True)
class MambaSpec:
    """A state-space layer's page: its states (conv, ssm) packed one after the other, a state per
    block; mamba_cache_mode "none" (one block a request), "align" or "all" (a block per
    block_size tokens, slot k the state after (k + 1) * block_size tokens)."""
    block_size: int
    shapes: tuple
    dtypes: tuple
    page_size_padded: int = None
    mamba_type: MambaAttentionBackendEnum = MambaAttentionBackendEnum.MAMBA2
    mamba_cache_mode: str = "none"
    num_speculative_blocks: int = 0
    num_prefill_checkpoint_blocks: int = 0
    num_heads: int = 1
    tokens_per_state: int = -1
    tp_replicated: bool = False

    @property
    def state_content_size_bytes(self):
        return sum(int(np.prod(shape)) * torch.tensor([], dtype=dtype).element_size()
                   for shape, dtype in zip(self.shapes, self.dtypes))

    @property
    def page_size_bytes(self):
        return self.page_size_padded or self.state_content_size_bytes

    def get_num_kernel_states(self, kernel_block_size):
        return 1


@dataclass
class KVCacheTensor:
    size: int
    layers: list
    layer_stride: int
    block_stride: int
    offset: int = 0


@dataclass
class KVCacheGroupSpec:
    layer_names: list
    kv_cache_spec: object


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list
    kv_cache_groups: list
    kv_cache_layout: str = None


# --- vllm/v1/kv_cache_layout.py: stride orders of the logical [L, B, H, N, C] -------------------------
class KVCacheLayout(enum.Enum):
    LBHNC = (0, 1, 2, 3, 4)
    LBNHC = (0, 1, 3, 2, 4)
    LHBNC = (0, 2, 1, 3, 4)
    BLHNC = (1, 0, 2, 3, 4)
    BLNHC = (1, 0, 3, 2, 4)
    BHLNC = (1, 2, 0, 3, 4)


def layer_shape_bytes(spec, num_blocks, kernel_block_size):
    """compute_layer_kv_cache_shape_bytes: (B, H, N, C) with C in bytes."""
    return (num_blocks * (spec.block_size // kernel_block_size), spec.num_heads,
            spec.get_num_kernel_states(kernel_block_size), spec.state_content_size_bytes)


def layout_strides(shape, layout, fixed=(None,) * 5, padded_page=None):
    """compute_layout_strides: byte strides of [L, B, H, N, C], innermost physical axis first; a
    padded page (page_size_padded) sets the stride of the page grid's innermost axis (L or B), the
    axes outside the page being L, B or of size 1."""
    order = layout.value
    grid_end = max(order.index(0), order.index(1)) + 1
    if padded_page is not None and int(np.prod([shape[d] for d in order[:grid_end]])) != shape[0] * shape[1]:
        raise ValueError(f"Page padding requires dimensions outside the page tail to be L, B, or singleton; "
                         f"got {layout.name} with shape {shape}.")
    strides, running = [0] * 5, 1
    for physical, dim in reversed(tuple(enumerate(order))):
        if padded_page is not None and physical == grid_end - 1:
            running = max(running, padded_page)
        strides[dim] = fixed[dim] or running
        running = strides[dim] * shape[dim]
    return strides


def views_of(raw, spec, num_blocks, layout, tensor, kernel_block_size):
    """create_kv_cache_views: each layer of `tensor` as a [B, H, N, C] view of `raw` in the spec's
    dtype. Kernel blocks split a manager block only where it is one dense page."""
    shape = layer_shape_bytes(spec, num_blocks, kernel_block_size)
    ratio = shape[0] // num_blocks
    block_stride = tensor.block_stride
    if ratio > 1:
        dense_page = int(np.prod(layer_shape_bytes(spec, 1, spec.block_size)[1:]))
        if block_stride != dense_page:
            raise ValueError(f"The resolved KV cache layout ({layout.name}) does not store blocks as dense, unpadded "
                             f"pages (block stride {block_stride} != page {dense_page}), so a manager block cannot "
                             f"be split into {ratio} kernel blocks of {kernel_block_size} tokens.")
        block_stride //= ratio
    full = (len(tensor.layers),) + shape
    strides = layout_strides(full, layout, (tensor.layer_stride, block_stride, None, None, None),
                             spec.page_size_padded)
    view = torch.as_strided(raw, full, strides, raw.storage_offset() + tensor.offset)
    if isinstance(spec, MambaSpec):  # int8 pages, which the layer's bind_kv_cache unpacks
        return [view[i] for i in range(len(tensor.layers))]
    return [view[i].view(spec.dtype) for i in range(len(tensor.layers))]


# --- attention backends' customize_spec (vllm/v1/attention/backends/*.py) ---------------------------
class FlashAttentionBackend:
    @staticmethod
    def get_name():
        return "FLASH_ATTN"

    @classmethod
    def customize_spec(cls, spec):
        return spec


class FlashInferBackend(FlashAttentionBackend):
    @staticmethod
    def get_name():
        return "FLASHINFER"

    @classmethod
    def customize_spec(cls, spec):
        if spec.kv_quant_mode != KVQuantMode.NVFP4:
            return spec
        full_dim = spec.head_size // 2 + spec.head_size // 16  # nvfp4_kv_cache_full_dim
        return replace(spec, num_head_slots=2 * spec.num_kv_heads, state_content_bytes=full_dim)


class TritonAttentionBackend(FlashAttentionBackend):
    @staticmethod
    def get_name():
        return "TRITON_ATTN"

    @classmethod
    def customize_spec(cls, spec):
        if spec.kv_quant_mode not in (KVQuantMode.INT8_PER_TOKEN_HEAD, KVQuantMode.FP8_PER_TOKEN_HEAD,
                                      KVQuantMode.INT4_PER_TOKEN_HEAD):
            return spec
        k, v = spec.head_size, spec.head_size_v
        if spec.kv_quant_mode == KVQuantMode.INT4_PER_TOKEN_HEAD:
            k, v = k // 2, v // 2
        return replace(spec, state_content_bytes=(k + v) + 2 * 4)  # inline fp32 scale after each side


class RocmAttentionBackend(FlashAttentionBackend):
    @staticmethod
    def get_name():
        return "ROCM_ATTN"

    @classmethod
    def customize_spec(cls, spec):
        size = torch.tensor([], dtype=spec.dtype).element_size()
        return replace(spec, num_head_slots=2, state_content_bytes=spec.num_kv_heads * spec.head_size * size)


class TurboQuantBackend(FlashAttentionBackend):
    """turboquant_attn.py and quantization/turboquant/config.py (c2057261): K and V packed in one
    slot per head, [key | value], its size rounded up to even (slot_size_aligned); keys FP8 (a byte
    an element) or MSE indices and an fp16 norm, values uniform with an fp16 scale and zero point."""
    PRESETS = {KVQuantMode.TURBOQUANT_K8V4: (8, 4), KVQuantMode.TURBOQUANT_4BIT_NC: (4, 4),
               KVQuantMode.TURBOQUANT_K3V4_NC: (3, 4), KVQuantMode.TURBOQUANT_3BIT_NC: (3, 3)}

    @staticmethod
    def get_name():
        return "TURBOQUANT"

    @classmethod
    def customize_spec(cls, spec):
        if spec.state_content_bytes is not None or spec.kv_quant_mode not in cls.PRESETS:
            return spec
        key_bits, value_bits = cls.PRESETS[spec.kv_quant_mode]
        key = spec.head_size if key_bits == 8 else -(-spec.head_size * key_bits // 8) + 2
        slot = key + -(-spec.head_size * value_bits // 8) + 4
        return replace(spec, state_content_bytes=slot + slot % 2)


class FlashMLABackend(FlashAttentionBackend):
    @staticmethod
    def get_name():
        return "FLASHMLA"

    @classmethod
    def customize_spec(cls, spec):
        if spec.cache_dtype_str == "fp8_ds_mla":
            return replace(spec, state_content_bytes=656)
        return spec


# --- the kernels that write a token's KV (reshape_and_cache and the quantised modes) -------------------
def _bytes(t):
    return t.contiguous().view(torch.uint8)


def write_token(fmt, cache, kb, t, data, head_size):
    """Writes one token's data into kernel block kb, slot t, of a layer's [B, H, N, C] view.
    data: per format (see Engine._token_data): K and V of this rank's heads, codes and scales."""
    d = head_size
    if fmt == "packed":
        cache[kb, :, t, :d] = data["k"].to(cache.dtype)
        cache[kb, :, t, d:2 * d] = data["v"].to(cache.dtype)
    elif fmt == "packed_codes":  # fp8 per tensor: the codes, as uint8
        cache[kb, :, t, :d] = data["k"]
        cache[kb, :, t, d:2 * d] = data["v"]
    elif fmt == "kv_slots":  # ROCM_ATTN: each slot viewed as PagedAttention.split_kv_cache views it
        heads, tokens = data["k"].shape[0], cache.shape[2]
        x = 16 // cache.element_size()
        key = cache[kb, 0].view(heads, d // x, tokens, x)  # a slot's tokens are one contiguous run
        value = cache[kb, 1].view(heads, d, tokens)
        k, v = data["k"].to(cache.dtype), data["v"].to(cache.dtype)
        for h in range(heads):
            key[h, :, t, :] = k[h].reshape(d // x, x)
            value[h, :, t] = v[h]
    elif fmt == "per_token_head":  # [K | K scale f32 | V | V scale f32], the view's dtype int8 or uint8
        raw = cache.view(torch.uint8)
        for h in range(data["k"].shape[0]):
            raw[kb, h, t, :d] = _bytes(data["k"][h])
            raw[kb, h, t, d:d + 4] = _bytes(data["k_scale"][h:h + 1])
            raw[kb, h, t, d + 4:2 * d + 4] = _bytes(data["v"][h])
            raw[kb, h, t, 2 * d + 4:] = _bytes(data["v_scale"][h:h + 1])
    elif fmt == "int4":  # _reshape_cache_int4_kernel: nibbles (even low), scale bits with the zero point
        half = d // 2
        for h in range(data["k"].shape[0]):
            for side, start in (("k", 0), ("v", half + 4)):
                q = data[side][h].to(torch.int32)
                packed = (q[0::2] & 0xF) | ((q[1::2] & 0xF) << 4)
                cache[kb, h, t, start:start + half] = packed.to(torch.uint8)
                bits = data[side + "_scale"][h:h + 1].view(torch.int32)
                bits = (bits & -16) | (data[side + "_zp"][h:h + 1].to(torch.int32) & 0xF)
                cache[kb, h, t, start + half:start + half + 4] = _bytes(bits)
    elif fmt == "nvfp4":  # reshape_and_cache_nvfp4: per page K data | K scales | V data | V scales(swizzled)
        heads = data["k"].shape[0]
        page = cache[kb].view(-1)  # a head-major page is contiguous
        tokens, width = cache.shape[2], cache.shape[3]
        groups = d // 16
        side_bytes = heads * tokens * width
        for i, side in enumerate("kv"):
            base = i * side_bytes
            for h in range(heads):
                q = data[side][h].to(torch.int32)
                packed = ((q[0::2] & 0xF) | ((q[1::2] & 0xF) << 4)).to(torch.uint8)
                start = base + (h * tokens + t) * (d // 2)
                page[start:start + d // 2] = packed
                scales = base + heads * tokens * (d // 2) + h * tokens * groups
                sf = data[side + "_sf"][h]
                if side == "k":
                    page[scales + t * groups:scales + (t + 1) * groups] = sf
                else:
                    # [T//4, 4, 4, S//4] permuted (0, 2, 3, 1): the SM100 trtllm-gen order
                    linear = torch.full((tokens, groups), -1, dtype=torch.int64)
                    linear[t] = torch.arange(groups)
                    order = linear.reshape(tokens // 4, 4, 4, groups // 4).permute(0, 2, 3, 1).reshape(-1)
                    for at, s in enumerate(order.tolist()):
                        if s >= 0:
                            page[scales + at] = sf[s]
    elif fmt == "mla":
        cache[kb, 0, t, :] = data["latent"].to(cache.dtype) if cache.dtype != torch.uint8 else data["latent"]
    else:
        raise AssertionError(fmt)


def random_token(fmt, heads, d, cache, g):
    """One token's data of an earlier request, in the format `fmt` takes."""
    def codes(high, *shape):
        return torch.randint(0, high, shape, generator=g).to(torch.uint8)

    def scales(n):
        return torch.rand(n, generator=g) + 0.01

    if fmt == "mla":
        width = cache.shape[-1]
        return {"latent": codes(0x70, width) if cache.dtype == torch.uint8 else torch.randn(width, generator=g)}
    if fmt in ("packed", "kv_slots"):
        return {p: torch.randn(heads, d, generator=g) for p in "kv"}
    if fmt == "packed_codes":
        return {p: codes(0x70, heads, d) for p in "kv"}
    if fmt == "per_token_head":
        return {"k": codes(0x70, heads, d).view(cache.dtype), "v": codes(0x70, heads, d).view(cache.dtype),
                "k_scale": scales(heads), "v_scale": scales(heads)}
    if fmt == "int4":
        return {"k": codes(16, heads, d), "v": codes(16, heads, d), "k_scale": scales(heads), "v_scale": scales(heads),
                "k_zp": codes(16, heads), "v_zp": codes(16, heads)}
    if fmt == "nvfp4":
        return {"k": codes(16, heads, d), "v": codes(16, heads, d), "k_sf": codes(0x70, heads, d // 16),
                "v_sf": codes(0x70, heads, d // 16)}
    raise AssertionError(fmt)


# --- the engine's objects -----------------------------------------------------------------------------
class AttentionLayer(torch.nn.Module):
    """vllm's Attention layer: its cache (bind_kv_cache stores the view as is), backend and scales."""

    def __init__(self, backend, k_scale=1.0, v_scale=1.0, target=None):
        super().__init__()
        self.attn_backend = backend
        self.kv_sharing_target_layer_name = target
        self.kv_cache = torch.tensor([])
        self._k_scale = torch.tensor(k_scale, dtype=torch.float32)
        self._v_scale = torch.tensor(v_scale, dtype=torch.float32)

    def get_attn_backend(self):
        return self.attn_backend


class MambaLayer(torch.nn.Module):
    """vllm/model_executor/layers/mamba/abstract.py MambaBase (MambaMixer2's get_state_shape /
    get_state_dtype): bind_kv_cache unpacks the [num_blocks, 1, 1, page bytes] int8 page view
    into its states, each [num_blocks, *shape] in its dtype (the conv state (d_conv - 1,
    conv_dim / tp), vLLM's "SD" layout; the SSM state (heads / tp, head_dim, d_state))."""

    def __init__(self, spec):
        super().__init__()
        self.spec = spec
        self.kv_cache = ()

    def get_state_shape(self):
        return self.spec.shapes

    def get_state_dtype(self):
        return self.spec.dtypes

    @property
    def mamba_type(self):
        return self.spec.mamba_type

    def bind_kv_cache(self, kv_cache):
        pages = kv_cache.squeeze(2).squeeze(1)
        states, offset = [], 0
        for shape, dtype in zip(self.get_state_shape(), self.get_state_dtype()):
            nbytes = int(np.prod(shape)) * torch.tensor([], dtype=dtype).element_size()
            states.append(pages[:, offset:offset + nbytes].view(dtype).view(-1, *shape))
            offset += nbytes
        self.kv_cache = tuple(states)


@dataclass
class Group:
    """One KV cache group: its layers, attention backend, spec type and format."""
    layer_names: list
    backend: type = FlashAttentionBackend
    block_size: int = 16
    kernel_block_size: int = None
    window: int = None
    mla: bool = False
    mla_alignment: int = None  # MLAAttentionSpec.alignment
    mamba: bool = False
    mamba_dims: object = None  # a Mamba2 group's Mamba2Dims (tests/mamba2_standin.py)
    mamba_mode: str = "none"  # cache_config.mamba_cache_mode: "none", "align" or "all"
    cache_dtype: str = "auto"  # this group's --kv-cache-dtype (skip layers: "auto")
    layer_heads: dict = None  # per-layer KV heads (UniformTypeKVCacheSpecs: one spec per layer)


class KVCacheBlocks:
    """What update_state_after_alloc is handed (vllm/v1/core/kv_cache_manager.py): the request's
    blocks per group, the first `hashed` of group 0 found in the prefix cache."""

    def __init__(self, block_ids, hashed):
        self.block_ids, self.hashed = tuple(list(g) for g in block_ids), hashed

    def get_block_ids(self):
        return self.block_ids

    def get_unhashed_block_ids_all_groups(self):
        """Per group, the blocks with no hash (here: all but group 0's first `hashed`), the null
        block (0) left out (c2057261)."""
        groups = (self.block_ids[0][self.hashed:],) + self.block_ids[1:]
        return tuple([b for b in g if b != 0] for g in groups)


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list
    block_ids: tuple
    num_computed_tokens: int
    prefill_token_ids: list = None  # only for Model Runner V2


@dataclass
class CachedRequestData:
    req_ids: list = field(default_factory=list)
    resumed_req_ids: set = field(default_factory=set)
    new_token_ids: list = field(default_factory=list)
    all_token_ids: dict = field(default_factory=dict)
    new_block_ids: list = field(default_factory=list)
    num_computed_tokens: list = field(default_factory=list)
    num_output_tokens: list = field(default_factory=list)


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict
    total_num_scheduled_tokens: int
    scheduled_spec_decode_tokens: dict
    finished_req_ids: set
    preempted_req_ids: set = None
    kv_connector_metadata: object = None
    has_sync_kv_loads: bool = False


class GPUModelRunner:
    """vllm/v1/worker/gpu_model_runner.py: requests[id].block_ids, extended by new_block_ids,
    replaced for a request resumed from preemption."""

    def __init__(self, worker):
        self.worker = worker
        self.requests = {}
        self.kv_cache_config = None

    def _update_states(self, out):
        for rid in out.finished_req_ids:
            self.requests.pop(rid, None)
        for new in out.scheduled_new_reqs:
            self.requests[new.req_id] = types.SimpleNamespace(block_ids=tuple(list(g) for g in new.block_ids))
        cached = out.scheduled_cached_reqs
        for rid, ids in zip(cached.req_ids, cached.new_block_ids):
            if ids is None:
                continue
            if rid in cached.resumed_req_ids:
                self.requests[rid].block_ids = tuple(list(g) for g in ids)
            else:
                for g, more in zip(self.requests[rid].block_ids, ids):
                    g.extend(more)

    def execute_model(self, scheduler_output, intermediate_tensors=None):
        self._update_states(scheduler_output)
        self.worker.forward(scheduler_output, lambda rid: self.requests[rid].block_ids)


class GPUModelRunnerV2:
    """vllm/v1/worker/gpu/model_runner.py: req_states and block_tables (GPU tensors: nothing that
    lists a request's block ids in Python)."""

    def __init__(self, worker):
        self.worker = worker
        self.req_states = types.SimpleNamespace(req_id_to_index={})
        self._gpu_block_table = {}  # stands for BlockTables' device tensors
        self.block_tables = types.SimpleNamespace()
        self.kv_cache_config = None

    def execute_model(self, scheduler_output, intermediate_tensors=None, dummy_run=False,
                      skip_attn_for_dummy_run=False, is_profile=False, context_len=0):
        out = scheduler_output
        for rid in out.finished_req_ids | (out.preempted_req_ids or set()):
            self._gpu_block_table.pop(rid, None)
            self.req_states.req_id_to_index.pop(rid, None)
        for new in out.scheduled_new_reqs:  # add_requests: written with overwrite=True
            assert new.prefill_token_ids is not None
            self._gpu_block_table[new.req_id] = tuple(list(g) for g in new.block_ids)
            self.req_states.req_id_to_index[new.req_id] = len(self.req_states.req_id_to_index)
        cached = out.scheduled_cached_reqs
        for rid, ids in zip(cached.req_ids, cached.new_block_ids):  # update_requests: appended
            self.req_states.req_id_to_index[rid]  # a request it does not hold is a KeyError, as in vLLM
            if ids is not None:
                for g, more in zip(self._gpu_block_table[rid], ids):
                    g.extend(more)
        self.worker.forward(out, lambda rid: self._gpu_block_table[rid])


class Engine:
    """tp workers of one model, a scheduler with one block pool (block 0 the null block), chunked
    prefill, preemption, a prefix cache, speculative decoding, and a KV connector's life cycle.

    groups: [Group]; total_heads KV heads of head_size; layout: the KVCacheLayout the engine core
    resolved; runner "v1" or "v2"; alias: {layer: target} sharing caches; scales:
    {layer: (k_scale, v_scale)}; connector: (class, kv_transfer_config's extra config) or None;
    prefix_caching: full blocks of finished requests are found again by their tokens (one group);
    prefill_stats: the scheduler sets request.prefill_stats at a first admission, as vLLM does
    (False: an older vLLM without it); kv_role: the connector's kv_transfer_config.kv_role.

    The scheduler follows vllm/v1/core/sched/scheduler.py (the tree of 2026-08-19, c2057261, and
    the copy @ 157ad7e7): a waiting request with no computed tokens is admitted with its local
    prefix-cache hit (full blocks, at most num_tokens - 1 tokens), then the connector's
    get_num_new_matched_tokens(request, that hit), prefill_stats.set(local, external),
    update_state_after_alloc(request, blocks, external); an asynchronous load parks it until the
    workers report it in get_finished's finished_recving, and a load that covers every token leaves
    the last to compute. build_connector_meta sees the step's output before num_computed_tokens
    advances. Speculative decoding: a decode step schedules 1 + k tokens (the drafts in
    scheduled_spec_decode_tokens); the kernels write all of them, rejected drafts included, and
    update_from_output rolls num_computed_tokens back by the rejected ones (synchronous scheduling).
    A preempted request (_preempt_request: blocks freed, num_computed_tokens 0, num_preemptions + 1)
    is admitted again and recomputes everything it had."""

    def __init__(self, groups, total_heads=4, head_size=16, tp=1, num_blocks=40, layout=KVCacheLayout.LBNHC,
                 runner="v2", alias=None, scales=None, connector=None, chunk=None, seed=0,
                 mla_widths=None, dtype=torch.bfloat16, earlier_requests=True, prefix_caching=False,
                 prefill_stats=True, kv_role="kv_both"):
        self.groups, self.total_heads, self.head_size, self.tp = groups, total_heads, head_size, tp
        self.num_blocks, self.layout, self.runner_kind = num_blocks, layout, runner
        self.alias, self.scales, self.chunk, self.dtype = alias or {}, scales or {}, chunk, dtype
        # Fill every block with other data first (earlier requests'), or leave the zeros of a fresh pool.
        self.earlier_requests = earlier_requests
        self.mla_widths = mla_widths or (head_size - 8, 8)
        self.rng = np.random.default_rng(seed)
        self.free = [int(b) for b in self.rng.permutation(np.arange(1, num_blocks))]
        self.layers = [n for g in groups for n in g.layer_names]
        self.connector_spec = connector
        self.requests = {}
        self.truth = {}
        self.step_count = 0
        self.prefix_caching, self.prefill_stats, self.kv_role = prefix_caching, prefill_stats, kv_role
        self.cached = {}  # prefix cache: the tokens up to a full block's end -> that block
        self.finished_recving = set()
        self.log = []  # per step: {request: (start, n, drafts, accepted)}, for the tests
        self.finished_pending = set()  # finished, held by the connector
        self.workers = [self._worker(rank) for rank in range(tp)]
        self.scheduler_connector = None
        if connector is not None:
            cls, _ = connector
            self.scheduler_connector = cls(self.workers[0].vllm_config, KVConnectorRole.SCHEDULER,
                                           self.workers[0].scheduler_kv_cache_config)
        for worker in self.workers:
            self.initialize_kv_cache(worker)

    # -- specs and caches -------------------------------------------------------------------------------
    def mamba_dims(self):
        """The model's Mamba2 dimensions (its state-space groups share them)."""
        return next((g.mamba_dims for g in self.groups if g.mamba and g.mamba_dims), None) or Mamba2Dims()

    def gdn_config(self):
        """A Gated DeltaNet model's HF config fields (Qwen3NextConfig's names)."""
        d = self.mamba_dims()
        if not isinstance(d, GdnDims):
            return {}
        return {"linear_num_key_heads": d.num_k_heads, "linear_num_value_heads": d.num_v_heads,
                "linear_key_head_dim": d.head_k_dim, "linear_value_head_dim": d.head_v_dim,
                "linear_conv_kernel_dim": d.d_conv}

    def heads_of_rank(self, rank, total=None):
        total = total or self.total_heads
        if total >= self.tp:
            per = total // self.tp
            return list(range(rank * per, (rank + 1) * per))
        return [rank // (self.tp // total)]

    def spec_of(self, group):
        if group.layer_heads:
            specs = {name: self._spec(group, max(1, group.layer_heads.get(name, self.total_heads) // self.tp))
                     for name in group.layer_names}
            return UniformTypeKVCacheSpecs(block_size=group.block_size, kv_cache_specs=specs)
        return self._spec(group, 1 if group.mla else max(1, self.total_heads // self.tp))

    def _spec(self, group, heads):
        mode = get_kv_quant_mode(group.cache_dtype)
        dtype = {KVQuantMode.NONE: self.dtype, KVQuantMode.INT8_PER_TOKEN_HEAD: torch.int8}.get(mode, torch.uint8)
        if group.mamba:
            return self.mamba_spec(group)
        if group.mla:
            spec = MLAAttentionSpec(block_size=group.block_size, num_kv_heads=1, head_size=sum(self.mla_widths),
                                    dtype=dtype, kv_quant_mode=mode, cache_dtype_str=group.cache_dtype,
                                    alignment=group.mla_alignment)
        elif group.window:
            spec = SlidingWindowSpec(block_size=group.block_size, num_kv_heads=heads, head_size=self.head_size,
                                     dtype=dtype, kv_quant_mode=mode, sliding_window=group.window)
        else:
            spec = FullAttentionSpec(block_size=group.block_size, num_kv_heads=heads, head_size=self.head_size,
                                     dtype=dtype, kv_quant_mode=mode)
        return group.backend.customize_spec(spec)

    def mamba_spec(self, group):
        """MambaStateShapeCalculator.mamba2_state_shape (vllm/model_executor/layers/mamba/
        mamba_utils.py): groups extended to tp when n_groups is not a multiple of it, the conv
        state (d_conv - 1, conv_dim / tp), the SSM state (heads / tp, head_dim, d_state); dtypes
        (the model's, mamba_ssm_cache_dtype float32)."""
        d = group.mamba_dims or Mamba2Dims()
        if isinstance(d, GdnDims):  # gated_delta_net_state_shape: recurrent (heads / tp, head_v_dim, head_k_dim)
            shapes = ((d.d_conv - 1, d.conv_dim // self.tp), (d.num_v_heads // self.tp, d.head_v_dim, d.head_k_dim))
            return self._padded_to_attention(
                MambaSpec(group.block_size, shapes, (self.dtype, torch.float32),
                          mamba_type=MambaAttentionBackendEnum.GDN_ATTN, mamba_cache_mode=group.mamba_mode))
        groups = d.n_groups + (0 if d.n_groups % self.tp == 0 else self.tp - d.n_groups)
        conv_dim = d.intermediate + 2 * groups * d.d_state
        shapes = ((d.d_conv - 1, conv_dim // self.tp), (d.heads // self.tp, d.head_dim, d.d_state))
        return self._padded_to_attention(
            MambaSpec(group.block_size, shapes, (self.dtype, torch.float32), mamba_cache_mode=group.mamba_mode))

    def _padded_to_attention(self, spec):
        """The platform's hybrid check (vllm/platforms/interface.py, c2057261): an attention layer's
        page must hold a Mamba page (vLLM raises the attention block size until it does; here the
        engine must be given such a block size), and the Mamba page is padded to exactly the
        attention page (mamba_page_size_padded)."""
        attention = [g for g in getattr(self, "groups", ()) if not g.mamba]
        if not attention:
            return spec
        page = self.spec_of(attention[0]).page_size_bytes
        if page < spec.page_size_bytes:
            raise ValueError(f"an attention page of {page} bytes cannot hold a Mamba page of {spec.page_size_bytes}: "
                             "vLLM would raise the attention block size")
        return replace(spec, page_size_padded=page) if page > spec.page_size_bytes else spec

    def _worker(self, rank):
        groups = [KVCacheGroupSpec([n for n in g.layer_names if n not in self.alias], self.spec_of(g))
                  for g in self.groups]
        cache_config = types.SimpleNamespace(cache_dtype=self.groups[0].cache_dtype,
                                             block_size=self.groups[0].block_size,
                                             kv_cache_dtype_skip_layers=[], kv_cache_layout=self.layout.name)
        modules = {}
        for g in self.groups:
            for name in g.layer_names:
                k_scale, v_scale = self.scales.get(name, (1.0, 1.0))
                modules[name] = (MambaLayer(self.mamba_spec(g)) if g.mamba else
                                 AttentionLayer(g.backend, k_scale, v_scale, self.alias.get(name)))
        extra = self.connector_spec[1] if self.connector_spec else {}
        vllm_config = types.SimpleNamespace(
            parallel_config=types.SimpleNamespace(tensor_parallel_size=self.tp, pipeline_parallel_size=1,
                                                  decode_context_parallel_size=1),
            cache_config=cache_config,
            model_config=types.SimpleNamespace(get_total_num_kv_heads=lambda: self.total_heads,
                                               hf_text_config=types.SimpleNamespace(
                                                   kv_lora_rank=self.mla_widths[0],
                                                   qk_rope_head_dim=self.mla_widths[1],
                                                   n_groups=getattr(self.mamba_dims(), "n_groups", None),
                                                   **self.gdn_config())),
            compilation_config=types.SimpleNamespace(static_forward_context=modules),
            kv_transfer_config=types.SimpleNamespace(kv_connector_extra_config=extra))
        worker = types.SimpleNamespace(tp_rank=rank, pp_rank=0, vllm_config=vllm_config, modules=modules,
                                       scheduler_kv_cache_config=None, connector=None, caches={})
        worker.scheduler_kv_cache_config = self._allocation(groups)
        worker.forward = lambda out, block_ids_of, w=worker: self._forward(w, out, block_ids_of)
        worker.model_runner = (GPUModelRunnerV2 if self.runner_kind == "v2" else GPUModelRunner)(worker)
        return worker

    def _allocation(self, groups):
        """get_kv_cache_config_from_groups: one region of bytes_per_block x num_blocks; every group
        starts at byte 0 (a block id belongs to one group at a time); inside a group a tensor per
        distinct layer spec, at increasing offsets; block-outermost layouts interleave a whole
        block of every layer."""
        def specs_of(group):
            per_layer = getattr(group.kv_cache_spec, "kv_cache_specs", None)
            return {name: (per_layer[name] if per_layer else group.kv_cache_spec) for name in group.layer_names}

        attention = [g for g in groups if g.layer_names]  # state-space groups' pages too (MambaSpec)
        bytes_per_block = max(sum(spec.page_size_bytes for spec in specs_of(g).values()) for g in attention)
        outermost_block = self.layout.value[0] == 1
        tensors = []
        for group in attention:
            by_spec = {}
            for name, spec in specs_of(group).items():
                by_spec.setdefault(spec, []).append(name)
            byte_offset = 0
            for spec, names in by_spec.items():
                shape = (len(names),) + layer_shape_bytes(spec, self.num_blocks, spec.block_size)
                fixed = (None, bytes_per_block if outermost_block else None, None, None, None)
                layer_stride, block_stride = layout_strides(shape, self.layout, fixed, spec.page_size_padded)[:2]
                offset = byte_offset * max(layer_stride, spec.page_size_bytes) // spec.page_size_bytes
                tensors.append(KVCacheTensor(size=bytes_per_block * self.num_blocks, layers=names,
                                             layer_stride=layer_stride, block_stride=block_stride, offset=offset))
                byte_offset += len(names) * spec.page_size_bytes
        return KVCacheConfig(num_blocks=self.num_blocks, kv_cache_tensors=tensors, kv_cache_groups=groups,
                             kv_cache_layout=self.layout.name)

    def initialize_kv_cache(self, worker):
        """allocate_kv_cache + bind_kv_cache + the connector's registration, as the runners do in
        initialize_kv_cache. May run again (Model Runner V2 re-initialising)."""
        config = worker.scheduler_kv_cache_config
        size = config.kv_cache_tensors[0].size
        raw = torch.zeros(-(-size // 4096) * 4096, dtype=torch.int8)  # allocate_kv_cache
        caches = {}
        for g, group in zip(self.groups, config.kv_cache_groups):
            per_layer = getattr(group.kv_cache_spec, "kv_cache_specs", None)
            for tensor in (t for t in config.kv_cache_tensors if set(t.layers) <= set(group.layer_names)):
                spec = per_layer[tensor.layers[0]] if per_layer else group.kv_cache_spec
                views = views_of(raw, spec, self.num_blocks, self.layout, tensor, g.kernel_block_size or g.block_size)
                caches.update(zip(tensor.layers, views))
            if self.format_of(g) in ("per_token_head", "int4"):
                # TritonAttentionImpl._ensure_scale_caches: every (token, head) scale starts at 1.0.
                d = self.head_size // (2 if self.format_of(g) == "int4" else 1)
                for view in views:
                    raw_view = view.view(torch.uint8)
                    for start in (d, 2 * d + 4):
                        raw_view[..., start:start + 4] = _bytes(torch.ones(1))
        for name, target in self.alias.items():
            caches[name] = caches[target]
        if self.earlier_requests:
            self._write_earlier_requests(worker, caches)
        for name, module in worker.modules.items():
            if isinstance(module, MambaLayer):
                module.bind_kv_cache(caches[name])
            else:
                module.kv_cache = caches.get(name, module.kv_cache)
        runner_config = copy.deepcopy(config)  # the runner's copy lists the sharing layers too
        for name, target in self.alias.items():
            for group in runner_config.kv_cache_groups:
                if target in group.layer_names:
                    group.layer_names.append(name)
        worker.model_runner.kv_cache_config = runner_config
        worker.raw, worker.caches = raw, caches
        if self.connector_spec is not None:
            cls, _ = self.connector_spec
            if worker.connector is None:
                worker.connector = self.call(worker, cls, worker.vllm_config, KVConnectorRole.WORKER, config)
            self.call(worker, worker.connector.register_kv_caches, dict(caches))

    # -- requests -----------------------------------------------------------------------------------------
    def add_request(self, external_id, prompt, output, kv, child=None, spec=None, kv_transfer_params=None):
        """kv: the engine's KV of every position (Engine docs: per layer, per format); child: the
        index of a parallel-sampling child (n > 1); spec: per decode step (drafts proposed, drafts
        accepted), speculative decoding's outcome; kv_transfer_params: what a disaggregated proxy
        hands the request (sampling_params.extra_args). The scheduler's Request (vllm/v1/request.py)
        keeps the engine's id only."""
        rid = f"{external_id}-{uuid.uuid4().hex[:8]}"
        if child is not None:
            rid = f"{child}_{rid}"
        self.requests[rid] = types.SimpleNamespace(
            request_id=rid, prompt_token_ids=list(prompt), output_token_ids=list(output),
            num_computed_tokens=0, block_ids=None, new=True, resumed=False, done=False, admitted=False,
            num_tokens=len(prompt), num_preemptions=0, prefill_stats=None, spec=list(spec or []),
            kv_transfer_params=kv_transfer_params, loading=False, finished_params=None)
        self.truth[rid] = kv
        return rid

    def _take(self):
        """A free block for new KV; a cached block taken so is no longer found by its tokens."""
        block = self.free.pop()
        for key in [k for k, b in self.cached.items() if b == block]:
            del self.cached[key]
        return block

    def _allocate(self, request, upto):
        groups = request.block_ids or tuple([] for _ in self.groups)
        added = []
        for g, ids in zip(self.groups, groups):
            if g.mamba and g.mamba_mode != "none":
                # MambaManager.get_num_skipped_tokens = num_computed_tokens - 1: remove_skipped_blocks
                # frees every block before the last computed token's and nulls it in the request's
                # list; a freed block goes to the next allocation (its state is gone).
                for j in range(max(0, (request.num_computed_tokens - 1) // g.block_size)):
                    if j < len(ids) and ids[j] > 0:
                        self.free.append(ids[j])
                        ids[j] = 0
            need = -(-upto // g.block_size) - len(ids)
            new = [self._take() for _ in range(max(0, need))]
            ids.extend(new)
            added.append(new)
        request.block_ids = groups
        return tuple(added)

    def preempt(self, rid):
        """_preempt_request: the request gives its blocks back (kept in the prefix cache until
        taken) and will recompute from the start."""
        request = self.requests[rid]
        self._cache_blocks(request)
        self.free[:0] = [b for g in request.block_ids for b in g if b > 0]
        request.block_ids, request.num_computed_tokens, request.resumed = None, 0, True
        request.admitted, request.spec = False, request.spec
        request.num_preemptions += 1
        self._preempted = getattr(self, "_preempted", set()) | {rid}

    def _cache_blocks(self, request):
        """The request's full, computed blocks, found again by the tokens up to their end."""
        if not self.prefix_caching or request.block_ids is None:
            return
        bs = self.groups[0].block_size
        tokens = request.prompt_token_ids + request.output_token_ids
        for i, block in enumerate(request.block_ids[0][:request.num_computed_tokens // bs]):
            self.cached[tuple(tokens[:(i + 1) * bs])] = block

    def _admit(self, request):
        """A waiting request with no computed tokens: its prefix-cache hit, then the connector's.
        Returns False while it cannot be scheduled (the connector is still looking up, or loading)."""
        local_blocks = []
        if self.prefix_caching:
            assert len(self.groups) == 1, "the stand-in's prefix cache serves one KV cache group"
            bs = self.groups[0].block_size
            tokens = request.prompt_token_ids + request.output_token_ids
            for i in range((request.num_tokens - 1) // bs):  # max_cache_hit_length: num_tokens - 1
                block = self.cached.get(tuple(tokens[:(i + 1) * bs]))
                if block is None or block not in self.free:
                    break
                local_blocks.append(block)
        local = len(local_blocks) * (self.groups[0].block_size if local_blocks else 0)
        external, load_async = 0, False
        if self.scheduler_connector is not None:
            external, load_async = self.scheduler_connector.get_num_new_matched_tokens(request, local)
            if external is None:
                return False
        for block in local_blocks:
            self.free.remove(block)
        if self.prefill_stats and request.num_preemptions <= 0:
            request.prefill_stats = types.SimpleNamespace(num_prompt_tokens=len(request.prompt_token_ids),
                                                          num_local_cached_tokens=local,
                                                          num_external_cached_tokens=external)
        request.block_ids = (list(local_blocks),) + tuple([] for _ in self.groups[1:])
        self._allocate(request, local + external)
        if self.scheduler_connector is not None:
            blocks = KVCacheBlocks(request.block_ids, len(local_blocks))
            self.scheduler_connector.update_state_after_alloc(request, blocks, external)
        request.num_computed_tokens = local + external
        request.admitted = True
        request.loading = load_async
        request.sync_load = external > 0 and not load_async  # loaded by this step's start_load_kv
        return not load_async

    def _mamba_block_aligned_split(self, request, n, block_size):
        """Scheduler._mamba_block_aligned_split (c2057261): a prefill chunk ends where a state is
        kept (slot k: the state after (k + 1) * block_size tokens): at a block boundary unless it is
        the prompt's last chunk, never past the last block boundary of the request's tokens, and a
        chunk that starts mid-block at the next boundary. (No EAGLE, no partial-tail hash hits, no
        shared-prefix junctions here: their stops are left out.)"""
        start = request.num_computed_tokens
        prefill_end = max(len(request.prompt_token_ids), request.num_tokens - 1)
        if start >= prefill_end:
            return n
        last_cache_position = request.num_tokens - request.num_tokens % block_size
        end = start + n
        if end < prefill_end:
            aligned_end = end // block_size * block_size
            if aligned_end > start or block_size <= (self.chunk or float("inf")):  # max_num_scheduled_tokens
                end = aligned_end
        stops = ((start // block_size + 1) * block_size if start % block_size else 0, last_cache_position)
        end = min((s for s in stops if start < s < end), default=end)
        return max(end - start, 0)

    def schedule(self, finished):
        new, cached, scheduled, spec_tokens = [], CachedRequestData(), {}, {}
        has_sync_kv_loads = False
        self._step_plan = {}
        for rid, request in self.requests.items():
            if request.done:
                continue
            if not request.admitted and not self._admit(request):
                continue
            if request.loading:
                if rid not in self.finished_recving:
                    continue
                self.finished_recving.discard(rid)
                request.loading = False
                if request.num_computed_tokens == request.num_tokens:  # a full hit: the last recomputed
                    request.num_computed_tokens -= 1
            total = len(request.prompt_token_ids) + len(request.output_token_ids) - 1  # written positions
            if request.num_computed_tokens >= total:
                continue
            # num_tokens - num_computed_tokens: the prompt (in chunks when chunked), everything again
            # after a preemption, else the last sampled token, and the drafts with it.
            n = request.num_tokens - request.num_computed_tokens
            drafts = accepted = 0
            if n == 1 and request.spec:
                proposed, accepted = request.spec.pop(0)
                drafts = min(proposed, total - request.num_computed_tokens - 1)
                accepted = min(accepted, drafts)
                n += drafts
                spec_tokens[rid] = [-1] * drafts
            elif self.chunk:
                n = min(n, self.chunk)
            for g in self.groups:
                if g.mamba and g.mamba_mode == "align" and not drafts:
                    n = self._mamba_block_aligned_split(request, n, g.block_size)
            if n == 0:
                continue  # (vLLM schedules it no tokens this step either)
            self._step_plan[rid] = (request.num_computed_tokens, n, drafts, accepted)
            upto = request.num_computed_tokens + n
            added = self._allocate(request, upto)
            if request.new or (request.resumed and self.runner_kind == "v2"):
                # Model Runner V2 is sent a resumed request as a new one (scheduler.py)
                new.append(NewRequestData(rid, request.prompt_token_ids, tuple(list(g) for g in request.block_ids),
                                          request.num_computed_tokens,
                                          prefill_token_ids=request.prompt_token_ids + request.output_token_ids))
                request.new = request.resumed = False
            else:
                cached.req_ids.append(rid)
                if request.resumed:
                    cached.resumed_req_ids.add(rid)
                    cached.new_block_ids.append(tuple(list(g) for g in request.block_ids))
                    request.resumed = False
                else:
                    cached.new_block_ids.append(added if any(added) else None)
                cached.num_computed_tokens.append(request.num_computed_tokens)
            scheduled[rid] = n
            has_sync_kv_loads = has_sync_kv_loads or getattr(request, "sync_load", False)
            request.sync_load = False
        return SchedulerOutput(new, cached, scheduled, sum(scheduled.values()), spec_tokens, set(finished),
                               preempted_req_ids=getattr(self, "_preempted", set()),
                               has_sync_kv_loads=has_sync_kv_loads)

    def _forward(self, worker, out, block_ids_of):
        """Writes the KV of every scheduled position, as the attention layers' kernels do (a
        rejected draft's KV is another token's: here the previous position's). A connector waits
        for each layer's load first and is handed each layer to save after."""
        connector = worker.connector
        if connector is not None:
            for name in self.layers:
                connector.wait_for_layer_load(name)
        for rid, n in out.num_scheduled_tokens.items():
            request = self.requests[rid]
            ids = block_ids_of(rid)
            start, _, drafts, accepted = self._step_plan.get(rid, (request.num_computed_tokens, n, 0, 0))
            rejected = range(start + n - drafts + accepted, start + n)
            for p in range(request.num_computed_tokens, request.num_computed_tokens + n):
                for gi, g in enumerate(self.groups):
                    if g.mamba:
                        continue
                    kernel = g.kernel_block_size or g.block_size
                    block = ids[gi][p // g.block_size]
                    kb = block * (g.block_size // kernel) + (p % g.block_size) // kernel
                    t = (p % g.block_size) % kernel
                    fmt = self.format_of(g)
                    for name in g.layer_names:
                        if name in self.alias:
                            continue
                        total = (g.layer_heads or {}).get(name, self.total_heads)
                        source = p - 1 if p in rejected else p
                        data = self._token_data(worker.tp_rank, g, self.truth[rid][name], source, total)
                        write_token(fmt, worker.caches[name], kb, t, data, self.head_size)
            end = request.num_computed_tokens + n - (drafts - accepted)
            for gi, g in enumerate(self.groups):
                if g.mamba:
                    self._write_states(worker, g, ids[gi], request.num_computed_tokens, end, self.truth[rid])
        if connector is not None:
            for name in self.layers:
                connector.save_kv_layer(name, worker.caches.get(name), None)

    def _write_states(self, worker, group, block_ids, start, end, truth):
        """The states a step leaves (mamba_mixer2.py conv_ssm_forward): the state after `end` in
        the block of the step's last token, slot (end - 1) // block_size; with mamba_cache_mode
        "all" also each block boundary the step crossed, the state after (j + 1) * block_size
        tokens in slot j (varlen_states at the chunks that end on a boundary). truth: per layer
        {'conv': [T, conv_dim, d_conv - 1], 'ssm': [T, heads, head_dim, d_state]} (Gated DeltaNet:
        'recurrent' [T, heads, head_k_dim, head_v_dim]), row p - 1 the state after positions [0, p),
        the whole model's."""
        bs = group.block_size
        writes = [((j + 1) * bs, j) for j in range(start // bs, (end - 1) // bs)] if group.mamba_mode == "all" else []
        writes.append((end, (end - 1) // bs))
        dims = group.mamba_dims or Mamba2Dims()
        gdn = isinstance(dims, GdnDims)
        conv_units, heads = (gdn_rank_units if gdn else rank_units)(dims, self.tp, worker.tp_rank)
        for name in group.layer_names:
            conv, ssm = worker.modules[name].kv_cache
            for position, slot in writes:
                block = block_ids[slot]
                state = truth[name]
                conv[block] = torch.from_numpy(state["conv"][position - 1][conv_units].T.copy()).to(conv.dtype)
                if gdn:  # the truth [heads, head_k_dim, head_v_dim]; vLLM keeps (head_v_dim, head_k_dim)
                    value = state["recurrent"][position - 1][heads].transpose(0, 2, 1)
                else:
                    value = state["ssm"][position - 1][heads]
                ssm[block] = torch.from_numpy(value.copy()).to(ssm.dtype)

    def _write_earlier_requests(self, worker, caches):
        """Every slot of every block written once with other data, as earlier requests leave it."""
        g_ = torch.Generator().manual_seed(1000 + worker.tp_rank)
        for g in self.groups:
            fmt = self.format_of(g)
            if g.mamba or fmt is None:
                continue
            for name in g.layer_names:
                if name in self.alias:
                    continue
                cache = caches[name]
                if fmt == "nvfp4" and not cache[0].is_contiguous():
                    continue  # a layout the NVFP4 kernels do not write (kvscope refuses it)
                heads = 1 if g.mla else cache.shape[1] // (2 if fmt in ("nvfp4",) else 1)
                if fmt == "kv_slots":
                    heads = max(1, self.total_heads // self.tp)
                for kb in range(cache.shape[0]):
                    for t in range(cache.shape[2]):
                        write_token(fmt, cache, kb, t, random_token(fmt, heads, self.head_size, cache, g_),
                                    self.head_size)

    def format_of(self, group):
        mode = get_kv_quant_mode(group.cache_dtype)
        if group.mla:
            return "mla"
        if group.backend is RocmAttentionBackend:
            return "kv_slots"
        return {KVQuantMode.NONE: "packed", KVQuantMode.FP8_PER_TENSOR: "packed_codes",
                KVQuantMode.INT8_PER_TOKEN_HEAD: "per_token_head", KVQuantMode.FP8_PER_TOKEN_HEAD: "per_token_head",
                KVQuantMode.INT4_PER_TOKEN_HEAD: "int4", KVQuantMode.NVFP4: "nvfp4"}.get(mode)

    def _token_data(self, rank, group, truth, p, total):
        """Position p's data for this rank's heads: truth is {part: [total heads, seq, ...]} (MLA:
        {'latent': [seq, width]})."""
        if group.mla:
            return {"latent": truth["latent"][p]}
        heads = self.heads_of_rank(rank, total)
        return {part: value[heads, p] for part, value in truth.items()}

    def step(self):
        """One engine step: schedule, each worker's forward and connector calls (as the first
        runner's connector context and Model Runner V2's pre/post_forward make them), then the
        scheduler frees what is finished. Returns the request ids the workers reported finished."""
        self.step_count += 1
        finished_now = [rid for rid, r in self.requests.items()
                        if not r.done and r.num_computed_tokens >= len(r.prompt_token_ids) + len(r.output_token_ids) - 1
                        and r.block_ids is not None]
        finished_ids = set()
        for rid in finished_now:
            request = self.requests[rid]
            request.done = True
            finished_ids.add(rid)
            held = False
            if self.scheduler_connector is not None:
                held, request.finished_params = self.scheduler_connector.request_finished_all_groups(
                    request, request.block_ids)
            if held:
                self.finished_pending.add(rid)
            else:
                self._free(rid)
        out = self.schedule(finished_ids)
        self._preempted = set()
        if self.scheduler_connector is not None:
            out.kv_connector_metadata = self.scheduler_connector.build_connector_meta(out)
        reported = []
        for worker in self.workers:
            def run(w=worker):
                # Loads start before the forward only when this step's forward needs them
                # (synchronous loads); otherwise after it, off the critical path.
                c = w.connector
                load_before = out.has_sync_kv_loads
                if c is not None:
                    c.handle_preemptions(out.kv_connector_metadata)
                    c.bind_connector_metadata(out.kv_connector_metadata)
                    if load_before:
                        c.start_load_kv(types.SimpleNamespace(attn_metadata=None))
                w.model_runner.execute_model(out)
                if c is None:
                    return set(), set()
                if self.runner_kind == "v2":
                    c.finish_forward()
                if not load_before:
                    c.start_load_kv(types.SimpleNamespace(attn_metadata=None))
                c.wait_for_save()
                results = c.get_transfer_results(set(out.finished_req_ids))
                c.clear_connector_metadata()
                return set(results.finished_sending), set(results.finished_recving)
            reported.append(self.call(worker, run))
        self.log.append(dict(self._step_plan))
        for rid, n in out.num_scheduled_tokens.items():
            request = self.requests[rid]
            _, _, drafts, accepted = self._step_plan[rid]
            request.num_computed_tokens += n - (drafts - accepted)  # update_from_output: rejections roll back
            if request.num_computed_tokens >= len(request.prompt_token_ids):  # sampled: the next token known
                request.num_tokens = min(max(request.num_tokens, request.num_computed_tokens + 1),
                                         len(request.prompt_token_ids) + len(request.output_token_ids))
        # KVOutputAggregator: a request is finished sending / receiving once every worker said so.
        self.finished_recving |= set.intersection(*[r for _, r in reported]) if reported else set()
        reported = [s for s, _ in reported]
        done = set.intersection(*reported) if reported else set()
        for rid in done & self.finished_pending:
            self.finished_pending.discard(rid)
            self._free(rid)
        return done

    def _free(self, rid):
        request = self.requests[rid]
        self._cache_blocks(request)
        self.free[:0] = [b for g in request.block_ids for b in g if b > 0]

    def run(self, max_steps=200):
        """Steps until every request is finished and released; returns the steps taken."""
        for n in range(max_steps):
            self.step()
            if all(r.done for r in self.requests.values()) and not self.finished_pending:
                return n + 1
        raise AssertionError("requests did not finish")

    def call(self, worker, fn, *args, **kwargs):
        parallel_state.set_ranks(worker.tp_rank, worker.pp_rank)
        return fn(*args, **kwargs)


def rht_signs(head_size):
    """vLLM's signs, from the stand-in of its module (the capture reads them from vLLM too)."""
    return _get_rht_signs(head_size, 0, "cpu")
