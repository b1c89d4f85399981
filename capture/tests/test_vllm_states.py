"""A hybrid model's recurrent states through the connector, against the stand-in of vLLM main
(tests/vllm_main.py) running a small Mamba2 or Gated DeltaNet (tests/mamba2_standin.py): the state
at the request's end, and at the block boundaries vLLM keeps states of ("align" and "all"), each
rank's rows and which whole-model units they are, bit for bit; the states of blocks vLLM frees
before the request ends are copied in the step that wrote them; then the bundle, with the HF
reference's states at the same positions."""

import json
import os
import subprocess
import tempfile
import unittest

import h5py
import numpy as np
import torch

import vllm_main as vm
from mamba2_standin import GdnDims, Mamba2Dims, gdn_rank_units, gdn_states, mamba2_states, rank_units
from kvscope_capture import BundleWriter, bundle_from_shards
from kvscope_capture.hf_reference import extract_hf_mamba_states
from kvscope_capture.shards import ShardSet
from kvscope_capture.vllm.connector import KvscopeConnector

BINARY = os.environ.get("KVSCOPE_BINARY")
ATTN = ["model.layers.0.self_attn.attn", "model.layers.2.self_attn.attn"]
MIXERS = ["model.layers.1.mixer", "model.layers.3.mixer"]
HEADS, DIM, BLOCK = 2, 8, 8


