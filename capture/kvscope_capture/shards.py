"""Shard files: one finished request's KV blocks as one vLLM worker (TP rank x PP stage) holds them,
written by KvscopeConnector, read back and merged by ShardSet.

A shard is a small HDF5 file, `<request>.tp<r>.pp<p>.h5`, written under a temporary name and
renamed when complete, so that a reader never sees half a shard:
    attrs   format "kvscope-shard", format_version 1, request_id, tp_rank, pp_rank,
            num_computed_tokens, kv_cache_config (JSON: this stage's layers); optional:
            provenance (JSON list of [start, end, kind, details], provenance.py), kv_role
    prompt_token_ids, output_token_ids         int64
    block_ids/group_<g>                        int64, the request's blocks in vLLM group g (0 = null)
    layers/<layer>/block_ids                   int64 [n], the blocks stored, in row order
    layers/<layer>/k, v                        [n, heads_per_rank, block_size, head_size], raw bits,
                                               attribute dtype (MLA: latent)
    layers/<layer>/<key>                       what decodes a quantised format, as RankCaches.read
                                               gives it (k_scale, v_scale, zero points, RHT signs,
                                               NVFP4 global scales), raw bits, attribute dtype
    states/<layer>/positions                   int64 [c], a state-space layer's checkpoints (the
                                               state after positions [0, p)); attribute kind
    states/<layer>/<part>, <part>_units        this rank's state [c, units_r, ...] (raw bits,
                                               attribute dtype) and each row's whole-model unit

A request the connector could not write (its queue was full) leaves `<request>.tp<r>.pp<p>.skipped`
instead, a line of text saying why.
"""

import glob
import hashlib
import json
import os
import re
import time

import h5py
import numpy as np

from .stages import merge_stage_configs
from .tensors import canonical_dtype, to_array

FORMAT = "kvscope-shard"
VERSION = 1


def safe_name(request_id):
    """A file name for a request id: itself when it is one, else with a hash that keeps two ids apart."""
    text = str(request_id)
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", text)
    if safe != text:
        safe += "-" + hashlib.sha1(text.encode("utf-8")).hexdigest()[:8]
    return safe


def shard_path(directory, request_id, tp_rank, pp_rank):
    return os.path.join(directory, f"{safe_name(request_id)}.tp{tp_rank}.pp{pp_rank}.h5")


def skipped_marker_path(shard):
    """The marker a request leaves instead of its shard `shard` when it was not captured."""
    return shard[:-len(".h5")] + ".skipped"


def _stored(value, what, declared=None):
    """A part of a layer's entry as (numpy array of its bits, dtype name). declared: the config's
    format of K and V, whose quantised codes may come as uint8."""
    import torch

    if isinstance(value, torch.Tensor):
        if declared is not None and canonical_dtype(declared) is not None:
            return to_array(value, what, canonical_dtype(declared))
        t = value.detach().cpu().contiguous()
        name = str(t.dtype).replace("torch.", "")
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(np.uint16), name
        if name.startswith("float8"):
            return t.view(torch.uint8).numpy(), name
        return t.numpy(), name
    array = np.asarray(value)
    return array, str(array.dtype)


