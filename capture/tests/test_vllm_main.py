"""Capture from the vLLM users run today, against the stand-in of its main branch (tests/vllm_main.py):
layouts decided from each layer's spec and read bit for bit through strided views of one shared
buffer, every cache format (bf16, fp8 per tensor, int8 / fp8 / int4 per token-head, NVFP4), layers in
their own formats, both model runners, re-registration, suffixed request ids, the layers that share
a cache, MultiConnector beside an offloading connector, and shards written off the engine's step."""

import json
import os
import subprocess
import tempfile
import threading
import unittest

import numpy as np
import torch

import vllm_main as vm
from kvscope_capture import bundle_from_shards
from kvscope_capture.shards import ShardSet
from kvscope_capture.vllm import KvscopeWorkerExtension, LayoutError
from kvscope_capture.vllm.connector import KvscopeConnector
from kvscope_capture.vllm.rank_caches import RankCaches
from kvscope_capture.vllm.worker_extension import _V2_NEEDS_SNAPSHOTS

BINARY = os.environ.get("KVSCOPE_BINARY")
L = [f"model.layers.{i}.self_attn.attn" for i in range(4)]
HEADS, DIM = 4, 64


def truth(names, fmt, seq, seed=0, heads=HEADS, dim=DIM, mla_width=None):
    """Each layer's data for every position, as the stand-in's kernels take it (random codes and
    scales for the quantised formats: the capture must carry the bits, whatever they mean)."""
    g = torch.Generator().manual_seed(seed)

    def codes(high, *shape, dtype=torch.uint8):
        return torch.randint(0, high, shape, generator=g).to(dtype)

    def scales(*shape):
        return torch.rand(shape, generator=g) * 0.1 + 1e-3

    out = {}
    for name in names:
        if fmt == "mla":
            out[name] = {"latent": torch.randn(seq, mla_width, generator=g).to(torch.bfloat16)}
        elif fmt in ("packed", "kv_slots"):
            out[name] = {p: torch.randn(heads, seq, dim, generator=g).to(torch.bfloat16) for p in "kv"}
        elif fmt == "packed_codes":  # fp8 e4m3 codes without the NaNs
            out[name] = {p: codes(0x7f, heads, seq, dim) | (codes(2, heads, seq, dim) << 7) for p in "kv"}
        elif fmt == "per_token_head_int8":
            out[name] = {"k": codes(256, heads, seq, dim, dtype=torch.int16).sub(128).to(torch.int8),
                         "v": codes(256, heads, seq, dim, dtype=torch.int16).sub(128).to(torch.int8),
                         "k_scale": scales(heads, seq), "v_scale": scales(heads, seq)}
        elif fmt == "per_token_head_fp8":
            out[name] = {"k": codes(0x7f, heads, seq, dim), "v": codes(0x7f, heads, seq, dim),
                         "k_scale": scales(heads, seq), "v_scale": scales(heads, seq)}
        elif fmt == "int4":
            out[name] = {"k": codes(16, heads, seq, dim), "v": codes(16, heads, seq, dim),
                         "k_scale": scales(heads, seq), "v_scale": scales(heads, seq),
                         "k_zp": codes(16, heads, seq), "v_zp": codes(16, heads, seq)}
        elif fmt == "nvfp4":  # e2m1 codes and e4m3 block scale bytes (no NaN)
            out[name] = {"k": codes(16, heads, seq, dim), "v": codes(16, heads, seq, dim),
                         "k_sf": codes(0x7f, heads, seq, dim // 16), "v_sf": codes(0x7f, heads, seq, dim // 16)}
        else:
            raise AssertionError(fmt)
    return out


def rows_at(entry_ids, block_ids, block_size, p):
    """The stored row and offset of position p."""
    return entry_ids.index(block_ids[p // block_size]), p % block_size


class CaptureCase(unittest.TestCase):
    """What the capture tests share: an engine with kvscope's connector writing into a fresh folder."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.out = os.path.join(self.tmp.name, "shards")

    def tearDown(self):
        self.tmp.cleanup()

    def engine(self, groups, extra=None, **kwargs):
        return vm.Engine(groups, total_heads=kwargs.pop("heads", HEADS), head_size=kwargs.pop("dim", DIM),
                         connector=(KvscopeConnector, dict({"output_dir": self.out}, **(extra or {}))), **kwargs)

    def capture(self, engine, data, prompt=20, output=11, external="cmpl-7"):
        """One request through the engine and the connector; returns its ShardedRequest."""
        rid = engine.add_request(external, list(range(prompt)), list(range(100, 100 + output)), data)
        engine.run()
        for w in engine.workers:
            self.assertTrue(w.connector._writer.flush(30))
        shards = ShardSet(self.out)
        self.assertEqual(shards.incomplete, {})
        (request,) = [r for r in shards.requests if r.request_id == rid]
        self.assertEqual(request.external_request_id, external)  # read back from the engine's id
        return request

    def check_values(self, engine, request, data, expect):
        """Every written position of every layer on every rank, as the stand-in stored it.
        expect(entry, row, offset, heads, truth, p) asserts one position."""
        ranks = request.per_rank_kv()
        written = request.num_computed_tokens
        for gi, group in enumerate(engine.groups):
            for name in group.layer_names:
                for rank in range(engine.tp):
                    entry = ranks[rank][name]
                    heads = engine.heads_of_rank(rank)
                    for p in range(written):
                        row, t = rows_at(entry["block_ids"], request.block_ids[gi], group.block_size, p)
                        expect(entry, row, t, heads, data[engine.alias.get(name, name)], p)


class Capture(CaptureCase):
    def test_every_layout_and_kernel_block(self):
        """bf16 K|V packed in each of the six stride orders, with kernel blocks a quarter of the
        manager's, two groups overlaid on one region, TP 2."""
        def same(entry, row, t, heads, truth_, p):
            for part in "kv":
                self.assertTrue(torch.equal(entry[part][row, :, t], truth_[part][heads, p]), (part, p))

        for i, layout in enumerate(vm.KVCacheLayout):
            with self.subTest(layout=layout.name):
                self.tmp.cleanup()
                self.tmp = tempfile.TemporaryDirectory()
                self.out = os.path.join(self.tmp.name, "shards")
                kernel = 16 if layout.value[:2] == (0, 1) else None  # kernel blocks need dense pages
                groups = [vm.Group([L[0], L[2]], block_size=64, kernel_block_size=kernel, window=64),
                          vm.Group([L[1], L[3]], block_size=64, kernel_block_size=kernel)]
                engine = self.engine(groups, tp=2, layout=layout, chunk=16)
                data = truth(L, "packed", 80, seed=i)
                request = self.capture(engine, data, prompt=50, output=31)
                self.assertEqual([g["dtype"] for g in request.config["groups"]], ["bfloat16", "bfloat16"])
                self.check_values(engine, request, data, same)

    def test_layers_of_other_head_counts_at_offsets(self):
        """A group whose layers have their own specs (per-layer GQA: 4 and 2 KV heads) holds a tensor
        per spec, the second at an offset into the shared region, in each stride order."""
        for i, layout in enumerate(vm.KVCacheLayout):
            with self.subTest(layout=layout.name):
                self.tmp.cleanup()
                self.tmp = tempfile.TemporaryDirectory()
                self.out = os.path.join(self.tmp.name, "shards")
                heads = {L[1]: 2, L[3]: 2}
                engine = self.engine([vm.Group(L, layer_heads=heads)], layout=layout)
                offsets = sorted(t.offset for t in engine.workers[0].scheduler_kv_cache_config.kv_cache_tensors)
                self.assertEqual(len(offsets), 2)
                self.assertEqual(offsets[0], 0)
                self.assertGreater(offsets[1], 0)
                data = {**truth([L[0], L[2]], "packed", 31, seed=i),
                        **truth([L[1], L[3]], "packed", 31, seed=10 + i, heads=2)}
                request = self.capture(engine, data)
                ranks = request.per_rank_kv()
                for name in L:
                    entry = ranks[0][name]
                    for p in range(30):
                        row, t = rows_at(entry["block_ids"], request.block_ids[0], 16, p)
                        for part in "kv":
                            self.assertTrue(torch.equal(entry[part][row, :, t], data[name][part][:, p]), (name, p))

    def test_two_kv_heads_packed_and_slots_share_a_shape(self):
        """With 2 KV heads per rank, K|V packed per head and ROCm's K and V head slots are both
        [B, 2, N, 2 * D]: only the spec tells them apart."""
        for backend in (vm.FlashAttentionBackend, vm.RocmAttentionBackend):
            with self.subTest(backend=backend.get_name()):
                self.tmp.cleanup()
                self.tmp = tempfile.TemporaryDirectory()
                self.out = os.path.join(self.tmp.name, "shards")
                # ROCm attention's layouts: LHBNC, LBHNC (supported_kv_cache_layouts)
                engine = self.engine([vm.Group(L, backend=backend)], heads=2, dim=32, layout=vm.KVCacheLayout.LBHNC)
                shapes = {tuple(c.shape) for c in engine.workers[0].caches.values()}
                self.assertEqual(shapes, {(40, 2, 16, 64)})
                data = truth(L, "packed", 30, heads=2, dim=32)
                request = self.capture(engine, data)

                def same(entry, row, t, heads, truth_, p):
                    for part in "kv":
                        self.assertTrue(torch.equal(entry[part][row, :, t], truth_[part][heads, p]))
                self.check_values(engine, request, data, same)

    def test_skip_layers_keep_their_own_format(self):
        """--kv-cache-dtype fp8 with layers 1 and 3 skipped: those layers' spec says bf16 (their
        kv_quant_mode NONE), and the bundle says so, layer by layer."""
        groups = [vm.Group([L[0], L[2]], cache_dtype="fp8"), vm.Group([L[1], L[3]], cache_dtype="auto")]
        scales = {n: (0.5, 0.25) for n in L}
        engine = self.engine(groups, scales=scales)
        data = {**truth([L[0], L[2]], "packed_codes", 30), **truth([L[1], L[3]], "packed", 30)}
        request = self.capture(engine, data)
        formats = {n: g["dtype"] for g in request.config["groups"] for n in g["layer_names"]}
        self.assertEqual(formats, {L[0]: "float8_e4m3fn", L[2]: "float8_e4m3fn", L[1]: "bfloat16", L[3]: "bfloat16"})
        ranks = request.per_rank_kv()
        self.assertEqual(float(ranks[0][L[0]]["k_scale"]), 0.5)
        self.assertEqual(float(ranks[0][L[0]]["v_scale"]), 0.25)
        self.assertNotIn("k_scale", ranks[0][L[1]])

        def same(entry, row, t, heads, truth_, p):
            for part in "kv":
                got = entry[part][row, :, t]
                want = truth_[part][heads, p]
                self.assertTrue(torch.equal(got.view(torch.uint8) if got.dtype != torch.bfloat16 else got, want))
        self.check_values(engine, request, data, same)

    def test_fp8_is_the_platforms(self):
        """On ROCm MI300 vLLM's fp8 is e4m3fnuz (current_platform.fp8_dtype()), elsewhere e4m3fn."""
        from vllm.platforms import current_platform
        for platform, want in (("torch.float8_e4m3fn", "float8_e4m3fn"), ("torch.float8_e4m3fnuz", "float8_e4m3fnuz")):
            with self.subTest(platform=platform):
                current_platform.fp8 = platform
                try:
                    engine = vm.Engine([vm.Group(L, cache_dtype="fp8")], total_heads=HEADS, head_size=DIM)
                    worker = engine.workers[0]
                    caches = RankCaches(worker.scheduler_kv_cache_config, worker.vllm_config, worker.caches,
                                        worker.modules, 0, 0)
                finally:
                    current_platform.fp8 = "torch.float8_e4m3fn"
                self.assertEqual(caches.config["groups"][0]["dtype"], want)

    def test_hidden_state_and_sliding_mla_layers_listed_not_read(self):
        worker = vm.Engine([vm.Group(L)], total_heads=HEADS, head_size=DIM).workers[0]
        config = worker.scheduler_kv_cache_config
        spec = config.kv_cache_groups[0].kv_cache_spec

        @vm.dataclass(frozen=True, kw_only=True)
        class HiddenStateCacheSpec(vm.MLAAttentionSpec):
            pass

        hidden = HiddenStateCacheSpec(block_size=16, num_kv_heads=1, head_size=4096, dtype=torch.bfloat16)
        config.kv_cache_groups.append(vm.KVCacheGroupSpec(["model.layers.4.hidden"], hidden))
        caches = RankCaches(config, worker.vllm_config, worker.caches, worker.modules, 0, 0)
        self.assertEqual(caches.config["groups"][1]["not_compared"], "hidden-state cache layers (extract_hidden_states)")
        self.assertEqual(caches.config["groups"][0]["dtype"], "bfloat16")
        self.assertIs(config.kv_cache_groups[0].kv_cache_spec, spec)

    def test_per_token_head_int8_and_fp8(self):
        for dtype, fmt, want_dtype in (("int8_per_token_head", "per_token_head_int8", "int8"),
                                       ("fp8_per_token_head", "per_token_head_fp8", "float8_e4m3fn")):
            with self.subTest(dtype=dtype):
                self.tmp.cleanup()
                self.tmp = tempfile.TemporaryDirectory()
                self.out = os.path.join(self.tmp.name, "shards")
                engine = self.engine([vm.Group(L, backend=vm.TritonAttentionBackend, cache_dtype=dtype)], tp=2)
                data = truth(L, fmt, 30)
                request = self.capture(engine, data)
                self.assertEqual(request.config["groups"][0]["dtype"], want_dtype)

                def same(entry, row, t, heads, truth_, p):
                    for part in "kv":
                        got = entry[part][row, :, t]
                        want = truth_[part][heads, p]
                        self.assertTrue(torch.equal(got.view(want.dtype), want))
                        self.assertTrue(torch.equal(entry[part + "_scale"][row, :, t], truth_[part + "_scale"][heads, p]))
                self.check_values(engine, request, data, same)

    def test_int4_per_token_head(self):
        engine = self.engine([vm.Group(L, backend=vm.TritonAttentionBackend, cache_dtype="int4_per_token_head")])
        data = truth(L, "int4", 30)
        request = self.capture(engine, data)
        self.assertEqual(request.config["groups"][0]["dtype"], "int4_per_token_head")
        ranks = request.per_rank_kv()
        self.assertTrue(torch.equal(ranks[0][L[0]]["rht_signs"].float(), vm.rht_signs(DIM)))

        def same(entry, row, t, heads, truth_, p):
            for part in "kv":
                self.assertTrue(torch.equal(entry[part][row, :, t], truth_[part][heads, p]))
                self.assertTrue(torch.equal(entry[part + "_zero_point"][row, :, t], truth_[part + "_zp"][heads, p]))
                # The scale as the kernel stored it, its low 4 bits (the zero point's) cleared.
                want = (truth_[part + "_scale"][heads, p].view(torch.int32) & -16).view(torch.float32)
                self.assertTrue(torch.equal(entry[part + "_scale"][row, :, t], want))
        self.check_values(engine, request, data, same)

    def test_nvfp4(self):
        """FlashInfer's NVFP4 pages in the head-major layout: e2m1 codes, K's block scales in order and
        V's swizzled for the SM100 kernels, the global scales from _k_scale / _v_scale."""
        engine = self.engine([vm.Group(L, backend=vm.FlashInferBackend, cache_dtype="nvfp4")], tp=2,
                             layout=vm.KVCacheLayout.LBHNC, scales={n: (2.0, 0.75) for n in L})
        data = truth(L, "nvfp4", 30)
        request = self.capture(engine, data)
        self.assertEqual(request.config["groups"][0]["dtype"], "nvfp4")
        ranks = request.per_rank_kv()
        self.assertEqual((float(ranks[1][L[2]]["k_global_scale"]), float(ranks[1][L[2]]["v_global_scale"])),
                         (2.0, 0.75))

        def same(entry, row, t, heads, truth_, p):
            for part in "kv":
                self.assertTrue(torch.equal(entry[part][row, :, t], truth_[part][heads, p]))
                self.assertTrue(torch.equal(entry[part + "_scale"][row, :, t], truth_[part + "_sf"][heads, p]), part)
        self.check_values(engine, request, data, same)

    def test_mla_latent_view(self):
        """The latent (kv_lora_rank | rope) per position; with an alignment (DeepSeek V4's spec) each
        page padded: a block of 16 latents of 160 bytes, 2,560 bytes, in pages of 4,096."""
        for alignment in (None, 4096):
            with self.subTest(alignment=alignment):
                self.tmp.cleanup()
                self.tmp = tempfile.TemporaryDirectory()
                self.out = os.path.join(self.tmp.name, "shards")
                groups = [vm.Group(L, backend=vm.FlashMLABackend, mla=True, mla_alignment=alignment)]
                engine = self.engine(groups, tp=2, mla_widths=(64, 16))
                if alignment:
                    self.assertEqual(engine.spec_of(engine.groups[0]).page_size_bytes, 4096)
                data = truth(L, "mla", 30, mla_width=80)
                request = self.capture(engine, data)
                group = request.config["groups"][0]
                self.assertEqual((group["kv_lora_rank"], group["qk_rope_head_dim"]), (64, 16))

                def same(entry, row, t, heads, truth_, p):
                    self.assertTrue(torch.equal(entry["latent"][row, t], truth_["latent"][p]))
                self.check_values(engine, request, data, same)

    def test_unknown_formats_refused_by_name_at_registration(self):
        cases = [
            # a slot per head: FP8 keys (64 bytes) + 4-bit values (32) and their scale and zero point (4)
            (vm.Group(L, backend=vm.TurboQuantBackend, cache_dtype="turboquant_k8v4"), {},
             "kv_quant_mode TURBOQUANT_K8V4 with None head slots of 100 bytes.*FullAttentionSpec"),
            # 3-bit key indices (24) + their norm (2), 3-bit values (24) + 4: 54
            (vm.Group(L, backend=vm.TurboQuantBackend, cache_dtype="turboquant_3bit_nc"), {},
             "kv_quant_mode TURBOQUANT_3BIT_NC with None head slots of 54 bytes.*FullAttentionSpec"),
            (vm.Group(L, backend=vm.FlashInferBackend, cache_dtype="nvfp4"), {"layout": vm.KVCacheLayout.LBNHC},
             "NVFP4 pages only in a head-major layout"),
        ]
        for group, kwargs, message in cases:
            with self.subTest(message=message), self.assertRaisesRegex(LayoutError, "layer model.layers.0.* " + message):
                self.engine([group], **kwargs)

    def test_view_that_is_not_its_spec_refused(self):
        engine = vm.Engine([vm.Group(L)], total_heads=HEADS, head_size=DIM)
        worker = engine.workers[0]
        caches = dict(worker.caches)
        caches[L[1]] = caches[L[1]].float()
        with self.assertRaisesRegex(LayoutError, r"layer model.layers.1.self_attn.attn: the cache is \(40, 4, 16, 128\) "
                                                 r"float32, not the \[blocks, 4, tokens, 128\] bfloat16 view"):
            RankCaches(worker.scheduler_kv_cache_config, worker.vllm_config, caches, worker.modules, 0, 0)
        spec = worker.scheduler_kv_cache_config.kv_cache_groups[0].kv_cache_spec
        worker.scheduler_kv_cache_config.kv_cache_groups[0].kv_cache_spec = vm.replace(spec, tokens_per_state=4)
        with self.assertRaisesRegex(LayoutError, "4 tokens per stored state.*tokens_per_state=4"):
            RankCaches(worker.scheduler_kv_cache_config, worker.vllm_config, worker.caches, worker.modules, 0, 0)

    def test_sharing_layers_left_out_of_the_connectors_config(self):
        """Layer 3 shares layer 1's cache: the connector's config does not list it, vLLM registers
        it as layer 1's tensor; the capture reads it once and names it."""
        engine = self.engine([vm.Group(L)], alias={L[3]: L[1]})
        self.assertNotIn(L[3], engine.workers[0].scheduler_kv_cache_config.kv_cache_groups[0].layer_names)
        data = truth(L[:3], "packed", 30)
        request = self.capture(engine, data)
        self.assertEqual(request.config["kv_sharing"], {L[3]: L[1]})
        ranks = request.per_rank_kv()
        # Bit for bit (the slots no position wrote hold garbage, NaNs among it).
        self.assertTrue(torch.equal(ranks[0][L[3]]["k"].view(torch.int16), ranks[0][L[1]]["k"].view(torch.int16)))

    def test_sharing_layer_found_by_its_view_alone(self):
        """Without the module's kv_sharing_target_layer_name, a layer the config leaves out is its
        target's when exactly one listed layer has the very same view; two groups overlaid on one
        region give layer i of each the same view, and then nothing is guessed."""
        engine = vm.Engine([vm.Group(L)], total_heads=HEADS, head_size=DIM, alias={L[3]: L[1]})
        worker = engine.workers[0]
        worker.modules[L[3]].kv_sharing_target_layer_name = None
        caches = RankCaches(worker.scheduler_kv_cache_config, worker.vllm_config, worker.caches, worker.modules, 0, 0)
        self.assertEqual(caches.aliases, {L[3]: L[1]})
        names = [f"model.layers.{i}.self_attn.attn" for i in range(5)]
        engine = vm.Engine([vm.Group(names[:2] + names[4:]), vm.Group(names[2:4], window=32)], total_heads=HEADS,
                           head_size=DIM, alias={names[4]: names[0]})
        worker = engine.workers[0]
        self.assertEqual(worker.caches[names[0]].data_ptr(), worker.caches[names[2]].data_ptr())  # overlaid
        worker.modules[names[4]].kv_sharing_target_layer_name = None
        caches = RankCaches(worker.scheduler_kv_cache_config, worker.vllm_config, worker.caches, worker.modules, 0, 0)
        self.assertEqual(caches.aliases, {})
        self.assertNotIn(names[4], caches.layer_names())

    def test_registration_again_reads_the_new_caches(self):
        """Model Runner V2 may initialise its KV cache again: the connector reads the new buffer."""
        engine = self.engine([vm.Group(L)])
        first = engine.workers[0].connector._rank_caches()
        engine.initialize_kv_cache(engine.workers[0])
        second = engine.workers[0].connector._rank_caches()
        self.assertIsNot(first, second)
        self.assertEqual(second.caches[L[0]].data_ptr(), engine.workers[0].caches[L[0]].data_ptr())
        data = truth(L, "packed", 30)
        request = self.capture(engine, data)

        def same(entry, row, t, heads, truth_, p):
            self.assertTrue(torch.equal(entry["k"][row, :, t], truth_["k"][heads, p]))
        self.check_values(engine, request, data, same)

    def test_suffixed_request_ids_name_prompts_by_the_users_id(self):
        """The scheduler's Request carries the engine's id only ("<given>-<8 hex>", parallel-sampling
        children "<i>_<given>-<8 hex>"): the id given is read back from it for the connector's
        filter and the prompts' names; children of one request keep the engine's ids."""
        engine = self.engine([vm.Group(L)], extra={"requests": ["cmpl-"]})
        data = truth(L, "packed", 31)
        ids = [engine.add_request(ext, list(range(20)), list(range(100, 111)), data) for ext in ("cmpl-a", "other")]
        ids += [engine.add_request("cmpl-n", list(range(20)), list(range(100, 111)), data, child=i) for i in (0, 1)]
        engine.run()
        for w in engine.workers:
            w.connector._writer.flush(30)
        for rid in ids:
            self.assertRegex(rid, r"-[0-9a-f]{8}$")
        shards = ShardSet(self.out)
        self.assertEqual(sorted(r.request_id for r in shards.requests), sorted([ids[0], ids[2], ids[3]]))
        reference = ReferenceModel(data, L)
        written = bundle_from_shards(self.out, os.path.join(self.tmp.name, "b.h5"), reference, log=lambda _: None)
        self.assertEqual(sorted(written), sorted(["cmpl-a", ids[2], ids[3]]))


def kvscope(*args):
    result = subprocess.run([BINARY, *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise AssertionError(result.stderr)
    return result.stdout


class ToBundle(CaptureCase):
    """From the engine through the connector to a bundle that kvscope reads back exactly and
    analyses as clean."""

    def check_bundle(self, values, written=45):
        """The shards to a bundle (the reference: `values` with bf16 noise); kvscope export gives
        `values` bit for bit at every written position, and the analysis has no suspect. Returns
        the bundle's KV cache config."""
        import h5py
        bundle = os.path.join(self.tmp.name, "capture.h5")
        bundle_from_shards(self.out, bundle, ReferenceModel(values, L, noise=True), log=self.fail)
        out = os.path.join(self.tmp.name, "export.h5")
        kvscope("export", bundle, out)
        with h5py.File(out, "r") as f:
            (prompt,) = f["prompts"]
            for name in L:
                for part in "kv":
                    got = f[f"prompts/{prompt}/engine/{name}/{part}"][()]
                    np.testing.assert_array_equal(got[:, :written], values[name][part][:, :written].numpy(),
                                                  err_msg=f"{name} {part}")
        kvscope("analyze", bundle, "--json", bundle + ".json")
        with open(bundle + ".json") as f:
            self.assertEqual(json.load(f)["prompts"][0]["suspects"], [])
        with h5py.File(bundle, "r") as f:
            return json.loads(f["kv_cache_config"][0])

    @unittest.skipUnless(BINARY, "KVSCOPE_BINARY is not set")
    def test_bf16_and_int8_per_token_head(self):
        cases = (("auto", vm.FlashAttentionBackend, "packed"),
                 ("int8_per_token_head", vm.TritonAttentionBackend, "per_token_head_int8"))
        for cache_dtype, backend, fmt in cases:
            with self.subTest(cache_dtype=cache_dtype):
                self.tmp.cleanup()
                self.tmp = tempfile.TemporaryDirectory()
                self.out = os.path.join(self.tmp.name, "shards")
                engine = self.engine([vm.Group(L[:2], backend=backend, cache_dtype=cache_dtype, window=64),
                                      vm.Group(L[2:], backend=backend, cache_dtype=cache_dtype)],
                                     tp=2, layout=vm.KVCacheLayout.LBHNC, chunk=16)
                data = truth(L, fmt, 46, seed=3)
                values = {n: {p: (d[p].float() * d[p + "_scale"][..., None]) if fmt != "packed" else d[p].float()
                              for p in "kv"} for n, d in data.items()}
                self.capture(engine, data, prompt=30, output=16)
                self.check_bundle(values)

    @unittest.skipUnless(BINARY, "KVSCOPE_BINARY is not set")
    def test_nvfp4_and_int4_per_token_head(self):
        """vLLM's 4-bit caches from the engine's pages to kvscope's values, bit for bit (decoded here
        from the formats' definitions), and a clean capture of each analysed without a suspect."""
        from test_quantised_formats import int4_decode, nvfp4_decode
        cases = (("nvfp4", vm.FlashInferBackend, "nvfp4"),
                 ("int4_per_token_head", vm.TritonAttentionBackend, "int4"))
        signs = vm.rht_signs(DIM).numpy()
        for cache_dtype, backend, fmt in cases:
            with self.subTest(cache_dtype=cache_dtype):
                self.tmp.cleanup()
                self.tmp = tempfile.TemporaryDirectory()
                self.out = os.path.join(self.tmp.name, "shards")
                scales = {n: (0.5, 2.0) for n in L}
                engine = self.engine([vm.Group(L, backend=backend, cache_dtype=cache_dtype)], tp=2,
                                     layout=vm.KVCacheLayout.LBHNC, scales=scales)
                data = truth(L, fmt, 46, seed=6)
                values = {}
                for n, d in data.items():
                    if fmt == "nvfp4":
                        values[n] = {p: torch.from_numpy(nvfp4_decode(d[p].numpy(), d[p + "_sf"].numpy(), g))
                                     for p, g in zip("kv", scales[n])}
                    else:
                        cleared = {p: (d[p + "_scale"].view(torch.int32) & -16).view(torch.float32) for p in "kv"}
                        values[n] = {p: torch.from_numpy(int4_decode(d[p].numpy(), cleared[p].numpy(),
                                                                     d[p + "_zp"].numpy(), signs)) for p in "kv"}
                self.capture(engine, data, prompt=30, output=16)
                self.check_bundle(values)

    @unittest.skipUnless(BINARY, "KVSCOPE_BINARY is not set")
    def test_skip_layers_mixed_formats_in_one_bundle(self):
        """fp8 with layers 1 and 3 skipped: one bundle, fp8 and bf16 layers, each read back exactly
        and judged in its own format's floors."""
        from test_cross_language import decode_fp8
        groups = [vm.Group([L[0], L[2]], cache_dtype="fp8"), vm.Group([L[1], L[3]], cache_dtype="auto")]
        scales = {n: (0.5, 0.25) for n in L}
        engine = self.engine(groups, scales=scales, tp=2, layout=vm.KVCacheLayout.LBHNC)
        data = {**truth([L[0], L[2]], "packed_codes", 46, seed=4), **truth([L[1], L[3]], "packed", 46, seed=5)}
        values = {}
        for n in L:
            if n in (L[0], L[2]):
                values[n] = {p: torch.from_numpy((decode_fp8(data[n][p].numpy(), "float8_e4m3fn")
                                                  * np.float32(s)).astype(np.float32))
                             for p, s in zip("kv", scales[n])}
            else:
                values[n] = {p: data[n][p].float() for p in "kv"}
        self.capture(engine, data, prompt=30, output=16)
        config = self.check_bundle(values)
        self.assertEqual(sorted(g["dtype"] for g in config["groups"]), ["bfloat16", "float8_e4m3fn"])


class ReferenceModel:
    """An HF-interface model whose cache holds the engine's KV (enough to write a bundle); with
    noise, as a bf16 run of the reference differs from the engine's."""

    def __init__(self, data, names, noise=False):
        g = torch.Generator().manual_seed(1)

        def near(t):
            t = t.float()
            return (t + t.abs() * 2 ** -9 * torch.randn(t.shape, generator=g)).to(torch.bfloat16) if noise else t
        self.kv = [(near(data[n]["k"]), near(data[n]["v"])) for n in names]

    def __call__(self, input_ids, past_key_values=None, use_cache=True):
        import types
        n = input_ids.shape[1]
        layers = [types.SimpleNamespace(keys=k[None, :, :n], values=v[None, :, :n]) for k, v in self.kv]
        logits = torch.randn(1, n, 16, generator=torch.Generator().manual_seed(n))
        return types.SimpleNamespace(logits=logits, past_key_values=types.SimpleNamespace(layers=layers))


class WorkerExtensionOnBothRunners(unittest.TestCase):
    def llm(self, engine):
        worker_cls = type("Worker", (KvscopeWorkerExtension,), {})
        workers = []
        for w in engine.workers:
            obj = worker_cls()
            obj.vllm_config, obj.model_runner, obj.place = w.vllm_config, w.model_runner, w
            workers.append(obj)
        return workers

    def rpc(self, engine, workers, method, *args):
        return [engine.call(w.place, getattr(w, method), *args) for w in workers]

    def test_block_ids_from_the_scheduler_output_with_preemption(self):
        """Both runners: the blocks followed from each step's SchedulerOutput, a preempted request's
        list replaced when it resumes, and the last step's request kept after it finished."""
        for runner in ("v1", "v2"):
            with self.subTest(runner=runner):
                engine = vm.Engine([vm.Group(L[:2]), vm.Group(L[2:], window=32)], total_heads=HEADS, head_size=DIM,
                                   runner=runner, chunk=8)
                workers = self.llm(engine)
                self.rpc(engine, workers, "enable_block_table_snapshots")
                data = truth(L, "packed", 40)
                rid = engine.add_request("r", list(range(30)), list(range(100, 111)), data)
                for _ in range(3):
                    engine.step()
                engine.preempt(rid)
                engine.run()
                (ids,) = {tuple(x) for x in self.rpc(engine, workers, "get_request_ids")}
                self.assertEqual(ids, (rid,))
                final = engine.requests[rid].block_ids
                tables = self.rpc(engine, workers, "get_block_tables")[0]
                from kvscope_capture.tensors import load_torch_bytes
                for g, raw in enumerate(tables):
                    table = load_torch_bytes(raw, "table")
                    self.assertEqual(table[0].tolist(), final[g])
                caches = self.rpc(engine, workers, "get_kv_caches")[0]
                entry = load_torch_bytes(caches[L[0]], "kv")
                for p in range(40):
                    row = entry["block_ids"].index(final[0][p // 16])
                    self.assertTrue(torch.equal(entry["k"][row, :, p % 16], data[L[0]]["k"][:, p]))

    def test_v2_without_snapshots_says_what_to_do(self):
        engine = vm.Engine([vm.Group(L)], total_heads=HEADS, head_size=DIM, runner="v2")
        workers = self.llm(engine)
        with self.assertRaisesRegex(RuntimeError, "Model Runner V2.*enable_block_table_snapshots"):
            self.rpc(engine, workers, "get_block_tables")
        self.assertIn("KvscopeConnector", _V2_NEEDS_SNAPSHOTS)

    def test_v1_without_snapshots_reads_its_requests(self):
        engine = vm.Engine([vm.Group(L)], total_heads=HEADS, head_size=DIM, runner="v1")
        workers = self.llm(engine)
        data = truth(L, "packed", 30)
        rid = engine.add_request("r", list(range(20)), list(range(100, 111)), data)
        for _ in range(4):
            engine.step()
        self.assertEqual(self.rpc(engine, workers, "get_request_ids")[0], [rid])


def _offloading_class():
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata, SupportsHMA

    class Offloading(KVConnectorBase_V1, SupportsHMA):
        saved = []

        def __init__(self, vllm_config, role, kv_cache_config):
            super().__init__(vllm_config, role, kv_cache_config)
            self._pending, self._saving = [], {}

        def get_num_new_matched_tokens(self, request, num_computed_tokens):
            return 0, False

        def update_state_after_alloc(self, request, blocks, num_external_tokens):
            return None

        def build_connector_meta(self, scheduler_output):
            meta = KVConnectorMetadata()
            meta.requests, self._pending = self._pending, []
            return meta

        def request_finished(self, request, block_ids):
            return self.request_finished_all_groups(request, (block_ids,))

        def request_finished_all_groups(self, request, block_ids):
            self._pending.append(request.request_id)
            return True, {"offloaded": True}

        def start_load_kv(self, forward_context, **kwargs):
            for rid in getattr(self._get_connector_metadata(), "requests", []):
                self._saving[rid] = 2

        def wait_for_layer_load(self, layer_name):
            return None

        def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
            return None

        def wait_for_save(self):
            return None

        def get_finished(self, finished_req_ids):
            done = set()
            for rid in list(self._saving):
                self._saving[rid] -= 1
                if self._saving[rid] == 0:
                    done.add(rid)
                    del self._saving[rid]
                    Offloading.saved.append(rid)
            return done or None, None

    return Offloading


Offloading = _offloading_class()  # MultiConnector builds it by module path and name


class BesideOtherConnectors(unittest.TestCase):
    def test_inside_multiconnector_beside_an_offloading_connector(self):
        """kvscope's connector in vLLM's MultiConnector next to an asynchronous saver: both hold the
        request, its blocks are freed once both report, and the shards hold its KV."""
        from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiConnector

        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "shards")
            extra = {"connectors": [
                {"kv_connector": "Offloading", "kv_connector_module_path": "test_vllm_main", "kv_role": "kv_both"},
                {"kv_connector": "KvscopeConnector", "kv_connector_module_path": "kvscope_capture.vllm.connector",
                 "kv_role": "kv_producer", "kv_connector_extra_config": {"output_dir": out}}]}
            engine = vm.Engine([vm.Group(L)], total_heads=HEADS, head_size=DIM, tp=2,
                               connector=(MultiConnector, extra))
            data = truth(L, "packed", 30)
            rid = engine.add_request("r", list(range(20)), list(range(100, 111)), data)
            free_before = len(engine.free)
            steps = engine.run()
            self.assertEqual(engine.finished_pending, set())
            self.assertEqual(len(engine.free), free_before)  # every block back in the pool
            self.assertIn(rid, Offloading.saved)
            for w in engine.workers:
                w.connector._connectors[1]._writer.flush(30)
            request = ShardSet(out).requests[0]
            self.assertEqual(request.request_id, rid)
            ranks = request.per_rank_kv()
            p = 25
            row = ranks[1][L[2]]["block_ids"].index(request.block_ids[0][p // 16])
            self.assertTrue(torch.equal(ranks[1][L[2]]["v"][row, :, p % 16], data[L[2]]["v"][[2, 3], p]))
            self.assertGreater(steps, 0)


class OffTheEnginesStep(unittest.TestCase):
    def test_full_queue_skips_and_counts_never_waits(self):
        """A writer that cannot write (a stalled disk): start_load_kv still returns, the queue of
        two fills, later requests are skipped, counted and named, and every request's blocks are
        released to the engine."""
        import kvscope_capture.vllm.shard_queue as sq
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "shards")
            started, gate = threading.Event(), threading.Event()
            real = sq.write_shard

            def stalled(*args):
                started.set()
                gate.wait(60)
                return real(*args)

            sq.write_shard = stalled
            try:
                engine = vm.Engine([vm.Group(L)], total_heads=HEADS, head_size=DIM,
                                   connector=(KvscopeConnector, {"output_dir": out, "max_pending_requests": 2}))
            finally:
                sq.write_shard = real
            data = truth(L, "packed", 31)
            ids = [engine.add_request("r0", list(range(20)), list(range(100, 111)), data)]
            engine.run()
            self.assertTrue(started.wait(30))  # the first is being written, and stays so
            ids += [engine.add_request(f"r{i}", list(range(20)), list(range(100, 111)), data) for i in range(1, 5)]
            engine.run()
            self.assertEqual(engine.finished_pending, set())
            writer = engine.workers[0].connector._writer
            self.assertEqual(writer.skipped, 2)  # two wait in the queue, two did not fit
            gate.set()
            self.assertTrue(writer.flush(30))
            shards = ShardSet(out)
            self.assertEqual(len(shards.requests), 3)
            self.assertEqual(len(shards.incomplete), 2)
            for why in shards.incomplete.values():
                self.assertIn("queue was full (max_pending_requests 2)", why)
            self.assertEqual(sorted([r.request_id for r in shards.requests] + list(shards.incomplete)), sorted(ids))


    def test_a_shard_that_cannot_be_written_is_named(self):
        """A write that fails (a full disk) leaves the request named as left out, not silently missing."""
        import kvscope_capture.vllm.shard_queue as sq
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "shards")

            def full_disk(*args):
                raise OSError("No space left on device")

            real, sq.write_shard = sq.write_shard, full_disk
            try:
                engine = vm.Engine([vm.Group(L)], total_heads=HEADS, head_size=DIM,
                                   connector=(KvscopeConnector, {"output_dir": out}))
            finally:
                sq.write_shard = real
            rid = engine.add_request("r", list(range(20)), list(range(100, 111)), truth(L, "packed", 31))
            engine.run()
            self.assertEqual(engine.finished_pending, set())
            self.assertTrue(engine.workers[0].connector._writer.flush(30))
            self.assertEqual(list(ShardSet(out).incomplete), [rid])
            self.assertIn("No space left on device", ShardSet(out).incomplete[rid])


if __name__ == "__main__":
    unittest.main()
