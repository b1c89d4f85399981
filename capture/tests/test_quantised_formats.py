"""vLLM's 4-bit KV caches (NVFP4 and int4_per_token_head) through the Python writer: its checks of
the dicts the capture hands over, and kvscope's decoding of what it wrote (`kvscope export`),
compared with a decode written here from the formats' definitions (docs/bundle-format.md):
bit for bit. Damaged bundles are refused with the file and the dataset named. The kvscope parts
need KVSCOPE_BINARY (set by ctest)."""

import json
import os
import subprocess
import tempfile
import unittest

import h5py
import numpy as np

from kvscope_capture import BundleWriter

BINARY = os.environ.get("KVSCOPE_BINARY")

HEADS, HEAD_SIZE, BLOCK, BLOCKS = 2, 32, 4, 8
PROMPT_LEN, TOTAL = 8, 12  # positions 0..10 written (the last token's KV is not)
TABLE = [3, 6, 1]  # the prompt's physical blocks, shared by every group (as vLLM's groups of one table)
LAYERS = [f"model.layers.{i}.self_attn" for i in range(4)]


def config():
    def group(layer, dtype, v_dtype=None):
        g = {"layer_names": [layer], "spec_type": "FullAttentionSpec", "block_size": BLOCK, "sliding_window": None,
             "dtype": dtype, "num_kv_heads": HEADS, "head_size": HEAD_SIZE, "vllm_group": 0}
        if v_dtype:
            g["v_dtype"] = v_dtype
        return g
    return {"num_blocks": BLOCKS, "tp_size": 1, "total_num_kv_heads": HEADS, "dcp_size": 1, "pcp_size": 1,
            "groups": [group(LAYERS[0], "torch.bfloat16"), group(LAYERS[1], "nvfp4"),
                       group(LAYERS[2], "int4_per_token_head"), group(LAYERS[3], "float8_e4m3fn", "nvfp4")]}


# --- decoding from the definitions -------------------------------------------------------------

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def e4m3(bits):
    """OCP e4m3fn: bias 7, subnormals, S.1111.111 NaN; exact in float32."""
    bits = bits.astype(np.int64)
    sign = np.where(bits >> 7, -1.0, 1.0)
    exponent, mantissa = (bits >> 3) & 15, (bits & 7).astype(np.float64)
    value = sign * np.where(exponent == 0, mantissa / 8 * 2.0 ** -6, (1 + mantissa / 8) * np.exp2(exponent - 7.0))
    return np.where((exponent == 15) & (mantissa == 7), np.nan, value).astype(np.float32)


def nvfp4_decode(codes, scale_bits, global_scale):
    """e2m1(code) x e4m3(block scale) (exact in float32) x the global scale, rounded once."""
    block = np.repeat(e4m3(scale_bits), 16, axis=-1)
    return (E2M1[codes] * block) * np.float32(global_scale)


def hadamard(d):
    h = np.ones((1, 1))
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    return h


def int4_decode(codes, scales, zero_points, signs):
    """(q - zp) x scale, rotated back: signs * H (rotated) / d, in float64 (exact), then float32."""
    rotated = (codes.astype(np.float64) - zero_points[..., None]) * scales.astype(np.float64)[..., None]
    d = codes.shape[-1]
    return (rotated @ hadamard(d).T / d * signs).astype(np.float32)


def fp8_decode(codes, scale):
    return e4m3(codes) * np.float32(scale)


# --- an engine's caches ------------------------------------------------------------------------

