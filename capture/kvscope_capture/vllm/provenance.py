"""Where each position's KV came from, as vLLM's scheduler tells a KV connector (scheduler side).

What the connector is told, and where (vllm/v1/core/sched/scheduler.py, the tree of 2026-08-19
c2057261 and the newer copy @ 157ad7e7; vllm/v1/core/sched/output.py @ fc79393b):
- get_num_new_matched_tokens(request, num_computed_tokens) is asked when a waiting request with no
  computed tokens is considered (its first admission, or after a preemption reset it to 0);
  num_computed_tokens is the local prefix-cache hit rounded down to a block.
- update_state_after_alloc(request, blocks, num_external_tokens) follows in the same pass. Inside
  MultiConnector only the connector chosen to load gets the real num_external_tokens (the others
  get 0), so the split comes from request.prefill_stats, which the scheduler sets just before
  (num_local_cached_tokens, num_external_cached_tokens; first admission only).
- build_connector_meta(scheduler_output) is called every step before the scheduler advances
  num_computed_tokens: each scheduled request's NewRequestData / CachedRequestData.num_computed_tokens
  is where this step's tokens start, num_scheduled_tokens how many, scheduled_spec_decode_tokens the
  drafts among them (the last ones). A request resumed after a preemption comes back through
  get_num_new_matched_tokens and is scheduled from its new hit (Model Runner V2: as a new request;
  the first runner: in resumed_req_ids).
- Rejected drafts roll num_computed_tokens back (update_from_output), so the next step writes over
  them; a request's last step is cut at request_finished by its num_computed_tokens.

Positions are painted step by step, a later write over an earlier one; what a request holds when it
finishes is its provenance. With synchronous scheduling that is exact. With async scheduling the
scheduler learns a step's rejections one step late: the positions are then right, but the split
of a speculative step into decode and accepted drafts is not (see capture/README.md)."""

import math


class _Request:
    def __init__(self, prompt_len):
        self.prompt_len = prompt_len
        self.labels = []  # per position: (kind, details as a sorted tuple of items) or None
        self.admitted = False
        self.preemptions = 0
        self.recompute_until = 0  # positions below were computed before the last preemption
        self.aligned_local = 0
        self.split = None  # (local, external) when the scheduler said it
        self.chunks = 0