def data_for(tokens, dims, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = {name: {p: torch.randn(HEADS, len(tokens), DIM, generator=g).to(torch.bfloat16) for p in "kv"}
           for name in ATTN}
    for i, name in enumerate(MIXERS):
        if isinstance(dims, GdnDims):
            conv, recurrent = gdn_states(tokens, dims, seed=seed + 10 + i)
            out[name] = {"conv": conv, "recurrent": recurrent}
        else:
            conv, ssm = mamba2_states(tokens, dims, seed=seed + 10 + i)
            out[name] = {"conv": conv, "ssm": ssm}
    return out


class HFStandIn:
    """An HF hybrid model's interface (transformers' NemotronH / Granite 4 / Falcon-H1: KV for the
    attention layers, conv_states and ssm_states by layer index beside it): the engine's truth,
    with noise when asked (a bf16 run of the reference differs from the engine's); conv_states
    keeps d_conv columns, its first one an input the format does not keep."""

    def __init__(self, data, noise=False):
        self.data, self.noise, self.calls = data, noise, []
        self.g = torch.Generator().manual_seed(5)

    def near(self, t):
        t = torch.as_tensor(t).float()
        return t + t.abs() * 2 ** -9 * torch.randn(t.shape, generator=self.g) if self.noise else t

    def __call__(self, input_ids, past_key_values=None, use_cache=True):
        import types
        n = input_ids.shape[1]
        self.calls.append(n)
        layers = [types.SimpleNamespace(keys=self.data[name]["k"][None, :, :n], values=self.data[name]["v"][None, :, :n])
                  for name in ATTN]
        conv_states, states = [torch.zeros(0)] * 4, [torch.zeros(0)] * 4
        for name in MIXERS:
            index = int(name.split(".")[2])
            conv = torch.as_tensor(self.data[name]["conv"][n - 1])
            older = torch.full((conv.shape[0], 1), 7.0)  # the input before: not part of the state
            conv_states[index] = self.near(torch.cat([older, conv], dim=1))[None]
            state = self.data[name].get("ssm", self.data[name].get("recurrent"))
            states[index] = self.near(state[n - 1])[None]
        cache = types.SimpleNamespace(layers=layers, conv_states=conv_states)
        # Mamba2 hybrids' caches name the second state ssm_states, Qwen3-Next's recurrent_states.
        setattr(cache, "ssm_states" if "ssm" in self.data[MIXERS[0]] else "recurrent_states", states)
        logits = torch.randn(1, n, 16, generator=torch.Generator().manual_seed(n))
        return types.SimpleNamespace(logits=logits, past_key_values=cache)


class StatesThroughTheConnector(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.out = os.path.join(self.tmp.name, "shards")

    def tearDown(self):
        self.tmp.cleanup()

    def run_request(self, mode, dims, tp=2, prompt=21, output=10, chunk=None, extra=None):
        block = BLOCK if mode != "none" else 64  # prefix caching off: one block a request (max_model_len)
        groups = [vm.Group(list(ATTN), vm.FlashAttentionBackend, block_size=BLOCK),
                  vm.Group(list(MIXERS), block_size=block, mamba=True, mamba_dims=dims, mamba_mode=mode)]
        engine = vm.Engine(groups, total_heads=HEADS, head_size=DIM, tp=tp, num_blocks=48, chunk=chunk,
                           connector=(KvscopeConnector, dict({"output_dir": self.out}, **(extra or {}))))
        tokens = [(7 * i + 3) % 200 for i in range(prompt + output)]
        data = data_for(tokens, dims)
        rid = engine.add_request("cmpl-s", tokens[:prompt], tokens[prompt:], data)
        engine.run()
        for w in engine.workers:
            self.assertTrue(w.connector._writer.flush(30))
        (request,) = [r for r in ShardSet(self.out).requests if r.request_id == rid]
        return engine, request, tokens, data

    def check_states(self, request, data, dims, tp, positions):
        states = request.per_rank_states()
        self.assertEqual(sorted(states), MIXERS)
        for name in MIXERS:
            kind, got_positions, ranks = states[name]
            self.assertEqual(got_positions, positions, name)
            self.assertEqual(sorted(ranks), list(range(tp)))
            gdn = isinstance(dims, GdnDims)
            part = "recurrent" if gdn else "ssm"
            self.assertEqual(kind, "gated_delta_net" if gdn else "mamba2")
            for r, parts in ranks.items():
                self.assertEqual(sorted(parts), sorted(["conv", part]))
                conv_units, heads = (gdn_rank_units if gdn else rank_units)(dims, tp, r)
                conv, units = parts["conv"]
                self.assertEqual(units, conv_units, f"{name} rank {r}")
                self.assertEqual(conv.dtype, torch.bfloat16)  # the model's dtype, as vLLM keeps it
                want = torch.from_numpy(np.stack([data[name]["conv"][p - 1][conv_units] for p in positions]))
                torch.testing.assert_close(conv, want.to(torch.bfloat16), rtol=0, atol=0)
                state, units = parts[part]
                self.assertEqual(units, heads)
                want = np.stack([data[name][part][p - 1][heads] for p in positions]).astype(np.float32)
                np.testing.assert_array_equal(state.numpy(), want, err_msg=f"{name} rank {r}")

    def test_none_mode_keeps_the_end_state(self):
        dims = Mamba2Dims(n_groups=1)
        _, request, _, data = self.run_request("none", dims)
        self.assertEqual(request.num_computed_tokens, 30)
        self.check_states(request, data, dims, 2, [30])

    def test_all_mode_every_block_boundary_and_the_end(self):
        """Chunks of 20 cross boundaries mid-chunk: "all" writes each boundary's state; vLLM frees
        a request's earlier state blocks as it goes (and the stand-in hands them to the next
        allocation), so these were copied in the steps that wrote them."""
        dims = Mamba2Dims(heads=4, n_groups=2)
        engine, request, _, data = self.run_request("all", dims, chunk=20)
        self.assertEqual(request.block_ids[1][:2], [0, 0])  # freed: null blocks when the request ended
        self.check_states(request, data, dims, 2, [8, 16, 24, 30])
        for w in engine.workers:
            self.assertEqual(w.connector._checkpoints, {})  # handed to the shard, not kept

    def test_requests_not_captured_keep_no_states(self):
        dims = Mamba2Dims(n_groups=1)
        groups = [vm.Group(list(ATTN), vm.FlashAttentionBackend, block_size=BLOCK),
                  vm.Group(list(MIXERS), block_size=BLOCK, mamba=True, mamba_dims=dims, mamba_mode="all")]
        engine = vm.Engine(groups, total_heads=HEADS, head_size=DIM, tp=2, num_blocks=48, chunk=20,
                           connector=(KvscopeConnector, {"output_dir": self.out, "requests": ["cmpl-a"]}))
        other, tokens = list(range(50, 81)), list(range(31))  # two requests in the same steps
        engine.add_request("cmpl-b", other[:21], other[21:], data_for(other, dims, seed=3))
        data = data_for(tokens, dims)
        engine.add_request("cmpl-a", tokens[:21], tokens[21:], data)
        engine.run()
        for w in engine.workers:
            self.assertTrue(w.connector._writer.flush(30))
            self.assertEqual(w.connector._checkpoints, {})
        (request,) = ShardSet(self.out).requests
        self.assertEqual(request.external_request_id, "cmpl-a")
        self.check_states(request, data, dims, 2, [8, 16, 24, 30])

    def test_align_mode_chunk_ends_on_boundaries(self):
        """"align" keeps the state where a step ends on a boundary: its prefill chunks are cut
        there (20 -> 16), decode reaches 24, and the end (30)."""
        dims = Mamba2Dims(n_groups=1)
        engine, request, _, data = self.run_request("align", dims, chunk=20)
        self.assertEqual(engine.log[0][request.request_id][:2], (0, 16))
        self.check_states(request, data, dims, 2, [16, 24, 30])

    def test_align_mode_stops_at_the_last_boundary_of_an_unchunked_prompt(self):
        """Without chunking the prompt (21 tokens, blocks of 8) is still cut at its last block
        boundary (last_cache_position: 16), so that state is kept, then the rest (5)."""
        dims = Mamba2Dims(n_groups=1)
        engine, request, _, data = self.run_request("align", dims)
        steps = [step[request.request_id][:2] for step in engine.log if request.request_id in step]
        self.assertEqual(steps[:2], [(0, 16), (16, 5)])
        self.check_states(request, data, dims, 2, [16, 24, 30])

    def test_align_mode_chunks_smaller_than_a_block(self):
        """Chunks of 5 in blocks of 8: a chunk that starts mid-block stops at the boundary."""
        dims = Mamba2Dims(n_groups=1)
        engine, request, _, data = self.run_request("align", dims, chunk=5)
        steps = [step[request.request_id][:2] for step in engine.log if request.request_id in step]
        self.assertEqual(steps[:5], [(0, 5), (5, 3), (8, 5), (13, 3), (16, 5)])
        self.check_states(request, data, dims, 2, [8, 16, 24, 30])

    def test_end_state_only_when_asked(self):
        dims = Mamba2Dims(n_groups=1)
        _, request, _, data = self.run_request("all", dims, chunk=20, extra={"state_checkpoints": False})
        self.check_states(request, data, dims, 2, [30])

    def test_one_rank_and_four(self):
        for tp, dims in ((1, Mamba2Dims(n_groups=2)), (4, Mamba2Dims(heads=4, n_groups=1))):
            with self.subTest(tp=tp):
                self.tearDown()
                self.setUp()
                _, request, _, data = self.run_request("all", dims, tp=tp, chunk=20)
                self.check_states(request, data, dims, tp, [8, 16, 24, 30])

    def test_gated_delta_net(self):
        """Qwen3-Next's linear attention: conv over q | k | v split over the ranks, the recurrent
        state kept by vLLM as (head_v_dim, head_k_dim) and read in HF's order."""
        dims = GdnDims()
        for tp in (1, 2):
            with self.subTest(tp=tp):
                self.tearDown()
                self.setUp()
                _, request, _, data = self.run_request("align", dims, tp=tp, chunk=20)
                self.check_states(request, data, dims, tp, [16, 24, 30])
        bundle = os.path.join(self.tmp.name, "gdn.h5")
        bundle_from_shards(self.out, bundle, HFStandIn(data, noise=True), log=self.fail)
        with h5py.File(bundle, "r") as f:
            (pid,) = f["prompts"]
            state = f[f"prompts/{pid}/engine/states/{MIXERS[0]}"]
            self.assertEqual(state.attrs["kind"], b"gated_delta_net")
            self.assertEqual(state["rank_1/recurrent"].shape, (3, 2, dims.head_k_dim, dims.head_v_dim))
            ref = f[f"prompts/{pid}/reference/expected/states/{MIXERS[0]}/recurrent"][()]
            truth = data[MIXERS[0]]["recurrent"][[15, 23, 29]]
            self.assertLess(np.abs(ref - truth).max(), 2 ** -7 * np.abs(truth).max())
        if BINARY:
            result = subprocess.run([BINARY, "analyze", bundle, "--json", bundle + ".json"], capture_output=True,
                                    text=True)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            with open(bundle + ".json") as f:
                analysis = json.load(f)
            self.assertEqual((analysis["not_compared"], analysis["suspects"]), ([], []))

    def test_states_not_read_are_said_and_the_engine_runs(self):
        """A model whose HF config gives no n_groups: the states are not captured (said at
        registration), its attention still is."""
        dims = Mamba2Dims(n_groups=1)
        groups = [vm.Group(list(ATTN), vm.FlashAttentionBackend, block_size=BLOCK),
                  vm.Group(list(MIXERS), block_size=BLOCK, mamba=True, mamba_dims=dims, mamba_mode="all")]
        engine = vm.Engine(groups, total_heads=HEADS, head_size=DIM, tp=2, num_blocks=48,
                           connector=(KvscopeConnector, {"output_dir": self.out}))
        for w in engine.workers:
            del w.vllm_config.model_config.hf_text_config.n_groups
            w.connector.register_kv_caches(dict(w.caches))
            caches = w.connector._rank_caches()
            self.assertEqual(caches.state_layouts, {})
            self.assertIn("n_groups", caches.states_not_captured[0])
            self.assertIn(MIXERS[0], caches.states_not_captured[0])

    def test_bundle_with_the_reference_states(self):
        dims = Mamba2Dims(heads=4, n_groups=2)
        _, request, tokens, data = self.run_request("all", dims, chunk=20)
        bundle = os.path.join(self.tmp.name, "hybrid.h5")
        reference = HFStandIn(data, noise=True)
        bundle_from_shards(self.out, bundle, reference, baseline_model=HFStandIn(data), log=self.fail)
        self.assertEqual(reference.calls[-4:], [8, 16, 24, 30])  # a prefill to each checkpoint
        with h5py.File(bundle, "r") as f:
            (pid,) = f["prompts"]
            for name in MIXERS:
                engine = f[f"prompts/{pid}/engine/states/{name}"]
                self.assertEqual(engine["positions"][()].tolist(), [8, 16, 24, 30])
                self.assertEqual(engine.attrs["tp_size"], 2)
                ref = f[f"prompts/{pid}/reference/baseline/states/{name}"]
                self.assertEqual(ref["positions"][()].tolist(), [8, 16, 24, 30])
                want = np.stack([data[name]["conv"][p - 1] for p in (8, 16, 24, 30)]).astype(np.float32)
                np.testing.assert_array_equal(ref["conv"][()], want)  # the last d_conv - 1 columns
                expected = f[f"prompts/{pid}/reference/expected/states/{name}/ssm"][()]
                truth = np.stack([data[name]["ssm"][p - 1] for p in (8, 16, 24, 30)])
                self.assertLess(np.abs(expected - truth).max(), 2 ** -7 * np.abs(truth).max())
        if BINARY:  # kvscope compares them: equal within the noise, no suspect, nothing left out
            result = subprocess.run([BINARY, "inspect", bundle], capture_output=True, text=True)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            result = subprocess.run([BINARY, "analyze", bundle, "--json", bundle + ".json"], capture_output=True,
                                    text=True)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            with open(bundle + ".json") as f:
                analysis = json.load(f)
            self.assertEqual(analysis["not_compared"], [])
            self.assertEqual(analysis["suspects"], [])


class PaddedPages(unittest.TestCase):
    def test_a_padded_page_read_through_either_view(self):
        """mamba_page_size_padded: the page view [num_blocks, 1, 1, padded page] (vLLM of 2026-08-19)
        and a view of the states alone with the padded block stride (the refactored interface's
        [B, 1, 1, state_content_size_bytes]) read the same states."""
        from types import SimpleNamespace
        from kvscope_capture.vllm.mamba_state import MambaStateLayout

        dims, tp, blocks = Mamba2Dims(heads=4, n_groups=2), 2, 6
        engine = SimpleNamespace(tp=tp, dtype=torch.bfloat16, _padded_to_attention=lambda spec: spec)  # states alone
        spec = vm.Engine.mamba_spec(engine, vm.Group(MIXERS, mamba=True, mamba_dims=dims, block_size=8))
        content = spec.page_size_bytes
        spec = vm.MambaSpec(spec.block_size, spec.shapes, spec.dtypes, page_size_padded=content + 96)
        raw = torch.zeros(blocks * spec.page_size_bytes, dtype=torch.int8)
        page_view = raw.view(blocks, 1, 1, spec.page_size_bytes)
        content_view = torch.as_strided(raw, (blocks, 1, 1, content), (spec.page_size_bytes, content, content, 1))
        layer = vm.MambaLayer(spec)
        layer.bind_kv_cache(page_view)
        conv, ssm = layer.kv_cache
        g = torch.Generator().manual_seed(3)
        conv.copy_(torch.randn(conv.shape, generator=g).to(conv.dtype))
        ssm.copy_(torch.randn(ssm.shape, generator=g))
        raw.view(blocks, -1)[:, content:] = 99  # the padding: not a state
        layout = MambaStateLayout(spec, tp, 1, SimpleNamespace(n_groups=2), "layer m")
        self.assertIsNone(layout.why_not)
        for view in (page_view, content_view):
            layout.check(view, blocks)
            got = layout.read(view, [4, 2])
            torch.testing.assert_close(got["conv"], conv[[4, 2]].transpose(1, 2), rtol=0, atol=0)
            torch.testing.assert_close(got["ssm"], ssm[[4, 2]], rtol=0, atol=0)


class AttentionOnlyReference(HFStandIn):
    """A reference whose cache holds KV and no state: not the engine's hybrid model."""

    def __call__(self, input_ids, past_key_values=None, use_cache=True):
        out = super().__call__(input_ids, past_key_values, use_cache)
        out.past_key_values.conv_states = [torch.zeros(0)] * 4
        return out


class ReferenceStates(unittest.TestCase):
    def test_a_reference_without_states_is_refused_by_name(self):
        case = StatesThroughTheConnector("test_none_mode_keeps_the_end_state")
        case.setUp()
        try:
            _, _, _, data = case.run_request("none", Mamba2Dims())
            with self.assertRaisesRegex(ValueError, "prompt cmpl-s, expected, layer model.layers.1.mixer: the "
                                                    "reference model's cache holds no state of layer 1"):
                bundle_from_shards(case.out, os.path.join(case.tmp.name, "b.h5"), AttentionOnlyReference(data))
        finally:
            case.tearDown()

    def test_prefix_prefills_and_the_last_columns(self):
        dims = Mamba2Dims()
        tokens = list(range(12))
        data = data_for(tokens, dims)
        model = HFStandIn(data)
        found = extract_hf_mamba_states(model, tokens, [4, 12])
        self.assertEqual(model.calls, [4, 12])
        self.assertEqual(sorted(found), [1, 3])
        np.testing.assert_array_equal(found[1]["conv"].numpy(), data[MIXERS[0]]["conv"][[3, 11]].astype(np.float32))
        with self.assertRaises(ValueError):
            extract_hf_mamba_states(model, tokens, [4, 4])


if __name__ == "__main__":
    unittest.main()
