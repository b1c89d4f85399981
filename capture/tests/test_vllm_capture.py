"""Capture from upstream vLLM on GPU, against stand-ins of its objects (tests/vllm_cluster.py):
every cache layout read back bit for bit, the KV connector's life cycle, TP 2 and PP 2 shards
merged, fp8 scales, and the same data through the connector and through the worker extension's
RPCs analysed identically by kvscope. Needs KVSCOPE_BINARY for the tests that read bundles back."""

import io
import json
import os
import subprocess
import sys
import tempfile
import unittest

import h5py
import numpy as np
import torch

import vllm_cluster as vc
from mamba2_standin import Mamba2Dims, mamba2_states, rank_units
from test_cross_language import decode_fp8
from kvscope_capture import (BundleWriter, bundle_from_shards, extract_hf_kv_caches_teacher_forced,
                             extract_vllm_block_tables, extract_vllm_kv_cache_config, make_kv_extract_fn)
from kvscope_capture.shards import ShardSet
from kvscope_capture.stages import merge_stage_caches
from kvscope_capture.vllm import KvscopeWorkerExtension, LayoutError, detect_layout
from kvscope_capture.vllm.connector import KvscopeConnector

BINARY = os.environ.get("KVSCOPE_BINARY")
L = [f"model.layers.{i}.self_attn.attn" for i in range(4)]


