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
connector beside this one in MultiConnector, e.g. "NixlConnector"); state_checkpoints (default
true): with mamba_cache_mode "align" or "all", also keep the recurrent states vLLM writes at block
boundaries (false: the state at the request's end only).

State-space layers (hybrid models' MambaSpec groups: Mamba2, Gated DeltaNet): the shard holds each
layer's state, this rank's rows (mamba_state.py), at the request's end and, with
state_checkpoints, at each block boundary vLLM keeps a state of. vLLM frees a request's earlier
state blocks as it advances, so the scheduler names, in each step's metadata, the blocks that
step's forward leaves a boundary state in, and every worker copies them to the host in
wait_for_save, after that forward: each costs the copy of one state page per layer, held in host
memory until the request's shard is written.

How (vllm/distributed/kv_transfer/kv_connector/v1/base.py): the scheduler calls request_finished
once a request is done, before its blocks are freed. The connector answers True (the blocks stay
held) and hands the request's block ids and tokens to the workers in the next step's connector
metadata. Each worker copies those blocks to the host in start_load_kv (called every step, with or
without a forward pass; since August 2026 after the step's forward unless the step loads KV
synchronously: either way the blocks are held), hands them to a background writer
(shard_queue.py), and reports the request in get_finished (which vLLM's get_transfer_results
wraps), which frees the blocks. Only the request's blocks are read; nothing is
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
import types

from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1, KVConnectorMetadata,
                                                                KVConnectorRole, SupportsHMA)

from ..shards import shard_path
from .provenance import ProvenanceTracker
from .mamba_state import step_checkpoints
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
    """dumps: requests finished, to copy out; state_checkpoints: {request: [(vLLM group, block,
    position)]}, the boundary states this step's forward leaves; forget: requests whose states
    the workers may drop (finished and not captured)."""

    def __init__(self, dumps, state_checkpoints=None, forget=()):
        self.dumps = list(dumps)
        self.state_checkpoints = dict(state_checkpoints or {})
        self.forget = set(forget)


def _state_groups(kv_cache_config):
    """{vLLM group: (block_size, mamba_cache_mode)} of the MambaSpec groups."""
    groups = {}
    for g, group in enumerate(getattr(kv_cache_config, "kv_cache_groups", None) or ()):
        spec = group.kv_cache_spec
        per_layer = getattr(spec, "kv_cache_specs", None)
        spec = next(iter(per_layer.values())) if per_layer else spec
        if type(spec).__name__ == "MambaSpec" and not int(getattr(spec, "num_speculative_blocks", 0) or 0):
            groups[g] = (int(spec.block_size), str(getattr(spec, "mamba_cache_mode", "none")))
    return groups


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
        checkpoints = extra.get("state_checkpoints", True)
        self._state_groups = _state_groups(kv_cache_config) if checkpoints else {}
        self._state_groups = {g: v for g, v in self._state_groups.items() if v[1] in ("all", "align")}
        self._state_blocks = {}  # request -> its block ids per vLLM group, as the workers' tables hold them
        self._forget = set()
        if role == KVConnectorRole.SCHEDULER:
            self._provenance = ProvenanceTracker(extra.get("external_connector"), _block_size(vllm_config,
                                                                                               kv_cache_config))
        # Worker side
        self._checkpoints = {}  # request -> {position: {layer: {part: tensor}}}, copied after each forward
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

    def _may_be_wanted(self, request_id):
        """Before it finishes: whether a request may be captured (its states are kept until then)."""
        if self._max_requests is not None and self._captured >= int(self._max_requests):
            return False
        ids = [str(request_id), given_request_id(types.SimpleNamespace(request_id=request_id))]
        return not self._prefixes or any(i.startswith(p) for i in ids for p in self._prefixes)

    def _state_marks(self, scheduler_output):
        """{request: [(vLLM group, block, position)]}: the block-boundary states this step leaves
        (mamba_state.step_checkpoints), from each scheduled request's block table (the workers'
        append-only rows: new requests' block_ids, then new_block_ids; a resumed request's anew)."""
        starts = {}
        for new in getattr(scheduler_output, "scheduled_new_reqs", None) or ():
            starts[new.req_id] = int(new.num_computed_tokens)
            self._state_blocks[new.req_id] = [list(ids) for ids in new.block_ids]
        cached = getattr(scheduler_output, "scheduled_cached_reqs", None)
        resumed = getattr(cached, "resumed_req_ids", set()) or set()
        for i, rid in enumerate(getattr(cached, "req_ids", None) or ()):
            starts[rid] = int(cached.num_computed_tokens[i])
            more = cached.new_block_ids[i]
            if more is None:
                continue
            if rid in resumed or rid not in self._state_blocks:
                self._state_blocks[rid] = [list(ids) for ids in more]
            else:
                for ids, extra in zip(self._state_blocks[rid], more):
                    ids.extend(extra)
        spec = getattr(scheduler_output, "scheduled_spec_decode_tokens", None) or {}
        marks = {}
        for rid, n in (getattr(scheduler_output, "num_scheduled_tokens", None) or {}).items():
            if rid not in starts or spec.get(rid) or not self._may_be_wanted(rid):
                continue
            blocks = self._state_blocks.get(rid) or []
            for g, (block_size, mode) in self._state_groups.items():
                for position, slot in step_checkpoints(mode, block_size, starts[rid], starts[rid] + int(n)):
                    if g < len(blocks) and slot < len(blocks[g]) and blocks[g][slot] > 0:
                        marks.setdefault(rid, []).append((g, blocks[g][slot], position))
        return marks

    def request_finished(self, request, block_ids):
        """One KV cache group: block_ids is its list."""
        return self.request_finished_all_groups(request, (list(block_ids),))

    def request_finished_all_groups(self, request, block_ids):
        self._state_blocks.pop(request.request_id, None)
        if not self._wanted(request) or not any(len(g) for g in block_ids):
            self._provenance.forget(request.request_id)
            if self._state_groups:
                self._forget.add(request.request_id)
            return False, None
        self._captured += 1
        dump = KvscopeDump(request.request_id, request.prompt_token_ids, request.output_token_ids,
                           request.num_computed_tokens, block_ids, given_request_id(request), kv_role=self._kv_role)
        dump.provenance = self._provenance.finished(request, dump.num_computed_tokens)
        self._pending.append(dump)
        return True, None  # held until the workers report it in get_finished

    def build_connector_meta(self, scheduler_output):
        self._provenance.scheduled(scheduler_output)
        marks = self._state_marks(scheduler_output) if self._state_groups else {}
        meta = KvscopeConnectorMetadata(self._pending, marks, self._forget)
        self._pending, self._forget = [], set()
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
            states = self._checkpoints.pop(dump.request_id, {})  # its boundary states, copied step by step
            if self._writer.has_room():
                ids = {b for group in dump.block_ids for b in group if b > 0}  # 0: vLLM's null block
                for position, layers in caches.read_states(
                        caches.final_state_marks(dump.block_ids, dump.num_computed_tokens)).items():
                    states.setdefault(position, {}).update(layers)
                self._writer.submit(path, dump, caches.config, caches.read(ids), caches.tp_rank, caches.pp_rank,
                                    caches.state_records(states))
            else:
                self._writer.skip(path, dump.request_id, f"the shard writer's queue was full "
                                                         f"(max_pending_requests {self._max_pending})")
            self._copied.add(dump.request_id)

    def wait_for_layer_load(self, layer_name):
        return None

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        return None  # the blocks are read whole once the request has finished

    def wait_for_save(self):
        """After the step's forward: the block-boundary states it left, copied before the scheduler
        frees their blocks."""
        if not self.has_connector_metadata():
            return None
        metadata = self._get_connector_metadata()
        for rid in getattr(metadata, "forget", ()):
            self._checkpoints.pop(rid, None)
        marks = getattr(metadata, "state_checkpoints", None)
        if marks:
            caches = self._rank_caches()
            for rid, request_marks in marks.items():
                for position, layers in caches.read_states(request_marks).items():
                    self._checkpoints.setdefault(rid, {}).setdefault(position, {}).update(layers)
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
