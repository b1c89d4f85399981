"""A vLLM worker extension with the KV-cache RPCs of the vLLM-Neuron worker, for upstream vLLM on GPU:

    llm = LLM(model, worker_extension_cls="kvscope_capture.vllm.KvscopeWorkerExtension", ...)
    llm.collective_rpc("enable_block_table_snapshots")  # before the requests: follow their blocks
    llm.collective_rpc("get_kv_cache_config")   # per worker: the config, as kvscope reads it
    llm.collective_rpc("get_kv_caches")         # per worker: {layer: torch.save({'k', 'v', ...})}
    llm.collective_rpc("get_block_tables")      # per worker: [torch.save(int32 [batch, blocks])] per group

vLLM mixes the class into its Worker (vllm/v1/worker/worker_base.py), so `self` is the worker and
`self.model_runner` its model runner: the first one (vllm/v1/worker/gpu_model_runner.py, which
keeps `requests[id].block_ids`) or Model Runner V2 (vllm/v1/worker/gpu/model_runner.py, which
vLLM chose for dense models from May 2026, and, once connectors no longer sent it back to the
first runner, with them too; it keeps its block tables on the GPU only).

Block ids: both runners are handed each step's SchedulerOutput. Once `enable_block_table_snapshots`
has run (make_kv_extract_fn calls it), every step's new requests' `block_ids` and running requests'
`new_block_ids` are followed (a request resumed after preemption gets its list anew: Model Runner
V2 is sent it as a new request, the first runner as a resumed one), and the last
step's requests are kept after they finish: vLLM frees a finished request's blocks at once, and
with them its row of the block table. The blocks keep their bytes until another request takes
them: capture one request at a time, with prefix caching off (the validation loop does).
"""

import io

from .rank_caches import RankCaches, _tensor, block_tables

_V2_NEEDS_SNAPSHOTS = ("this worker's model runner (Model Runner V2) keeps no block ids per request outside the "
                       "GPU: call llm.collective_rpc('enable_block_table_snapshots') before the requests run "
                       "(make_kv_extract_fn does), or capture with KvscopeConnector")


def _torch_save(obj):
    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _parallel_ranks():
    """This worker's (tp_rank, pp_rank)."""
    from vllm.distributed import parallel_state

    return parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_pp_group().rank_in_group


def forward_layers(vllm_config):
    """{layer name: attention module} of this worker (their caches, backends and scales)."""
    context = vllm_config.compilation_config.static_forward_context
    return {name: module for name, module in context.items() if hasattr(module, "kv_cache")}


def _groups(block_ids):
    return tuple(list(g) for g in block_ids)


class BlockIdTracker:
    """Each request's block ids per vLLM KV cache group, followed from the SchedulerOutput that
    every step hands the model runner (vllm/v1/core/sched/output.py); works on both runners."""

    def __init__(self):
        self.block_ids = {}
        self.last_batch = []  # [(request id, block ids)] of the last step that ran requests

    def observe(self, scheduler_output):
        if scheduler_output is None:
            return
        for new in getattr(scheduler_output, "scheduled_new_reqs", None) or []:
            self.block_ids[new.req_id] = _groups(new.block_ids)
        cached = getattr(scheduler_output, "scheduled_cached_reqs", None)
        if cached is not None:
            resumed = set(getattr(cached, "resumed_req_ids", None) or ())
            # vLLM before resumed_req_ids: a flag per request.
            for rid, flag in zip(cached.req_ids, getattr(cached, "resumed_from_preemption", None) or ()):
                if flag:
                    resumed.add(rid)
            for rid, new_ids in zip(cached.req_ids, cached.new_block_ids):
                if new_ids is None:
                    continue
                if rid in resumed or rid not in self.block_ids:
                    self.block_ids[rid] = _groups(new_ids)
                else:
                    for group, ids in zip(self.block_ids[rid], new_ids):
                        group.extend(ids)
        scheduled = [rid for rid in getattr(scheduler_output, "num_scheduled_tokens", None) or {}
                     if rid in self.block_ids]
        if scheduled:  # a step without requests keeps the last one's
            self.last_batch = [(rid, _groups(self.block_ids[rid])) for rid in scheduled]
        for rid in getattr(scheduler_output, "finished_req_ids", None) or ():
            self.block_ids.pop(rid, None)


