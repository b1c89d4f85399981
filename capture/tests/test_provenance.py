"""Where each position's KV came from, as kvscope's connector learns it from the scheduler of the
stand-in of vLLM main (tests/vllm_main.py): a prefix-cache hit, another connector's load (inside
MultiConnector, with and without the scheduler's prefill_stats), chunked prefill, decode steps,
speculative decoding with rejections, and a preemption. Each expected range list is worked out by
hand from the scenario (the steps from the stand-in's own log), and read back from the shards, the
bundle, and kvscope inspect."""

import json
import os
import subprocess
import tempfile
import unittest

import h5py
import torch

import vllm_main as vm
from kvscope_capture import bundle_from_shards
from kvscope_capture.shards import ShardSet
from kvscope_capture.vllm.connector import KvscopeConnector
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata, SupportsHMA

BINARY = os.environ.get("KVSCOPE_BINARY")
L = [f"model.layers.{i}.self_attn.attn" for i in range(2)]
HEADS, DIM, BS = 2, 16, 16


def truth(seq, seed):
    g = torch.Generator().manual_seed(seed)
    return {n: {p: torch.randn(HEADS, seq, DIM, generator=g).to(torch.bfloat16) for p in "kv"} for n in L}


class Loader(KVConnectorBase_V1, SupportsHMA):
    """An external KV store: a request whose kv_transfer_params say {"stored": n} has its first n
    tokens loaded (synchronously, in start_load_kv) from `Loader.store`, the KV as computed. Like
    vLLM's connectors, it leaves the last token of the request to compute (one must be scheduled)."""
    store = {}

    def __init__(self, vllm_config, role, kv_cache_config):
        super().__init__(vllm_config, role, kv_cache_config)
        self._loads = []

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        stored = min((request.kv_transfer_params or {}).get("stored", 0), request.num_tokens - 1)
        return max(0, stored - num_computed_tokens), False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        if num_external_tokens:
            end = min(request.kv_transfer_params["stored"], request.num_tokens - 1)
            self._loads.append((request.request_id, blocks.get_block_ids()[0], end - num_external_tokens, end))

    def build_connector_meta(self, scheduler_output):
        meta = KVConnectorMetadata()
        meta.loads, self._loads = self._loads, []
        return meta

    def register_kv_caches(self, kv_caches):
        self.caches = kv_caches

    def start_load_kv(self, forward_context, **kwargs):
        for rid, blocks, start, end in self._get_connector_metadata().loads:
            data = Loader.store[rid.rsplit("-", 1)[0]]
            for name in L:
                for p in range(start, end):
                    vm.write_token("packed", self.caches[name], blocks[p // BS], p % BS,
                                   {part: data[name][part][:, p] for part in "kv"}, DIM)

    def wait_for_layer_load(self, layer_name):
        return None

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        return None

    def wait_for_save(self):
        return None

    def request_finished_all_groups(self, request, block_ids):
        return False, None


class Provenance(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.out = os.path.join(self.tmp.name, "shards")

    def tearDown(self):
        self.tmp.cleanup()

    def engine(self, **kwargs):
        extra = kwargs.pop("extra", {})
        return vm.Engine([vm.Group(L)], total_heads=HEADS, head_size=DIM, num_blocks=kwargs.pop("num_blocks", 40),
                         connector=(KvscopeConnector, dict({"output_dir": self.out}, **extra)), **kwargs)

    def shards(self, engine):
        for w in engine.workers:
            c = w.connector
            for writer in [c._writer] if hasattr(c, "_writer") else [x._writer for x in c._connectors
                                                                      if hasattr(x, "_writer")]:
                self.assertTrue(writer.flush(30))
        shards = ShardSet(self.out)
        self.assertEqual(shards.incomplete, {})
        return {r.request_id: r for r in shards.requests}

    def steps_of(self, engine, rid):
        """The engine steps that scheduled the request, from the stand-in's log: [(step, start, n, drafts, accepted)]."""
        return [(s,) + plan[rid] for s, plan in enumerate(engine.log) if rid in plan]

    def as_lists(self, ranges):
        return [[s, e, k, d] for s, e, k, d in ranges]

    def test_chunked_prefill_and_decode_steps(self):
        engine = self.engine(chunk=8)
        rid = engine.add_request("r", list(range(30)), list(range(100, 106)), truth(36, 1))
        engine.run()
        steps = self.steps_of(engine, rid)
        self.assertEqual([x[1:3] for x in steps[:4]], [(0, 8), (8, 8), (16, 8), (24, 6)])
        decode = [s for s, start, n, _, _ in steps[4:]]
        self.assertEqual(len(decode), 5)  # positions 30..34; the sixth output token has no KV
        want = [[0, 8, "prefill", {"chunk": 0}], [8, 16, "prefill", {"chunk": 1}], [16, 24, "prefill", {"chunk": 2}],
                [24, 30, "prefill", {"chunk": 3}]] + [[30 + i, 31 + i, "decode", {"step": s}] for i, s in enumerate(decode)]
        self.assertEqual(self.as_lists(self.shards(engine)[rid].provenance), want)

    def test_prefix_cache_hit(self):
        """The second request shares the first's first 40 tokens: two full blocks (32 tokens) come
        from the prefix cache, the first request's own blocks."""
        engine = self.engine(prefix_caching=True)
        a_kv, b_kv = truth(50, 1), truth(50, 2)
        for n in L:
            for p in "kv":
                b_kv[n][p][:, :40] = a_kv[n][p][:, :40]
        a = engine.add_request("a", list(range(45)), list(range(100, 103)), a_kv)
        engine.run()
        a_blocks = engine.requests[a].block_ids[0]
        b = engine.add_request("b", list(range(40)) + [900, 901, 902], list(range(200, 204)), b_kv)
        engine.run()
        shards = self.shards(engine)
        self.assertEqual(shards[b].block_ids[0][:2], a_blocks[:2])
        decode = [s for s, start, n, _, _ in self.steps_of(engine, b)[1:]]
        want = [[0, 32, "prefix_cache", {"blocks": a_blocks[:2]}], [32, 43, "prefill", {"chunk": 0}]] + \
               [[43 + i, 44 + i, "decode", {"step": s}] for i, s in enumerate(decode)]
        self.assertEqual(self.as_lists(shards[b].provenance), want)
        # The KV of the shared positions is the first request's, read from the shared blocks.
        kv = shards[b].per_rank_kv()[0][L[1]]
        row = kv["block_ids"].index(a_blocks[1])
        self.assertTrue(torch.equal(kv["k"][row, :, 5], a_kv[L[1]]["k"][:, 21]))

    def test_speculative_decoding_keeps_only_accepted_drafts(self):
        """Decode steps of 1 + 3 tokens: 1 of 3 drafts accepted, then 3; then only 2 drafts fit
        (29 positions in all), none accepted; then 1, accepted. Rejected drafts were written and are
        overwritten."""
        engine = self.engine()
        rid = engine.add_request("r", list(range(20)), list(range(100, 110)), truth(30, 3),
                                 spec=[(3, 1), (3, 3), (3, 0), (3, 2)])
        engine.run()
        steps = self.steps_of(engine, rid)
        self.assertEqual([x[1:] for x in steps], [(0, 20, 0, 0), (20, 4, 3, 1), (22, 4, 3, 3), (26, 3, 2, 0),
                                                  (27, 2, 1, 1)])
        s = [x[0] for x in steps]
        want = [[0, 20, "prefill", {"chunk": 0}],
                [20, 21, "decode", {"step": s[1]}], [21, 22, "spec_accepted", {"step": s[1]}],
                [22, 23, "decode", {"step": s[2]}], [23, 26, "spec_accepted", {"step": s[2]}],
                [26, 27, "decode", {"step": s[3]}],
                [27, 28, "decode", {"step": s[4]}], [28, 29, "spec_accepted", {"step": s[4]}]]
        request = self.shards(engine)[rid]
        self.assertEqual(request.num_computed_tokens, 29)
        self.assertEqual(self.as_lists(request.provenance), want)
        # Every position holds its own KV in the end: each rejected draft was written over.
        data = engine.truth[rid]
        kv = request.per_rank_kv()[0][L[0]]
        for p in range(29):
            row = kv["block_ids"].index(request.block_ids[0][p // BS])
            self.assertTrue(torch.equal(kv["v"][row, :, p % BS], data[L[0]]["v"][:, p]), p)

    def test_preemption_recomputes(self):
        """Preempted after its prompt and two decode steps (22 positions written); its blocks are
        taken by nobody, but prefix caching is off: it recomputes 0-21 and computes 22 anew."""
        for runner in ("v1", "v2"):
            with self.subTest(runner=runner):
                engine = self.engine(chunk=8, runner=runner)
                rid = engine.add_request("r", list(range(20)), list(range(100, 108)), truth(28, 4))
                for _ in range(5):
                    engine.step()
                self.assertEqual(engine.requests[rid].num_computed_tokens, 22)
                engine.preempt(rid)
                engine.run()
                steps = self.steps_of(engine, rid)
                before, after = steps[:5], steps[5:]
                self.assertEqual([x[1:3] for x in after[:3]], [(0, 8), (8, 8), (16, 7)])
                decode = [x[0] for x in after[3:]]
                want = [[0, 22, "recomputed", {"preemption": 0}], [22, 23, "decode", {"step": after[2][0]}]] + \
                       [[23 + i, 24 + i, "decode", {"step": s}] for i, s in enumerate(decode)]
                self.assertEqual(len(before), 5)
                self.assertEqual(self.as_lists(self.shards(engine)[rid].provenance), want)
                self.tearDown()
                self.setUp()

    def test_external_load_inside_multiconnector(self):
        """Another connector loads 39 tokens beyond a 16-token local hit; kvscope, beside it in
        MultiConnector, is told 0 external tokens and takes the split from the scheduler's
        prefill_stats. Without prefill_stats (an older vLLM) the name given in its config and the
        start of the request's first step say the same."""
        from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiConnector
        for stats in (True, False):
            with self.subTest(prefill_stats=stats):
                extra = {"connectors": [
                    {"kv_connector": "Loader", "kv_connector_module_path": "test_provenance", "kv_role": "kv_both"},
                    {"kv_connector": "KvscopeConnector", "kv_connector_module_path": "kvscope_capture.vllm.connector",
                     "kv_role": "kv_consumer",
                     "kv_connector_extra_config": {"output_dir": self.out, "external_connector": "Loader"}}]}
                engine = vm.Engine([vm.Group(L)], total_heads=HEADS, head_size=DIM, prefix_caching=True,
                                   connector=(MultiConnector, extra), prefill_stats=stats)
                warm = truth(60, 5)
                first = engine.add_request("w", list(range(20)), [300], warm)
                engine.run()
                Loader.store["x"] = warm
                rid = engine.add_request("x", list(range(16)) + list(range(500, 540)), list(range(100, 104)), warm,
                                         kv_transfer_params={"stored": 56})
                engine.run()
                request = {r.request_id: r for r in ShardSet(self.out).requests}[rid] if self._flush(engine) else None
                blocks = engine.requests[first].block_ids[0][:1]
                # 56 tokens stored, the whole prompt: the last is computed here.
                steps = self.steps_of(engine, rid)
                self.assertEqual(steps[0][1:3], (55, 1))
                want = [[0, 16, "prefix_cache", {"blocks": blocks}], [16, 55, "external", {"connector": "Loader"}],
                        [55, 56, "prefill", {"chunk": 0}]] + \
                       [[56 + i, 57 + i, "decode", {"step": x[0]}] for i, x in enumerate(steps[1:])]
                self.assertEqual(self.as_lists(request.provenance), want)
                self.assertEqual(request.kv_role, "kv_consumer")
                self.check_bundle(request, want, warm)
                self.tearDown()
                self.setUp()

    def _flush(self, engine):
        for w in engine.workers:
            for c in w.connector._connectors:
                if hasattr(c, "_writer"):
                    self.assertTrue(c._writer.flush(30))
        return True

    def check_bundle(self, request, want, values):
        """The provenance reaches the bundle as the prompt's attribute, engine-only or with a
        reference, and kvscope inspect shows it."""
        from test_vllm_main import ReferenceModel
        from transfer_standin import inspect_bundle
        bundle = os.path.join(self.tmp.name, "b.h5")
        (pid,) = bundle_from_shards(self.out, bundle, None, request_ids=[request.request_id], log=self.fail)
        with h5py.File(bundle, "r") as f:
            self.assertEqual(int(f.attrs["engine_only"]), 1)
            self.assertEqual(f.attrs["kv_role"].decode(), request.kv_role)
            got = json.loads(f[f"prompts/{pid}"].attrs["provenance"].decode())
        self.assertEqual([[r["start"], r["end"], r["kind"], {k: v for k, v in r.items()
                                                             if k not in ("start", "end", "kind")}] for r in got], want)
        if BINARY:
            inspect_bundle(BINARY, bundle)
            referenced = os.path.join(self.tmp.name, "r.h5")
            bundle_from_shards(self.out, referenced, ReferenceModel(values, L), request_ids=[request.request_id],
                               log=self.fail)
            out = subprocess.run([BINARY, "inspect", referenced], capture_output=True, text=True)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertIn("provenance: 0-15 prefix_cache (blocks", out.stdout)
            self.assertIn("16-54 external (Loader); 55 prefill (chunk 0); 56-58 decode", out.stdout)


if __name__ == "__main__":
    unittest.main()
