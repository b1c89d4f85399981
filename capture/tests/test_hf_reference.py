"""The reference side: HF caches of every transformers API, sliding-window layers that HF trims,
and MLA latents from a model built like HF's DeepSeek attention (checked against RoPE and RMSNorm
computed here in double precision)."""

import math
import os
import tempfile
import types
import unittest

import h5py
import numpy as np
import torch

from kvscope_capture import BundleWriter, extract_hf_mla_latents, hf_cache_layers

NAMES = ["model.layers.0.self_attn", "model.layers.1.self_attn"]


class CacheApis(unittest.TestCase):
    def setUp(self):
        g = torch.Generator().manual_seed(0)
        self.kv = [(torch.randn(1, 2, 5, 4, generator=g), torch.randn(1, 2, 5, 4, generator=g)) for _ in range(3)]

    def check(self, past):
        got = hf_cache_layers(past)
        self.assertEqual(len(got), 3)
        for (k, v), (gk, gv) in zip(self.kv, got):
            self.assertIs(gk, k)
            self.assertIs(gv, v)

    def test_layers_api(self):  # transformers >= 4.54
        self.check(types.SimpleNamespace(layers=[types.SimpleNamespace(keys=k, values=v) for k, v in self.kv]))

    def test_key_cache_api(self):  # older DynamicCache
        self.check(types.SimpleNamespace(key_cache=[k for k, _ in self.kv], value_cache=[v for _, v in self.kv]))

    def test_legacy_tuple(self):
        self.check(tuple(self.kv))


class SlidingWindowReference(unittest.TestCase):
    """HF keeps W - 1 (or, in some versions, W) positions of a sliding layer: the writer stores the
    last W - 1, which is what kvscope aligns to the end of the sequence."""

    def write(self, held):
        cfg = {"num_blocks": 8, "tp_size": 1, "total_num_kv_heads": 2, "groups": [
            {"layer_names": [NAMES[0]], "spec_type": "SlidingWindowSpec", "sliding_window": 4, "block_size": 4,
             "num_kv_heads": 2, "head_size": 4, "dtype": "float32"},
            {"layer_names": [NAMES[1]], "spec_type": "FullAttentionSpec", "block_size": 4, "num_kv_heads": 2,
             "head_size": 4, "dtype": "float32"}]}
        full = torch.arange(2 * 10 * 4, dtype=torch.float32).reshape(1, 2, 10, 4)
        sliding = full[:, :, 10 - held:]
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "b.h5")
            w = BundleWriter(path)
            try:
                w.set_kv_cache_config(cfg)
                w.add_prompt("p", list(range(10)), 10)
                w.add_reference_kv("p", "expected", ((sliding, sliding), (full, full)))
                with h5py.File(w._partial, "r") as f:
                    return full, f[f"prompts/p/reference/expected/{NAMES[0]}/k"][()]
            finally:
                w.abandon()

    def test_window_minus_one_kept(self):
        full, stored = self.write(3)
        np.testing.assert_array_equal(stored, full[:, :, 7:].numpy())

    def test_whole_window_trimmed_to_w_minus_one(self):
        full, stored = self.write(4)
        np.testing.assert_array_equal(stored, full[:, :, 7:].numpy())

    def test_too_short_is_an_error(self):
        with self.assertRaisesRegex(ValueError, "layer model.layers.0.self_attn: 2 positions, other layers hold 10 "
                                                "and its sliding window 4 needs at least 3"):
            self.write(2)


