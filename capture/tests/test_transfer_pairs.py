"""Capture at both ends of a KV transfer (transfer_standin.py): kvscope's connector beside a NIXL-like
connector in MultiConnector on the producer and on the consumer, each writing an engine-only bundle.
An unfaulted transfer is bit-identical at every transferred position; each injected fault leaves
its own signature in the consumer's bundle against the producer's, worked out here from the
producer's values; the consumer's provenance marks the loaded positions external."""

import json
import os
import tempfile
import unittest

import h5py
import numpy as np
import torch

import transfer_standin as ts

BINARY = os.environ.get("KVSCOPE_BINARY")
P = ts.PROMPT
LOADED = P - 1  # the consumer recomputes the last prompt token


def e4m3(codes):
    """float8 e4m3fn codes as float64: sign, 4 exponent bits (bias 7), 3 mantissa bits."""
    codes = codes.astype(np.int64)
    exp, man = (codes >> 3) & 0xF, codes & 7
    mag = np.where(exp == 0, man / 8.0 * 2.0 ** -6, (1 + man / 8.0) * 2.0 ** (exp - 7.0))
    return np.where(codes & 0x80, -mag, mag)


def bf16(raw):
    """Raw bf16 bits (uint16) as float64."""
    return torch.from_numpy(raw.astype(np.int16)).view(torch.bfloat16).double().numpy()


