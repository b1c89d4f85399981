"""Impact (docs/bundle-format.md, "Impact"): the engine's KV put into the reference model, the KL
of each decode step's next-token distribution. A bundle whose engine KV is the stand-in model's own
but in one layer is measured through `kvscope export`; its KL is checked against a float64
computation of the same per-step semantics written here (numpy, from the stand-in's weights), the
fp8 rounding against hand-worked values and the formats' grids. Needs KVSCOPE_BINARY."""

import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types
import unittest
from contextlib import redirect_stderr, redirect_stdout
from unittest import mock

import h5py
import numpy as np
import torch

from hf_causal_lm_standin import StandinCausalLM, StandinConfig, StandinDynamicCache
from kvscope_capture import BundleWriter
from kvscope_capture.__main__ import main
from kvscope_capture.impact import impact_bundle, quantise_per_tensor, round_to_fp8

BINARY = os.environ.get("KVSCOPE_BINARY")
LAYERS = [f"model.layers.{i}.self_attn" for i in range(3)]
WINDOW = 6  # layer 2's sliding window
PROMPT_LEN, TEACHER = 8, 8
PERTURBED = 1


def kv_cache_config():
    return {"num_blocks": 30, "tp_size": 1, "total_num_kv_heads": 2, "dcp_size": 1, "pcp_size": 1,
            "groups": [{"layer_names": LAYERS[:2], "spec_type": "FullAttentionSpec", "block_size": 4,
                        "sliding_window": None, "dtype": "torch.float32", "num_kv_heads": 2, "head_size": 4},
                       {"layer_names": LAYERS[2:], "spec_type": "SlidingWindowSpec", "block_size": 2,
                        "sliding_window": WINDOW, "dtype": "torch.float32", "num_kv_heads": 2, "head_size": 4}]}


