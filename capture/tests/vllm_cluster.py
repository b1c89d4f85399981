"""A stand-in for upstream vLLM v1 serving on GPUs before its specs described the cache layout (the
first model runner, backends with get_kv_cache_shape and get_kv_cache_stride_order: vLLM 0.10 to
the spring of 2026, before #44455 packed every backend's K and V): attention backends
with their cache shapes and stride orders, workers that allocate caches the way
gpu_model_runner does (raw bytes viewed in the physical order, permuted back to the logical
shape), a scheduler that allocates blocks from a pool whose block 0 is the null block, and the
KV connector's life cycle (request_finished, build_connector_meta, start_load_kv, get_finished).

State-space layers (hybrid models) as that vLLM held them with prefix caching off: MambaSpec
(mamba_type a string, mamba_cache_mode), Mamba2's (conv, ssm) state shapes, the conv state
(d_conv - 1, conv_dim / tp), and the runner handing each layer (and the connector) a list of its
state views, [num_blocks, *shape] strided by the page (gpu_model_runner.py _reshape_kv_cache_tensors
and mamba_utils.py of vllm-project/vllm as mirrored in Josephasafg/vllm @ 7b743ba9, 2026-04-02);
the request's end state in its one block, a small Mamba2's (tests/mamba2_standin.py).

The KV is written into the caches slot by slot the way the backends' reshape_and_cache kernels
do, by code written here, independently of kvscope_capture's reading code."""

import os
import sys
import types

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "standin_vllm"))

from vllm.distributed import parallel_state  # noqa: E402  (the stand-in)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from mamba2_standin import Mamba2Dims, rank_units  # noqa: E402


# --- attention backends (vllm/v1/attention/backends/*.py) ----------------------------------------
class FlashAttentionBackend:
    layout = "NHD"

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        if block_size % 16 != 0:
            raise ValueError("Block size must be a multiple of 16.")
        return (2, num_blocks, block_size, num_kv_heads, head_size)

    @classmethod
    def get_kv_cache_stride_order(cls):
        return (0, 1, 2, 3, 4) if cls.layout == "NHD" else (0, 1, 3, 2, 4)

    @staticmethod
    def write(cache, block, offset, k, v, dim):
        cache[0, block, offset] = k
        cache[1, block, offset] = v


class FlashAttentionHNDBackend(FlashAttentionBackend):
    layout = "HND"


class FlashInferBackend:
    layout = "HND"  # FlashInfer's default on recent GPUs

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        return (num_blocks, 2, block_size, num_kv_heads, head_size)

    @classmethod
    def get_kv_cache_stride_order(cls):
        return (0, 1, 2, 3, 4) if cls.layout == "NHD" else (0, 1, 3, 2, 4)

    @staticmethod
    def write(cache, block, offset, k, v, dim):
        cache[block, 0, offset] = k
        cache[block, 1, offset] = v


class TritonAttentionBackend(FlashInferBackend):
    layout = "NHD"

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        if block_size % 16 != 0:
            raise ValueError("Block size must be a multiple of 16.")
        return (num_blocks, 2, block_size, num_kv_heads, head_size)


class PackedTritonAttentionBackend:
    """The newer non-MLA layout (Triton in newer versions, CPU): K and V packed on the last axis."""
    layout = "NHD"

    @staticmethod
    def get_name():
        return "TRITON_ATTN"

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        if block_size % 16 != 0:
            raise ValueError("Block size must be a multiple of 16.")
        return (num_blocks, num_kv_heads, block_size, 2 * head_size)

    @classmethod
    def get_kv_cache_stride_order(cls):
        return (0, 2, 1, 3) if cls.layout == "NHD" else (0, 1, 2, 3)

    @staticmethod
    def write(cache, block, offset, k, v, dim):
        cache[block, :, offset, :dim] = k
        cache[block, :, offset, dim:] = v


class RocmAttentionBackend(FlashAttentionBackend):
    """ROCm attention (rocm_attn.py @ 7b743ba9): reports FlashAttention's (2, num_blocks, block_size,
    heads, head_size), which its kernels do not use (PagedAttention.split_kv_cache reinterprets the
    bytes)."""

    @staticmethod
    def get_name():
        return "ROCM_ATTN"