def write_shard(path, dump, config, layers, tp_rank, pp_rank, states=None):
    """dump: KvscopeDump (ids and tokens); layers: RankCaches.read's result; states:
    RankCaches.state_records' result (state-space layers), or None."""
    partial = path + ".partial"
    with h5py.File(partial, "w") as f:
        f.attrs["format"] = FORMAT
        f.attrs["format_version"] = VERSION
        f.attrs["request_id"] = str(dump.request_id)
        if getattr(dump, "external_request_id", None):
            f.attrs["external_request_id"] = str(dump.external_request_id)
        f.attrs["tp_rank"] = int(tp_rank)
        f.attrs["pp_rank"] = int(pp_rank)
        f.attrs["num_computed_tokens"] = int(dump.num_computed_tokens)
        f.attrs["kv_cache_config"] = json.dumps(config)
        if getattr(dump, "provenance", None):
            f.attrs["provenance"] = json.dumps([list(r) for r in dump.provenance])
        if getattr(dump, "kv_role", None):
            f.attrs["kv_role"] = str(dump.kv_role)
        f.create_dataset("prompt_token_ids", data=np.asarray(dump.prompt_token_ids, np.int64))
        f.create_dataset("output_token_ids", data=np.asarray(dump.output_token_ids, np.int64))
        for g, ids in enumerate(dump.block_ids):
            f.create_dataset(f"block_ids/group_{g}", data=np.asarray(ids, np.int64))
        # fp8_ds_mla's mixed-format tokens travel as their uint8 bytes (the writer splits them).
        declared = {(n, part): "float8_e4m3fn" if g["dtype"] == "fp8_ds_mla" else g.get(f"{part}_dtype", g["dtype"])
                    for g in config["groups"] for n in g["layer_names"] for part in ("k", "v", "latent")}
        for name, entry in layers.items():
            group = f.create_group(f"layers/{name}")
            for key, value in entry.items():
                if value is None:
                    continue
                if key == "block_ids":
                    group.create_dataset(key, data=np.asarray(value, np.int64))
                    continue
                array, dtype = _stored(value, f"{path}, layer {name}, {key}",
                                       declared.get((name, key)))
                group.create_dataset(key, data=array).attrs["dtype"] = dtype
        for name, record in (states or {}).items():
            group = f.create_group(f"states/{name}")
            group.attrs["kind"] = str(record["kind"])
            group.create_dataset("positions", data=np.asarray(record["positions"], np.int64))
            for part, (value, units) in record["parts"].items():
                array, dtype = _stored(value, f"{path}, state of layer {name}, {part}")
                group.create_dataset(part, data=array).attrs["dtype"] = dtype
                group.create_dataset(part + "_units", data=np.asarray(units, np.int64))
    os.replace(partial, path)


