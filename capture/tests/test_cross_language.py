"""Bundles written by the Python writer from RPC-shaped torch.save bytes are read by kvscope (C++),
which reconstructs them (TP merge, paging, sliding windows, snapshot merging) and must give back
exactly the tensors the Python side started from. Needs KVSCOPE_BINARY (set by ctest)."""

import io
import json
import os
import subprocess
import tempfile
import unittest

import h5py
import numpy as np
import torch

from engine_standin import PagedEngine
from kvscope_capture import BundleWriter

BINARY = os.environ.get("KVSCOPE_BINARY")


def config(total_heads, tp, spec, window=6):
    per_rank = max(1, total_heads // tp)
    layers = ["model.layers.0.self_attn", "model.layers.1.self_attn", "model.layers.2.self_attn"]
    return {
        "num_blocks": 40, "tp_size": tp, "total_num_kv_heads": total_heads, "dcp_size": 1, "pcp_size": 1,
        "groups": [
            {"layer_names": [layers[0], layers[2]], "spec_type": spec, "block_size": 2, "sliding_window": window,
             "dtype": "torch.bfloat16", "num_kv_heads": per_rank, "head_size": 4},
            {"layer_names": [layers[1]], "spec_type": "FullAttentionSpec", "block_size": 4, "sliding_window": None,
             "dtype": "torch.bfloat16", "num_kv_heads": per_rank, "head_size": 4},
        ],
    }


def decode_fp8(codes, dtype):
    """fp8 codes to float32 from the formats' definitions (OCP e4m3fn: bias 7, S.1111.111 NaN;
    e5m2: bias 15, IEEE specials)."""
    e_bits, m_bits, bias = (4, 3, 7) if dtype == "float8_e4m3fn" else (5, 2, 15)
    sign = np.where(codes >> 7, -1.0, 1.0)
    exponent = (codes >> m_bits) & ((1 << e_bits) - 1)
    mantissa = (codes & ((1 << m_bits) - 1)).astype(np.float64)
    normal = (1 + mantissa / (1 << m_bits)) * np.exp2(exponent.astype(np.float64) - bias)
    subnormal = mantissa / (1 << m_bits) * np.exp2(1.0 - bias)
    value = sign * np.where(exponent == 0, subnormal, normal)
    if dtype == "float8_e5m2":
        value = np.where(exponent == 31, np.where(mantissa == 0, sign * np.inf, np.nan), value)
    else:
        value = np.where((exponent == 15) & (mantissa == 7), np.nan, value)
    return value.astype(np.float32)


@unittest.skipUnless(BINARY, "KVSCOPE_BINARY is not set")
class CrossLanguage(unittest.TestCase):
    def run_case(self, total_heads, tp, spec, keep_only_referenced):
        torch.manual_seed(total_heads * 100 + tp)
        cfg = config(total_heads, tp, spec)
        window = 6
        prompt_len, total = 8, 16
        divergence = 11
        names = [n for g in cfg["groups"] for n in g["layer_names"]]
        truth = {n: (torch.randn(total_heads, total, 4).to(torch.bfloat16),
                     torch.randn(total_heads, total, 4).to(torch.bfloat16)) for n in names}
        engine = PagedEngine(cfg, seed=tp)
        with tempfile.TemporaryDirectory() as tmp:
            bundle = os.path.join(tmp, "capture.h5")
            with BundleWriter(bundle, model="cross-language", engine="stand-in") as w:
                w.set_kv_cache_config(cfg)
                w.add_prompt("p", list(range(total)), prompt_len)
                # Snapshot 0 ran to the divergence and one token past it: the KV at the divergence is
                # the engine's own wrong token. Snapshot 1 re-prefilled the teacher token there.
                wrong = {n: (k.clone(), v.clone()) for n, (k, v) in truth.items()}
                for k, v in wrong.values():
                    k[:, divergence] = 99
                    v[:, divergence] = -99
                rpc, tables = engine.snapshot(wrong, divergence + 2)
                w.add_engine_snapshot("p", rpc, tables, divergence + 2, keep_only_referenced=keep_only_referenced)
                rpc, tables = engine.snapshot(truth, total)
                w.add_engine_snapshot("p", rpc, tables, total, keep_only_referenced=keep_only_referenced)
                w.set_divergence("p", [divergence])
                w.add_reference_kv("p", "expected", tuple((k.unsqueeze(0), v.unsqueeze(0)) for k, v in
                                                          (truth[n] for n in sorted(names))))
            out = os.path.join(tmp, "export.h5")
            result = subprocess.run([BINARY, "export", bundle, out], capture_output=True, text=True)
            self.assertEqual(result.returncode, 0, result.stderr)
            with h5py.File(out, "r") as f:
                for group in cfg["groups"]:
                    for name in group["layer_names"]:
                        k_true = truth[name][0].float().numpy()
                        got = f[f"prompts/p/engine/{name}"]
                        present = got["present"][()].astype(bool)
                        # Held positions: the window of each snapshot (SlidingWindowSpec), its
                        # validated range, never the last position.
                        expect = np.zeros(total, bool)
                        for written, begin, end in ((divergence + 1, 0, divergence), (total - 1, divergence, total - 1)):
                            first = max(0, written - window + 1) if group["spec_type"] == "SlidingWindowSpec" else 0
                            expect[max(begin, first):end] = True
                        np.testing.assert_array_equal(present, expect, err_msg=name)
                        k = got["k"][()]
                        np.testing.assert_array_equal(k[:, present], k_true[:, present], err_msg=name)
                        self.assertTrue(np.isnan(k[:, ~present]).all())
                        np.testing.assert_array_equal(got["v"][()][:, present], truth[name][1].float().numpy()[:, present])
                        ref = f[f"prompts/p/expected/{name}"]
                        np.testing.assert_array_equal(ref["k"][()], k_true)

    def run_quantised(self, dtype, granularity):
        """A quantised cache as engines hand it: uint8 codes (torch has them as uint8 before it
        has float8 types) with scales per tensor, head, or token and head. kvscope's decoding must
        give exactly the codes' values, decoded here from the format's definition, times the scales."""
        total_heads, tp, total = 4, 2, 12
        cfg = config(total_heads, tp, "FullAttentionSpec")
        for group in cfg["groups"]:
            group["dtype"] = dtype
        names = [n for g in cfg["groups"] for n in g["layer_names"]]
        rng = np.random.default_rng(7)
        codes = {n: tuple(torch.from_numpy(rng.integers(0, 0x7f, (total_heads, total, 4)).astype(np.uint8)
                                           | (rng.integers(0, 2, (total_heads, total, 4)) << 7).astype(np.uint8))
                          for _ in "kv") for n in names}

        def scales_of(n):
            shape = {"tensor": (), "head": (total_heads,), "token_head": (total_heads, total)}[granularity]
            return tuple(rng.uniform(0.01, 3.0, shape).astype(np.float32) for _ in "kv")

        scales = {n: scales_of(n) for n in names}
        engine = PagedEngine(cfg, seed=3)
        with tempfile.TemporaryDirectory() as tmp:
            bundle = os.path.join(tmp, "capture.h5")
            with BundleWriter(bundle, model="cross-language", engine="stand-in") as w:
                w.set_kv_cache_config(cfg)
                w.add_prompt("p", list(range(total)), 6)
                rpc, tables = engine.snapshot(codes, total, scales)
                w.add_engine_snapshot("p", rpc, tables, total, keep_only_referenced=True)
                w.add_reference_kv("p", "expected", tuple(
                    (torch.zeros(1, total_heads, total, 4), torch.zeros(1, total_heads, total, 4)) for _ in names))
            out = os.path.join(tmp, "export.h5")
            result = subprocess.run([BINARY, "export", bundle, out], capture_output=True, text=True)
            self.assertEqual(result.returncode, 0, result.stderr)
            with h5py.File(out, "r") as f:
                for name in names:
                    for part, index in (("k", 0), ("v", 1)):
                        values = decode_fp8(codes[name][index].numpy(), dtype)
                        scale = scales[name][index]
                        scale = scale.reshape(total_heads, total, 1) if scale.ndim == 2 else \
                            scale.reshape(total_heads, 1, 1) if scale.ndim == 1 else scale
                        want = (values * scale).astype(np.float32)
                        got = f[f"prompts/p/engine/{name}"][part][()]
                        np.testing.assert_array_equal(got[:, :total - 1], want[:, :total - 1], err_msg=f"{name} {part}")

    def test_hybrid_chunked_and_odd_block_sizes(self):
        """A hybrid model as vLLM serves it: a chunked-local group (chunks of 6, blocks of 2), a
        full-attention group whose block size the groups' shared page size makes 528, and a
        state-space group, listed and not compared."""
        layers = ["model.layers.0.attn", "model.layers.1.attn", "model.layers.2.attn", "model.layers.3.mixer"]
        cfg = {"num_blocks": 24, "tp_size": 2, "total_num_kv_heads": 4, "groups": [
            {"layer_names": [layers[0], layers[2]], "spec_type": "ChunkedLocalAttentionSpec", "block_size": 2,
             "attention_chunk_size": 6, "dtype": "torch.bfloat16", "num_kv_heads": 2, "head_size": 4},
            {"layer_names": [layers[1]], "spec_type": "FullAttentionSpec", "block_size": 528,
             "dtype": "torch.bfloat16", "num_kv_heads": 2, "head_size": 4},
            {"layer_names": [layers[3]], "spec_type": "MambaSpec", "block_size": 528}]}
        total = 16
        torch.manual_seed(11)
        truth = {n: (torch.randn(4, total, 4).to(torch.bfloat16), torch.randn(4, total, 4).to(torch.bfloat16))
                 for n in layers[:3]}
        engine = PagedEngine(cfg, seed=5)
        with tempfile.TemporaryDirectory() as tmp:
            bundle = os.path.join(tmp, "hybrid.h5")
            with BundleWriter(bundle, model="cross-language", engine="stand-in") as w:
                w.set_kv_cache_config(cfg)
                w.add_prompt("p", list(range(total)), 10)
                rpc, tables = engine.snapshot(truth, total)
                w.add_engine_snapshot("p", rpc, tables, total, keep_only_referenced=True)
                # HF's cache of a hybrid model holds an entry for every layer, empty for the mixer.
                hf = [(truth[n][0].unsqueeze(0), truth[n][1].unsqueeze(0)) for n in layers[:3]]
                hf.append((torch.zeros(1, 4, 0, 4), torch.zeros(1, 4, 0, 4)))
                w.add_reference_kv("p", "expected", tuple(hf))
            out = os.path.join(tmp, "export.h5")
            result = subprocess.run([BINARY, "export", bundle, out], capture_output=True, text=True)
            self.assertEqual(result.returncode, 0, result.stderr)
            with h5py.File(out, "r") as f:
                self.assertNotIn(layers[3], f["prompts/p/engine"])
                for name in layers[:3]:
                    got = f[f"prompts/p/engine/{name}"]
                    present = got["present"][()].astype(bool)
                    expect = np.zeros(total, bool)
                    expect[(12 if name != layers[1] else 0):total - 1] = True  # 15 written: chunk 2 is 12..
                    np.testing.assert_array_equal(present, expect, err_msg=name)
                    np.testing.assert_array_equal(got["k"][()][:, present], truth[name][0].float().numpy()[:, present])
                    np.testing.assert_array_equal(got["v"][()][:, present], truth[name][1].float().numpy()[:, present])
            result = subprocess.run([BINARY, "analyze", bundle], capture_output=True, text=True)
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertIn("not compared: state-space layers (1): model.layers.3.mixer", result.stdout)

    def test_provenance_is_read_and_shown(self):
        # What the writer records, kvscope inspect reads and says (decode steps merged).
        cfg = config(4, 2, "FullAttentionSpec")
        names = [n for g in cfg["groups"] for n in g["layer_names"]]
        total = 12
        truth = {n: (torch.randn(4, total, 4).to(torch.bfloat16), torch.randn(4, total, 4).to(torch.bfloat16)) for n in names}
        with tempfile.TemporaryDirectory() as tmp:
            bundle = os.path.join(tmp, "capture.h5")
            with BundleWriter(bundle, model="cross-language", engine="stand-in") as w:
                w.set_kv_cache_config(cfg)
                w.add_prompt("p", list(range(total)), 8)
                rpc, tables = PagedEngine(cfg, seed=1).snapshot(truth, total)
                w.add_engine_snapshot("p", rpc, tables, total)
                w.add_reference_kv("p", "expected", tuple((k.unsqueeze(0), v.unsqueeze(0)) for k, v in
                                                          (truth[n] for n in sorted(names))))
                w.set_provenance("p", [(0, 4, "prefix_cache", {"blocks": [2, 3]}),
                                       (4, 8, "external", {"connector": "NixlConnector"}),
                                       (8, 9, "decode", {"step": 0}), (9, 10, "decode", {"step": 1})])
            result = subprocess.run([BINARY, "inspect", bundle], capture_output=True, text=True)
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertIn("provenance: 0-3 prefix_cache (blocks 2-3); 4-7 external (NixlConnector); "
                          "8-9 decode (steps 0-1)", result.stdout)

    def test_groups_of_different_head_sizes(self):
        """A model whose sliding layers have another head size than its full ones (6 and 4): each
        layer goes through at its own and is analysed at it."""
        cfg = config(2, 2, "SlidingWindowSpec")
        cfg["groups"][0]["head_size"] = 6
        total = 14
        torch.manual_seed(5)
        truth = {n: (torch.randn(2, total, g["head_size"]).to(torch.bfloat16), torch.randn(2, total, g["head_size"]).to(torch.bfloat16))
                 for g in cfg["groups"] for n in g["layer_names"]}
        prompt = self.round_trip_exact(cfg, truth, total, seed=4)
        self.assertEqual(prompt["layer_head_dims"], [[6, 6], [4, 4], [6, 6]])
        self.assertEqual(prompt["suspects"], [])

    def test_engine_only_capture_is_diffed_against_a_reference(self):
        """An engine-only bundle (engine_only=True: no reference KV) is compared by `kvscope diff A B`
        against A's reference: a head of layer 1 scaled by 2 in B is a regression at layer 1; the
        same engine without the fault is no worse; on its own, or against an analysis (which holds
        no KV), it says that it needs A's reference."""
        cfg = config(2, 2, "SlidingWindowSpec")
        names = [n for g in cfg["groups"] for n in g["layer_names"]]
        total = 14
        torch.manual_seed(8)
        truth = {n: (torch.randn(2, total, 4).to(torch.bfloat16), torch.randn(2, total, 4).to(torch.bfloat16)) for n in names}
        faulty = {n: (k.clone(), v.clone()) for n, (k, v) in truth.items()}
        faulty["model.layers.1.self_attn"][0][0, 9:] *= 2

        def write(path, kv, engine_only):
            with BundleWriter(path, model="cross-language", engine="stand-in", engine_only=engine_only) as w:
                w.set_kv_cache_config(cfg)
                w.add_prompt("p", list(range(total)), 8)
                rpc, tables = PagedEngine(cfg, seed=3).snapshot(kv, total)
                w.add_engine_snapshot("p", rpc, tables, total, keep_only_referenced=True)
                if engine_only:
                    with self.assertRaisesRegex(ValueError, "engine-only bundle holds no reference"):
                        w.add_reference_kv("p", "expected", ())
                else:
                    w.add_reference_kv("p", "expected", tuple((truth[n][0][None], truth[n][1][None]) for n in sorted(names)))

        with tempfile.TemporaryDirectory() as tmp:
            a, b, c = (os.path.join(tmp, name) for name in ("a.h5", "b.h5", "c.h5"))
            write(a, truth, False)
            write(b, faulty, True)
            write(c, truth, True)
            with h5py.File(b, "r") as f:
                self.assertEqual(int(f.attrs["engine_only"]), 1)
                self.assertNotIn("reference", f["prompts/p"])
            worse = subprocess.run([BINARY, "diff", a, b], capture_output=True, text=True)
            self.assertEqual(worse.returncode, 1, worse.stdout + worse.stderr)
            self.assertIn("reference: A's expected (B is an engine-only capture)", worse.stdout)
            self.assertIn("first worse: model.layers.1.self_attn, token 9 ", worse.stdout)
            same = subprocess.run([BINARY, "diff", a, c, "--json", os.path.join(tmp, "d.json")], capture_output=True, text=True)
            self.assertEqual(same.returncode, 0, same.stdout + same.stderr)
            with open(os.path.join(tmp, "d.json")) as f:
                self.assertTrue(json.load(f)["b"]["reference_from_a"])
            report = subprocess.run([BINARY, "report", b, "--against", a, "-o", os.path.join(tmp, "report"), "--no-whatif"],
                                    capture_output=True, text=True, env=dict(os.environ, QT_QPA_PLATFORM="offscreen"))
            self.assertEqual(report.returncode, 0, report.stdout + report.stderr)
            with open(os.path.join(tmp, "report", "report.html"), encoding="utf-8") as f:
                html = f.read()
            self.assertIn("A's reference (B is an engine-only capture)", html)
            self.assertIn("B is worse in 1 layer(s)", html)
            alone = subprocess.run([BINARY, "check", b], capture_output=True, text=True)
            self.assertNotEqual(alone.returncode, 0)
            self.assertIn("engine-only capture holds no reference KV", alone.stdout + alone.stderr)
            analysis = os.path.join(tmp, "a.json")
            self.assertEqual(subprocess.run([BINARY, "analyze", a, "--json", analysis], capture_output=True).returncode, 0)
            from_json = subprocess.run([BINARY, "diff", analysis, b], capture_output=True, text=True)
            self.assertEqual(from_json.returncode, 2, from_json.stdout)
            self.assertIn("engine-only capture holds no reference KV", from_json.stderr)

    def round_trip_exact(self, cfg, truth, total, seed):
        """Writes one clean prompt of `truth` ({layer: (k, v)} [heads, total, dim] bf16) through the
        paged stand-in, checks that kvscope exports exactly those heads and values, and returns the
        prompt of its analysis JSON."""
        with tempfile.TemporaryDirectory() as tmp:
            bundle = os.path.join(tmp, "capture.h5")
            with BundleWriter(bundle, model="cross-language", engine="stand-in") as w:
                w.set_kv_cache_config(cfg)
                w.add_prompt("p", list(range(total)), 8)
                rpc, tables = PagedEngine(cfg, seed=seed).snapshot(truth, total)
                w.add_engine_snapshot("p", rpc, tables, total, keep_only_referenced=True)
                w.add_reference_kv("p", "expected", tuple((truth[n][0][None], truth[n][1][None]) for n in sorted(truth)))
            out = os.path.join(tmp, "export.h5")
            result = subprocess.run([BINARY, "export", bundle, out], capture_output=True, text=True)
            self.assertEqual(result.returncode, 0, result.stderr)
            with h5py.File(out, "r") as f:
                for name, (k, v) in truth.items():
                    got = f[f"prompts/p/engine/{name}"]
                    self.assertEqual(got["k"].shape[0], k.shape[0], name)
                    present = got["present"][()].astype(bool)
                    np.testing.assert_array_equal(got["k"][()][:, present], k.float().numpy()[:, present], err_msg=name)
                    np.testing.assert_array_equal(got["v"][()][:, present], v.float().numpy()[:, present], err_msg=name)
            result = subprocess.run([BINARY, "analyze", bundle, "--json", out + ".json"], capture_output=True, text=True)
            self.assertEqual(result.returncode, 0, result.stderr)
            with open(out + ".json") as f:
                return json.load(f)["prompts"][0]

    def test_groups_of_different_head_counts(self):
        """A model whose sliding layers have 1 KV head and full layers 4 (per-layer GQA), at TP 2:
        the sliding group's head is replicated on both ranks, the full group's partitioned. Each
        layer goes through with its own heads and is analysed at them."""
        cfg = config(4, 2, "SlidingWindowSpec")
        cfg["groups"][0].update(num_kv_heads=1, total_num_kv_heads=1)
        total = 14
        torch.manual_seed(6)
        heads = {n: g.get("total_num_kv_heads", 4) for g in cfg["groups"] for n in g["layer_names"]}
        truth = {n: (torch.randn(h, total, 4).to(torch.bfloat16), torch.randn(h, total, 4).to(torch.bfloat16))
                 for n, h in heads.items()}
        prompt = self.round_trip_exact(cfg, truth, total, seed=3)
        self.assertEqual(prompt["layer_heads"], [1, 4, 1])
        self.assertEqual(prompt["suspects"], [])

        # The per-rank count must agree with the group's total over TP.
        cfg["groups"][0]["num_kv_heads"] = 2
        with self.assertRaisesRegex(ValueError, r"groups\[0\]\.num_kv_heads: 2 per rank disagrees"):
            with tempfile.TemporaryDirectory() as tmp:
                with BundleWriter(os.path.join(tmp, "bad.h5"), model="m", engine="e") as w:
                    w.set_kv_cache_config(cfg)

    def test_prefix_caching(self):
        """Two prompts whose engine shared the blocks of a common 8-token prefix (the second's
        tables point at the first's blocks there). A fault in a shared block is one fault: its
        suspect names the block and both prompts."""
        cfg = config(2, 2, "FullAttentionSpec")
        names = [n for g in cfg["groups"] for n in g["layer_names"]]
        torch.manual_seed(9)
        total, prefix = 16, 8
        truth = {p: {n: (torch.randn(2, total, 4), torch.randn(2, total, 4)) for n in names} for p in "ab"}
        for n in names:  # the common prefix: the same tokens, so the same KV
            for part in (0, 1):
                truth["b"][n][part][:, :prefix] = truth["a"][n][part][:, :prefix]
        tokens = {"a": list(range(100, 100 + total)), "b": list(range(100, 100 + prefix)) + list(range(300, 300 + total - prefix))}
        engine = {p: {n: (k.to(torch.bfloat16), v.to(torch.bfloat16).clone()) for n, (k, v) in truth[p].items()} for p in "ab"}
        layer = "model.layers.1.self_attn"  # block size 4: positions 2-6 lie in its blocks 0 and 1, both shared
        for p in "ab":
            engine[p][layer][1][:, 2:7] *= 3
        paged = PagedEngine(cfg, seed=2)
        with tempfile.TemporaryDirectory() as tmp:
            bundle = os.path.join(tmp, "prefix.h5")
            with BundleWriter(bundle, model="cross-language", engine="stand-in") as w:
                w.set_kv_cache_config(cfg)
                first_tables = None
                for p in "ab":
                    w.add_prompt(p, tokens[p], 10)
                    pinned = None if first_tables is None else {
                        g: {b: int(t[0, b]) for b in range(prefix // group["block_size"])}
                        for g, (t, group) in enumerate(zip(first_tables, cfg["groups"]))}
                    rpc, tables = paged.snapshot(engine[p], total, pinned=pinned)
                    if first_tables is None:
                        first_tables = [torch.load(io.BytesIO(t)).numpy() for t in tables]
                    w.add_engine_snapshot(p, rpc, tables, total, keep_only_referenced=True)
                    order = sorted(names)
                    w.add_reference_kv(p, "baseline", tuple((truth[p][n][0][None], truth[p][n][1][None]) for n in order))
                    w.add_reference_kv(p, "expected", tuple((truth[p][n][0][None].to(torch.bfloat16),
                                                             truth[p][n][1][None].to(torch.bfloat16)) for n in order))
            out = os.path.join(tmp, "analysis.json")
            result = subprocess.run([BINARY, "analyze", bundle, "--json", out], capture_output=True, text=True)
            self.assertEqual(result.returncode, 0, result.stderr)
            with open(out) as f:
                suspects = json.load(f)["suspects"]
            self.assertTrue(suspects, result.stdout)
            s = suspects[0]
            self.assertEqual((s["first_layer"], s["tokens"][0]), (layer, 2))
            self.assertEqual(s["prompts"], ["a", "b"])
            self.assertEqual(s["shared_block"], {"physical": int(first_tables[1][0, 0]), "prompts": ["a", "b"]})
            self.assertIn("which prompts a, b share (prefix caching)", s["evidence"])

    def test_fp8_e4m3fn_per_tensor(self):
        self.run_quantised("float8_e4m3fn", "tensor")

    def test_fp8_e4m3fn_per_head(self):
        self.run_quantised("float8_e4m3fn", "head")

    def test_fp8_e5m2_per_token_head(self):
        self.run_quantised("float8_e5m2", "token_head")

    def test_partitioned_sliding_window_spec(self):
        self.run_case(4, 2, "SlidingWindowSpec", keep_only_referenced=True)

    def test_replicated_sliding_window_spec(self):
        self.run_case(2, 4, "SlidingWindowSpec", keep_only_referenced=False)

    def test_partitioned_full_attention_with_window(self):
        self.run_case(4, 4, "FullAttentionSpec", keep_only_referenced=False)

    def test_replicated_full_attention_with_window(self):
        self.run_case(1, 2, "FullAttentionSpec", keep_only_referenced=True)


@unittest.skipUnless(BINARY, "KVSCOPE_BINARY is not set")
class CrossLanguageMla(unittest.TestCase):
    """An MLA layer's latent as vLLM holds it ([num_blocks, block_size, head_size], bf16, fp8 with
    one scale, or fp8_ds_mla bytes) goes through the writer and comes back from kvscope as c_kv and
    k_pe: exactly the values the Python side started from, decoded here from the formats'
    definitions."""

    RANK, ROPE, BLOCK, TOTAL = 128, 16, 4, 15
    LAYERS = ["model.layers.0.self_attn", "model.layers.1.self_attn"]

    def config(self, dtype):
        # total_num_kv_heads as DeepSeek's config gives it (the query heads): an MLA cache ignores it.
        return {"num_blocks": 12, "tp_size": 2, "total_num_kv_heads": 8, "groups": [
            {"layer_names": self.LAYERS, "spec_type": "MLAAttentionSpec", "block_size": self.BLOCK,
             "num_kv_heads": 1, "head_size": self.RANK + self.ROPE, "kv_lora_rank": self.RANK,
             "qk_rope_head_dim": self.ROPE, "dtype": dtype, "sliding_window": None}]}

    def run_mla(self, dtype):
        rng = np.random.default_rng(11)
        table = [7, 2, 9, 4]  # physical blocks of logical 0..3, scattered
        written = self.TOTAL - 1
        truth, caches, extra = {}, {}, {}
        for n in self.LAYERS:
            k_pe = torch.randn(self.TOTAL, self.ROPE).to(torch.bfloat16)
            if dtype == "torch.bfloat16":
                c_kv = torch.randn(self.TOTAL, self.RANK).to(torch.bfloat16)
                latent = torch.cat([c_kv, k_pe], -1)
                cache = torch.zeros(12, self.BLOCK, self.RANK + self.ROPE, dtype=torch.bfloat16)
                truth[n] = (c_kv.float().numpy(), k_pe.float().numpy())
            else:
                codes = (rng.integers(0, 0x7f, (self.TOTAL, self.RANK)) | (rng.integers(0, 2, (self.TOTAL, self.RANK)) << 7)).astype(np.uint8)
                values = decode_fp8(codes, "float8_e4m3fn")
                if dtype == "fp8_ds_mla":
                    scales = rng.uniform(0.01, 2.0, (self.TOTAL, self.RANK // 128)).astype(np.float32)
                    latent = np.concatenate([codes, scales.view(np.uint8), k_pe.view(torch.int16).numpy().view(np.uint8)], -1)
                    truth[n] = (values * np.repeat(scales, 128, -1), k_pe.float().numpy())
                else:  # plain fp8: c_kv and k_pe quantised alike, with one scale
                    pe_codes = (rng.integers(0, 0x7f, (self.TOTAL, self.ROPE))).astype(np.uint8)
                    latent = np.concatenate([codes, pe_codes], -1)
                    extra[n] = 0.75
                    truth[n] = (values * 0.75, decode_fp8(pe_codes, "float8_e4m3fn") * 0.75)
                latent = torch.from_numpy(latent)
                cache = torch.zeros(12, self.BLOCK, latent.shape[-1], dtype=torch.uint8)
            for p in range(written):
                cache[table[p // self.BLOCK], p % self.BLOCK] = latent[p]
            caches[n] = cache
        per_rank = []
        for r in range(2):  # TP replicates the latent: both ranks hold it; rank 1 as torch.save bytes
            layers = {}
            for n in self.LAYERS:
                entry = {"latent": caches[n]}
                if n in extra:
                    entry["k_scale"] = torch.tensor(extra[n])
                if r == 0:
                    layers[n] = entry if n in extra else caches[n]
                else:
                    buffer = io.BytesIO()
                    torch.save(entry, buffer)
                    layers[n] = buffer.getvalue()
            per_rank.append(layers)
        with tempfile.TemporaryDirectory() as tmp:
            bundle = os.path.join(tmp, "mla.h5")
            with BundleWriter(bundle, model="cross-language MLA", engine="stand-in") as w:
                w.set_kv_cache_config(self.config(dtype))
                w.add_prompt("p", list(range(self.TOTAL)), 9)
                w.add_engine_snapshot("p", per_rank, [torch.tensor([table], dtype=torch.int32)], self.TOTAL,
                                      keep_only_referenced=True)
                # Both reference layouts: (c_kv, k_pe) per layer, and the latent [1, seq, head_size].
                w.add_reference_kv("p", "expected", tuple((torch.from_numpy(truth[n][0])[None], torch.from_numpy(truth[n][1])[None])
                                                          for n in self.LAYERS))
                w.add_reference_kv("p", "baseline", {n: torch.from_numpy(np.concatenate(truth[n], -1))[None]
                                                     for n in self.LAYERS})
            out = os.path.join(tmp, "export.h5")
            result = subprocess.run([BINARY, "export", bundle, out], capture_output=True, text=True)
            self.assertEqual(result.returncode, 0, result.stderr)
            with h5py.File(out, "r") as f:
                for n in self.LAYERS:
                    got = f[f"prompts/p/engine/{n}"]
                    present = got["present"][()].astype(bool)
                    np.testing.assert_array_equal(present, np.arange(self.TOTAL) < written)
                    np.testing.assert_array_equal(got["k"][()][0, :written], truth[n][0][:written], err_msg=n)
                    np.testing.assert_array_equal(got["v"][()][0, :written], truth[n][1][:written], err_msg=n)
                    for role in ("expected", "baseline"):
                        np.testing.assert_array_equal(f[f"prompts/p/{role}/{n}/k"][()][0], truth[n][0])
                        np.testing.assert_array_equal(f[f"prompts/p/{role}/{n}/v"][()][0], truth[n][1])
            result = subprocess.run([BINARY, "analyze", bundle, "--json", out + ".json"], capture_output=True, text=True)
            self.assertEqual(result.returncode, 0, result.stderr)
            with open(out + ".json") as f:
                prompt = json.load(f)["prompts"][0]
            self.assertEqual(prompt["part_names"], ["c_kv", "k_pe"])
            self.assertEqual(prompt["replica_differences"], [])

    def test_bf16(self):
        self.run_mla("torch.bfloat16")

    def test_fp8_one_scale(self):
        self.run_mla("float8_e4m3fn")

    def test_fp8_ds_mla(self):
        self.run_mla("fp8_ds_mla")

    def test_bad_latents(self):
        with tempfile.TemporaryDirectory() as tmp, BundleWriter(os.path.join(tmp, "bad.h5")) as w:
            w.set_kv_cache_config(self.config("torch.bfloat16"))
            w.add_prompt("p", list(range(self.TOTAL)), 9)
            narrow = torch.zeros(12, self.BLOCK, self.RANK, dtype=torch.bfloat16)
            with self.assertRaisesRegex(ValueError, r"rank 0, layer model.layers.0.self_attn: an MLA latent must be "
                                                     r"\[num_blocks, block_size, head_size\] = \(12, 4, 144\)"):
                w.add_engine_snapshot("p", [{n: narrow for n in self.LAYERS}] * 2, [np.zeros((1, 4), np.int32)], 15)
            with self.assertRaisesRegex(ValueError, r"layer model.layers.0.self_attn, k_pe: shape \(1, 1, 15, 8\), "
                                                     r"expected \[batch, seq, 16\]"):
                w.add_reference_kv("p", "expected", {n: (torch.zeros(1, 15, self.RANK), torch.zeros(1, 15, 8))
                                                     for n in self.LAYERS})
            w.abandon()


if __name__ == "__main__":
    unittest.main()


def dcp_slot(pos, block_size, dcp, interleave):
    """vLLM's slot mapping under decode context parallelism (vllm/v1/worker/block_table.py):
    (table entry, offset in the physical block, DCP rank holding the position)."""
    virtual = block_size * dcp
    off = pos % virtual
    return pos // virtual, off // (dcp * interleave) * interleave + off % interleave, (off // interleave) % dcp


@unittest.skipUnless(BINARY, "KVSCOPE_BINARY is not set")
class CrossLanguageDcp(unittest.TestCase):
    """Decode context parallelism: each rank of a DCP group holds its share of the positions in the
    blocks the table names, laid here by vLLM's slot mapping; kvscope puts the sequence back
    together exactly, checks the replicas of each share, and names the DCP rank of a fault."""

    BLOCK, TOTAL, HEAD = 4, 23, 4
    LAYERS = ["model.layers.0.self_attn", "model.layers.1.self_attn"]

    def run_dcp(self, tp, heads, dcp, interleave, corrupt_rank=None, copy_differs=None):
        cfg = {"num_blocks": 16, "tp_size": tp, "total_num_kv_heads": heads, "dcp_size": dcp,
               "cp_kv_cache_interleave_size": interleave, "pcp_size": 1,
               "groups": [{"layer_names": self.LAYERS, "spec_type": "FullAttentionSpec", "block_size": self.BLOCK,
                           "sliding_window": None, "dtype": "torch.bfloat16", "num_kv_heads": 1,
                           "head_size": self.HEAD}]}
        torch.manual_seed(tp * 10 + dcp + interleave)
        written = self.TOTAL - 1
        entries = -(-written // (self.BLOCK * dcp))
        table = [13, 3, 8, 5, 11][:entries]
        truth = {n: (torch.randn(heads, self.TOTAL, self.HEAD).to(torch.bfloat16),
                     torch.randn(heads, self.TOTAL, self.HEAD).to(torch.bfloat16)) for n in self.LAYERS}
        copies = tp // heads
        per_rank = []
        for r in range(tp):
            layers = {}
            for n in self.LAYERS:
                k = torch.randn(16, 1, self.BLOCK, self.HEAD).to(torch.bfloat16)  # other data
                v = torch.randn(16, 1, self.BLOCK, self.HEAD).to(torch.bfloat16)
                head = r // copies
                for p in range(written):
                    entry, offset, rank = dcp_slot(p, self.BLOCK, dcp, interleave)
                    if rank == r % dcp:
                        k[table[entry], 0, offset] = truth[n][0][head, p]
                        v[table[entry], 0, offset] = 0 if (r == corrupt_rank and n == self.LAYERS[1]) else truth[n][1][head, p]
                if copy_differs is not None and r == copy_differs and n == self.LAYERS[0]:
                    k[table[1]] = -k[table[1]]  # this rank's copy of one block
                layers[n] = (k, v)
            per_rank.append(layers)
        with tempfile.TemporaryDirectory() as tmp:
            bundle = os.path.join(tmp, "dcp.h5")
            with BundleWriter(bundle, model="cross-language DCP", engine="stand-in") as w:
                w.set_kv_cache_config(cfg)
                w.add_prompt("p", list(range(self.TOTAL)), 9)
                w.add_engine_snapshot("p", per_rank, [torch.tensor([table], dtype=torch.int32)], self.TOTAL,
                                      keep_only_referenced=True)
                for role in ("expected", "baseline"):
                    w.add_reference_kv("p", role, tuple((k.unsqueeze(0), v.unsqueeze(0)) for k, v in
                                                        (truth[n] for n in self.LAYERS)))
            out = os.path.join(tmp, "export.h5")
            result = subprocess.run([BINARY, "export", bundle, out], capture_output=True, text=True)
            self.assertEqual(result.returncode, 0, result.stderr)
            with h5py.File(out, "r") as f:
                for n in self.LAYERS:
                    got = f[f"prompts/p/engine/{n}"]
                    np.testing.assert_array_equal(got["present"][()].astype(bool), np.arange(self.TOTAL) < written)
                    v_true = truth[n][1].float().numpy()[:, :written].copy()
                    if corrupt_rank is not None and n == self.LAYERS[1]:
                        for p in range(written):
                            if dcp_slot(p, self.BLOCK, dcp, interleave)[2] == corrupt_rank % dcp:
                                v_true[corrupt_rank // copies, p] = 0
                    np.testing.assert_array_equal(got["k"][()][:, :written], truth[n][0].float().numpy()[:, :written], err_msg=n)
                    np.testing.assert_array_equal(got["v"][()][:, :written], v_true, err_msg=n)
            result = subprocess.run([BINARY, "analyze", bundle, "--json", out + ".json"], capture_output=True, text=True)
            self.assertEqual(result.returncode, 0, result.stderr)
            with open(out + ".json") as f:
                return json.load(f)["prompts"][0]

    def test_latent_like_one_head_dcp_2(self):
        prompt = self.run_dcp(tp=4, heads=1, dcp=2, interleave=1)
        self.assertEqual(prompt["replica_differences"], [])
        self.assertEqual(prompt["suspects"], [])

    def test_two_heads_dcp_2_runs_of_2(self):
        prompt = self.run_dcp(tp=8, heads=2, dcp=2, interleave=2)
        self.assertEqual(prompt["suspects"], [])

    def test_whole_blocks_alternate(self):
        self.assertEqual(self.run_dcp(tp=4, heads=1, dcp=4, interleave=4)["suspects"], [])

    def test_one_dcp_rank_unwritten(self):
        # TP rank 3 (DCP rank 1 of the second head's group) never wrote V in layer 1.
        prompt = self.run_dcp(tp=4, heads=2, dcp=2, interleave=1, corrupt_rank=3)
        suspects = prompt["suspects"]
        self.assertEqual(len(suspects), 1, suspects)
        s = suspects[0]
        self.assertEqual((s["pattern"], s["first_layer"], s["heads"], s["dcp_ranks"], s["tp_ranks"]),
                         ("tp_rank", self.LAYERS[1], [1], [1], [3]))
        self.assertEqual(s["hypothesis"]["kind"], "zeros")

    def test_replica_of_a_share_differs(self):
        # TP 4, one head, DCP 2: ranks 2 and 3 copy ranks 0 and 1; rank 3's copy of one block differs.
        prompt = self.run_dcp(tp=4, heads=1, dcp=2, interleave=1, copy_differs=3)
        self.assertEqual(prompt["suspects"], [])
        d = prompt["replica_differences"]
        self.assertEqual(len(d), 1, d)
        self.assertEqual((d[0]["rank"], d[0]["against_rank"], d[0]["layer"], d[0]["physical_block"], d[0]["logical_block"]),
                         (3, 1, self.LAYERS[0], 3, 1))

    def test_bad_dcp_config(self):
        with tempfile.TemporaryDirectory() as tmp, BundleWriter(os.path.join(tmp, "bad.h5")) as w:
            cfg = {"num_blocks": 16, "tp_size": 4, "total_num_kv_heads": 4, "dcp_size": 2, "groups": [
                {"layer_names": self.LAYERS, "spec_type": "FullAttentionSpec", "block_size": 4, "dtype": "torch.bfloat16",
                 "num_kv_heads": 1, "head_size": 4, "sliding_window": None}]}
            with self.assertRaisesRegex(ValueError, "dcp_size: 2 needs each KV head on a multiple of 2"):
                w.set_kv_cache_config(cfg)
            w.abandon()


class CrossLanguageStates(unittest.TestCase):
    """A hybrid model's recurrent states written by the Python writer (TP 2, one Mamba2 group, so
    B and C on both ranks; the conv state bf16, the SSM state fp32, as vLLM keeps them) are read
    by kvscope: the analysis compares them with the reference's (within bf16's noise: no
    suspect, no state-space layer left uncompared), and names a stale state where the file has
    one."""

    ATTN = ["model.layers.0.self_attn", "model.layers.2.self_attn"]
    MIXERS = ["model.layers.1.mixer", "model.layers.3.mixer"]

    def bundle(self, tmp):
        from mamba2_standin import Mamba2Dims, mamba2_states, rank_units

        dims, tp, total = Mamba2Dims(heads=4, n_groups=1), 2, 24
        cfg = {"num_blocks": 24, "tp_size": tp, "total_num_kv_heads": 2, "groups": [
            {"layer_names": self.ATTN, "spec_type": "FullAttentionSpec", "block_size": 8, "dtype": "torch.bfloat16",
             "num_kv_heads": 1, "head_size": 4, "sliding_window": None},
            {"layer_names": self.MIXERS, "spec_type": "MambaSpec", "block_size": 8}]}
        tokens = [(5 * i + 1) % 200 for i in range(total)]
        truth = {n: (torch.randn(2, total, 4).to(torch.bfloat16), torch.randn(2, total, 4).to(torch.bfloat16))
                 for n in self.ATTN}
        rpc, tables = PagedEngine(cfg, seed=4).snapshot(truth, total)
        positions = [8, 16, 23]  # two block boundaries and the end (23 written)
        path = os.path.join(tmp, "states.h5")
        g = torch.Generator().manual_seed(9)
        with BundleWriter(path, model="cross-language", engine="stand-in") as w:
            w.set_kv_cache_config(cfg)
            w.add_prompt("p", tokens, 16)
            w.add_engine_snapshot("p", rpc, tables, total, keep_only_referenced=True)
            w.add_reference_kv("p", "expected", tuple((truth[n][0][None], truth[n][1][None]) for n in self.ATTN))
            for i, name in enumerate(self.MIXERS):
                conv, ssm = mamba2_states(tokens, dims, seed=i)
                conv, ssm = torch.from_numpy(conv[[p - 1 for p in positions]]), torch.from_numpy(ssm[[p - 1 for p in positions]])
                ranks = {}
                for r in range(tp):
                    conv_units, heads = rank_units(dims, tp, r)
                    ranks[r] = {"conv": (conv[:, conv_units].to(torch.bfloat16), conv_units),
                                "ssm": (ssm[:, heads].float(), heads)}
                w.add_state("p", name, positions, ranks)
                near = lambda t: (t + t.abs() * 2 ** -10 * torch.randn(t.shape, generator=g, dtype=t.dtype)).float()
                w.add_reference_state("p", "expected", name, positions, {"conv": near(conv), "ssm": near(ssm)})
        return path, positions

    def analyse(self, path):
        out = path + ".json"
        result = subprocess.run([BINARY, "analyze", path, "--json", out], capture_output=True, text=True)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        with open(out) as f:
            return json.load(f)

    @unittest.skipUnless(BINARY, "KVSCOPE_BINARY is not set")
    def test_states_are_read_and_compared(self):
        with tempfile.TemporaryDirectory() as tmp:
            path, positions = self.bundle(tmp)
            result = subprocess.run([BINARY, "inspect", path], capture_output=True, text=True)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            data = self.analyse(path)
            self.assertEqual(data["not_compared"], [])  # the mixers' states were compared
            self.assertEqual(data["suspects"], [])       # the engine's states are the reference's within bf16
            self.assertEqual(data["prompts"][0].get("problems", []), [])

    @unittest.skipUnless(BINARY, "KVSCOPE_BINARY is not set")
    def test_a_stale_state_is_found_at_its_layer_and_checkpoint(self):
        """The engine's state at the second checkpoint (16) of one mixer is its state at the first
        (8), on every rank, rewritten in the file as a stale slot would leave it."""
        with tempfile.TemporaryDirectory() as tmp:
            path, positions = self.bundle(tmp)
            with h5py.File(path, "r+") as f:
                for r in range(2):
                    for part in ("conv", "ssm"):
                        ds = f[f"prompts/p/engine/states/{self.MIXERS[1]}/rank_{r}/{part}"]
                        ds[1] = ds[0]
            data = self.analyse(path)
            (top, *_) = data["suspects"]
            self.assertEqual(top["pattern"], "state", top)
            self.assertEqual(top["first_layer"], self.MIXERS[1], top)
            self.assertEqual(top["hypothesis"]["kind"], "state_stale", top)
            self.assertEqual(top["hypothesis"]["parameters"], {"position": 16, "holds_position": 8}, top)