def paged(cfg, layers, seq_len, seed):
    """The engine's cache as vLLM pages it (float32, one rank): a shuffled block pool, garbage
    elsewhere, a sliding-window group's blocks before the window freed."""
    rng = np.random.default_rng(seed)
    pool = [int(b) for b in rng.permutation(np.arange(1, cfg["num_blocks"]))]
    written = seq_len - 1
    caches, tables = {}, []
    for group in cfg["groups"]:
        bs = group["block_size"]
        first = max(0, written - group["sliding_window"] + 1) if group["spec_type"] == "SlidingWindowSpec" else 0
        row = [-1] * ((seq_len + bs - 1) // bs + 1)
        for b in range((written + bs - 1) // bs):
            row[b] = pool.pop() if (b + 1) * bs > first else -1
        tables.append(np.array([row], np.int32))
        for name in group["layer_names"]:
            k, v = layers[name]
            kc = torch.randn(cfg["num_blocks"], k.shape[0], bs, k.shape[2])
            vc = torch.randn(cfg["num_blocks"], k.shape[0], bs, k.shape[2])
            for b, phys in enumerate(row):
                for o in range(bs):
                    if phys >= 0 and b * bs + o < written:
                        kc[phys, :, o], vc[phys, :, o] = k[:, b * bs + o], v[:, b * bs + o]
            caches[name] = (kc, vc)
    return [caches], tables


# --- the float64 computation -------------------------------------------------------------------------

class Double:
    """The stand-in's computation in float64 (numpy), one position at a time."""

    def __init__(self, model):
        self.cfg = model.config
        self.w = {name: p.detach().double().numpy() for name, p in model.named_parameters()}

    def rms(self, x, name):
        return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + self.cfg.rms_norm_eps) * self.w[name]

    def rope(self, x, position):  # x [heads, dim]
        d = x.shape[-1]
        angles = position / self.cfg.rope_theta ** (np.arange(0, d, 2) / d)
        cos, sin = np.cos(np.r_[angles, angles]), np.sin(np.r_[angles, angles])
        return x * cos + np.concatenate([-x[:, d // 2:], x[:, :d // 2]], axis=-1) * sin

    def row(self, token, position, past):
        """Logits of one position, and each layer's (k, v) of the row; past(layer, k_row, v_row) ->
        (K, V) [kv_heads, position + 1, dim] that the layer attends to."""
        cfg, w = self.cfg, self.w
        x = w["embed_tokens.weight"][token]
        rows = []
        for layer in range(cfg.num_hidden_layers):
            p = f"layers.{layer}."
            h = self.rms(x, p + "input_layernorm.weight")
            d = cfg.head_dim
            q = self.rope((w[p + "self_attn.q_proj.weight"] @ h).reshape(-1, d), position)
            k = self.rope((w[p + "self_attn.k_proj.weight"] @ h).reshape(-1, d), position)
            v = (w[p + "self_attn.v_proj.weight"] @ h).reshape(-1, d)
            rows.append((k, v))
            keys, values = past(layer, k, v)
            window = cfg.sliding_windows[layer]
            first = max(0, position - window + 1) if window else 0
            groups = cfg.num_attention_heads // cfg.num_key_value_heads
            out = []
            for head in range(cfg.num_attention_heads):
                kh, vh = keys[head // groups, first:], values[head // groups, first:]
                scores = kh @ q[head] / np.sqrt(d)
                weights = np.exp(scores - scores.max())
                out.append(weights / weights.sum() @ vh)
            x = x + w[p + "self_attn.o_proj.weight"] @ np.concatenate(out)
            h = self.rms(x, p + "post_attention_layernorm.weight")
            gate = w[p + "gate_proj.weight"] @ h
            x = x + w[p + "down_proj.weight"] @ (gate / (1 + np.exp(-gate)) * (w[p + "up_proj.weight"] @ h))
        return w["lm_head.weight"] @ self.rms(x, "norm.weight"), rows

    def reference_kv(self, tokens):
        """Every layer's K and V [kv_heads, n, dim] of a causal pass over tokens."""
        kv = [([], []) for _ in range(self.cfg.num_hidden_layers)]

        def past(layer, k, v):
            kv[layer][0].append(k)
            kv[layer][1].append(v)
            return np.stack(kv[layer][0], 1), np.stack(kv[layer][1], 1)

        for position, token in enumerate(tokens):
            self.row(token, position, past)
        return [(np.stack(k, 1), np.stack(v, 1)) for k, v in kv]

    def step_logits(self, tokens, reference, replaced):
        """The spec's steps: the token at q with past [0, q) from `replaced` {layer: (K, V, held)}
        where held, else the reference's; the row at q the replaced source's where held, else its own."""
        logits = []
        for q in range(PROMPT_LEN - 1, PROMPT_LEN - 1 + TEACHER):
            def past(layer, k, v):
                keys = [reference[layer][0][:, :q].copy(), k[:, None]]
                values = [reference[layer][1][:, :q].copy(), v[:, None]]
                if layer in replaced:
                    rk, rv, held = replaced[layer]
                    keys[0][:, held[:q]] = rk[:, :q][:, held[:q]]
                    values[0][:, held[:q]] = rv[:, :q][:, held[:q]]
                    if held[q]:
                        keys[1], values[1] = rk[:, q:q + 1], rv[:, q:q + 1]
                return np.concatenate(keys, 1), np.concatenate(values, 1)
            logits.append(self.row(tokens[q], q, past)[0])
        return np.array(logits)


def kl64(reference, other):
    def log_p(x):
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))
    p, r = log_p(reference), log_p(other)
    return (np.exp(p) * (p - r)).sum(-1)


# --- fp8 by its grid -------------------------------------------------------------------------------

def fp8_grid(fmt):
    """Every finite non-negative value of the format, from its codes (bias 7 / 15), with the code."""
    e_bits, m_bits, bias = (4, 3, 7) if fmt == "e4m3fn" else (5, 2, 15)
    values = []
    for code in range(1 << (e_bits + m_bits)):
        e, m = code >> m_bits, code & ((1 << m_bits) - 1)
        if fmt == "e4m3fn" and e == 15 and m == 7 or fmt == "e5m2" and e == 31:
            continue  # NaN / infinities
        values.append(((m / (1 << m_bits)) * 2.0 ** (1 - bias) if e == 0
                       else (1 + m / (1 << m_bits)) * 2.0 ** (e - bias), code))
    return sorted(values)


def round_by_grid(x, fmt):
    """Nearest grid value, a tie to the even code, beyond the largest the largest."""
    grid = fp8_grid(fmt)
    out = []
    for value in np.asarray(x, np.float64).ravel():
        best = min(grid, key=lambda g: (abs(abs(value) - g[0]), g[1] & 1))
        out.append(np.copysign(best[0], value))
    return np.array(out).reshape(np.shape(x))


class Fp8Rounding(unittest.TestCase):
    def test_hand_worked(self):
        cases = {"e4m3fn": [(1.0, 1.0), (1.0625, 1.0), (1.1875, 1.25), (232.0, 224.0), (448.0, 448.0),
                            (460.0, 448.0), (1e6, 448.0), (-1e6, -448.0), (2.0 ** -9, 2.0 ** -9),
                            (1.5 * 2.0 ** -9, 2.0 ** -8), (0.5 * 2.0 ** -9, 0.0), (0.6 * 2.0 ** -9, 2.0 ** -9),
                            (1.9375, 2.0), (-0.3, -0.3125), (0.0, 0.0)],
                 "e5m2": [(1.125, 1.0), (1.375, 1.5), (57344.0, 57344.0), (6e4, 57344.0),
                          (2.0 ** -16, 2.0 ** -16), (3 * 2.0 ** -17, 2.0 ** -15), (-3.0, -3.0), (0.3, 0.3125)]}
        for fmt, pairs in cases.items():
            given, expected = np.array(pairs).T
            np.testing.assert_array_equal(round_to_fp8(given, fmt), expected, err_msg=fmt)

    def test_against_the_grid(self):
        rng = np.random.default_rng(5)
        for fmt, largest in (("e4m3fn", 448.0), ("e5m2", 57344.0)):
            x = np.concatenate([rng.normal(0, 1, 300) * np.exp2(rng.integers(-18, 18, 300)),
                                rng.uniform(-1.2, 1.2, 100) * largest])
            np.testing.assert_array_equal(round_to_fp8(x, fmt), round_by_grid(x, fmt), err_msg=fmt)

    def test_per_tensor_scale(self):
        x = np.array([[0.5, -2.0], [1.3, 0.01]], np.float32)
        scale = np.float32(2.0) / np.float32(448.0)
        np.testing.assert_array_equal(quantise_per_tensor(x, "fp8_e4m3/tensor"),
                                      (round_by_grid(x / scale, "e4m3fn") * scale).astype(np.float32))
        self.assertEqual(quantise_per_tensor(x, "fp8_e4m3/tensor")[0, 1], -2.0)  # amax maps to 448 exactly


@unittest.skipUnless(BINARY, "KVSCOPE_BINARY is not set")
class Impact(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.manual_seed(0)
        cls.model = StandinCausalLM(StandinConfig(sliding_windows=[None, None, WINDOW]), seed=3).eval()
        rng = np.random.default_rng(11)
        cls.tokens = rng.integers(0, cls.model.config.vocab_size, PROMPT_LEN + TEACHER)
        with torch.no_grad():
            out = cls.model(torch.as_tensor(cls.tokens)[None], past_key_values=StandinDynamicCache())
        # The reference's own KV (float32), and the engine's: the same but in one layer.
        cls.own = {name: (layer.keys[0].clone(), layer.values[0].clone())
                   for name, layer in zip(LAYERS, out.past_key_values.layers)}
        cls.engine = dict(cls.own)
        noise = torch.Generator().manual_seed(9)
        k, v = cls.own[LAYERS[PERTURBED]]
        k, v = k.clone(), v.clone()
        k[:, 2:] += 0.4 * torch.randn(k[:, 2:].shape, generator=noise)
        v[:, 2:] += 0.4 * torch.randn(v[:, 2:].shape, generator=noise)
        cls.engine[LAYERS[PERTURBED]] = (k, v)
        # The baseline (a three-way capture's fp32 reference): here the reference's own but in layer 0,
        # so that its rows are told apart from the engine's.
        cls.baseline = dict(cls.own)
        k, v = (x.clone() for x in cls.own[LAYERS[0]])
        k += 0.05 * torch.randn(k.shape, generator=noise)
        v += 0.05 * torch.randn(v.shape, generator=noise)
        cls.baseline[LAYERS[0]] = (k, v)
        cls.tmp = tempfile.TemporaryDirectory()
        cls.bundle = os.path.join(cls.tmp.name, "capture.h5")
        cfg = kv_cache_config()
        with BundleWriter(cls.bundle, model="stand-in", engine="stand-in") as w:
            w.set_kv_cache_config(cfg)
            w.add_prompt("p", cls.tokens, PROMPT_LEN)
            per_rank, tables = paged(cfg, cls.engine, len(cls.tokens), seed=1)
            w.add_engine_snapshot("p", per_rank, tables, len(cls.tokens))
            w.add_reference_kv("p", "expected", out.past_key_values)
            w.add_reference_kv("p", "baseline", {n: (k[None], v[None]) for n, (k, v) in cls.baseline.items()})
            # A prompt without teacher tokens: nothing to measure.
            w.add_prompt("bare", cls.tokens[:PROMPT_LEN], PROMPT_LEN)
            bare = {n: (k[:, :PROMPT_LEN], v[:, :PROMPT_LEN]) for n, (k, v) in cls.own.items()}
            per_rank, tables = paged(cfg, bare, PROMPT_LEN, seed=2)
            w.add_engine_snapshot("bare", per_rank, tables, PROMPT_LEN)
            w.add_reference_kv("bare", "expected", {n: (k[None], v[None]) for n, (k, v) in bare.items()})
        cls.export = os.path.join(cls.tmp.name, "export.h5")
        result = subprocess.run([BINARY, "export", cls.bundle, cls.export, "--prompt", "p"], capture_output=True,
                                text=True)
        assert result.returncode == 0, result.stderr
        with h5py.File(cls.export, "r") as f:
            cls.present = {n: f[f"prompts/p/engine/{n}/present"][()].astype(bool) for n in LAYERS}
        cls.double = Double(cls.model)
        cls.reference64 = cls.double.reference_kv(cls.tokens[:-1])
        cls.logits64 = cls.double.step_logits(cls.tokens, cls.reference64, {})

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def run_impact(self, **kwargs):
        kwargs.setdefault("cache_class", StandinDynamicCache)
        return impact_bundle(self.bundle, self.model, model_name="stand-in", **kwargs)

    def replaced64(self, layers, source=None):
        """{layer index: the engine's KV (as written; or the baseline's) where the engine holds
        positions (the baseline: all), held}: the float64 side's transplant, the engine's presence
        from kvscope's export."""
        n = len(self.tokens)
        out = {}
        for i in layers:
            held = np.ones(n, bool)
            if source is None:
                held[:] = False
                held[:len(self.present[LAYERS[i]])] = self.present[LAYERS[i]]
            k, v = (x.double().numpy() for x in (source or self.engine)[LAYERS[i]])
            out[i] = (k, v, held)
        return out

    def test_kl_against_float64(self):
        self.assertFalse(self.present[LAYERS[2]][:PROMPT_LEN].all())  # the window dropped early positions
        expected = {(kind, first): list(range(first, 3)) if kind.endswith("from") else [first]
                    for kind in ("layer", "from", "baseline", "baseline_from") for first in range(3)}
        kl64_rows = {key: kl64(self.logits64, self.double.step_logits(
            self.tokens, self.reference64, self.replaced64(layers, self.baseline if key[0].startswith("baseline")
                                                           else None)))
                     for key, layers in expected.items()}
        for step_batch in (1, 3, None):  # batching the steps changes nothing
            with self.subTest(step_batch=step_batch):
                result = self.run_impact(engine_kv=self.export, step_batch=step_batch)
                transplants, kl, top1 = result["p"]
                self.assertEqual(list(result), ["p"])  # "bare" has no teacher tokens: skipped
                rows = [(t["kind"], LAYERS.index(t["layer"])) for t in transplants]
                self.assertEqual(rows, [(kind, i) for kind in ("layer", "from", "baseline", "baseline_from")
                                        for i in range(3)])
                self.assertEqual(kl.shape, (12, TEACHER))
                for row, key in enumerate(rows):
                    np.testing.assert_allclose(kl[row], kl64_rows[key], rtol=2e-3, atol=1e-9, err_msg=str(key))
                # The engine's KV, where it is the reference's own, moves nothing: up to the rounding of
                # the row at q (the reference's whole-sequence forward vs the step's own, float32 here).
                for key in (("layer", 0), ("layer", 2), ("from", 2), ("baseline", 1), ("baseline", 2),
                            ("baseline_from", 1), ("baseline_from", 2)):
                    self.assertLess(kl[rows.index(key)].max(), 1e-9, key)
                    self.assertFalse(top1[rows.index(key)].any(), key)
                # The perturbed layer clearly does, alone and with the layers after it.
                for key in (("layer", 1), ("from", 0), ("from", 1), ("baseline", 0), ("baseline_from", 0)):
                    self.assertGreater(kl[rows.index(key)].min(), 1e-6, key)
                self.assertGreater(kl[rows.index(("layer", 1))].min(), 1e-3)
                np.testing.assert_array_equal(
                    top1[rows.index(("layer", 1))],
                    np.argmax(self.logits64, -1) != np.argmax(self.double.step_logits(
                        self.tokens, self.reference64, self.replaced64([1])), -1))

    def test_layers_option(self):
        """--layers picks the rows; a `from` row still replaces every later layer."""
        everything = self.run_impact(engine_kv=self.export)["p"]
        transplants, kl, _ = self.run_impact(engine_kv=self.export, layers="0")["p"]
        self.assertEqual(transplants, [{"kind": kind, "layer": LAYERS[0]}
                                       for kind in ("layer", "from", "baseline", "baseline_from")])
        for row in range(4):
            np.testing.assert_array_equal(kl[row], everything[1][everything[0].index(transplants[row])])
        self.assertGreater(kl[1].min(), 1e-3)

    def test_schemes_against_float64(self):
        result = self.run_impact(engine_kv=self.export, schemes=["fp8_e4m3/tensor", "fp8_e5m2/tensor"], layers="1-2")
        transplants, kl, top1 = result["p"]
        schemes = [t for t in transplants if t["kind"] == "scheme"]
        self.assertEqual([(t["scheme"], t["layer"]) for t in schemes],
                         [(s, LAYERS[i]) for s in ("fp8_e4m3/tensor", "fp8_e5m2/tensor") for i in (1, 2)])
        n = len(self.tokens) - 1
        for row, t in enumerate(transplants):
            if t["kind"] != "scheme":
                continue
            fmt, largest = ("e4m3fn", 448.0) if t["scheme"].startswith("fp8_e4m3") else ("e5m2", 57344.0)
            decoded = []
            for x in self.own[t["layer"]]:
                x = x[:, :n].numpy()
                scale = np.float32(np.abs(x).max()) / np.float32(largest)
                decoded.append(round_by_grid(x / scale, fmt) * np.float64(scale))
            replaced = {LAYERS.index(t["layer"]): (decoded[0], decoded[1], np.ones(n + 1, bool))}
            expected = kl64(self.logits64, self.double.step_logits(self.tokens, self.reference64, replaced))
            np.testing.assert_allclose(kl[row], expected, rtol=2e-3, atol=1e-9, err_msg=str(t))
            self.assertGreater(kl[row].max(), 0, t)
        e4m3 = [kl[row].mean() for row, t in enumerate(transplants) if t.get("scheme") == "fp8_e4m3/tensor"]
        e5m2 = [kl[row].mean() for row, t in enumerate(transplants) if t.get("scheme") == "fp8_e5m2/tensor"]
        self.assertTrue(all(a < b for a, b in zip(e4m3, e5m2)))  # one mantissa bit fewer costs more

    def test_record_as_specified_and_kvscope_still_reads_the_bundle(self):
        binary_env = dict(os.environ, KVSCOPE_BINARY=BINARY)
        with tempfile.TemporaryDirectory() as tmp:
            bundle = os.path.join(tmp, "b.h5")
            with open(self.bundle, "rb") as src, open(bundle, "wb") as dst:
                dst.write(src.read())
            for _ in range(2):  # the second run replaces the first's group
                result = impact_bundle(bundle, self.model, model_name="stand-in", cache_class=StandinDynamicCache,
                                       binary=BINARY, prompts=["p"])
            transplants, kl, top1 = result["p"]
            with h5py.File(bundle, "r") as f:
                group = f["prompts/p/impact"]
                self.assertEqual(sorted(group), ["kl", "top1_changed", "transplants"])
                self.assertEqual(group.attrs["computed_by"].decode(), "kvscope_capture impact (stand-in)")
                self.assertGreater(group.attrs["seconds"], 0)
                self.assertEqual(group["kl"].dtype, np.float64)
                self.assertEqual(group["top1_changed"].dtype, np.int8)
                self.assertEqual(group["transplants"].dtype.kind, "S")  # fixed-length strings
                for name in group:
                    self.assertTrue(group[name].fletcher32 and group[name].chunks, name)
                self.assertEqual([json.loads(s) for s in group["transplants"][()]], transplants)
                np.testing.assert_array_equal(group["kl"][()], kl)
                np.testing.assert_array_equal(group["top1_changed"][()], top1)
                self.assertNotIn("impact", f["prompts/bare"])
            inspected = subprocess.run([BINARY, "inspect", bundle], capture_output=True, text=True, env=binary_env)
            self.assertEqual(inspected.returncode, 0, inspected.stderr)

    def test_bad_input_is_named(self):
        def refused(fragments, **kwargs):
            with self.assertRaises(ValueError) as caught:
                self.run_impact(**kwargs)
            for fragment in fragments:
                self.assertIn(fragment, str(caught.exception))

        refused(["/nonexistent/export.h5", "no such"], engine_kv="/nonexistent/export.h5")
        refused(["'bare'", "teacher tokens"], engine_kv=self.export, prompts=["bare"])
        refused(["no prompt 'q'"], engine_kv=self.export, prompts=["q"])
        refused(["/nonexistent/kvscope"], binary="/nonexistent/kvscope")
        refused(["fp8_e4m3/head"], engine_kv=self.export, schemes=["fp8_e4m3/head"])
        other = StandinCausalLM(StandinConfig(sliding_windows=[None, None, WINDOW]), seed=4).eval()
        with self.assertRaises(ValueError) as caught:
            impact_bundle(self.bundle, other, cache_class=StandinDynamicCache, engine_kv=self.export)
        self.assertIn(f"prompt 'p', layer {LAYERS[0]}: the model's k differs from the bundle's reference",
                      str(caught.exception))
        with tempfile.TemporaryDirectory() as tmp:
            partial = os.path.join(tmp, "partial.h5")
            subprocess.run([BINARY, "export", self.bundle, partial, "--prompt", "p", "--layers", "0,2"], check=True,
                           capture_output=True)
            refused([partial, "'p'", LAYERS[1]], engine_kv=partial)
            refused([self.bundle, "not a kvscope export"], engine_kv=self.bundle)

    def test_command_line(self):
        """`python3 -m kvscope_capture impact` loads the model through transformers (a stand-in
        module here) and writes what impact_bundle computes."""
        standin = types.ModuleType("transformers")
        standin.DynamicCache = StandinDynamicCache
        loaded = []

        def from_pretrained(name, torch_dtype=None):
            loaded.append((name, torch_dtype))
            return StandinCausalLM(StandinConfig(sliding_windows=[None, None, WINDOW]), seed=3).to(torch_dtype)

        standin.AutoModelForCausalLM = types.SimpleNamespace(from_pretrained=from_pretrained)
        expected = self.run_impact(engine_kv=self.export)["p"]
        with tempfile.TemporaryDirectory() as tmp:
            bundle = shutil.copy(self.bundle, os.path.join(tmp, "b.h5"))
            stdout, stderr = io.StringIO(), io.StringIO()
            with mock.patch.dict(sys.modules, {"transformers": standin}), redirect_stdout(stdout), \
                    redirect_stderr(stderr):
                code = main(["impact", bundle, "--model", "org/model", "--dtype", "float32", "--device", "cpu",
                             "--engine-kv", self.export, "--schemes", "fp8_e4m3/tensor"])
            self.assertEqual(code, 0, stderr.getvalue())
            self.assertEqual(loaded, [("org/model", torch.float32)])
            self.assertIn("p: 15 transplants x 8 steps", stdout.getvalue())
            self.assertIn("bare: no teacher tokens, skipped", stderr.getvalue())
            with h5py.File(bundle, "r") as f:
                group = f["prompts/p/impact"]
                self.assertEqual(group.attrs["computed_by"].decode(), "kvscope_capture impact (org/model)")
                np.testing.assert_array_equal(group["kl"][:12], expected[1])
                self.assertEqual([json.loads(s)["kind"] for s in group["transplants"][()]],
                                 [kind for kind in ("layer", "from", "baseline", "baseline_from", "scheme")
                                  for _ in range(3)])
            with mock.patch.dict(sys.modules, {"transformers": standin}), redirect_stderr(stderr):
                code = main(["impact", bundle, "--model", "org/model", "--engine-kv", self.export, "--prompt", "bare"])
            self.assertEqual(code, 2)
            self.assertIn("prompt 'bare' has no teacher tokens", stderr.getvalue())

    def test_command_line_without_transformers(self):
        if importlib.util.find_spec("transformers") is not None:
            self.skipTest("transformers is installed")
        stderr = io.StringIO()
        with redirect_stderr(stderr):
            code = main(["impact", self.bundle, "--model", "some/model"])
        self.assertEqual(code, 2)
        self.assertIn("transformers", stderr.getvalue())


if __name__ == "__main__":
    unittest.main()