class OldFlashAttentionBackend(FlashAttentionBackend):
    """Older versions: get_kv_cache_shape without cache_dtype_str."""

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size):
        if block_size % 16 != 0:
            raise ValueError("Block size must be a multiple of 16.")
        return (2, num_blocks, block_size, num_kv_heads, head_size)


class FlashMLABackend:
    layout = "NHD"

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        if cache_dtype_str == "fp8_ds_mla":  # DeepSeek's 656 bytes a token, whatever head_size says
            return (num_blocks, block_size, 656)
        return (num_blocks, block_size, head_size)

    @classmethod
    def get_kv_cache_stride_order(cls):
        return (0, 1, 2)

    @staticmethod
    def write(cache, block, offset, latent, unused, dim):
        cache[block, offset] = latent


class NvfpFlashInferBackend:
    """A layout kvscope does not know: 2 * num_kv_heads head slots (FlashInfer with NVFP4)."""
    layout = "NHD"

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        return (num_blocks, 2 * num_kv_heads, block_size, head_size)

    @classmethod
    def get_kv_cache_stride_order(cls):
        return (0, 1, 2, 3)


# --- KV cache specs (vllm/v1/kv_cache_interface.py) -----------------------------------------------
class FullAttentionSpec:
    def __init__(self, block_size, num_kv_heads, head_size, dtype, sliding_window=None):
        self.block_size, self.num_kv_heads, self.head_size = block_size, num_kv_heads, head_size
        self.dtype, self.sliding_window = dtype, sliding_window


class SlidingWindowSpec(FullAttentionSpec):
    pass


class MLAAttentionSpec(FullAttentionSpec):
    pass


class MambaSpec:
    """A state-space layer's state: shapes and dtypes, no tokens, no heads (vllm/v1/kv_cache_interface.py
    of the spring of 2026: mamba_type a string, mamba_cache_mode; no page view: the runner hands each
    layer its states, see Cluster._worker)."""

    def __init__(self, block_size, shapes, dtypes, mamba_type="mamba2", mamba_cache_mode="none"):
        self.block_size, self.shapes, self.dtypes = block_size, shapes, dtypes
        self.mamba_type, self.mamba_cache_mode, self.num_speculative_blocks = mamba_type, mamba_cache_mode, 0

    @property
    def page_size_bytes(self):
        return sum(int(np.prod(s)) * torch.tensor([], dtype=d).element_size() for s, d in zip(self.shapes, self.dtypes))


class AttentionLayer(torch.nn.Module):
    """vllm.attention.layer.Attention: its cache, backend and fp8 scales."""

    def __init__(self, backend, k_scale=1.0, v_scale=1.0):
        super().__init__()
        self.attn_backend = backend
        self.kv_sharing_target_layer_name = None
        self.kv_cache = [torch.tensor([])]
        self._k_scale = torch.tensor(k_scale, dtype=torch.float32)
        self._v_scale = torch.tensor(v_scale, dtype=torch.float32)


def allocate(backend, num_kernel_blocks, kernel_block_size, heads, dim, dtype, cache_dtype="auto"):
    """As gpu_model_runner._reshape_kv_cache_tensors: raw storage viewed in the backend's physical
    order, permuted back to the logical shape (so HND and NHD differ only in strides)."""
    shape = backend.get_kv_cache_shape(num_kernel_blocks, kernel_block_size, heads, dim,
                                       *((cache_dtype,) if cache_dtype != "auto" else ()))
    order = backend.get_kv_cache_stride_order()
    physical = tuple(shape[i] for i in order)
    inverse = [order.index(i) for i in range(len(order))]
    raw = torch.randn(int(np.prod(physical)))  # other requests' garbage
    raw = raw.to(dtype) if dtype != torch.uint8 else torch.randint(0, 0x70, raw.shape, dtype=torch.uint8)
    return raw.view(physical).permute(*inverse)


class Group:
    """One KV cache group of the model: its layers, spec and backend."""

    def __init__(self, layer_names, backend, block_size=16, kernel_block_size=None, window=None, mla=False,
                 mamba=False, mamba_dims=None):
        self.layer_names, self.backend, self.block_size = list(layer_names), backend, block_size
        self.kernel_block_size = kernel_block_size or block_size
        self.window, self.mla, self.mamba = window, mla, mamba
        self.mamba_dims = mamba_dims  # a Mamba2 group's Mamba2Dims (tests/mamba2_standin.py); None: Mamba2Dims()


