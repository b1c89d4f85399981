"""The seed's extraction API against stand-ins: an object whose collective_rpc returns RPC-shaped
data, and a small torch model with the HF call interface."""

import os
import tempfile
import unittest

import h5py
import numpy as np
import torch

from engine_standin import FakeLLM, PagedEngine, TinyHFModel
from kvscope_capture import (BundleWriter, extract_hf_kv_caches_teacher_forced, extract_vllm_block_tables,
                             extract_vllm_kv_cache_config, extract_vllm_kv_caches, generate_hf_logits_and_kv,
                             make_kv_extract_fn)

CFG = {"num_blocks": 10, "tp_size": 2, "total_num_kv_heads": 2, "dcp_size": 1, "pcp_size": 1,
       "groups": [{"layer_names": ["layers.0.self_attn", "layers.1.self_attn"], "spec_type": "FullAttentionSpec",
                   "block_size": 4, "sliding_window": None, "dtype": "torch.bfloat16", "num_kv_heads": 1,
                   "head_size": 4}]}


class Extract(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.truth = {n: (torch.randn(2, 12, 4).to(torch.bfloat16), torch.randn(2, 12, 4).to(torch.bfloat16))
                      for n in CFG["groups"][0]["layer_names"]}
        per_rank, tables = PagedEngine(CFG, seed=1).snapshot(self.truth, 12)
        self.llm = FakeLLM(CFG, per_rank, tables)

    def test_vllm_extraction(self):
        self.assertEqual(extract_vllm_kv_cache_config(self.llm), CFG)
        caches = extract_vllm_kv_caches(self.llm, CFG)
        self.assertEqual(len(caches), 2)
        k, v = caches[1]["layers.1.self_attn"]
        self.assertEqual(tuple(k.shape), (10, 1, 4, 4))
        self.assertEqual(k.dtype, torch.bfloat16)
        tables = extract_vllm_block_tables(self.llm)
        self.assertEqual(len(tables), 1)
        phys = int(tables[0][0, 0])
        # Two heads over TP 2: rank 1 holds head 1. Position 2 is logical block 0, slot 2.
        self.assertTrue(torch.equal(k[phys, 0, 2], self.truth["layers.1.self_attn"][0][1, 2]))

    def test_hf_generation_and_teacher_forcing_agree(self):
        model = TinyHFModel(layers=2)
        prompt = torch.tensor([1, 5, 7, 2])
        logits, kv = generate_hf_logits_and_kv(model, prompt, 5)
        self.assertEqual(tuple(logits.shape), (5, 32))
        self.assertEqual(tuple(kv[0][0].shape), (1, 2, 4 + 5, 4))  # every position incl. the last generated
        teacher = logits.argmax(-1)
        tf_logits, tf_kv = extract_hf_kv_caches_teacher_forced(model, prompt, teacher, return_logits=True)
        torch.testing.assert_close(tf_logits, logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(tf_kv[1][1], kv[1][1], rtol=1e-5, atol=1e-5)
        self.assertEqual(len(extract_hf_kv_caches_teacher_forced(model, prompt, teacher)), 2)

    def test_kv_extract_fn_in_a_validation_loop(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "loop.h5")
            with BundleWriter(path) as w:
                w.set_kv_cache_config(extract_vllm_kv_cache_config(self.llm))
                w.add_prompt("p", list(range(12)), 6)
                kv_extract_fn = make_kv_extract_fn(self.llm, w, "p")
                kv_extract_fn(9)   # a generate call that diverged at 7
                kv_extract_fn(12)  # re-fed through 7, ran to the end
                w.set_divergence("p", [7])
                w.add_reference_kv("p", "expected", tuple((k.unsqueeze(0), v.unsqueeze(0)) for k, v in self.truth.values()))
            with h5py.File(path, "r") as f:
                engine = f["prompts/p/engine"]
                self.assertEqual([engine[s].attrs["validated_until"] for s in ("snapshot_0", "snapshot_1")], [7, 11])
                self.assertIn("physical_block_ids", engine["snapshot_0"])
                self.assertNotIn(0, engine["snapshot_0/physical_block_ids"][()].tolist())  # never the null block


if __name__ == "__main__":
    unittest.main()
