"""Both ends of a disaggregated KV transfer, on the stand-in of vLLM main (vllm_main.py): a NIXL-like
producer / consumer pair that can corrupt the transfer in each way users report, with kvscope's
connector beside it in MultiConnector at each end writing an engine-only bundle.

NixlLikeConnector mirrors vLLM's NixlConnector (pull mode) in vllm/distributed/kv_transfer/
kv_connector/v1/nixl/pull_scheduler.py (the tree of 2026-08-19, c2057261), in the parts a capture
depends on:
- the producer (kv_role kv_producer; requests with kv_transfer_params do_remote_decode) holds a
  finished request's blocks (request_finished returns True) and hands the consumer
  kv_transfer_params do_remote_prefill, remote_block_ids, remote_engine_id, remote_request_id,
  remote_num_tokens; it frees them once the consumer says it has read them (get_finished's
  finished_sending);
- the consumer (kv_role kv_consumer) answers get_num_new_matched_tokens with every prompt token
  beyond the local hit, loaded asynchronously; update_state_after_alloc takes the request's blocks
  not found in the prefix cache (get_unhashed_block_ids_all_groups) as the blocks to fill, and
  clears do_remote_prefill; the worker reads the producer's blocks into them (the last
  len(local) remote blocks) and reports the request in get_finished's finished_recving; the
  scheduler then runs it, recomputing the last prompt token.
The block ids differ on the two sides (each engine has its own pool). Here the consumer reads the
producer's caches in process, as NIXL reads its registered memory. One TP rank.

make_transfer_pairs(out_dir) writes a producer and a consumer bundle per fault, for `kvscope
transfer PRODUCER CONSUMER`."""

import os
import subprocess

import h5py
import numpy as np
import torch

import vllm_main as vm
from kvscope_capture import bundle_from_shards
from kvscope_capture.shards import ShardSet
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata, SupportsHMA
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiConnector

LAYERS = [f"model.layers.{i}.self_attn.attn" for i in range(2)]
HEADS, DIM, BS = 2, 16, 16  # 2 KV heads: the packed and split pages have one shape
PROMPT, OUTPUT = 40, 4
FP8_SCALE = 0.05

PRODUCERS = {}  # engine_id -> the producer Engine (NIXL's side channel and registered memory)