class TransferPairs(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.pairs = ts.make_transfer_pairs(cls.tmp.name)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def kv(self, fault, side, prompt="req"):
        """{(layer, part): values [heads, positions, head_size]} of one side (raw bits) and dtype."""
        path = self.pairs[fault][0 if side == "producer" else 1]
        return {(n, part): ts.positions(path, prompt, n, part) for n in ts.LAYERS for part in "kv"}

    def both(self, fault):
        return self.kv(fault, "producer"), self.kv(fault, "consumer")

    def test_every_fault_has_a_pair(self):
        self.assertEqual(set(self.pairs), set(ts.FAULTS))
        for fault, (producer, consumer, description) in self.pairs.items():
            self.assertTrue(os.path.exists(producer) and os.path.exists(consumer), fault)
            self.assertTrue(description)

    def test_provenance_and_roles(self):
        """The producer's prompt was computed in one prefill; the consumer's first 39 positions were
        loaded by the NIXL-like connector, the 40th recomputed, the rest decoded."""
        producer, consumer, _ = self.pairs["none"]
        with h5py.File(producer, "r") as f:
            self.assertEqual(f.attrs["kv_role"].decode(), "kv_producer")
            ranges = json.loads(f["prompts/req"].attrs["provenance"].decode())
            self.assertEqual(ranges, [{"start": 0, "end": P, "kind": "prefill", "chunk": 0}])
        with h5py.File(consumer, "r") as f:
            self.assertEqual(f.attrs["kv_role"].decode(), "kv_consumer")
            ranges = json.loads(f["prompts/req"].attrs["provenance"].decode())
        self.assertEqual(ranges[0], {"start": 0, "end": LOADED, "kind": "external", "connector": "NixlLikeConnector"})
        self.assertEqual(ranges[1], {"start": LOADED, "end": P, "kind": "prefill", "chunk": 0})
        self.assertEqual([r["kind"] for r in ranges[2:]], ["decode"] * (ts.OUTPUT - 1))

    def test_unfaulted_pair_is_bit_identical(self):
        """Every transferred position, K and V, every layer and head: the same bits, though the two
        engines' block ids and physical layouts (LBNHC, LBHNC) differ."""
        producer, consumer = self.both("none")
        for key, (values, dtype) in producer.items():
            self.assertEqual(dtype, "bfloat16")
            self.assertEqual(values.shape[1], P)
            np.testing.assert_array_equal(consumer[key][0][:, :P], values, err_msg=str(key))

    def pages(self, fault):
        """Both sides as [heads, P, 2*head_size] pages (K|V) of each layer, raw bits."""
        producer, consumer = self.both(fault)
        return ({n: np.concatenate([producer[(n, "k")][0], producer[(n, "v")][0]], axis=-1) for n in ts.LAYERS},
                {n: np.concatenate([consumer[(n, "k")][0], consumer[(n, "v")][0]], axis=-1) for n in ts.LAYERS})

    def check_pages(self, fault, block_fn):
        """Per block j (whole blocks only), consumer page == block_fn(producer page [heads, 16, 32])."""
        producer, consumer = self.pages(fault)
        for n in ts.LAYERS:
            for j in range(LOADED // ts.BS):
                span = slice(j * ts.BS, (j + 1) * ts.BS)
                want = block_fn(producer[n][:, span])
                np.testing.assert_array_equal(consumer[n][:, span], want, err_msg=f"{fault} {n} block {j}")
            self.assertFalse(np.array_equal(consumer[n][:, :32], producer[n][:, :32]), fault)

    def test_layout_misreads(self):
        heads, tokens, content = ts.HEADS, ts.BS, 2 * ts.DIM
        # Head-major bytes read token-major: byte run of (h, t) lands at (t', h') with t'*H + h' = h*N + t.
        def head_as_token(page):
            flat = page.reshape(-1, content)  # rows in (h, t) order
            return flat.reshape(tokens, heads, content).transpose(1, 0, 2)

        def token_as_head(page):
            flat = page.transpose(1, 0, 2).reshape(-1, content)  # rows in (t, h) order
            return flat.reshape(heads, tokens, content)

        def split_as_packed(page):
            k, v = page[..., :ts.DIM], page[..., ts.DIM:]
            split = np.stack([x.transpose(1, 0, 2).reshape(tokens, heads * ts.DIM) for x in (k, v)])
            return split.reshape(heads, tokens, content)

        self.check_pages("head_major_read_token_major", head_as_token)
        self.check_pages("token_major_read_head_major", token_as_head)
        self.check_pages("split_read_packed", split_as_packed)

    def test_kv_swapped(self):
        producer, consumer = self.both("kv_swapped")
        for n in ts.LAYERS:
            np.testing.assert_array_equal(consumer[(n, "k")][0][:, :LOADED], producer[(n, "v")][0][:, :LOADED])
            np.testing.assert_array_equal(consumer[(n, "v")][0][:, :LOADED], producer[(n, "k")][0][:, :LOADED])

    def test_block_offset(self):
        """Position p holds the producer's p + 16 while that is a position of the request."""
        producer, consumer = self.both("block_offset")
        for key, (values, _) in producer.items():
            np.testing.assert_array_equal(consumer[key][0][:, :P - ts.BS], values[:, ts.BS:], err_msg=str(key))

    def test_other_request_and_stale_block(self):
        """Block 1 (positions 16-31) holds the earlier request's block 1 (another request), or what
        the earlier request left in the physical block the transferred one took (stale)."""
        for fault in ("other_request", "stale_block"):
            path = self.pairs[fault][0]
            earlier = {(n, part): ts.positions(path, "earlier", n, part)[0] for n in ts.LAYERS for part in "kv"}
            with h5py.File(path, "r") as f:
                def table(prompt):
                    snap = f[f"prompts/{prompt}/engine/snapshot_0"]
                    return snap["block_tables/group_0"][int(snap.attrs["batch_row"])].tolist()
                mine, theirs = table("req"), table("earlier")
            # other_request: the earlier request's block 1; stale: the earlier request's block that
            # had the physical id the transferred request's block 1 has.
            j = 1 if fault == "other_request" else theirs.index(mine[1])
            producer, consumer = self.both(fault)
            for key, (values, _) in producer.items():
                got = consumer[key][0]
                np.testing.assert_array_equal(got[:, 16:32], earlier[key][:, j * 16:(j + 1) * 16], err_msg=fault)
                np.testing.assert_array_equal(got[:, :16], values[:, :16], err_msg=fault)
                np.testing.assert_array_equal(got[:, 32:LOADED], values[:, 32:LOADED], err_msg=fault)
                self.assertFalse(np.array_equal(got[:, 16:32], values[:, 16:32]), fault)

    def test_unwritten_blocks(self):
        producer, consumer = self.both("unwritten_zeros")
        _, partial = self.both("partially_written")
        for key, (values, _) in producer.items():
            want = values[:, :LOADED].copy()
            want[:, 16:32] = 0
            np.testing.assert_array_equal(consumer[key][0][:, :LOADED], want, err_msg=str(key))
            want[:, 16:21] = values[:, 16:21]
            np.testing.assert_array_equal(partial[key][0][:, :LOADED], want, err_msg=str(key))

    def test_fp8_conversion_and_wrong_scale(self):
        """The consumer holds e4m3 codes with its declared scale: decoded, they are the producer's
        values within e4m3's rounding (half a unit in the last of 3 mantissa bits, relative), or
        twice them when the declared scale is twice the one converted with."""
        for fault, factor in (("fp8_conversion", 1.0), ("fp8_wrong_scale", 2.0)):
            producer, consumer = self.both(fault)
            declared = ts.FP8_SCALE * factor
            for key, (values, _) in producer.items():
                codes, dtype = consumer[key]
                self.assertEqual(dtype, "float8_e4m3fn")
                decoded = e4m3(codes[:, :LOADED]) * declared
                want = bf16(values[:, :LOADED]) * factor
                tiny = np.abs(want) < 2 ** -6 * ts.FP8_SCALE * factor  # e4m3 subnormals: an absolute step
                err = np.abs(decoded - want)
                self.assertTrue(np.all(err[~tiny] <= np.abs(want[~tiny]) * 2 ** -4 + 1e-12), fault)
                self.assertTrue(np.all(err[tiny] <= 2 ** -10 * ts.FP8_SCALE * factor), fault)

    @unittest.skipUnless(BINARY, "KVSCOPE_BINARY is not set")
    def test_bundles_read_by_kvscope_inspect(self):
        for fault, (producer, consumer, _) in self.pairs.items():
            for path in (producer, consumer):
                ts.inspect_bundle(BINARY, path)


if __name__ == "__main__":
    unittest.main()