def truth_kv(names, heads, seq, dim, seed, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.uint8:  # fp8 e4m3 codes, NaN (0x7f / 0xff) left out
        return {n: tuple(torch.randint(0, 0x7f, (heads, seq, dim), generator=g, dtype=torch.uint8)
                         | (torch.randint(0, 2, (heads, seq, dim), generator=g, dtype=torch.uint8) << 7)
                         for _ in "kv") for n in names}
    return {n: (torch.randn(heads, seq, dim, generator=g).to(dtype), torch.randn(heads, seq, dim, generator=g).to(dtype))
            for n in names}


def export(bundle, tmp):
    out = os.path.join(tmp, os.path.basename(bundle) + ".export.h5")
    result = subprocess.run([BINARY, "export", bundle, out], capture_output=True, text=True)
    if result.returncode != 0:
        raise AssertionError(result.stderr)
    return h5py.File(out, "r")


def analyse(bundle, tmp):
    out = bundle + ".json"
    result = subprocess.run([BINARY, "analyze", bundle, "--json", out], capture_output=True, text=True)
    if result.returncode != 0:
        raise AssertionError(result.stderr)
    with open(out) as f:
        data = json.load(f)
    data.pop("bundle", None)
    return data


def reference_of(cluster, kv, noise_seed=1):
    """A reference close to the engine's KV (bf16 rounding noise of an fp32 run), in model order."""
    g = torch.Generator().manual_seed(noise_seed)
    out = []
    for name in sorted(cluster.layers, key=lambda n: int(n.split(".")[2])):
        k, v = (t.float() for t in kv[cluster.alias.get(name, name)])
        out.append(tuple((t + t.abs() * 2 ** -9 * torch.randn(t.shape, generator=g)).to(torch.bfloat16)
                         for t in (k, v)))
    return out


class Layouts(unittest.TestCase):
    """Each backend's cache, written slot by slot as its kernels do, read back through the detected
    layout: with the backend (sentinel sizes) and from the tensor alone."""

    def check(self, backend, block_size=16, kernel=16, heads=2, dim=8, mla=False):
        num_blocks = 6
        ratio = block_size // kernel
        cache = vc.allocate(backend, num_blocks * ratio, kernel, 1 if mla else heads, dim, torch.bfloat16)
        g = torch.Generator().manual_seed(5)
        k = torch.randn(num_blocks * block_size, heads, dim, generator=g).to(torch.bfloat16)
        v = torch.randn(num_blocks * block_size, heads, dim, generator=g).to(torch.bfloat16)
        lat = torch.randn(num_blocks * block_size, dim, generator=g).to(torch.bfloat16)
        for slot in range(num_blocks * block_size):
            b, o = slot // block_size, slot % block_size
            kb, ko = b * ratio + o // kernel, o % kernel
            if mla:
                backend.write(cache, kb, ko, lat[slot], None, dim)
            else:
                backend.write(cache, kb, ko, k[slot], v[slot], dim)
        ids = [4, 1, 3]
        if not mla:  # a layout is never guessed from the shape alone
            with self.assertRaisesRegex(LayoutError, "does not guess a layout from the shape"):
                detect_layout(cache.shape, num_blocks, block_size, heads, dim)
        for given in (backend, None) if mla else (backend,):
            layout = detect_layout(cache.shape, num_blocks, block_size, 1 if mla else heads, dim, backend=given,
                                   mla=mla)
            self.assertEqual(layout.kernel_blocks_per_block, ratio)
            got = layout.read_blocks(cache, ids)
            order = ids
            if mla:
                want = torch.stack([lat[b * block_size:(b + 1) * block_size] for b in order])
                self.assertTrue(torch.equal(got, want))
            else:
                for part, src in zip(got, (k, v)):
                    want = torch.stack([src[b * block_size:(b + 1) * block_size].transpose(0, 1) for b in order])
                    self.assertEqual(tuple(part.shape), (3, heads, block_size, dim))
                    self.assertTrue(torch.equal(part, want), f"{backend.__name__} {given}")

    def test_flash_attention_nhd(self):
        self.check(vc.FlashAttentionBackend)

    def test_flash_attention_hnd(self):
        self.check(vc.FlashAttentionHNDBackend)

    def test_flashinfer_hnd(self):
        self.check(vc.FlashInferBackend)

    def test_triton(self):
        self.check(vc.TritonAttentionBackend)

    def test_packed_kv_nhd_and_hnd(self):
        self.check(vc.PackedTritonAttentionBackend)
        hnd = type("PackedHND", (vc.PackedTritonAttentionBackend,), {"layout": "HND"})
        self.check(hnd)

    def test_mla(self):
        self.check(vc.FlashMLABackend, dim=24, mla=True)

    def test_kernel_blocks_smaller_than_the_managers(self):
        self.check(vc.FlashAttentionBackend, block_size=64, kernel=16)
        self.check(vc.PackedTritonAttentionBackend, block_size=32, kernel=16)

    def test_older_backends_without_cache_dtype(self):
        self.check(vc.OldFlashAttentionBackend)

    def test_rocm_attention_refused(self):
        with self.assertRaisesRegex(LayoutError, "layer z: backend ROCM_ATTN .*reinterpret the cache's bytes"):
            shape = vc.RocmAttentionBackend.get_kv_cache_shape(6, 16, 2, 8)  # what it reports
            detect_layout(shape, 6, 16, 2, 8, backend=vc.RocmAttentionBackend, what="layer z")

    def test_unknown_layout_refused_by_name(self):
        cache = torch.zeros(6, 4, 16, 8)
        with self.assertRaisesRegex(LayoutError, r"layer x: backend NvfpFlashInferBackend reports a cache of shape "
                                                 r"\(1009, 6, 32, 88\)"):
            detect_layout(cache.shape, 6, 16, 2, 8, backend=vc.NvfpFlashInferBackend, what="layer x")
        with self.assertRaisesRegex(LayoutError, r"layer y: no attention backend .* does not guess a layout from the "
                                                 r"shape \(7, 3, 16, 8\)"):
            detect_layout((7, 3, 16, 8), 6, 16, 2, 8, what="layer y")
        with self.assertRaisesRegex(LayoutError, r"shape \(2, 6, 16, 2, 9\) is not the layout \(kv, blocks, tokens, "
                                                 r"heads, dim\) .* \(backend FlashAttentionBackend\)"):
            detect_layout((2, 6, 16, 2, 9), 6, 16, 2, 8, backend=vc.FlashAttentionBackend)


def two_groups(backend, window=20, kernel=16, block_size=16):
    return [vc.Group([L[0], L[2]], backend, block_size=block_size, kernel_block_size=kernel, window=window),
            vc.Group([L[1], L[3]], backend, block_size=block_size, kernel_block_size=kernel)]


class Connector(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.shards = os.path.join(self.tmp.name, "shards")

    def tearDown(self):
        self.tmp.cleanup()

    def capture(self, cluster, request_id, kv, prompt_len=20, total=45, async_scheduling=False):
        """One request through the connector's life cycle; checks that its blocks are held exactly
        until every worker has written its shard."""
        scheduler, workers = cluster.connectors(KvscopeConnector)
        prompt, output = list(range(prompt_len)), list(range(100, 100 + total - prompt_len))
        request, block_ids = cluster.run_request(request_id, prompt, output, kv, async_scheduling)
        held, params = scheduler.request_finished_all_groups(request, block_ids)
        self.assertEqual((held, params), (True, None))
        for worker in cluster.workers:
            worker.model_runner.requests.pop(request_id)
        # Before the step that hands the request to the workers, nothing is written or reported.
        self.assertEqual(os.listdir(self.shards) if os.path.isdir(self.shards) else [], [])
        finished = cluster.step(scheduler, workers, {request_id})
        self.assertEqual(finished, {request_id})
        cluster.finish(request_id, block_ids)
        self.assertEqual(cluster.step(scheduler, workers, set()), set())  # reported once
        return request, block_ids

    @unittest.skipUnless(BINARY, "KVSCOPE_BINARY is not set")
    def test_tp2_pp2_shards_merge_to_the_engine_kv(self):
        self.round_trip(vc.FlashAttentionHNDBackend, tp=2, pp=2, kernel=16, block_size=32)

    @unittest.skipUnless(BINARY, "KVSCOPE_BINARY is not set")
    def test_every_backend(self):
        hnd = type("PackedHND", (vc.PackedTritonAttentionBackend,), {"layout": "HND"})
        for backend in (vc.FlashAttentionBackend, vc.FlashInferBackend, vc.TritonAttentionBackend,
                        vc.PackedTritonAttentionBackend, hnd):
            with self.subTest(backend=backend.__name__):
                self.shards = os.path.join(self.tmp.name, backend.__name__)
                self.round_trip(backend, tp=2, pp=1)

    @unittest.skipUnless(BINARY, "KVSCOPE_BINARY is not set")
    def test_async_scheduling_counts_the_last_token(self):
        self.round_trip(vc.FlashInferBackend, tp=1, pp=1, async_scheduling=True)

    def round_trip(self, backend, tp, pp, kernel=16, block_size=16, async_scheduling=False):
        cluster = vc.Cluster(two_groups(backend, kernel=kernel, block_size=block_size), total_heads=4, tp=tp,
                             pp=pp, output_dir=self.shards)
        kv = truth_kv(cluster.layers, 4, 45, 8, seed=1)
        self.capture(cluster, "cmpl-1-0", kv, async_scheduling=async_scheduling)
        self.assertEqual(sorted(os.listdir(self.shards)),
                         [f"cmpl-1-0.tp{t}.pp{p}.h5" for t in range(tp) for p in range(pp)])
        bundle = os.path.join(self.shards, "c.h5")
        bundle_from_shards(self.shards, bundle, vc.FixedReference(reference_of(cluster, kv)), log=self.fail)
        with export(bundle, self.tmp.name) as f:
            for name in cluster.layers:
                got = f[f"prompts/cmpl-1-0/engine/{name}"]
                present = got["present"][()].astype(bool)
                window = 20 if name in (L[0], L[2]) else None
                expect = np.zeros(45, bool)
                expect[(max(0, 44 - window + 1) if window else 0):44] = True
                # Held: the window's positions (blocks wholly before it were freed), never the last.
                self.assertTrue(np.all(present[expect]), name)
                self.assertFalse(present[44])
                for part, truth in zip("kv", kv[name]):
                    np.testing.assert_array_equal(got[part][()][:, present], truth.float().numpy()[:, present],
                                                  err_msg=f"{name} {part}")

    @unittest.skipUnless(BINARY, "KVSCOPE_BINARY is not set")
    def test_fp8_cache_with_its_scales(self):
        scales = {L[0]: (0.5, 2.0), L[1]: (0.25, 3.0), L[2]: (1.5, 0.125), L[3]: (4.0, 0.75)}
        cluster = vc.Cluster(two_groups(vc.FlashInferBackend, window=None), total_heads=2, tp=2, dtype=torch.uint8,
                             cache_dtype="fp8", scales=scales, output_dir=self.shards)
        kv = truth_kv(cluster.layers, 2, 45, 8, seed=2, dtype=torch.uint8)
        self.capture(cluster, "r0", kv)
        bundle = os.path.join(self.tmp.name, "fp8.h5")
        reference = [tuple(torch.zeros(2, 45, 8) for _ in "kv") for _ in L]
        bundle_from_shards(self.shards, bundle, vc.FixedReference(reference), log=self.fail)
        with export(bundle, self.tmp.name) as f:
            for name in cluster.layers:
                for part, codes, scale in zip("kv", kv[name], scales[name]):
                    want = decode_fp8(codes.numpy(), "float8_e4m3fn") * np.float32(scale)
                    got = f[f"prompts/r0/engine/{name}"][part][()]
                    np.testing.assert_array_equal(got[:, :44], want[:, :44], err_msg=f"{name} {part}")

    @unittest.skipUnless(BINARY, "KVSCOPE_BINARY is not set")
    def test_mla_shards_to_a_bundle(self):
        """An MLA model's latents (c_kv 16, k_pe 8) from the connector to an analysis; a TP rank
        whose copy of one position differs is named with its block."""
        for fault in (None, (1, L[1], 37)):
            with self.subTest(replica_fault=fault):
                self.shards = os.path.join(self.tmp.name, f"mla_{fault is not None}")
                cluster = vc.Cluster([vc.Group(L[:2], vc.FlashMLABackend, mla=True)], total_heads=1, head_size=24,
                                     tp=2, output_dir=self.shards, replica_fault=fault)
                g = torch.Generator().manual_seed(3)
                latents = {n: torch.randn(45, 24, generator=g).to(torch.bfloat16) for n in L[:2]}
                _, block_ids = self.capture(cluster, "mla", latents)
                shards = ShardSet(self.shards)
                self.assertEqual(shards.incomplete, {})
                (request,) = shards.requests
                rank = request.per_rank_kv()[0]  # rank 0 wrote every value right
                for name in L[:2]:
                    entry = rank[name]
                    for i, b in enumerate(block_ids[0]):
                        got = entry["latent"][entry["block_ids"].index(b)][:min(16, 44 - i * 16)]
                        self.assertTrue(torch.equal(got, latents[name][i * 16:i * 16 + len(got)]))
                reference = vc.FixedMlaReference([(latents[n][:, :16], latents[n][:, 16:]) for n in L[:2]])
                bundle = os.path.join(self.tmp.name, f"mla_{fault is not None}.h5")
                bundle_from_shards(self.shards, bundle, reference, log=self.fail)
                prompt = analyse(bundle, self.tmp.name)["prompts"][0]
                self.assertEqual(prompt["part_names"], ["c_kv", "k_pe"])
                self.assertEqual((prompt["num_heads"], prompt["head_dim"], prompt["v_head_dim"]), (1, 16, 8))
                self.assertEqual(prompt["suspects"], [])  # rank 0's copy, the one analysed, is the reference
                if fault is None:
                    self.assertEqual(prompt["replica_differences"], [])
                    continue
                (d,) = prompt["replica_differences"]
                self.assertEqual((d["rank"], d["against_rank"], d["layer"], d["blocks"]), (1, 0, L[1], 1))
                self.assertEqual(d["physical_block"], block_ids[0][37 // 16])
                self.assertEqual((d["logical_block"], d["positions"]), (2, [32, 43]))

    @unittest.skipUnless(BINARY, "KVSCOPE_BINARY is not set")
    def test_fp8_ds_mla_shards_to_a_bundle(self):
        """DeepSeek's fp8_ds_mla cache (656 bytes a token: 512 e4m3 values of c_kv, 4 fp32 scales,
        64 bf16 values of k_pe) from the connector to an analysis that reads back exactly the
        values the bytes encode."""
        cluster = vc.Cluster([vc.Group(L[:2], vc.FlashMLABackend, mla=True)], total_heads=128, head_size=576,
                             tp=2, dtype=torch.uint8, cache_dtype="fp8_ds_mla", mla_widths=(512, 64),
                             output_dir=self.shards, num_blocks=8)
        rng = np.random.default_rng(5)
        latents, reference = {}, []
        for name in L[:2]:
            codes = (rng.integers(0, 0x7f, (45, 512)) | (rng.integers(0, 2, (45, 512)) << 7)).astype(np.uint8)
            scales = rng.uniform(0.01, 2.0, (45, 4)).astype(np.float32)
            k_pe = torch.randn(45, 64).to(torch.bfloat16)
            latents[name] = torch.from_numpy(np.concatenate(
                [codes, scales.view(np.uint8), k_pe.view(torch.int16).numpy().view(np.uint8)], -1))
            c_kv = decode_fp8(codes, "float8_e4m3fn") * np.repeat(scales, 128, -1)
            reference.append((torch.from_numpy(c_kv), k_pe.float()))
        self.capture(cluster, "ds", latents)
        bundle = os.path.join(self.tmp.name, "ds.h5")
        bundle_from_shards(self.shards, bundle, vc.FixedMlaReference(reference), log=self.fail)
        prompt = analyse(bundle, self.tmp.name)["prompts"][0]
        self.assertEqual(prompt["part_names"], ["c_kv", "k_pe"])
        self.assertEqual(prompt["suspects"], [])
        for part in ("k_linf", "v_linf"):  # the reference is what the bytes say, exactly
            errors = [x for layer in prompt["metrics"][part] for token in layer for x in token if x is not None]
            self.assertEqual(len(errors), 2 * 44)
            self.assertEqual(max(errors), 0.0)

    @unittest.skipUnless(BINARY, "KVSCOPE_BINARY is not set")
    def test_hybrid_model_to_a_bundle(self):
        """Attention layers captured and compared; the state-space layers' end states captured as
        vLLM of the spring of 2026 registered them (a list of state views per layer), with the
        reference's states beside them; every layer compared."""
        dims = Mamba2Dims(n_groups=1)
        groups = [vc.Group([L[0], L[2]], vc.FlashAttentionBackend),
                  vc.Group([L[1], L[3]], None, block_size=64, mamba=True, mamba_dims=dims)]
        cluster = vc.Cluster(groups, total_heads=2, tp=2, output_dir=self.shards)
        kv = truth_kv([L[0], L[2]], 2, 45, 8, seed=12)
        tokens = list(range(20)) + list(range(100, 125))  # what capture() runs
        states = {n: dict(zip(("conv", "ssm"), mamba2_states(tokens, dims, seed=i))) for i, n in enumerate((L[1], L[3]))}
        self.capture(cluster, "h", dict(kv, **states))
        # HF's cache of a hybrid model: an entry for every layer, empty KV for the state-space ones.
        reference = [kv[n] if n in (L[0], L[2]) else (torch.zeros(2, 0, 8), torch.zeros(2, 0, 8)) for n in L]
        bundle = os.path.join(self.tmp.name, "hybrid.h5")
        bundle_from_shards(self.shards, bundle, vc.FixedReference(reference, states={1: states[L[1]], 3: states[L[3]]}),
                           log=self.fail)
        with h5py.File(bundle, "r") as f:
            for name in (L[1], L[3]):
                self.assertEqual(f[f"prompts/h/engine/states/{name}/positions"][()].tolist(), [44])
                for r in range(2):
                    conv_units, _ = rank_units(dims, 2, r)
                    got = f[f"prompts/h/engine/states/{name}/rank_{r}/conv"][()]
                    want = torch.from_numpy(states[name]["conv"][43][conv_units]).to(torch.bfloat16)
                    np.testing.assert_array_equal(got[0], want.view(torch.int16).numpy().view(np.uint16))
                np.testing.assert_array_equal(f[f"prompts/h/reference/expected/states/{name}/ssm"][0],
                                              states[name]["ssm"][43].astype(np.float32))
        data = analyse(bundle, self.tmp.name)
        self.assertEqual(data["not_compared"], [])  # the state-space layers' states compared too
        self.assertEqual(data["prompts"][0]["layer_names"][:2], [L[0], L[2]])

    def test_only_the_named_requests_and_incomplete_shards(self):
        cluster = vc.Cluster(two_groups(vc.FlashAttentionBackend), tp=2, output_dir=self.shards)
        cluster.kv_transfer_config.kv_connector_extra_config["requests"] = ["keep"]
        kv = truth_kv(cluster.layers, 4, 45, 8, seed=4)
        scheduler, workers = cluster.connectors(KvscopeConnector)
        request, block_ids = cluster.run_request("other-1", range(20), range(25), kv)
        self.assertEqual(scheduler.request_finished_all_groups(request, block_ids), (False, None))
        self.assertEqual(scheduler.request_finished(request, block_ids[0]), (False, None))
        cluster.finish("other-1", block_ids)
        self.capture(cluster, "keep-2", kv)
        os.remove(os.path.join(self.shards, "keep-2.tp1.pp0.h5"))
        shards = ShardSet(self.shards)
        self.assertEqual(shards.requests, [])
        self.assertIn("(tp, pp) [(1, 0)] are missing", shards.incomplete["keep-2"])
        with self.assertRaisesRegex(ValueError, "no complete request"):
            bundle_from_shards(self.shards, os.path.join(self.tmp.name, "x.h5"), None, log=lambda line: None)

    def test_needs_an_output_dir(self):
        cluster = vc.Cluster(two_groups(vc.FlashAttentionBackend))
        with self.assertRaisesRegex(ValueError, "output_dir"):
            cluster.connectors(KvscopeConnector)


class CommandLine(unittest.TestCase):
    def test_bundle_needs_its_shards_and_model(self):
        result = subprocess.run([sys.executable, "-m", "kvscope_capture", "bundle", "--out", "x.h5"],
                                capture_output=True, text=True)
        self.assertEqual(result.returncode, 2)
        self.assertIn("--shards", result.stderr)
        self.assertIn("--model", result.stderr)


class WorkerExtension(unittest.TestCase):
    def test_config_as_kvscope_reads_it(self):
        cluster = vc.Cluster(two_groups(vc.PackedTritonAttentionBackend), total_heads=4, tp=2, pp=2)
        llm = vc.FakeLLM(cluster, KvscopeWorkerExtension)
        config = extract_vllm_kv_cache_config(llm)
        self.assertEqual(config["tp_size"], 2)
        self.assertEqual(config["pp_size"], 2)
        self.assertEqual([g["layer_names"] for g in config["groups"]], [[L[0], L[2]], [L[1], L[3]]])
        self.assertEqual([g["spec_type"] for g in config["groups"]], ["SlidingWindowSpec", "FullAttentionSpec"])
        self.assertEqual(config["groups"][0]["num_kv_heads"], 2)
        self.assertEqual(config["groups"][0]["dtype"], "torch.bfloat16")

    def test_hybrid_model_reads_its_attention_layers(self):
        groups = [vc.Group([L[0], L[2]], vc.FlashAttentionBackend), vc.Group([L[1], L[3]], None, mamba=True)]
        cluster = vc.Cluster(groups, total_heads=2)
        llm = vc.FakeLLM(cluster, KvscopeWorkerExtension)
        (config,) = llm.collective_rpc("get_kv_cache_config")
        self.assertEqual([g["spec_type"] for g in config["groups"]], ["FullAttentionSpec", "MambaSpec"])
        kv = truth_kv(cluster.layers, 2, 45, 8, seed=7)
        cluster.run_request("h", range(20), range(25), kv)
        (caches,) = llm.collective_rpc("get_kv_caches")
        self.assertEqual(sorted(caches), [L[0], L[2]])

    def test_aliased_layers_are_named(self):
        groups = [vc.Group([L[0], L[1]], vc.FlashAttentionBackend)]
        cluster = vc.Cluster(groups, alias={L[1]: L[0]})
        llm = vc.FakeLLM(cluster, KvscopeWorkerExtension)
        (config,) = llm.collective_rpc("get_kv_cache_config")
        self.assertEqual(config["kv_sharing"], {L[1]: L[0]})

    def test_block_tables_outlive_the_request_once_enabled(self):
        cluster = vc.Cluster(two_groups(vc.FlashAttentionBackend), tp=1)
        llm = vc.FakeLLM(cluster, KvscopeWorkerExtension)
        llm.collective_rpc("enable_block_table_snapshots")
        kv = truth_kv(cluster.layers, 4, 45, 8, seed=6)
        _, block_ids = cluster.run_request("a", range(20), range(25), kv)
        cluster.finish("a", block_ids)
        (tables,) = llm.collective_rpc("get_block_tables")
        self.assertEqual(llm.collective_rpc("get_request_ids"), [["a"]])
        table = torch.load(io.BytesIO(tables[1]))
        self.assertEqual(table[0, :len(block_ids[1])].tolist(), block_ids[1])


@unittest.skipUnless(BINARY, "KVSCOPE_BINARY is not set")
class SameDataBothWays(unittest.TestCase):
    """The connector's shards and the worker extension's RPCs (the blocks of the request, or the
    whole pool as the Neuron RPC hands it) give bundles that kvscope analyses identically."""

    def test_tp2_triton(self):
        self.run_case(two_groups(vc.TritonAttentionBackend, window=24), tp=2, pp=1)

    def test_pp2_packed_kv_with_kernel_blocks(self):
        self.run_case(two_groups(vc.PackedTritonAttentionBackend, window=24, block_size=32, kernel=16), tp=1, pp=2)

    def run_case(self, groups, tp, pp):
        with tempfile.TemporaryDirectory() as tmp:
            shards = os.path.join(tmp, "shards")
            cluster = vc.Cluster(groups, total_heads=4, tp=tp, pp=pp, output_dir=shards, seed=9)
            kv = truth_kv(cluster.layers, 4, 45, 8, seed=8)
            # A fault in one layer, so that the analysis has something to find.
            kv[L[1]][0][1, 30:] = (kv[L[1]][0][1, 30:].float() * 1.5).to(torch.bfloat16)
            reference = reference_of(cluster, truth_kv(cluster.layers, 4, 45, 8, seed=8))
            scheduler, workers = cluster.connectors(KvscopeConnector)
            llm = vc.FakeLLM(cluster, KvscopeWorkerExtension)
            prompt, output = list(range(20)), list(range(100, 125))
            request, block_ids = cluster.run_request("p0", prompt, output, kv)

            def rpc_bundle(path, all_blocks):
                with BundleWriter(path, model="m", engine="vLLM", notes="kvscope_capture KvscopeConnector shards") as w:
                    w.set_kv_cache_config(extract_vllm_kv_cache_config(llm))
                    w.add_prompt("p0", prompt + output, 20)
                    if all_blocks:
                        workers = llm.collective_rpc("get_kv_caches", kwargs={"all_blocks": True})
                        caches = [{n: torch.load(io.BytesIO(b)) for n, b in r.items()}
                                  for r in merge_stage_caches(workers, tp)]
                        w.add_engine_snapshot("p0", caches, extract_vllm_block_tables(llm), 45,
                                              keep_only_referenced=True)
                    else:
                        make_kv_extract_fn(llm, w, "p0")(45)
                    logits, ref = extract_hf_kv_caches_teacher_forced(vc.FixedReference(reference), prompt, output,
                                                                      return_logits=True)
                    w.add_reference_kv("p0", "expected", ref)
                    w.add_logits("p0", "expected", logits)

            rpc_bundle(os.path.join(tmp, "rpc.h5"), all_blocks=False)
            rpc_bundle(os.path.join(tmp, "pool.h5"), all_blocks=True)
            scheduler.request_finished_all_groups(request, block_ids)
            for worker in cluster.workers:
                worker.model_runner.requests.pop("p0")
            self.assertEqual(cluster.step(scheduler, workers, {"p0"}), {"p0"})
            bundle_from_shards(shards, os.path.join(tmp, "connector.h5"), vc.FixedReference(reference), model="m",
                               log=self.fail)
            connector = analyse(os.path.join(tmp, "connector.h5"), tmp)
            self.assertTrue(connector["suspects"], "the fault in layer 1 is found")
            self.assertEqual(connector, analyse(os.path.join(tmp, "rpc.h5"), tmp))
            self.assertEqual(connector, analyse(os.path.join(tmp, "pool.h5"), tmp))


if __name__ == "__main__":
    unittest.main()