class KvscopeWorkerExtension:
    def _kvscope_caches(self):
        """This worker's caches as kvscope reads them, built anew whenever the runner registered
        other tensors (Model Runner V2 may initialise its KV cache again)."""
        runner = self.model_runner
        layers = forward_layers(self.vllm_config)
        caches = {name: module.kv_cache for name, module in layers.items()}
        key = (id(runner.kv_cache_config),
               tuple((name, _data_ptr(tensor)) for name, tensor in sorted(caches.items())))
        if getattr(self, "_kvscope_key", None) != key:
            tp_rank, pp_rank = _parallel_ranks()
            self._kvscope_rank_caches = RankCaches(runner.kv_cache_config, self.vllm_config, caches, layers,
                                                   tp_rank, pp_rank)
            self._kvscope_key = key
        return self._kvscope_rank_caches

    def enable_block_table_snapshots(self):
        """From now on, every step's requests and block ids are followed (see the module's note)."""
        if getattr(self, "_kvscope_tracker", None) is not None:
            return True
        tracker = BlockIdTracker()
        runner = self.model_runner
        execute = runner.execute_model

        def execute_and_record(scheduler_output=None, *args, **kwargs):
            tracker.observe(scheduler_output)
            return execute(scheduler_output, *args, **kwargs)

        runner.execute_model = execute_and_record
        self._kvscope_tracker = tracker
        return True

    def get_kv_cache_config(self):
        """The KV cache config as kvscope reads it (docs/bundle-format.md), from vLLM's KVCacheConfig,
        with this worker's tp_rank / pp_rank and pipeline stage's layers."""
        caches = self._kvscope_caches()
        return dict(caches.config, tp_rank=caches.tp_rank, pp_rank=caches.pp_rank)

    def get_request_ids(self):
        """The request ids of get_block_tables' rows, in order."""
        return [rid for rid, _ in self._kvscope_batch()]

    def _kvscope_batch(self):
        """[(request id, block ids per vLLM group)]: the last step's requests as followed, or
        without snapshots the first runner's batch now."""
        tracker = getattr(self, "_kvscope_tracker", None)
        if tracker is not None and tracker.last_batch:
            return tracker.last_batch
        requests = getattr(self.model_runner, "requests", None)
        if requests is None:
            raise RuntimeError(_V2_NEEDS_SNAPSHOTS)
        return [(rid, _groups(state.block_ids)) for rid, state in requests.items()]

    def get_block_tables(self):
        """[torch.save(int32 tensor [batch, max_blocks])] per group, -1 for null blocks; rows as
        get_request_ids orders them."""
        config = self._kvscope_caches().config
        return [_torch_save(t) for t in block_tables(config, [ids for _, ids in self._kvscope_batch()])]

    def get_kv_caches(self, all_blocks=False):
        """{layer: torch.save({'k': k, 'v': v, 'block_ids': ids, scales...})}, k and v
        [len(ids), heads_per_rank, block_size, head_size]: the blocks of the batch's requests
        (all_blocks: the whole pool, as the Neuron RPC returns it; a GPU's pool is many GB)."""
        caches = self._kvscope_caches()
        if all_blocks:
            ids = range(caches.config["num_blocks"])
        else:
            ids = {b for _, groups in self._kvscope_batch() for g in groups for b in g if b > 0}
        return {name: _torch_save(entry) for name, entry in caches.read(ids).items()}


def _data_ptr(value):
    tensor = _tensor(value)
    return tensor.data_ptr() if tensor is not None else id(value)
