"""A vLLM worker extension with the KV-cache RPCs of the vLLM-Neuron worker, for upstream vLLM on GPU:

    llm = LLM(model, worker_extension_cls="kvscope_capture.vllm.KvscopeWorkerExtension", ...)
    llm.collective_rpc("get_kv_cache_config")   # per worker: the config, as kvscope reads it
    llm.collective_rpc("get_kv_caches")         # per worker: {layer: torch.save({'k', 'v', ...})}
    llm.collective_rpc("get_block_tables")      # per worker: [torch.save(int32 [batch, blocks])] per group

vLLM mixes the class into its Worker (vllm/v1/worker/worker_base.py), so `self` is the worker and
`self.model_runner` its GPUModelRunner. kvscope_capture's extract_vllm_* functions, and with them
the seed's teacher-forced validation loop (make_kv_extract_fn), work unchanged on top.

Block tables: vLLM frees a finished request's blocks at once, and with them its row of the block
table. Once `enable_block_table_snapshots` has run (make_kv_extract_fn calls it), each step
records its requests' block ids, so that get_block_tables returns the last step's requests even
after they finished. Their blocks keep their bytes until another request takes them: capture one
request at a time, with prefix caching off (the validation loop does).
"""

import io

from .rank_caches import RankCaches, block_tables


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


class KvscopeWorkerExtension:
    def _kvscope_caches(self):
        if getattr(self, "_kvscope_rank_caches", None) is None:
            runner = self.model_runner
            layers = forward_layers(self.vllm_config)
            caches = {name: module.kv_cache for name, module in layers.items()}
            tp_rank, pp_rank = _parallel_ranks()
            self._kvscope_rank_caches = RankCaches(runner.kv_cache_config, self.vllm_config, caches, layers,
                                                   tp_rank, pp_rank)
        return self._kvscope_rank_caches

    def _kvscope_running(self):
        """[(request id, block ids per vLLM group)] of the requests in this worker's batch now."""
        return [(rid, tuple(list(g) for g in state.block_ids)) for rid, state in self.model_runner.requests.items()]

    def enable_block_table_snapshots(self):
        """From now on, every step records its requests' block ids (see the module's note)."""
        if getattr(self, "_kvscope_last_batch", None) is not None:
            return True
        self._kvscope_last_batch = self._kvscope_running()
        runner = self.model_runner
        execute = runner.execute_model

        def execute_and_record(*args, **kwargs):
            result = execute(*args, **kwargs)
            batch = self._kvscope_running()
            if batch:  # a step without requests keeps the last one's
                self._kvscope_last_batch = batch
            return result

        runner.execute_model = execute_and_record
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
        recorded = getattr(self, "_kvscope_last_batch", None)
        running = self._kvscope_running()
        return running if running or recorded is None else recorded

    def get_block_tables(self):
        """[torch.save(int32 tensor [batch, max_blocks])] per group, -1 for null blocks; rows as
        get_request_ids orders them."""
        config = self._kvscope_caches().config
        return [_torch_save(t) for t in block_tables(config, [ids for _, ids in self._kvscope_batch()])]

    def get_kv_caches(self, all_blocks=False):
        """{layer: torch.save({'k': k, 'v': v, 'block_ids': ids[, 'k_scale', 'v_scale']})}, k and v
        [len(ids), heads_per_rank, block_size, head_size]: the blocks of the batch's requests
        (all_blocks: the whole pool, as the Neuron RPC returns it; a GPU's pool is many GB)."""
        caches = self._kvscope_caches()
        if all_blocks:
            ids = range(caches.config["num_blocks"])
        else:
            ids = {b for _, groups in self._kvscope_batch() for g in groups for b in g if b > 0}
        return {name: _torch_save(entry) for name, entry in caches.read(ids).items()}
