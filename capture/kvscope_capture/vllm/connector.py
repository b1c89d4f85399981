"""A vLLM KV connector that writes each finished request's KV cache to a shard file per worker
(TP rank x PP stage), for `python3 -m kvscope_capture bundle` to merge into a bundle.

    LLM(model, kv_transfer_config=KVTransferConfig(
        kv_connector="KvscopeConnector", kv_connector_module_path="kvscope_capture.vllm.connector",
        kv_role="kv_producer", kv_connector_extra_config={"output_dir": "kv-shards"}))

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvscopeConnector",
        "kv_connector_module_path": "kvscope_capture.vllm.connector", "kv_role": "kv_producer",
        "kv_connector_extra_config": {"output_dir": "kv-shards"}}'

Options (kv_connector_extra_config): output_dir (required); requests: request id prefixes to
capture, matched against the id the user gave and the engine's (which vLLM suffixes with
"-<8 hex>"; default: every request); max_requests: stop capturing after this many;
max_pending_requests: requests copied to the host and not yet written, at most (default 8);
external_connector: the name the provenance gives KV that another connector loaded (the transfer
connector beside this one in MultiConnector, e.g. "NixlConnector").

How (vllm/distributed/kv_transfer/kv_connector/v1/base.py): the scheduler calls request_finished
once a request is done, before its blocks are freed. The connector answers True (the blocks stay
held) and hands the request's block ids and tokens to the workers in the next step's connector
metadata. Each worker copies those blocks to the host in start_load_kv (called every step, with or
without a forward pass), hands them to a background writer (shard_queue.py), and reports the
request in get_finished, which frees the blocks. Only the request's blocks are read; nothing is
held for longer than one step, and the step pays the device-to-host copy only. When the writer's
queue is full the request is skipped and counted, and a marker file names it.

Each shard says where each position's KV came from (provenance.py): the scheduler side follows
what vLLM tells connectors of every request (its prefix-cache hit, another connector's load, the
prefill chunks, decode steps, accepted drafts and preemptions).

At both ends of a disaggregated deployment (NixlConnector's kv_producer and kv_consumer), beside the
transfer connector in MultiConnector: on the producer the blocks copied are those request_finished
hands the transfer connector to send; on the consumer the request runs only once the transfer
connector has reported its load finished (get_finished), so the blocks copied when it finishes
hold what was loaded, marked `external` in the provenance.

Beside another connector (LMCache, NIXL, offloading), vLLM's MultiConnector runs both:
kv_connector "MultiConnector" with kv_connector_extra_config {"connectors": [{...kvscope's
KVTransferConfig...}, {...the other's...}]}; a request's blocks are freed when both are done.
"""

import os
import re

from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1, KVConnectorMetadata,
                                                                KVConnectorRole, SupportsHMA)

from ..shards import shard_path
from .provenance import ProvenanceTracker
from .rank_caches import RankCaches
from .shard_queue import ShardQueue
from .worker_extension import _parallel_ranks, forward_layers


# vLLM makes a request's id unique inside the engine as "<the id given>-<8 hex>"
# (vllm/v1/engine/input_processor.py, assign_request_id), and a parallel-sampling child's as
# "<index>_<that>" (parallel_sampling.py); the scheduler's Request keeps only that id.
_ENGINE_ID = re.compile(r"^(?:\d+_)?(?P<given>.+)-[0-9a-f]{8}$")


def given_request_id(request):
    """The id the user gave a request, as far as the engine's id tells it."""
    given = getattr(request, "external_req_id", None)
    if given:
        return str(given)
    match = _ENGINE_ID.match(str(request.request_id))
    return match.group("given") if match else str(request.request_id)


class KvscopeDump:
    """One finished request, as the scheduler hands it to the workers."""

    def __init__(self, request_id, prompt_token_ids, output_token_ids, num_computed_tokens, block_ids,
                 external_request_id=None, provenance=None, kv_role=None):
        self.request_id = request_id
        self.external_request_id = external_request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids = list(output_token_ids)
        # The last sampled token has no KV. With async scheduling vLLM has already counted it
        # (num_computed_tokens == every token) when the request finishes.
        self.num_computed_tokens = min(int(num_computed_tokens),
                                       len(self.prompt_token_ids) + len(self.output_token_ids) - 1)
        self.block_ids = tuple(list(g) for g in block_ids)  # per vLLM KV cache group
        self.provenance = list(provenance or [])  # [(start, end, kind, details)]
        self.kv_role = kv_role


class KvscopeConnectorMetadata(KVConnectorMetadata):
    def __init__(self, dumps):
        self.dumps = list(dumps)