class NixlLikeConnector(KVConnectorBase_V1, SupportsHMA):
    """kv_connector_extra_config: engine_id; fault (consumer): (name, args), how its reads go wrong."""

    notified = {}  # producer engine_id -> request ids the consumer has read

    def __init__(self, vllm_config, role, kv_cache_config):
        super().__init__(vllm_config, role, kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self.engine_id = extra["engine_id"]
        self.fault = extra.get("fault")
        self._need_recv, self._sending = {}, set()

    # --- scheduler side ------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        params = request.kv_transfer_params
        if params and params.get("do_remote_prefill"):
            count = len(request.prompt_token_ids) - num_computed_tokens
            if count > 0:
                return count, True
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        params = request.kv_transfer_params
        if params and params.get("do_remote_prefill") and params.get("remote_block_ids"):
            local = blocks.get_unhashed_block_ids_all_groups() if num_external_tokens > 0 else ()
            self._need_recv[request.request_id] = (local, dict(params))
            params["do_remote_prefill"] = False

    def build_connector_meta(self, scheduler_output):
        meta = KVConnectorMetadata()
        meta.reqs_to_recv, self._need_recv = self._need_recv, {}
        return meta

    def request_finished_all_groups(self, request, block_ids):
        params = request.kv_transfer_params
        if not params or not params.get("do_remote_decode"):
            return False, None
        return True, dict(do_remote_prefill=True, do_remote_decode=False, remote_block_ids=[list(g) for g in block_ids],
                          remote_engine_id=self.engine_id, remote_request_id=request.request_id,
                          remote_num_tokens=request.num_computed_tokens)

    # --- worker side ---------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches):
        self.caches = kv_caches

    def start_load_kv(self, forward_context, **kwargs):
        meta = self._get_connector_metadata()
        self._done = set()
        for rid, (local, params) in getattr(meta, "reqs_to_recv", {}).items():
            producer = PRODUCERS[params["remote_engine_id"]]
            remote = params["remote_block_ids"][0]
            local = list(local[0]) if local else []
            remote = remote[len(remote) - len(local):]  # a local prefix hit: only the tail is read
            for name in LAYERS:
                source = producer.workers[0].caches[name]
                for j, (r, l) in enumerate(zip(remote, local)):
                    self.caches[name][l] = read_page(self.fault, name, source, remote, j, self.caches[name].dtype)
            NixlLikeConnector.notified.setdefault(params["remote_engine_id"], set()).add(params["remote_request_id"])
            self._done.add(rid)

    def wait_for_layer_load(self, layer_name):
        return None

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        return None

    def wait_for_save(self):
        return None

    def get_finished(self, finished_req_ids):
        sending = NixlLikeConnector.notified.pop(self.engine_id, set())
        recving, self._done = getattr(self, "_done", set()), set()
        return sending or None, recving or None


# --- the faults: what the consumer's block j holds, from the producer's cache -------------------------
FAULTS = {
    "none": "every transferred position identical",
    "head_major_read_token_major": "each block's [heads, tokens, K|V] bytes read as [tokens, heads, K|V]",
    "token_major_read_head_major": "each block's [tokens, heads, K|V] bytes read as [heads, tokens, K|V]",
    "split_read_packed": "each block's split page (K of every head, then V: [2, tokens, heads*head_size]) read as "
                         "packed [heads, tokens, K|V]; with 2 KV heads the shapes agree",
    "kv_swapped": "K and V halves swapped at every position",
    "block_offset": "position p holds the producer's p + 16 (one block on); the last block holds the producer's "
                    "null block",
    "other_request": "positions 16-31 (block 1) hold another request's block 1",
    "stale_block": "positions 16-31 (block 1) hold the block's contents before this request wrote it (an earlier "
                   "request's)",
    "fp8_conversion": f"converted to fp8 e4m3 with scale {FP8_SCALE}, declared: equal within fp8's rounding",
    "fp8_wrong_scale": f"converted to fp8 e4m3 with scale {FP8_SCALE}, declared {2 * FP8_SCALE}: every value doubled",
    "unwritten_zeros": "positions 16-31 (block 1) all zeros: read before the producer wrote them",
    "partially_written": "positions 21-31 of block 1 zeros: only its first 5 tokens were written when read",
}


def read_page(fault, layer, source, remote, j, dtype):
    """The [heads, tokens, content] page the consumer receives as its block j, `remote` the
    producer's blocks of the request."""
    name, args = fault or ("none", {})
    page = source[remote[j]].clone()
    heads, tokens, content = page.shape
    if name == "head_major_read_token_major":
        page = page.reshape(-1).view(tokens, heads, content).permute(1, 0, 2).contiguous()
    elif name == "token_major_read_head_major":
        page = page.permute(1, 0, 2).contiguous().reshape(-1).view(heads, tokens, content)
    elif name == "split_read_packed":
        k, v = page[..., :content // 2], page[..., content // 2:]
        split = torch.stack([x.permute(1, 0, 2).reshape(tokens, -1) for x in (k, v)])  # [2, tokens, heads*hs]
        page = split.reshape(-1).view(heads, tokens, content)
    elif name == "kv_swapped":
        page = torch.cat([page[..., content // 2:], page[..., :content // 2]], dim=-1)
    elif name == "block_offset":
        page = source[remote[j + 1] if j + 1 < len(remote) else 0].clone()
    elif name == "other_request" and j == 1:
        page = source[args["blocks"][1]].clone()
    elif name == "stale_block" and j == 1:
        page = args["before"][layer][remote[1]].clone()
    elif name == "unwritten_zeros" and j == 1:
        page = torch.zeros_like(page)
    elif name == "partially_written" and j == 1:
        page[:, 5:] = 0
    if name.startswith("fp8"):
        return e4m3_codes(page.float() / FP8_SCALE)
    return page.to(dtype)


def _e4m3_table():
    codes = np.arange(256)
    exp, man = (codes >> 3) & 0xF, codes & 7
    mag = np.where(exp == 0, man / 8.0 * 2.0 ** -6, (1 + man / 8.0) * 2.0 ** (exp - 7.0))
    values = np.where(codes & 0x80, -mag, mag)
    keep = (codes & 0x7F) != 0x7F  # 0x7f and 0xff are NaN
    return codes[keep], values[keep]


def e4m3_codes(x):
    """float8 e4m3fn codes (uint8) of x, the nearest value, saturating at 448: the conversion a
    transfer that casts does (written here; this torch has no float8)."""
    codes, values = _e4m3_table()
    flat = np.clip(x.double().numpy().reshape(-1), -448, 448)
    nearest = np.abs(flat[:, None] - values[None, :]).argmin(axis=1)
    return torch.from_numpy(codes[nearest].astype(np.uint8).reshape(tuple(x.shape)))


# --- a pair of engines, one request transferred -------------------------------------------------------
def _connectors(out, role, engine_id, fault=None):
    return {"connectors": [
        {"kv_connector": "NixlLikeConnector", "kv_connector_module_path": "transfer_standin", "kv_role": role,
         "kv_connector_extra_config": {"engine_id": engine_id, "fault": fault}},
        {"kv_connector": "KvscopeConnector", "kv_connector_module_path": "kvscope_capture.vllm.connector",
         "kv_role": role, "kv_connector_extra_config": {"output_dir": out, "external_connector": "NixlLikeConnector"}}]}


def truth(seq, seed):
    g = torch.Generator().manual_seed(seed)
    return {n: {p: torch.randn(HEADS, seq, DIM, generator=g).to(torch.bfloat16) for p in "kv"} for n in LAYERS}


def _flush(engine):
    for w in engine.workers:
        for c in w.connector._connectors:
            if hasattr(c, "_writer"):
                assert c._writer.flush(30)


def run_pair(folder, fault_name="none", layout=vm.KVCacheLayout.LBNHC, consumer_layout=vm.KVCacheLayout.LBHNC):
    """A producer computes two prompts (an earlier one, then the transferred one); the consumer
    loads the second's KV through the NIXL-like connector (faulted as named) and decodes. Returns
    {producer, consumer: shard folder, rid, earlier, producer_blocks, consumer_blocks}."""
    engine_id = f"prefill-{fault_name}"
    producer_out, consumer_out = os.path.join(folder, "producer"), os.path.join(folder, "consumer")
    # A pool of 3 blocks when the transferred request must take the earlier one's blocks (stale).
    blocks = 4 if fault_name == "stale_block" else 16
    producer = vm.Engine([vm.Group(LAYERS)], total_heads=HEADS, head_size=DIM, num_blocks=blocks, layout=layout,
                         connector=(MultiConnector, _connectors(producer_out, "kv_producer", engine_id)), seed=1)
    PRODUCERS[engine_id] = producer
    data, earlier_data = truth(PROMPT + OUTPUT, 7), truth(PROMPT + OUTPUT, 8)
    earlier = producer.add_request("earlier", list(range(500, 500 + PROMPT)), [1], earlier_data,
                                   kv_transfer_params={"do_remote_decode": False})
    producer.run()
    before = {n: c.clone() for n, c in producer.workers[0].caches.items()}
    earlier_blocks = producer.requests[earlier].block_ids[0]
    rid = producer.add_request("req", list(range(PROMPT)), [1], data, kv_transfer_params={"do_remote_decode": True})
    for _ in range(40):  # until the request is done and only the transfer connector holds it
        producer.step()
        request = producer.requests[rid]
        if request.done and request.finished_params is not None:
            break
    producer.step()  # kvscope copies the finished request's blocks in the next step
    params = dict(producer.requests[rid].finished_params)

    args = {"blocks": earlier_blocks, "before": before}
    fp8 = fault_name.startswith("fp8")
    declared = 2 * FP8_SCALE if fault_name == "fp8_wrong_scale" else FP8_SCALE
    consumer = vm.Engine([vm.Group(LAYERS, cache_dtype="fp8" if fp8 else "auto")], total_heads=HEADS, head_size=DIM,
                         num_blocks=24, layout=consumer_layout, seed=2,
                         scales={n: (declared, declared) for n in LAYERS} if fp8 else None,
                         connector=(MultiConnector, _connectors(consumer_out, "kv_consumer", f"decode-{fault_name}",
                                                                (fault_name, args))))
    consumer_data = data
    if fp8:  # the consumer computes its own positions in its format: fp8 codes of the same values
        consumer_data = {n: {p: e4m3_codes(v.float() / declared) for p, v in kv.items()} for n, kv in data.items()}
    crid = consumer.add_request("req", list(range(PROMPT)), list(range(100, 100 + OUTPUT)), consumer_data,
                                kv_transfer_params=params)
    consumer.run()
    producer.run()  # the consumer has read the blocks: the producer frees them
    _flush(producer)
    _flush(consumer)
    del PRODUCERS[engine_id]
    return {"producer": producer_out, "consumer": consumer_out, "rid": rid, "crid": crid, "earlier": earlier,
            "producer_blocks": params["remote_block_ids"][0], "earlier_blocks": earlier_blocks,
            "consumer_blocks": consumer.requests[crid].block_ids[0]}


def make_transfer_pairs(out_dir, faults=None):
    """For each fault (default: all of FAULTS), out_dir/<fault>/producer.h5 and consumer.h5,
    engine-only bundles of the same prompt "req" (the producer's also holds "earlier").
    Returns {fault: (producer_path, consumer_path, expected_description)}."""
    pairs = {}
    for name in faults or FAULTS:
        folder = os.path.join(out_dir, name)
        os.makedirs(folder, exist_ok=True)
        run = run_pair(folder, name)
        paths = []
        for side in ("producer", "consumer"):
            path = os.path.join(folder, f"{side}.h5")
            bundle_from_shards(run[side], path, None, model="stand-in", log=print)
            paths.append(path)
        pairs[name] = (paths[0], paths[1], FAULTS[name])
    return pairs


# --- reading a bundle back --------------------------------------------------------------------------------
def positions(bundle, prompt, layer, part):
    """[heads, positions, head_size] of the first snapshot of an engine-only bundle, as stored (raw
    bits: uint16 for bf16, uint8 for fp8), with its dtype name."""
    with h5py.File(bundle, "r") as f:
        snap = f[f"prompts/{prompt}/engine/snapshot_0"]
        seq = int(snap["seq_lens"][int(snap.attrs["batch_row"])])
        table = snap["block_tables/group_0"][int(snap.attrs["batch_row"])]
        stored = snap["physical_block_ids"][()].tolist() if "physical_block_ids" in snap else None
        ds = snap[f"rank_0/{layer}/{part}"]
        data, dtype = ds[()], ds.attrs.get("dtype", str(ds.dtype))
    rows = []
    for p in range(seq - 1):  # the last position has no KV yet
        block = int(table[p // BS])
        rows.append(data[stored.index(block) if stored is not None else block, :, p % BS])
    return np.stack(rows, axis=1), dtype.decode() if isinstance(dtype, bytes) else dtype


def inspect_bundle(binary, bundle):
    """kvscope inspect reads the engine-only bundle as any other (exit 0, no complaint), saying it is
    engine-only. Returns inspect's output."""
    out = subprocess.run([binary, "inspect", bundle], capture_output=True, text=True)
    if out.returncode != 0 or out.stderr.strip() or "engine-only: no reference KV" not in out.stdout:
        raise AssertionError(f"kvscope inspect {bundle}: exit {out.returncode}\n{out.stdout}\n{out.stderr}")
    return out.stdout
