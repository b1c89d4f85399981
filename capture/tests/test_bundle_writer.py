"""The writer refuses bad input with a clear ValueError before writing anything, and writes only
documented fields of format v2."""

import json
import os
import re
import tempfile
import unittest

import h5py
import numpy as np
import torch

from engine_standin import PagedEngine, torch_save_bytes
from kvscope_capture import BundleWriter

LAYERS = ["layers.0.self_attn", "layers.1.self_attn"]


def config(**overrides):
    cfg = {"num_blocks": 12, "tp_size": 2, "total_num_kv_heads": 4, "dcp_size": 1, "pcp_size": 1,
           "groups": [{"layer_names": LAYERS, "spec_type": "FullAttentionSpec", "block_size": 4,
                       "sliding_window": None, "dtype": "torch.bfloat16", "num_kv_heads": 2, "head_size": 8}]}
    cfg.update(overrides)
    return cfg


def engine_state(cfg, seq_len=10):
    truth = {n: (torch.randn(4, seq_len, 8).to(torch.bfloat16), torch.randn(4, seq_len, 8).to(torch.bfloat16))
             for n in LAYERS}
    rpc, tables = PagedEngine(cfg, seed=0).snapshot(truth, seq_len)
    return truth, rpc, tables


class Writer(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.tmp.name, "b.h5")

    def tearDown(self):
        self.tmp.cleanup()

    def writer(self):
        w = BundleWriter(self.path, model="m", engine="e", notes="n", run="42")
        w.set_kv_cache_config(config())
        w.add_prompt("p", list(range(10)), 6, token_strings=[f"t{i}" for i in range(10)])
        return w

    def test_writes_only_documented_fields(self):
        truth, rpc, tables = engine_state(config())
        with self.writer() as w:
            w.add_engine_snapshot("p", rpc, tables, 10)
            w.add_reference_kv("p", "expected", {n: (k.unsqueeze(0), v.unsqueeze(0)) for n, (k, v) in truth.items()})
            w.add_reference_kv("p", "baseline", tuple((k.float().unsqueeze(0).numpy(), v.float().unsqueeze(0).numpy())
                                                      for k, v in (truth[n] for n in LAYERS)))
            w.add_logits("p", "actual", torch.randn(1, 4, 16))
            w.set_divergence("p", [7])
        self.assertFalse(os.path.exists(self.path + ".partial"))
        with h5py.File(self.path, "r") as f:
            # Strings are fixed-length UTF-8 (h5py reads them as bytes).
            self.assertEqual(f.attrs["format"], b"kvscope-capture")
            self.assertEqual(f.attrs["format_version"], 2)
            self.assertEqual(f.attrs["run"], b"42")
            self.assertEqual(set(f), {"kv_cache_config", "prompts"})
            p = f["prompts/p"]
            self.assertEqual(set(p), {"input_ids", "teacher_tokens", "token_strings", "engine", "reference", "logits",
                                      "divergence_positions"})
            self.assertEqual(p.attrs["prompt_len"], 6)
            self.assertEqual(p["teacher_tokens"][()].tolist(), [6, 7, 8, 9])
            snap = p["engine/snapshot_0"]
            self.assertEqual(set(snap), {"seq_lens", "block_tables", "rank_0", "rank_1"})
            self.assertEqual(snap.attrs["validated_until"], 7)
            k = snap["rank_1/layers.0.self_attn/k"]
            self.assertEqual(k.shape, (12, 2, 4, 8))
            self.assertEqual(k.attrs["dtype"], b"bfloat16")
            self.assertEqual(k.dtype, np.uint16)
            self.assertEqual(p["reference/baseline/layers.1.self_attn/v"].attrs["dtype"], b"float32")
            self.assertEqual(p["logits/actual"].shape, (4, 16))

    def test_provenance(self):
        ranges = [(0, 4, "prefix_cache", {"blocks": [7]}), (4, 6, "external", {"connector": "LMCacheConnectorV1"}),
                  (6, 7, "decode", {"step": 0}), (7, 8, "decode", {"step": 1}), (9, 10, "recomputed", None)]
        with self.writer() as w:
            w.set_provenance("p", ranges)
            for bad, says in (([(0, 11, "prefill", None)], "not within the prompt's 10 positions"),
                              ([(0, 4, "prefill", None), (3, 5, "decode", None)], "before the previous range ends (4)"),
                              ([(0, 4, "lmcache", None)], "kind 'lmcache' is not one of"),
                              ([(0, 4, "external", {})], "names its connector"),
                              ([(0, 4, "prefill", {"chunks": 1})], "unknown detail 'chunks'"),
                              ([(0, 4, "decode", {"step": -1})], "step must be a non-negative integer"),
                              ([(0, 4)], "is not (start, end, kind, details)")):
                with self.assertRaisesRegex(ValueError, "prompt p: provenance range .*" + re.escape(says)):
                    w.set_provenance("p", bad)
            with self.assertRaisesRegex(ValueError, "was not added"):
                w.set_provenance("q", ranges)
            truth, rpc, tables = engine_state(config())
            w.add_engine_snapshot("p", rpc, tables, 10)
            w.add_reference_kv("p", "expected", {n: (k.unsqueeze(0), v.unsqueeze(0)) for n, (k, v) in truth.items()})
        with h5py.File(self.path, "r") as f:
            self.assertEqual(json.loads(f["prompts/p"].attrs["provenance"]), [
                {"start": 0, "end": 4, "kind": "prefix_cache", "blocks": [7]},
                {"start": 4, "end": 6, "kind": "external", "connector": "LMCacheConnectorV1"},
                {"start": 6, "end": 7, "kind": "decode", "step": 0}, {"start": 7, "end": 8, "kind": "decode", "step": 1},
                {"start": 9, "end": 10, "kind": "recomputed"}])

    def test_rope_from_hf_config(self):
        # Llama-style: theta and head_dim; Phi-style: partial rotary; linear scaling kept.
        cases = [({"rope_theta": 500000.0, "head_dim": 128},
                  {"theta": 500000.0, "rotary_dim": 128, "style": "neox"}),
                 ({"rope_theta": 10000, "hidden_size": 2560, "num_attention_heads": 32, "partial_rotary_factor": 0.4},
                  {"theta": 10000.0, "rotary_dim": 32, "style": "neox"}),
                 ({"rope_theta": 10000, "head_dim": 64, "rope_scaling": {"rope_type": "linear", "factor": 4.0}},
                  {"theta": 10000.0, "rotary_dim": 64, "style": "neox", "scaling": {"type": "linear", "factor": 4.0}})]
        truth, rpc, tables = engine_state(config())
        for hf, expected in cases:
            with self.writer() as w:
                w.set_rope(hf)
                w.add_engine_snapshot("p", rpc, tables, 10)
                w.add_reference_kv("p", "expected", {n: (k.unsqueeze(0), v.unsqueeze(0)) for n, (k, v) in truth.items()})
            with h5py.File(self.path, "r") as f:
                self.assertEqual(json.loads(f.attrs["rope"]), expected)
        w = self.writer()
        with self.assertRaisesRegex(ValueError, "llama3 scaling needs a positive number low_freq_factor"):
            w.set_rope({"rope_theta": 500000.0, "head_dim": 128, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})
        w.abandon()

    def rope_of(self, hf):
        """The `rope` attribute set_rope writes for an HF config (dict)."""
        truth, rpc, tables = engine_state(config())
        with self.writer() as w:
            w.set_rope(hf)
            w.add_engine_snapshot("p", rpc, tables, 10)
            w.add_reference_kv("p", "expected", {n: (k.unsqueeze(0), v.unsqueeze(0)) for n, (k, v) in truth.items()})
        with h5py.File(self.path, "r") as f:
            return json.loads(f.attrs["rope"])

    def test_rope_scalings_from_real_configs(self):
        """The scalings of the models people run, from their config.json as published (trimmed to
        the fields RoPE reads), written with transformers' names and defaults."""
        # meta-llama/Llama-3.1-8B
        llama = {"hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 131072,
                 "rope_theta": 500000.0, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                          "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
        self.assertEqual(self.rope_of(llama)["scaling"],
                         {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 8192})
        # deepseek-ai/DeepSeek-V3 (MLA: the rotated part is k_pe, qk_rope_head_dim 64)
        v3 = {"qk_rope_head_dim": 64, "rotary_dim": 64, "max_position_embeddings": 163840, "rope_theta": 10000,
              "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                               "original_max_position_embeddings": 4096, "type": "yarn"}}
        self.assertEqual(self.rope_of(v3),
                         {"theta": 10000.0, "rotary_dim": 64, "style": "neox",
                          "scaling": {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                                      "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}})
        # Qwen2.5-7B-Instruct with the YaRN its model card documents
        qwen = {"hidden_size": 3584, "num_attention_heads": 28, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
                "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}}
        self.assertEqual(self.rope_of(qwen)["scaling"],
                         {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})
        # microsoft/Phi-3-mini-128k-instruct: original_max_position_embeddings outside rope_scaling;
        # factor max_position_embeddings / original (transformers' default attention factor).
        short = [1.0] * 48
        long = [1.0 + i / 4 for i in range(48)]
        phi3 = {"hidden_size": 3072, "num_attention_heads": 32, "max_position_embeddings": 131072,
                "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
                "rope_scaling": {"long_factor": long, "short_factor": short, "type": "longrope"}}
        self.assertEqual(self.rope_of(phi3)["scaling"],
                         {"type": "longrope", "short_factor": short, "long_factor": long,
                          "original_max_position_embeddings": 4096, "factor": 32.0})
        # Qwen/Qwen2-VL-7B-Instruct: mrope (transformers renames the type default)
        for kind in ("mrope", "default"):
            vl = {"hidden_size": 3584, "num_attention_heads": 28, "rope_theta": 1000000.0,
                  "rope_scaling": {"type": kind, "mrope_section": [16, 24, 24]}}
            self.assertEqual(self.rope_of(vl)["scaling"], {"type": kind, "mrope_section": [16, 24, 24]})
        # Dynamic NTK keeps the config's max_position_embeddings, which transformers' formula reads.
        dyn = {"head_dim": 128, "max_position_embeddings": 4096, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}
        self.assertEqual(self.rope_of(dyn)["scaling"], {"type": "dynamic", "factor": 2.0, "max_position_embeddings": 4096})
        # transformers 5's rope_parameters (rope_theta inside it), default or scaled.
        v5 = {"head_dim": 128, "max_position_embeddings": 131072,
              "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
        rope = self.rope_of(v5)
        self.assertEqual((rope["theta"], rope["scaling"]["type"]), (500000.0, "llama3"))
        self.assertNotIn("scaling", self.rope_of({"head_dim": 64, "rope_parameters": {"rope_type": "default",
                                                                                         "rope_theta": 1e6}}))

    def test_rope_refusals(self):
        """Only what kvscope cannot reproduce is refused, with what and why."""
        cases = [({"head_dim": 64, "rope_scaling": {"rope_type": "proportional", "factor": 2.0}}, "scaling type 'proportional'"),
                 ({"head_dim": 64, "rope_scaling": {"rope_type": "dynamic", "alpha": 1000.0}}, "alpha"),
                 ({"head_dim": 64, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "max_position_embeddings"),
                 ({"head_dim": 64, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "original_max_position_embeddings"),
                 ({"head_dim": 8, "max_position_embeddings": 64,
                   "rope_scaling": {"rope_type": "longrope", "short_factor": [1, 1], "long_factor": [1, 2, 3, 4],
                                    "original_max_position_embeddings": 16}}, "has 2 factors for 4 rotated pairs"),
                 ({"head_dim": 64, "rope_scaling": {"type": "mrope"}}, "without mrope_section"),
                 ({"head_dim": 64, "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                                       "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
                  "one RoPE per layer type")]
        for hf, message in cases:
            w = self.writer()
            with self.subTest(message), self.assertRaisesRegex(ValueError, message):
                w.set_rope(hf)
            w.abandon()

    def test_format_v2_integrity(self):
        """Newest file format (checksummed metadata), no variable-length string anywhere, and a
        Fletcher32 checksum on every dataset that holds data."""
        truth, rpc, tables = engine_state(config())
        with self.writer() as w:
            w.add_engine_snapshot("p", rpc, tables, 10)
            w.add_reference_kv("p", "expected", {n: (k.unsqueeze(0), v.unsqueeze(0)) for n, (k, v) in truth.items()})
            w.add_logits("p", "actual", torch.randn(1, 4, 16))
            w.set_divergence("p", [7])
        with h5py.File(self.path, "r") as f:
            superblock = f.id.get_create_plist().get_version()[0]
            self.assertGreaterEqual(superblock, 2)  # 2 and later carry a checksum
            seen = []

            def check(name, obj):
                for key, value in obj.attrs.items():
                    info = h5py.check_string_dtype(obj.attrs.get_id(key).dtype)
                    if info is not None:
                        self.assertIsNotNone(info.length, f"{name}@{key} is a variable-length string")
                if isinstance(obj, h5py.Dataset):
                    seen.append(name)
                    info = h5py.check_string_dtype(obj.dtype)
                    if info is not None:
                        self.assertIsNotNone(info.length, f"{name} holds variable-length strings")
                    if obj.size:
                        self.assertIsNotNone(obj.chunks, f"{name} is not chunked")
                        self.assertTrue(obj.fletcher32, f"{name} has no checksum")

            check("/", f)
            f.visititems(check)
            self.assertIn("kv_cache_config", seen)
            self.assertIn("prompts/p/token_strings", seen)
            self.assertEqual(json.loads(f["kv_cache_config"][0].decode())["tp_size"], 2)
            # One block per chunk (or several under 4 KiB), so one block is read and checked alone.
            k = f["prompts/p/engine/snapshot_0/rank_0/layers.0.self_attn/k"]
            self.assertEqual(k.chunks[0], min(k.shape[0], max(1, 4096 // k[0].nbytes)))

    def test_refuses_bad_input_before_writing(self):
        truth, rpc, tables = engine_state(config())
        w = self.writer()
        cases = {
            "shape": lambda: w.add_engine_snapshot("p", [rpc[0], {n: {"k": torch.zeros(12, 2, 4, 7, dtype=torch.bfloat16),
                                                                      "v": torch.zeros(12, 2, 4, 7, dtype=torch.bfloat16)}
                                                                  for n in LAYERS}], tables, 10),
            "dtype": lambda: w.add_engine_snapshot("p", [rpc[0], {n: (torch.zeros(12, 2, 4, 8), torch.zeros(12, 2, 4, 8))
                                                                  for n in LAYERS}], tables, 10),
            "layer": lambda: w.add_engine_snapshot("p", [rpc[0], dict(rpc[1], **{"layers.9.self_attn": rpc[1][LAYERS[0]]})],
                                                   tables, 10),
            "ranks": lambda: w.add_engine_snapshot("p", rpc[:1], tables, 10),
            "table": lambda: w.add_engine_snapshot("p", rpc, [torch_save_bytes(torch.tensor([[1, 99]], dtype=torch.int32))], 10),
            "bytes": lambda: w.add_engine_snapshot("p", [rpc[0], {n: b"not a pickle" for n in LAYERS}], tables, 10),
            "reference heads": lambda: w.add_reference_kv("p", "expected", tuple((torch.zeros(1, 3, 10, 8),) * 2 for _ in LAYERS)),
            "reference layers": lambda: w.add_reference_kv("p", "expected", ((torch.zeros(1, 4, 10, 8),) * 2,)),
            "role": lambda: w.add_reference_kv("p", "golden", {}),
            "prompt": lambda: w.add_logits("q", "actual", np.zeros((2, 3), np.float32)),
            "slash": lambda: w.add_prompt("a/b", [1, 2], 1),
            "divergence": lambda: w.set_divergence("p", [2]),
            "nul": lambda: w.add_prompt("q", [1, 2], 1, token_strings=["a", "b\0"]),
        }
        expected_words = {"shape": "shape", "dtype": "float32 but the config says bfloat16", "layer": "layers.9.self_attn",
                          "ranks": "tp_size 2", "table": "99", "bytes": "not torch.save bytes",
                          "reference heads": "[batch, 4, seq, 8]", "reference layers": "1 layers",
                          "role": "golden", "prompt": "'q' was not added", "slash": "HDF5 name", "divergence": "prompt_len",
                          "nul": "NUL"}
        for name, call in cases.items():
            with self.subTest(name):
                with self.assertRaises(ValueError) as caught:
                    call()
                self.assertIn(expected_words[name], str(caught.exception))
        # Nothing of the refused calls was written.
        with h5py.File(w._partial, "r") as f:
            self.assertNotIn("engine", f["prompts/p"])
            self.assertNotIn("reference", f["prompts/p"])
        with self.assertRaises(ValueError):
            w.close()  # no snapshot, no reference
        w.abandon()
        self.assertFalse(os.path.exists(w._partial))
        self.assertFalse(os.path.exists(self.path))

    def test_config_is_validated(self):
        for cfg, words in (
            (config(num_blocks=0), "num_blocks"),
            (config(tp_size=3), "cannot be partitioned"),
            (dict(config(), groups=[dict(config()["groups"][0], num_kv_heads=4)]), "num_kv_heads"),
            (dict(config(), groups=[dict(config()["groups"][0], spec_type="MLAAttentionSpec")]),
             "kv_lora_rank: missing"),
            (dict(config(), groups=[dict(config()["groups"][0], spec_type="CrossAttentionSpec")]),
             "no group kvscope compares (only CrossAttentionSpec)"),
            (dict(config(), groups=[dict(config()["groups"][0], spec_type="FullAtentionSpec")]), "not supported"),
            (dict(config(), groups=[dict(config()["groups"][0], spec_type="ChunkedLocalAttentionSpec")]),
             "attention_chunk_size: missing"),
            (dict(config(), groups=[dict(config()["groups"][0], dtype="torch.int4")]), "unsupported dtype"),
            (dict(config(), pcp_size=2), "prefill context parallelism (2) is not supported"),
            (dict(config(), dcp_size=3), "dcp_size: 3 does not divide tp_size 2"),
            (dict(config(), dcp_size=2), "needs each KV head on a multiple of 2 TP ranks; they are on 1"),
            (dict(config(), tp_size=8, dcp_size=2, cp_kv_cache_interleave_size=3,
                  groups=[dict(config()["groups"][0], num_kv_heads=1)]),
             "cp_kv_cache_interleave_size: 3 does not divide groups[0].block_size 4"),
            (dict(config(), groups=[dict(config()["groups"][0], sliding_window=4096.0)]), "positive integer"),
            (dict(config(), notes=float("nan")), "JSON"),
        ):
            with self.subTest(words):
                w = BundleWriter(self.path)
                with self.assertRaises(ValueError) as caught:
                    w.set_kv_cache_config(cfg)
                self.assertIn(words, str(caught.exception))
                w.abandon()

    def test_exception_in_with_block_leaves_nothing(self):
        with self.assertRaises(RuntimeError):
            with self.writer():
                raise RuntimeError("capture script failed")
        self.assertFalse(os.path.exists(self.path))
        self.assertFalse(os.path.exists(self.path + ".partial"))


if __name__ == "__main__":
    unittest.main()