class KvscopeConnector(KVConnectorBase_V1, SupportsHMA):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        try:
            super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        except TypeError:  # vLLM before connectors were handed the KV cache config
            super().__init__(vllm_config=vllm_config, role=role)
        extra = dict(getattr(self._kv_transfer_config, "kv_connector_extra_config", None) or {})
        if not extra.get("output_dir"):
            raise ValueError("KvscopeConnector: kv_connector_extra_config needs output_dir (where the shards go)")
        self._output_dir = os.fspath(extra["output_dir"])
        self._prefixes = [str(p) for p in extra.get("requests", [])]
        self._max_requests = extra.get("max_requests")
        self._max_pending = int(extra.get("max_pending_requests", 8))
        self._kv_cache_config = kv_cache_config
        self._kv_role = getattr(self._kv_transfer_config, "kv_role", None)
        # Scheduler side
        self._pending = []
        self._captured = 0
        self._provenance = None
        if role == KVConnectorRole.SCHEDULER:
            self._provenance = ProvenanceTracker(extra.get("external_connector"), _block_size(vllm_config,
                                                                                               kv_cache_config))
        # Worker side
        self._caches = None
        self._registered = None
        self._expected = set()  # requests handed to this worker to dump
        self._copied = set()
        self._reported_finished = set()
        self._writer = None
        if role == KVConnectorRole.WORKER:
            os.makedirs(self._output_dir, exist_ok=True)
            self._writer = ShardQueue(self._max_pending)

    # --- scheduler side --------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        self._provenance.matched(request, num_computed_tokens)
        return 0, False  # kvscope only reads; it never loads KV into vLLM

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self._provenance.allocated(request, num_external_tokens)

    def _wanted(self, request):
        if self._max_requests is not None and self._captured >= int(self._max_requests):
            return False
        if not request.prompt_token_ids:  # prompt embeddings: no token ids to give the reference
            return False
        ids = [request.request_id, given_request_id(request)]
        return not self._prefixes or any(i.startswith(p) for i in ids for p in self._prefixes)

    def request_finished(self, request, block_ids):
        """One KV cache group: block_ids is its list."""
        return self.request_finished_all_groups(request, (list(block_ids),))

    def request_finished_all_groups(self, request, block_ids):
        if not self._wanted(request) or not any(len(g) for g in block_ids):
            self._provenance.forget(request.request_id)
            return False, None
        self._captured += 1
        dump = KvscopeDump(request.request_id, request.prompt_token_ids, request.output_token_ids,
                           request.num_computed_tokens, block_ids, given_request_id(request), kv_role=self._kv_role)
        dump.provenance = self._provenance.finished(request, dump.num_computed_tokens)
        self._pending.append(dump)
        return True, None  # held until the workers report it in get_finished

    def build_connector_meta(self, scheduler_output):
        self._provenance.scheduled(scheduler_output)
        meta = KvscopeConnectorMetadata(self._pending)
        self._pending = []
        return meta

    # --- worker side ---------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches):
        """Every layer is checked against its spec here, so that one kvscope cannot read stops the
        engine at start-up, not at the first finished request. A runner that registers again
        (Model Runner V2 initialising its KV cache anew) gets its caches read anew."""
        self._registered = dict(kv_caches)
        self._caches = None
        self._rank_caches()

    def _rank_caches(self):
        if self._caches is None:
            if self._kv_cache_config is None:
                raise ValueError("KvscopeConnector: this vLLM does not hand connectors their KV cache config; "
                                 "use kvscope_capture.vllm.KvscopeWorkerExtension instead")
            if self._registered is None:
                raise ValueError("KvscopeConnector: no KV caches were registered (register_kv_caches)")
            tp_rank, pp_rank = _parallel_ranks()
            self._caches = RankCaches(self._kv_cache_config, self._vllm_config, self._registered,
                                      forward_layers(self._vllm_config), tp_rank, pp_rank)
        return self._caches

    def start_load_kv(self, forward_context, **kwargs):
        """Every step: the requests the scheduler finished are copied out and written."""
        if not self.has_connector_metadata():
            return
        metadata = self._get_connector_metadata()
        dumps = getattr(metadata, "dumps", [])
        if not dumps:
            return
        caches = self._rank_caches()
        self._expected |= {dump.request_id for dump in dumps}
        for dump in dumps:
            path = shard_path(self._output_dir, dump.request_id, caches.tp_rank, caches.pp_rank)
            if self._writer.has_room():
                ids = {b for group in dump.block_ids for b in group if b > 0}  # 0: vLLM's null block
                self._writer.submit(path, dump, caches.config, caches.read(ids), caches.tp_rank, caches.pp_rank)
            else:
                self._writer.skip(path, dump.request_id, f"the shard writer's queue was full "
                                                         f"(max_pending_requests {self._max_pending})")
            self._copied.add(dump.request_id)

    def wait_for_layer_load(self, layer_name):
        return None

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        return None  # the blocks are read whole once the request has finished

    def wait_for_save(self):
        return None

    def shutdown(self):
        """Writes what is queued before the worker goes."""
        if self._writer is not None:
            self._writer.flush(120.0)

    def get_finished(self, finished_req_ids):
        """Requests whose blocks are copied out (or skipped): their blocks can be freed. vLLM expects
        only ids it has announced as finished (in this call or an earlier one)."""
        self._reported_finished |= set(finished_req_ids) & self._expected  # only ours: the set stays small
        done = self._copied & self._reported_finished
        self._copied -= done
        self._reported_finished -= done
        self._expected -= done
        return (done or None), None


def _block_size(vllm_config, kv_cache_config):
    """The KV cache manager's block size: the first KV cache group's, else the cache config's."""
    try:
        return int(kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size)
    except (AttributeError, IndexError, TypeError):
        return int(vllm_config.cache_config.block_size)