class ProvenanceTracker:
    """external_connector: the name given to KV another connector loaded (None: no connector
    beside this one loads KV, unless the scheduler says so). block_size: the KV cache manager's
    block size (the prefix-cache blocks' ids are the request's first blocks)."""

    UNNAMED = "unnamed KV connector"

    def __init__(self, external_connector, block_size):
        self.external_connector = external_connector
        self.block_size = int(block_size)
        self._requests = {}
        self._step = -1

    def _track(self, request_id, prompt_len):
        track = self._requests.get(request_id)
        if track is None:
            track = self._requests[request_id] = _Request(prompt_len)
        return track

    # --- the scheduler's calls -----------------------------------------------------------------
    def matched(self, request, num_computed_tokens):
        """get_num_new_matched_tokens: the request is being admitted (again)."""
        track = self._track(request.request_id, len(request.prompt_token_ids or ()))
        if track.admitted:  # it ran before: a preemption sent it back to the waiting queue
            track.preemptions += 1
            # What it had written and kept: every token it knows but the last (no KV yet).
            kept = max(0, min(len(track.labels), _num_tokens(request) - 1))
            del track.labels[kept:]
            track.recompute_until = kept
            track.admitted = False
        track.aligned_local = int(num_computed_tokens)
        track.split = None

    def allocated(self, request, num_external_tokens):
        """update_state_after_alloc: how many of the computed tokens are local and external."""
        track = self._requests.get(request.request_id)
        if track is None or track.admitted:
            return
        stats = getattr(request, "prefill_stats", None)
        if num_external_tokens:
            track.split = (track.aligned_local, int(num_external_tokens))
        elif stats is not None and track.preemptions == 0 and hasattr(stats, "num_external_cached_tokens"):
            track.split = (int(stats.num_local_cached_tokens), int(stats.num_external_cached_tokens))

    def scheduled(self, scheduler_output):
        """build_connector_meta: paints the positions every scheduled request writes this step."""
        self._step += 1
        starts, blocks = {}, {}
        for new in getattr(scheduler_output, "scheduled_new_reqs", None) or ():
            starts[new.req_id] = int(new.num_computed_tokens)
            blocks[new.req_id] = new.block_ids
            self._track(new.req_id, len(new.prompt_token_ids or ()))
        cached = getattr(scheduler_output, "scheduled_cached_reqs", None)
        resumed = getattr(cached, "resumed_req_ids", set()) or set()
        for i, rid in enumerate(getattr(cached, "req_ids", None) or ()):
            starts[rid] = int(cached.num_computed_tokens[i])
            if rid in resumed and cached.new_block_ids[i] is not None:
                blocks[rid] = cached.new_block_ids[i]  # a resumed request's whole block list
        spec = getattr(scheduler_output, "scheduled_spec_decode_tokens", None) or {}
        for rid, n in (getattr(scheduler_output, "num_scheduled_tokens", None) or {}).items():
            track = self._requests.get(rid)
            if track is None or rid not in starts:
                continue
            start = starts[rid]
            if not track.admitted:
                self._admit(track, start, blocks.get(rid))
            drafts = len(spec.get(rid, ()))
            self._paint(track, start, int(n), drafts)

    def finished(self, request, written):
        """request_finished: the request's ranges [(start, end, kind, details)] over its first
        `written` positions (those whose KV is written), and forgets it."""
        track = self._requests.pop(request.request_id, None)
        if track is None:
            return []
        labels = track.labels[:written]
        ranges, start = [], 0
        for p in range(1, len(labels) + 1):
            if p == len(labels) or labels[p] != labels[start]:
                if labels[start] is not None:
                    kind, details = labels[start]
                    ranges.append((start, p, kind, {k: list(v) if isinstance(v, tuple) else v for k, v in details}))
                start = p
        return ranges

    def forget(self, request_id):
        self._requests.pop(request_id, None)

    # --- painting ------------------------------------------------------------------------------
    def _set(self, track, p, label):
        if p >= len(track.labels):
            track.labels.extend([None] * (p + 1 - len(track.labels)))
        track.labels[p] = label

    def _admit(self, track, start, block_ids):
        """The request's first step since its admission: the positions it starts with were served
        from the prefix cache or loaded by another connector."""
        track.admitted = True
        if track.split is not None:
            local, external = track.split
        elif self.external_connector is not None and start > track.aligned_local:
            local, external = track.aligned_local, start - track.aligned_local
        else:
            local, external = start, 0
        local = min(local, start)
        first = list(block_ids[0]) if block_ids else []
        used = first[:math.ceil(local / self.block_size)] if local else []
        for p in range(local):
            self._set(track, p, ("prefix_cache", (("blocks", tuple(used)),)))
        for p in range(local, min(local + external, start)):
            self._set(track, p, ("external", (("connector", self.external_connector or self.UNNAMED),)))

    def _paint(self, track, start, n, drafts):
        prefill = False
        for p in range(start, start + n):
            if p < track.recompute_until:
                label = ("recomputed", (("preemption", track.preemptions - 1),))
            elif p >= start + n - drafts:
                label = ("spec_accepted", (("step", self._step),))  # kept only if accepted
            elif p < track.prompt_len:
                label, prefill = ("prefill", (("chunk", track.chunks),)), True
            else:
                label = ("decode", (("step", self._step),))
            self._set(track, p, label)
        if prefill:
            track.chunks += 1


def _num_tokens(request):
    """Request.num_tokens: the prompt and the output tokens so far."""
    value = getattr(request, "num_tokens", None)
    if value is not None:
        return int(value)
    return len(request.prompt_token_ids or ()) + len(getattr(request, "output_token_ids", ()) or ())