def _read_array(ds):
    """A stored tensor back as torch, bit for bit (bf16 and fp8 travel as raw bits)."""
    import torch

    dtype = ds.attrs["dtype"]
    data = np.ascontiguousarray(ds[()])
    if dtype == "bfloat16":
        return torch.from_numpy(data.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(data) if data.ndim else torch.tensor(data[()])


class ShardedRequest:
    """One request's shards (every TP rank x PP stage), checked to agree."""

    def __init__(self, request_id, shards):
        self.request_id = request_id
        first = shards[0]
        self.config = merge_stage_configs([s["config"] for s in shards])
        self.tp_size = self.config["tp_size"]
        self.pp_size = self.config.get("pp_size", 1)
        self.prompt_token_ids = first["prompt_token_ids"]
        self.output_token_ids = first["output_token_ids"]
        self.num_computed_tokens = first["num_computed_tokens"]
        self.block_ids = first["block_ids"]
        self.provenance = first["provenance"]  # [(start, end, kind, details)], [] when not recorded
        self.kv_role = first["kv_role"]
        # The id the user gave (vLLM appends "-<8 hex>" to it inside the engine).
        self.external_request_id = first.get("external_request_id")
        places = sorted((s["tp_rank"], s["pp_rank"]) for s in shards)
        want = [(t, p) for t in range(self.tp_size) for p in range(self.pp_size)]
        if places != want:
            missing = sorted(set(want) - set(places))
            raise ValueError(f"request {request_id}: shards of (tp, pp) {missing} are missing" if missing else
                             f"request {request_id}: shards {places} are not one per (tp, pp) rank")
        for s in shards:
            for key in ("prompt_token_ids", "output_token_ids", "num_computed_tokens", "block_ids", "provenance"):
                if s[key] != first[key]:
                    raise ValueError(f"{s['path']}: {key} differs from {first['path']}'s")
        self.shards = shards

    @property
    def all_token_ids(self):
        return self.prompt_token_ids + self.output_token_ids

    @property
    def seq_len(self):
        """Tokens of the sequence, counting the last sampled one whose KV is not written."""
        return self.num_computed_tokens + 1

    def per_rank_kv(self):
        """Per TP rank {layer: {'k', 'v', 'block_ids'[, scales]}}, the stages merged (what the
        writer's add_engine_snapshot takes)."""
        ranks = [dict() for _ in range(self.tp_size)]
        for s in self.shards:
            with h5py.File(s["path"], "r") as f:
                for name, group in f["layers"].items():
                    entry = {"block_ids": group["block_ids"][()].tolist()}
                    for key in group:
                        if key != "block_ids":
                            entry[key] = _read_array(group[key])
                    if name in ranks[s["tp_rank"]]:
                        raise ValueError(f"{s['path']}: layer {name} is in two shards of TP rank {s['tp_rank']}")
                    ranks[s["tp_rank"]][name] = entry
        return ranks

    def per_rank_states(self):
        """{layer: (kind, positions, {rank: {part: (tensor, units)}})} of the state-space layers
        every TP rank holds a state of (what the writer's add_state takes); the ranks' positions
        must agree."""
        found = {}
        for s in self.shards:
            with h5py.File(s["path"], "r") as f:
                for name, group in (f["states"].items() if "states" in f else ()):
                    positions = group["positions"][()].tolist()
                    parts = {key: (_read_array(group[key]), group[key + "_units"][()].tolist())
                             for key in group if key != "positions" and not key.endswith("_units")}
                    kind, first, ranks = found.setdefault(name, (str(group.attrs["kind"]), positions, {}))
                    if positions != first:
                        raise ValueError(f"{s['path']}: layer {name}'s state checkpoints {positions} differ from "
                                         f"another rank's {first}")
                    if s["tp_rank"] in ranks:
                        raise ValueError(f"{s['path']}: layer {name}'s state is in two shards of TP rank {s['tp_rank']}")
                    ranks[s["tp_rank"]] = parts
        incomplete = [name for name, (_, _, ranks) in found.items() if len(ranks) != self.tp_size]
        if incomplete:
            raise ValueError(f"request {self.request_id}: layer {incomplete[0]}'s state is missing from some TP ranks")
        return found

    def block_tables(self):
        from .vllm.rank_caches import block_tables
        return block_tables(self.config, [self.block_ids])


def wait_for_shards(directory, requests, timeout=60.0, poll=0.5):
    """Waits until `requests` requests (a number) have all their shards in `directory`, or `timeout`
    seconds; returns the ShardSet. vLLM writes a request's shards in the engine step after it
    finished, so generate() returns before they exist."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            shards = ShardSet(directory)
            if len(shards.requests) >= requests or time.monotonic() >= deadline:
                return shards
        except ValueError:
            if time.monotonic() >= deadline:
                raise
        time.sleep(poll)


class ShardSet:
    """The shards in a directory, grouped by request; requests missing shards are listed in
    `incomplete` (request id -> why), not merged."""

    def __init__(self, directory):
        self.directory = os.fspath(directory)
        if not os.path.isdir(self.directory):
            raise ValueError(f"{self.directory}: not a directory of kvscope shards")
        by_request = {}
        for path in sorted(glob.glob(os.path.join(self.directory, "*.h5"))):
            try:
                with h5py.File(path, "r") as f:
                    if f.attrs.get("format") != FORMAT:
                        continue
                    if int(f.attrs["format_version"]) != VERSION:
                        raise ValueError(f"format_version {f.attrs['format_version']}, this reader knows {VERSION}")
                    shard = {
                        "path": path,
                        "request_id": str(f.attrs["request_id"]),
                        "tp_rank": int(f.attrs["tp_rank"]),
                        "pp_rank": int(f.attrs["pp_rank"]),
                        "external_request_id": str(f.attrs.get("external_request_id", "")) or None,
                        "num_computed_tokens": int(f.attrs["num_computed_tokens"]),
                        "config": json.loads(f.attrs["kv_cache_config"]),
                        "prompt_token_ids": f["prompt_token_ids"][()].tolist(),
                        "output_token_ids": f["output_token_ids"][()].tolist(),
                        "block_ids": [f[f"block_ids/{g}"][()].tolist()
                                      for g in sorted(f["block_ids"], key=lambda n: int(n.split("_")[1]))],
                        "provenance": [tuple(r) for r in json.loads(f.attrs.get("provenance", "[]"))],
                        "kv_role": str(f.attrs.get("kv_role", "")) or None,
                    }
            except (OSError, KeyError, ValueError) as e:
                raise ValueError(f"{path}: not a readable kvscope shard ({e})") from e
            by_request.setdefault(shard["request_id"], []).append(shard)
        skipped = {}
        for path in sorted(glob.glob(os.path.join(self.directory, "*.skipped"))):
            with open(path) as f:
                request_id, _, why = f.read().strip().partition(": ")
            skipped[request_id] = f"request {request_id}: not captured by every worker ({why})"
        self.requests = []
        self.incomplete = dict(skipped)
        for request_id, shards in by_request.items():
            if request_id in skipped:
                continue
            try:
                self.requests.append(ShardedRequest(request_id, shards))
            except ValueError as e:
                self.incomplete[request_id] = str(e)
        if not self.requests and not self.incomplete:
            raise ValueError(f"{self.directory}: holds no kvscope shards (*.h5 written by KvscopeConnector)")