class RmsNorm(torch.nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class DeepseekAttention(torch.nn.Module):
    """The structure of HF's DeepseekV3Attention's key path: kv_a_proj_with_mqa splits into the
    latent (through kv_a_layernorm and kv_b_proj) and the shared rotary key; with rope_interleave
    the rotary dims are de-interleaved, then rotated in halves."""

    def __init__(self, hidden, rank, rope, nope, heads, interleave):
        super().__init__()
        self.kv_a_proj_with_mqa = torch.nn.Linear(hidden, rank + rope, bias=False)
        self.kv_a_layernorm = RmsNorm(rank)
        self.kv_b_proj = torch.nn.Linear(rank, heads * nope, bias=False)
        self.kv_lora_rank, self.qk_rope_head_dim, self.qk_nope_head_dim, self.heads = rank, rope, nope, heads
        self.interleave = interleave

    def forward(self, x):
        n = x.shape[1]
        k_pass, k_rot = torch.split(self.kv_a_proj_with_mqa(x), [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        k_nope = self.kv_b_proj(self.kv_a_layernorm(k_pass)).view(1, n, self.heads, -1).transpose(1, 2)
        d = self.qk_rope_head_dim
        k_rot = k_rot.view(1, 1, n, d)
        if self.interleave:
            k_rot = k_rot.view(1, 1, n, d // 2, 2).transpose(4, 3).reshape(1, 1, n, d)
        inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        angles = torch.arange(n, dtype=torch.float32)[:, None] * inv[None, :]
        cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
        rotated = torch.cat([-k_rot[..., d // 2:], k_rot[..., :d // 2]], -1)
        k_rot = k_rot * cos + rotated * sin
        return torch.cat([k_nope, k_rot.expand(1, self.heads, n, d)], -1)


class TinyDeepseek(torch.nn.Module):
    def __init__(self, interleave, layers=2, hidden=12, rank=8, rope=6, nope=4, heads=2, vocab=30):
        super().__init__()
        torch.manual_seed(1)
        self.config = types.SimpleNamespace(rope_interleave=interleave)
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.layers = torch.nn.ModuleList([torch.nn.Module() for _ in range(layers)])
        for layer in self.layers:
            layer.self_attn = DeepseekAttention(hidden, rank, rope, nope, heads, interleave)

    def forward(self, input_ids, use_cache=True):
        x = self.embed(input_ids)
        keys = [layer.self_attn(x) for layer in self.layers]
        past = types.SimpleNamespace(layers=[types.SimpleNamespace(keys=k, values=k[..., :4]) for k in keys])
        return types.SimpleNamespace(logits=torch.zeros(1, x.shape[1], 30), past_key_values=past)


class MlaLatents(unittest.TestCase):
    def expected(self, model, ids, attn):
        """c_kv and k_pe (vLLM's is_neox_style=False: rotated pairs) in double precision."""
        x = model.embed(torch.as_tensor(ids)).double()
        w = attn.kv_a_proj_with_mqa.weight.double()
        proj = x @ w.T
        k_pass, k_rot = proj[:, :attn.kv_lora_rank], proj[:, attn.kv_lora_rank:]
        c_kv = k_pass / torch.sqrt(k_pass.pow(2).mean(-1, keepdim=True) + 1e-6) * attn.kv_a_layernorm.weight.double()
        d = attn.qk_rope_head_dim
        k_pe = torch.empty_like(k_rot)
        for p in range(len(ids)):
            for i in range(d // 2):
                angle = p * 10000 ** (-2 * i / d)
                a, b = k_rot[p, 2 * i], k_rot[p, 2 * i + 1]
                k_pe[p, 2 * i] = a * math.cos(angle) - b * math.sin(angle)
                k_pe[p, 2 * i + 1] = b * math.cos(angle) + a * math.sin(angle)
        return c_kv, k_pe

    def test_latents_in_vllms_rotary_order(self):
        model = TinyDeepseek(interleave=True)
        ids = [3, 1, 4, 1, 5, 9, 2]
        latents = extract_hf_mla_latents(model, ids[:4], ids[4:])
        self.assertEqual(len(latents), 2)
        for (c_kv, k_pe), layer in zip(latents, model.layers):
            want_c, want_pe = self.expected(model, ids, layer.self_attn)
            self.assertEqual(tuple(c_kv.shape), (1, 7, 8))
            self.assertEqual(tuple(k_pe.shape), (1, 7, 6))
            np.testing.assert_allclose(c_kv[0].double().numpy(), want_c.detach().numpy(), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(k_pe[0].double().numpy(), want_pe.detach().numpy(), rtol=1e-5, atol=1e-6)

    def test_hf_order_differs_by_the_pair_permutation(self):
        model = TinyDeepseek(interleave=True)
        ids = [2, 7, 1, 8]
        (_, hf_pe), _ = extract_hf_mla_latents(model, ids, rope_order="hf")
        (_, vllm_pe), _ = extract_hf_mla_latents(model, ids)
        halves = torch.cat([vllm_pe[..., 0::2], vllm_pe[..., 1::2]], -1)
        self.assertTrue(torch.equal(hf_pe, halves))
        self.assertFalse(torch.equal(hf_pe, vllm_pe))

    def test_not_an_mla_model(self):
        with self.assertRaisesRegex(ValueError, "no MLA attention"):
            extract_hf_mla_latents(torch.nn.Linear(2, 2), [1])


if __name__ == "__main__":
    unittest.main()