class Cluster:
    """tp x pp workers of one model. total_heads KV heads of head_size (MLA: one latent of head_size,
    replicated on every TP rank); dtype the cache's (torch.uint8 codes with cache_dtype "fp8")."""

    def __init__(self, groups, total_heads=4, head_size=8, tp=1, pp=1, num_blocks=48, dtype=torch.bfloat16,
                 cache_dtype="auto", scales=None, output_dir=None, seed=0, alias=None, replica_fault=None,
                 mla_widths=None):
        self.groups, self.total_heads, self.head_size = groups, total_heads, head_size
        # (tp_rank, layer, position): that rank writes a wrong value there (MLA: its copy of the
        # latent then differs from the other ranks').
        self.replica_fault = replica_fault
        # MLA: (kv_lora_rank, qk_rope_head_dim) as the model config gives them; with cache_dtype
        # "fp8_ds_mla" the cache holds uint8 tokens of rank + 4 * rank / 128 + 2 * rope bytes.
        self.mla_widths = mla_widths or (head_size - head_size // 3, head_size // 3)
        self.cache_dtype = cache_dtype
        self.tp, self.pp, self.num_blocks, self.dtype = tp, pp, num_blocks, dtype
        self.rng = np.random.default_rng(seed)
        self.free = list(self.rng.permutation(np.arange(1, num_blocks)))  # block 0: the null block
        self.layers = [n for g in groups for n in g.layer_names]
        self.alias = alias or {}  # layer -> the layer whose cache it shares
        ordered = sorted(self.layers, key=lambda n: int(n.split(".")[2]))
        per_stage = -(-len(ordered) // pp)
        self.stage_of = {n: i // per_stage for i, n in enumerate(ordered)}
        self.scales = scales or {}
        extra = {"output_dir": output_dir} if output_dir else {}
        self.kv_transfer_config = types.SimpleNamespace(kv_connector_extra_config=extra)
        self.workers = [self._worker(t, p, cache_dtype) for p in range(pp) for t in range(tp)]

    def heads_of_rank(self, rank):
        if self.total_heads >= self.tp:
            per = self.total_heads // self.tp
            return list(range(rank * per, (rank + 1) * per))
        return [rank // (self.tp // self.total_heads)]

    def _spec(self, group):
        heads = 1 if group.mla else max(1, self.total_heads // self.tp)
        dtype = self.dtype
        if group.mamba:  # mamba_utils.py mamba2_state_shape of the spring of 2026 (prefix caching off)
            d = group.mamba_dims or Mamba2Dims()
            groups = d.n_groups + (0 if d.n_groups % self.tp == 0 else self.tp - d.n_groups)
            conv_dim = d.intermediate + 2 * groups * d.d_state
            return MambaSpec(group.block_size, ((d.d_conv - 1, conv_dim // self.tp), (d.heads // self.tp, d.head_dim,
                                                                                     d.d_state)), (dtype, torch.float32))
        if group.mla:
            return MLAAttentionSpec(group.block_size, heads, self.head_size, dtype)
        if group.window:
            return SlidingWindowSpec(group.block_size, heads, self.head_size, dtype, group.window)
        return FullAttentionSpec(group.block_size, heads, self.head_size, dtype)

    def _worker(self, tp_rank, pp_rank, cache_dtype):
        layers, caches, kv_groups = {}, {}, []
        for group in self.groups:
            names = [n for n in group.layer_names if self.stage_of[n] == pp_rank]
            if not names:
                continue
            spec = self._spec(group)
            kv_groups.append(types.SimpleNamespace(layer_names=names, kv_cache_spec=spec))
            ratio = group.block_size // group.kernel_block_size
            for name in names:
                k_scale, v_scale = self.scales.get(name, (1.0, 1.0))
                layer = AttentionLayer(group.backend, k_scale, v_scale)
                if name in self.alias:
                    layer.kv_cache = caches[self.alias[name]]
                    layer.kv_sharing_target_layer_name = self.alias[name]
                elif group.mamba:
                    # gpu_model_runner's _reshape_kv_cache_tensors (spring 2026): per state a view
                    # [num_blocks, *shape] in its dtype, strided by the page into one raw buffer;
                    # the layer's kv_cache is the list of them.
                    raw = torch.zeros(self.num_blocks * spec.page_size_bytes, dtype=torch.int8)
                    states, offset = [], 0
                    for shape, dtype_ in zip(spec.shapes, spec.dtypes):
                        size = torch.tensor([], dtype=dtype_).element_size()
                        inner = torch.empty((self.num_blocks,) + shape).stride()[1:]
                        states.append(torch.as_strided(raw.view(dtype_), (self.num_blocks,) + shape,
                                                       (spec.page_size_bytes // size,) + inner, offset // size))
                        offset += int(np.prod(shape)) * size
                    layer.kv_cache = [states]
                else:
                    layer.kv_cache = [allocate(group.backend, self.num_blocks * ratio, group.kernel_block_size,
                                               spec.num_kv_heads, self.head_size, self.dtype, self.cache_dtype)]
                layers[name], caches[name] = layer, layer.kv_cache
        vllm_config = types.SimpleNamespace(
            parallel_config=types.SimpleNamespace(tensor_parallel_size=self.tp, pipeline_parallel_size=self.pp,
                                                  decode_context_parallel_size=1),
            cache_config=types.SimpleNamespace(cache_dtype=cache_dtype, block_size=self.groups[0].block_size),
            # DeepSeek's config names the latent's two widths (an MLA cache's head_size is their sum).
            model_config=types.SimpleNamespace(get_total_num_kv_heads=lambda: self.total_heads,
                                               hf_text_config=types.SimpleNamespace(
                                                   kv_lora_rank=self.mla_widths[0],
                                                   qk_rope_head_dim=self.mla_widths[1],
                                                   n_groups=next((g.mamba_dims.n_groups for g in self.groups
                                                                  if g.mamba and g.mamba_dims), 1))),
            compilation_config=types.SimpleNamespace(static_forward_context=dict(layers)),
            kv_transfer_config=self.kv_transfer_config)
        kv_cache_config = types.SimpleNamespace(num_blocks=self.num_blocks, kv_cache_groups=kv_groups)
        runner = types.SimpleNamespace(kv_cache_config=kv_cache_config, requests={}, steps=0)

        def execute_model(scheduler_output=None):
            runner.steps += 1
            return None

        runner.execute_model = execute_model
        return types.SimpleNamespace(tp_rank=tp_rank, pp_rank=pp_rank, vllm_config=vllm_config, model_runner=runner,
                                     kv_cache_config=kv_cache_config,
                                     caches={n: c[0] for n, c in caches.items()})

    def call(self, worker, fn, *args, **kwargs):
        parallel_state.set_ranks(worker.tp_rank, worker.pp_rank)
        return fn(*args, **kwargs)

    # --- a request ---------------------------------------------------------------------------------
    def run_request(self, request_id, prompt, output, kv, async_scheduling=False):
        """Prefills and decodes a request: the KV of every position but the last (never written) goes
        into the workers' caches. kv: {layer: (k, v)} [total_heads, >= seq - 1, head_size], or for MLA
        {layer: latent [>= seq - 1, head_size]}. Returns the request (vllm.v1.request.Request's fields)
        and its block ids per group, after a sliding window freed what it left behind (null block 0)."""
        tokens = list(prompt) + list(output)
        written = len(tokens) - 1
        block_ids = []
        for group in self.groups:
            bs = group.block_size
            ids = [int(self.free.pop()) for _ in range(-(-written // bs))]
            block_ids.append(ids)
            for name in group.layer_names:
                for worker in self.workers:
                    if self.stage_of[name] != worker.pp_rank or name in self.alias:
                        continue
                    if group.mamba:  # the request's end state, in its one block (prefix caching off)
                        if name in kv and "ssm" in kv[name]:
                            conv_units, heads = rank_units(group.mamba_dims or Mamba2Dims(), self.tp, worker.tp_rank)
                            conv, ssm = worker.caches[name]
                            block = ids[(written - 1) // bs]
                            conv[block] = torch.from_numpy(kv[name]["conv"][written - 1][conv_units].T.copy()).to(conv.dtype)
                            ssm[block] = torch.from_numpy(kv[name]["ssm"][written - 1][heads].copy())
                        continue
                    cache = worker.caches[name]
                    heads = self.heads_of_rank(worker.tp_rank)
                    for p in range(written):
                        block = ids[p // bs] * (bs // group.kernel_block_size) + (p % bs) // group.kernel_block_size
                        offset = (p % bs) % group.kernel_block_size
                        if group.mla:
                            latent = kv[name][p]
                            if self.replica_fault == (worker.tp_rank, name, p):
                                latent = latent * 1.5
                            group.backend.write(cache, block, offset, latent, None, self.head_size)
                        else:
                            k, v = kv[name]
                            group.backend.write(cache, block, offset, k[heads, p], v[heads, p], self.head_size)
            if group.window:  # blocks wholly before the window are freed: the null block replaces them
                first_held = max(0, written - group.window + 1)
                for b in range(first_held // bs):
                    self.free.insert(0, ids[b])
                    ids[b] = 0
        state = types.SimpleNamespace(block_ids=tuple(block_ids), num_computed_tokens=written)
        # The step's SchedulerOutput, as the first runner's execute_model gets it (one prefill step).
        scheduler_output = types.SimpleNamespace(
            scheduled_new_reqs=[types.SimpleNamespace(req_id=request_id, block_ids=tuple(list(g) for g in block_ids))],
            scheduled_cached_reqs=types.SimpleNamespace(req_ids=[], new_block_ids=[], resumed_req_ids=set()),
            num_scheduled_tokens={request_id: written}, finished_req_ids=set())
        for worker in self.workers:
            worker.model_runner.requests[request_id] = state
            self.call(worker, worker.model_runner.execute_model, scheduler_output)
        # Async scheduling has counted the last sampled token already when the request finishes.
        request = types.SimpleNamespace(request_id=request_id, prompt_token_ids=list(prompt),
                                        output_token_ids=list(output),
                                        num_computed_tokens=written + 1 if async_scheduling else written)
        return request, tuple(block_ids)

    def finish(self, request_id, block_ids):
        """The request leaves the batch and its blocks go back to the pool (no connector holding them)."""
        for worker in self.workers:
            worker.model_runner.requests.pop(request_id, None)
        self.free[:0] = [b for g in block_ids for b in g if b > 0]

    # --- the connector's life cycle ------------------------------------------------------------------
    def connectors(self, connector_cls):
        """One scheduler-side connector and one per worker, as vLLM creates them."""
        scheduler = connector_cls(self.workers[0].vllm_config, KVConnectorRole.SCHEDULER,
                                  self.workers[0].kv_cache_config)
        workers = []
        for worker in self.workers:
            c = self.call(worker, connector_cls, worker.vllm_config, KVConnectorRole.WORKER, worker.kv_cache_config)
            self.call(worker, c.register_kv_caches, dict(worker.caches))
            workers.append(c)
        return scheduler, workers

    def step(self, scheduler, worker_connectors, finished_req_ids):
        """One engine step with no tokens to compute: the scheduler's metadata goes to every worker
        (bind, start_load_kv, get_finished, clear), as KVConnectorModelRunnerMixin does. Returns the
        request ids every worker reported finished sending."""
        meta = scheduler.build_connector_meta(types.SimpleNamespace(finished_req_ids=set(finished_req_ids)))
        reported = []
        for worker, connector in zip(self.workers, worker_connectors):
            def run():
                connector.bind_connector_metadata(meta)
                connector.start_load_kv(types.SimpleNamespace(attn_metadata=None))
                sending, _ = connector.get_finished(set(finished_req_ids))
                connector.clear_connector_metadata()
                return sending or set()
            reported.append(self.call(worker, run))
        for connector in worker_connectors:  # the shards are written off the step: wait for them
            writer = getattr(connector, "_writer", None)
            if writer is not None:
                writer.flush(60)
        return set.intersection(*reported) if reported else set()


class FakeLLM:
    """llm.collective_rpc as vLLM's executor does it: the method on every worker, in global rank
    order, with the worker extension mixed into the worker."""

    def __init__(self, cluster, extension_cls):
        self.cluster = cluster
        worker_cls = type("Worker", (extension_cls,), {})
        self.workers = []
        for w in cluster.workers:
            obj = worker_cls()
            obj.vllm_config, obj.model_runner = w.vllm_config, w.model_runner
            obj.place = w
            self.workers.append(obj)

    def collective_rpc(self, method, args=(), kwargs=None):
        return [self.cluster.call(w.place, getattr(w, method), *args, **(kwargs or {})) for w in self.workers]


class FixedMlaReference(torch.nn.Module):
    """An HF DeepSeek stand-in: attention modules named as HF names them, whose kv_a_layernorm
    outputs the given c_kv and whose cached keys end with the given k_pe (the same for every head,
    after qk_nope_head_dim values), as extract_hf_mla_latents reads them. Fixed random logits."""

    class _Latent(torch.nn.Module):
        def __init__(self, c_kv):
            super().__init__()
            self.c_kv = c_kv

        def forward(self, n):
            return self.c_kv[None, :n]

    def __init__(self, latents_in_model_order, heads=2, nope=4, vocab=16):
        super().__init__()
        self.heads, self.nope, self.vocab = heads, nope, vocab
        self.layers = torch.nn.ModuleList()
        self.k_pe = [k_pe for _, k_pe in latents_in_model_order]
        for c_kv, _ in latents_in_model_order:
            attention = torch.nn.Module()
            attention.kv_a_layernorm = self._Latent(c_kv)
            attention.kv_a_proj_with_mqa = torch.nn.Identity()
            attention.qk_nope_head_dim = nope
            layer = torch.nn.Module()
            layer.self_attn = attention
            self.layers.append(layer)

    def forward(self, input_ids, past_key_values=None, use_cache=True):
        n = input_ids.shape[1]
        cache = []
        for layer, k_pe in zip(self.layers, self.k_pe):
            layer.self_attn.kv_a_layernorm(n)
            rope = k_pe[None, None, :n].expand(1, self.heads, n, k_pe.shape[-1])
            keys = torch.cat([torch.zeros(1, self.heads, n, self.nope, dtype=k_pe.dtype), rope], -1)
            cache.append(types.SimpleNamespace(keys=keys, values=torch.zeros(1, self.heads, n, self.nope)))
        logits = torch.randn(1, n, self.vocab, generator=torch.Generator().manual_seed(n))
        return types.SimpleNamespace(logits=logits, past_key_values=types.SimpleNamespace(layers=cache))


class FixedReference:
    """An HF-interface model whose cache holds given KV (the reference) and whose logits are fixed
    random numbers: model(input_ids=..., use_cache=True) -> .logits, .past_key_values, with
    past_key_values a transformers >= 4.54 Cache (`layers[i].keys / .values`)."""

    def __init__(self, kv_in_model_order, vocab=16, seed=0, states=None):
        """states: {layer index: {'conv': [T, conv_dim, d_conv - 1], 'ssm': [T, ...]}}, row p - 1 the
        state after p tokens: the cache then also holds conv_states (d_conv columns) and ssm_states
        by layer index, as transformers' hybrid caches do."""
        self.kv, self.vocab, self.states = kv_in_model_order, vocab, states or {}
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, input_ids, past_key_values=None, use_cache=True):
        n = input_ids.shape[1]
        layers = [types.SimpleNamespace(keys=k[None, :, :n], values=v[None, :, :n]) for k, v in self.kv]
        logits = torch.randn(1, n, self.vocab, generator=torch.Generator().manual_seed(n))
        cache = types.SimpleNamespace(layers=layers)
        if self.states:
            cache.conv_states = [torch.zeros(0)] * len(layers)
            cache.ssm_states = [torch.zeros(0)] * len(layers)
            for index, state in self.states.items():
                conv = torch.as_tensor(state["conv"][n - 1]).float()
                cache.conv_states[index] = torch.cat([torch.zeros(conv.shape[0], 1), conv], dim=1)[None]
                cache.ssm_states[index] = torch.as_tensor(state["ssm"][n - 1]).float()[None]
        return types.SimpleNamespace(logits=logits, past_key_values=cache)