def caches(seed=0):
    """Per layer the dict the capture hands over ([BLOCKS, HEADS, BLOCK, HEAD_SIZE]) and the float32
    values it stands for, [HEADS, TOTAL - 1, HEAD_SIZE] along the table."""
    rng = np.random.default_rng(seed)
    shape = (BLOCKS, HEADS, BLOCK, HEAD_SIZE)
    out = {}

    def nvfp4(part):
        codes = rng.integers(0, 16, shape).astype(np.uint8)
        bits = rng.integers(0, 0x7F, shape[:3] + (HEAD_SIZE // 16,)).astype(np.uint8)  # finite, positive
        global_scale = np.float32(rng.uniform(1e-3, 2.0))
        return ({part: codes, f"{part}_scale": bits, f"{part}_global_scale": global_scale},
                nvfp4_decode(codes, bits, global_scale))

    # bf16: values that bf16 holds exactly, handed over as torch would (here: float32 is refused
    # for a bf16 group, so its bits go through torch)
    import torch
    k, v = (torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(torch.bfloat16) for _ in "kv")
    out[LAYERS[0]] = ({"k": k, "v": v}, (k.float().numpy(), v.float().numpy()))
    (k, kf), (v, vf) = nvfp4("k"), nvfp4("v")
    out[LAYERS[1]] = ({**k, **v}, (kf, vf))
    signs = np.where(rng.integers(0, 2, HEAD_SIZE) == 1, 1, -1).astype(np.int8)
    int4 = {"rht_signs": signs}
    decoded = []
    for part in "kv":
        codes = rng.integers(0, 16, shape).astype(np.uint8)
        scales = rng.uniform(1e-3, 0.5, shape[:3]).astype(np.float32)
        zero = rng.integers(0, 16, shape[:3]).astype(np.uint8)
        int4.update({part: codes, f"{part}_scale": scales, f"{part}_zero_point": zero})
        decoded.append(int4_decode(codes, scales, zero, signs))
    out[LAYERS[2]] = (int4, tuple(decoded))
    codes = rng.integers(0, 0x7F, shape).astype(np.uint8) | (rng.integers(0, 2, shape) << 7).astype(np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x10  # no NaN
    k_scale = np.float32(0.37)
    (v, vf) = nvfp4("v")
    out[LAYERS[3]] = ({"k": codes, "k_scale": k_scale, **v}, (fp8_decode(codes, k_scale), vf))
    return out


def along_table(values, positions=TOTAL - 1):
    """[BLOCKS, HEADS, BLOCK, D] paged values -> [HEADS, positions, D] of the prompt's positions."""
    rows = np.concatenate([values[b] for b in TABLE], axis=1)
    return rows[:, :positions]


def write_bundle(path, layers):
    with BundleWriter(path, model="quantised formats", engine="stand-in") as w:
        w.set_kv_cache_config(config())
        w.add_prompt("p", list(range(TOTAL)), PROMPT_LEN)
        w.add_engine_snapshot("p", [{n: kv for n, (kv, _) in layers.items()}],
                              [np.array([TABLE], np.int64)] * 4, TOTAL)
        w.add_reference_kv("p", "expected", {n: tuple(along_table(x, TOTAL)[None] for x in values)
                                             for n, (_, values) in layers.items()})


class WriterChecks(unittest.TestCase):
    """The writer refuses what it cannot store faithfully, naming the prompt, rank, layer and problem."""

    def refused(self, layer, change, *words):
        layers = caches()
        kv = dict(layers[layer][0])
        change(kv)
        layers[layer] = (kv, layers[layer][1])
        with tempfile.TemporaryDirectory() as tmp:
            with self.assertRaises(ValueError) as caught:
                write_bundle(os.path.join(tmp, "b.h5"), layers)
        message = str(caught.exception)
        for word in ("prompt p", "rank 0", f"layer {layer}") + words:
            self.assertIn(word, message)

    def test_codes_above_15(self):
        def change(kv):
            kv["k"] = kv["k"].copy()
            kv["k"][2, 1, 3, 5] = 16
        self.refused(LAYERS[1], change, "code 16 at (2, 1, 3, 5)", "0..15")
        self.refused(LAYERS[2], change, "code 16 at (2, 1, 3, 5)")

    def test_nvfp4_scales(self):
        for bits, what in ((0x7F, "NaN"), (0xFF, "NaN"), (0x81, "negative")):
            def change(kv, bits=bits):
                kv["v_scale"] = kv["v_scale"].copy()
                kv["v_scale"][0, 0, 1, 1] = bits
            self.refused(LAYERS[1], change, "v_scale", what, f"0x{bits:02x}")
        self.refused(LAYERS[1], lambda kv: kv.update(k_scale=kv["k_scale"][..., :1]), "k_scale", "head_size / 16")
        self.refused(LAYERS[1], lambda kv: kv.update(k_scale=kv["k_scale"].astype(np.float32)), "k_scale", "uint8")
        self.refused(LAYERS[1], lambda kv: kv.update(k_global_scale=np.float32("nan")), "k_global_scale", "positive")
        self.refused(LAYERS[1], lambda kv: kv.pop("v_global_scale"), "v_global_scale")
        self.refused(LAYERS[3], lambda kv: kv.pop("v_scale"), "v_scale")

    def test_int4_side_data(self):
        def bad_sign(kv):
            kv["rht_signs"] = kv["rht_signs"].copy()
            kv["rht_signs"][3] = 2
        self.refused(LAYERS[2], bad_sign, "rht_signs", "holds 2")
        self.refused(LAYERS[2], lambda kv: kv.pop("rht_signs"), "rht_signs")
        self.refused(LAYERS[2], lambda kv: kv.update(rht_signs=kv["rht_signs"][:16]), "rht_signs", "(32,)")

        def negative_scale(kv):
            kv["v_scale"] = kv["v_scale"].copy()
            kv["v_scale"][1, 0, 2] = -0.5
        self.refused(LAYERS[2], negative_scale, "v_scale", "-0.5", "(1, 0, 2)")

        def nan_scale(kv):
            kv["k_scale"] = kv["k_scale"].copy()
            kv["k_scale"][0, 1, 0] = np.nan
        self.refused(LAYERS[2], nan_scale, "k_scale", "nan")

        def zero_point(kv):
            kv["k_zero_point"] = kv["k_zero_point"].copy()
            kv["k_zero_point"][0, 0, 0] = 16
        self.refused(LAYERS[2], zero_point, "k_zero_point", "zero point 16")
        self.refused(LAYERS[2], lambda kv: kv.update(v_scale=kv["v_scale"][:, :1]), "v_scale", "float32")

    def test_config(self):
        cfg = config()
        cfg["groups"][1]["head_size"] = 24
        with tempfile.TemporaryDirectory() as tmp, BundleWriter(os.path.join(tmp, "b.h5")) as w:
            with self.assertRaisesRegex(ValueError, r"groups\[1\]\.dtype: nvfp4 needs head_size a multiple of 16"):
                w.set_kv_cache_config(cfg)
            cfg = config()
            cfg["groups"][3]["v_dtype"] = "float7"
            with self.assertRaisesRegex(ValueError, r"groups\[3\]\.v_dtype: unsupported dtype"):
                w.set_kv_cache_config(cfg)
            w.abandon()


@unittest.skipUnless(BINARY, "KVSCOPE_BINARY is not set")
class ReadByKvscope(unittest.TestCase):
    def export(self, bundle, out):
        return subprocess.run([BINARY, "export", bundle, out], capture_output=True, text=True)

    def test_export_bit_for_bit(self):
        """Every layer's K and V as kvscope decodes them: the values decoded here, bit for bit (int4
        too: every step of its decode is exact in float64, then rounded once to float32)."""
        layers = caches()
        with tempfile.TemporaryDirectory() as tmp:
            bundle, out = os.path.join(tmp, "b.h5"), os.path.join(tmp, "export.h5")
            write_bundle(bundle, layers)
            with h5py.File(bundle, "r") as f:  # what the bundle holds, as docs/bundle-format.md says
                lg = f["prompts/p/engine/snapshot_0/rank_0"]
                self.assertEqual(lg[LAYERS[1]]["k_scale"].attrs["dtype"], b"float8_e4m3fn")
                self.assertEqual(lg[LAYERS[1]]["k"].attrs["dtype"], b"float4_e2m1fn")
                self.assertEqual(lg[LAYERS[1]]["v"].attrs["scale"], np.float64(layers[LAYERS[1]][0]["v_global_scale"]))
                self.assertEqual(lg[LAYERS[2]]["k"].attrs["dtype"], b"int4_per_token_head")
                np.testing.assert_array_equal(lg[LAYERS[2]]["rht_signs"][()], layers[LAYERS[2]][0]["rht_signs"])
                self.assertEqual(lg[LAYERS[3]]["k"].attrs["dtype"], b"float8_e4m3fn")
                self.assertEqual(lg[LAYERS[3]]["v"].attrs["dtype"], b"float4_e2m1fn")
            result = self.export(bundle, out)
            self.assertEqual(result.returncode, 0, result.stderr)
            with h5py.File(out, "r") as f:
                for name, (_, values) in layers.items():
                    got = f[f"prompts/p/engine/{name}"]
                    present = got["present"][()].astype(bool)
                    self.assertEqual(present.sum(), TOTAL - 1, name)
                    for part, truth in zip("kv", values):
                        np.testing.assert_array_equal(got[part][()][:, :TOTAL - 1], along_table(truth), err_msg=f"{name} {part}")
            # and the mixed bundle (bf16, nvfp4, int4 and fp8 / nvfp4 groups over one table) analyses
            result = subprocess.run([BINARY, "analyze", bundle, "--json", os.path.join(tmp, "a.json")],
                                    capture_output=True, text=True)
            self.assertEqual(result.returncode, 0, result.stderr)
            with open(os.path.join(tmp, "a.json")) as f:
                analysis = json.load(f)
            self.assertEqual(analysis["problems"], [])
            self.assertEqual(analysis["prompts"][0]["problems"], [])

    def test_unquantised_part_keeps_its_floor(self):
        """A bf16 K beside an nvfp4 V (v_dtype), two-way: K is judged against bf16's floor, not
        against a quantisation floor of zero (its ratios near 1, no suspect)."""
        import torch
        rng = np.random.default_rng(1)
        cfg = config()
        cfg["groups"] = [dict(cfg["groups"][0], layer_names=LAYERS, v_dtype="nvfp4")]
        shape = (BLOCKS, HEADS, BLOCK, HEAD_SIZE)
        layers = {}
        for name in LAYERS:
            k = torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(torch.bfloat16)
            # the reference's K about a bf16 rounding away, as two bf16 runs differ
            noise = torch.from_numpy((1 + rng.standard_normal(shape) * 2.0 ** -9).astype(np.float32))
            k_ref = (k.float() * noise).to(torch.bfloat16).float().numpy()
            codes = rng.integers(0, 16, shape).astype(np.uint8)
            bits = rng.integers(0x30, 0x50, shape[:3] + (HEAD_SIZE // 16,)).astype(np.uint8)
            kv = {"k": k, "v": codes, "v_scale": bits, "v_global_scale": np.float32(0.01)}
            layers[name] = (kv, (k_ref, nvfp4_decode(codes, bits, np.float32(0.01))))
        with tempfile.TemporaryDirectory() as tmp:
            bundle, out = os.path.join(tmp, "b.h5"), os.path.join(tmp, "a.json")
            with BundleWriter(bundle) as w:
                w.set_kv_cache_config(cfg)
                w.add_prompt("p", list(range(TOTAL)), PROMPT_LEN)
                w.add_engine_snapshot("p", [{n: kv for n, (kv, _) in layers.items()}], [np.array([TABLE], np.int64)], TOTAL)
                w.add_reference_kv("p", "expected", {n: tuple(along_table(x, TOTAL)[None] for x in values)
                                                     for n, (_, values) in layers.items()})
            result = subprocess.run([BINARY, "analyze", bundle, "--json", out], capture_output=True, text=True)
            self.assertEqual(result.returncode, 0, result.stderr)
            with open(out) as f:
                analysis = json.load(f)
            self.assertEqual(analysis["suspects"], [])
            ratios = [x for row in analysis["prompts"][0]["error_ratios"]["k"] for x in row if x is not None]
            self.assertEqual(len(ratios), len(LAYERS) * (TOTAL - 1))
            self.assertLess(max(ratios), 4)

    def damaged(self, change, *words):
        """A bundle changed after writing: kvscope's export fails, naming the file, the dataset and
        what is wrong."""
        with tempfile.TemporaryDirectory() as tmp:
            bundle, out = os.path.join(tmp, "b.h5"), os.path.join(tmp, "export.h5")
            write_bundle(bundle, caches())
            with h5py.File(bundle, "r+") as f:
                change(f["prompts/p/engine/snapshot_0/rank_0"])
            result = self.export(bundle, out)
            self.assertNotEqual(result.returncode, 0)
            self.assertLess(result.returncode, 128, result.stderr)  # an error, not a crash
            for word in (bundle,) + words:
                self.assertIn(word, result.stderr)

    @staticmethod
    def replace(group, name, data):
        dtype = group[name].attrs.get("dtype")
        del group[name]
        group.create_dataset(name, data=data, chunks=data.shape or None, fletcher32=True)
        if dtype is not None:
            group[name].attrs["dtype"] = dtype

    def test_damaged(self):
        def code(layer):
            def change(g):
                data = g[layer]["k"][()]
                data[3, 1, 2, 7] = 0x21
                self.replace(g[layer], "k", data)
            return change
        self.damaged(code(LAYERS[1]), f"{LAYERS[1]}/k", "code 33 at physical block 3, head 1, slot 2, value 7",
                     "outside 0..15")
        self.damaged(code(LAYERS[2]), f"{LAYERS[2]}/k", "code 33")
        self.damaged(lambda g: self.replace(g[LAYERS[1]], "v_scale", g[LAYERS[1]]["v_scale"][()][..., :1]),
                     f"{LAYERS[1]}/v_scale", "shape [8, 2, 4, 1], expected [8, 2, 4, 2]")
        self.damaged(lambda g: g[LAYERS[2]].__delitem__("rht_signs"), f"{LAYERS[2]}/rht_signs", "missing")

        def bad_sign(g):
            signs = g[LAYERS[2]]["rht_signs"][()]
            signs[0] = 0
            self.replace(g[LAYERS[2]], "rht_signs", signs)
        self.damaged(bad_sign, f"{LAYERS[2]}/rht_signs", "+1 or -1")
        self.damaged(lambda g: g[LAYERS[2]].__delitem__("v_zero_point"), f"{LAYERS[2]}/v_zero_point", "missing")

        def nan_scale(g):
            bits = g[LAYERS[3]]["v_scale"][()]
            bits[1, 0, 0, 0] = 0xFF
            self.replace(g[LAYERS[3]], "v_scale", bits)
        self.damaged(nan_scale, f"{LAYERS[3]}/v_scale", "NaN", "0xff")


if __name__ == "__main__":
    unittest.main()
