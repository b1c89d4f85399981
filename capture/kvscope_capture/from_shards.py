"""A bundle from KvscopeConnector's shards and a HuggingFace reference: every captured request
becomes a prompt, with the engine's blocks as it held them when the request finished, and the
reference model teacher-forced over the same tokens (the engine's own output)."""

import re

from .bundle_writer import BundleWriter
from .extract import extract_hf_kv_caches_teacher_forced
from .hf_reference import extract_hf_mamba_states, extract_hf_mla_latents
from .shards import ShardSet, safe_name


def prompt_names(requests):
    """{engine request id: prompt id}: the id the user gave where it names one request (vLLM makes
    it unique inside the engine by appending "-<8 hex>"), else the engine's."""
    given = [r.external_request_id for r in requests]
    return {r.request_id: safe_name(r.external_request_id if r.external_request_id and given.count(
        r.external_request_id) == 1 else r.request_id) for r in requests}


def bundle_from_shards(shard_dir, out_path, expected_model, baseline_model=None, tokenizer=None,
                       request_ids=None, model="", log=print):
    """Writes `out_path` from the shards in `shard_dir`. expected_model / baseline_model: HF models
    (bf16 and fp32) with the HF call interface; expected_model None writes an engine-only bundle
    (each end of a KV transfer, compared with kvscope transfer). tokenizer (optional) names the
    tokens. request_ids: prefixes of the requests to take (default: all complete ones). Returns the
    prompt ids written. Requests whose shards are incomplete are reported through `log` and left
    out. Each request's provenance, when its shards have one, becomes its prompt's."""
    shards = ShardSet(shard_dir)
    for request_id, why in sorted(shards.incomplete.items()):
        log(f"left out: {why}")
    requests = [r for r in shards.requests
                if request_ids is None or any(i and i.startswith(p) for i in (r.request_id, r.external_request_id)
                                              for p in request_ids)]
    if not requests:
        raise ValueError(f"{shard_dir}: no complete request" + (" matches the ids given" if request_ids else ""))
    config = requests[0].config
    for r in requests[1:]:
        if r.config != config:
            raise ValueError(f"request {r.request_id}: its KV cache config differs from request "
                             f"{requests[0].request_id}'s; write them to separate bundles")
    names = prompt_names(requests)
    written = []
    if expected_model is None and baseline_model is not None:
        raise ValueError("bundle_from_shards: a baseline model needs the expected model too")
    roles = sorted({r.kv_role for r in requests if r.kv_role})
    metadata = {"kv_role": ",".join(roles)} if roles else {}
    with BundleWriter(out_path, model=model, engine="vLLM", notes="kvscope_capture KvscopeConnector shards",
                      engine_only=expected_model is None, **metadata) as w:
        w.set_kv_cache_config(config)
        for r in sorted(requests, key=lambda r: r.request_id):
            pid = names[r.request_id]
            tokens = r.all_token_ids
            if r.seq_len > len(tokens):
                raise ValueError(f"request {r.request_id}: {r.num_computed_tokens} tokens computed but only "
                                 f"{len(tokens)} in the prompt and output")
            tokens = tokens[:r.seq_len]
            prompt_len = min(len(r.prompt_token_ids), len(tokens))  # a request aborted in its prefill
            strings = [tokenizer.decode([t]) for t in tokens] if tokenizer is not None else None
            w.add_prompt(pid, tokens, prompt_len, token_strings=strings)
            if r.provenance:
                w.set_provenance(pid, [tuple(x) for x in r.provenance])
            w.add_engine_snapshot(pid, r.per_rank_kv(), r.block_tables(), r.seq_len)
            states = r.per_rank_states()  # state-space layers: {layer: (kind, positions, per rank)}
            for name, (kind, positions, ranks) in sorted(states.items()):
                w.add_state(pid, name, positions, ranks, kind=kind)
            prompt, teacher = tokens[:prompt_len], tokens[prompt_len:]
            # An MLA model's reference is its latents (HF caches the up-projected K and V).
            extract = extract_hf_mla_latents if w.is_mla else extract_hf_kv_caches_teacher_forced
            for role, hf in (("expected", expected_model), ("baseline", baseline_model)):
                if hf is None:
                    continue
                if teacher:
                    logits, kv = extract(hf, prompt, teacher, return_logits=True)
                    w.add_logits(pid, role, logits)
                else:
                    kv = extract(hf, prompt, teacher)
                w.add_reference_kv(pid, role, kv)
                if states:
                    _add_reference_states(w, pid, role, hf, tokens, states)
            written.append(pid)
    return written


def _add_reference_states(writer, pid, role, model, tokens, states):
    """The reference's state of each state-space layer at the engine's checkpoints: HF's layer
    index is the first number of vLLM's layer name (model.layers.<i>.mixer)."""
    wanted = sorted({p for _, positions, _ in states.values() for p in positions})
    found = extract_hf_mamba_states(model, tokens, wanted, state_part="state")
    for name, (_, positions, ranks) in sorted(states.items()):
        number = re.search(r"\d+", name)
        index = int(number.group()) if number else None
        if index not in found:
            raise ValueError(f"prompt {pid}, {role}, layer {name}: the reference model's cache holds no state of layer "
                             f"{index} (it has states of layers {sorted(found)[:8]})")
        rows = [wanted.index(p) for p in positions]
        # The engine's parts: "conv" and the recurrent state's name ("ssm" for Mamba2, "recurrent"
        # for Gated DeltaNet), which the reference's second state takes.
        other = [part for part in next(iter(ranks.values())) if part != "conv"]
        names = {"conv": "conv", "state": other[0] if len(other) == 1 else "state"}
        writer.add_reference_state(pid, role, name, positions,
                                   {names[part]: t[rows] for part, t in found[index].items()})
