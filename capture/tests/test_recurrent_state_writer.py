"""The writer's recurrent states (docs/bundle-format.md, "Recurrent state (hybrid models)"): what it
writes, read back with h5py bit for bit, and each bad input refused with the prompt, the layer and
the part named, before anything is written."""

import os
import tempfile
import unittest

import h5py
import numpy as np
import torch

from kvscope_capture import BundleWriter

ATTN = ["model.layers.0.attn", "model.layers.2.attn"]
MIXERS = ["model.layers.1.mixer", "model.layers.3.mixer"]
TP = 2
# A small Mamba2 layer: 4 heads of 3 dims, one group of state 2, conv kernel 4:
# conv_dim = heads * head_dim + 2 * groups * d_state = 12 + 4 = 16.
HEADS, HEAD_DIM, D_STATE, GROUPS, D_CONV = 4, 3, 2, 1, 4
INTERMEDIATE = HEADS * HEAD_DIM
CONV_DIM = INTERMEDIATE + 2 * GROUPS * D_STATE


def config():
    return {"num_blocks": 12, "tp_size": TP, "total_num_kv_heads": 2, "groups": [
        {"layer_names": ATTN, "spec_type": "FullAttentionSpec", "block_size": 4, "dtype": "torch.float32",
         "num_kv_heads": 1, "head_size": 4},
        {"layer_names": MIXERS, "spec_type": "MambaSpec", "block_size": 4}]}


def conv_units(rank):
    """vLLM's conv channels of a rank with one group over TP 2 (extra_groups_for_head_shards: the
    group's B and C replicated on every rank): its share of x, then B and C whole."""
    share = INTERMEDIATE // TP
    x = list(range(rank * share, (rank + 1) * share))
    b = list(range(INTERMEDIATE, INTERMEDIATE + D_STATE))
    c = list(range(INTERMEDIATE + D_STATE, CONV_DIM))
    return x + b + c


def ssm_units(rank):
    per = HEADS // TP
    return list(range(rank * per, (rank + 1) * per))


def whole_state(checkpoints, seed=0):
    rng = np.random.default_rng(seed)
    return {"conv": rng.standard_normal((checkpoints, CONV_DIM, D_CONV - 1)).astype(np.float32),
            "ssm": rng.standard_normal((checkpoints, HEADS, HEAD_DIM, D_STATE)).astype(np.float32)}


def sharded(whole):
    return {r: {"conv": (whole["conv"][:, conv_units(r)], conv_units(r)),
                "ssm": (whole["ssm"][:, ssm_units(r)], ssm_units(r))} for r in range(TP)}


class RecurrentStateWriter(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.tmp.name, "b.h5")

    def tearDown(self):
        self.tmp.cleanup()

    def writer(self, engine_only=False):
        w = BundleWriter(self.path, model="m", engine="e", engine_only=engine_only)
        w.set_kv_cache_config(config())
        w.add_prompt("p", list(range(10)), 6)
        blocks = [[1, 2, 3]]
        kv = {n: {"k": torch.zeros(4, 1, 4, 4), "v": torch.zeros(4, 1, 4, 4), "block_ids": [1, 2, 3, 4]} for n in ATTN}
        w.add_engine_snapshot("p", [kv, kv], [np.array(blocks), np.array([[4]])], 10)  # the mixers' state: block 4
        if not engine_only:
            w.add_reference_kv("p", "expected", {n: (torch.zeros(1, 2, 10, 4), torch.zeros(1, 2, 10, 4)) for n in ATTN})
        return w

    def refused(self, fn, *needles):
        with self.assertRaises(ValueError) as caught:
            fn()
        for needle in needles:
            self.assertIn(needle, str(caught.exception))
        return str(caught.exception)

    def test_writes_the_documented_objects_bit_for_bit(self):
        whole = whole_state(3)
        bf16 = torch.from_numpy(whole["conv"]).to(torch.bfloat16)
        with self.writer() as w:
            engine = sharded(whole)
            for r in range(TP):  # the conv state in the model's dtype, as vLLM keeps it
                engine[r]["conv"] = (bf16[:, conv_units(r)], conv_units(r))
            w.add_state("p", MIXERS[0], [4, 8, 10], engine)
            w.add_reference_state("p", "expected", MIXERS[0], [4, 8, 10], {"conv": bf16, "ssm": whole["ssm"]})
            w.add_reference_state("p", "baseline", MIXERS[0], [8], {"conv": whole["conv"][1:2],
                                                                     "ssm": torch.from_numpy(whole["ssm"][1:2])})
        with h5py.File(self.path, "r") as f:
            state = f[f"prompts/p/engine/states/{MIXERS[0]}"]
            self.assertEqual(state.attrs["kind"], b"mamba2")
            self.assertEqual(state.attrs["tp_size"], TP)
            self.assertEqual(state["positions"][()].tolist(), [4, 8, 10])
            self.assertEqual(sorted(state), ["positions", "rank_0", "rank_1"])
            self.assertEqual(sorted(state["rank_1"]), ["conv", "conv_units", "ssm", "ssm_units"])
            conv = state["rank_1/conv"]
            self.assertEqual(conv.attrs["dtype"], b"bfloat16")
            self.assertEqual(conv.dtype, np.uint16)
            want = bf16[:, conv_units(1)].contiguous().view(torch.int16).numpy().view(np.uint16)
            np.testing.assert_array_equal(conv[()], want)
            self.assertEqual(state["rank_1/conv_units"][()].tolist(), conv_units(1))
            # Units 12..15 (B and C of the one group) are on both ranks.
            self.assertEqual(set(state["rank_0/conv_units"][()]) & set(state["rank_1/conv_units"][()]),
                             set(range(INTERMEDIATE, CONV_DIM)))
            ssm = state["rank_0/ssm"]
            self.assertEqual(ssm.attrs["dtype"], b"float32")
            np.testing.assert_array_equal(ssm[()], whole["ssm"][:, :2])
            for ds in (conv, ssm, state["positions"], state["rank_0/ssm_units"]):
                self.assertTrue(ds.fletcher32, ds.name)  # checksummed chunks, as every dataset
            ref = f[f"prompts/p/reference/expected/states/{MIXERS[0]}"]
            self.assertEqual(sorted(ref), ["conv", "positions", "ssm"])
            self.assertEqual(ref["conv"].shape, (3, CONV_DIM, D_CONV - 1))
            base = f[f"prompts/p/reference/baseline/states/{MIXERS[0]}"]
            self.assertEqual(base["positions"][()].tolist(), [8])
            np.testing.assert_array_equal(base["ssm"][()], whole["ssm"][1:2])
            # The reference KV beside its states, in the same role group.
            self.assertIn(ATTN[0], f["prompts/p/reference/expected"])

    def test_reference_first_then_engine(self):
        whole = whole_state(1)
        with self.writer() as w:
            w.add_reference_state("p", "expected", MIXERS[1], [10], whole)
            w.add_state("p", MIXERS[1], [10], sharded(whole), kind="mamba2")
        with h5py.File(self.path, "r") as f:
            self.assertIn(f"prompts/p/engine/states/{MIXERS[1]}/rank_0/ssm", f)

    def test_positions_not_increasing(self):
        whole = whole_state(3)
        with self.writer() as w:
            self.refused(lambda: w.add_state("p", MIXERS[0], [4, 4, 8], sharded(whole)),
                         "prompt p", MIXERS[0], "not increasing", "checkpoint 1")
            self.refused(lambda: w.add_state("p", MIXERS[0], [0, 4, 8], sharded(whole)), "position 0", "1..10")
            self.refused(lambda: w.add_state("p", MIXERS[0], [4, 8, 11], sharded(whole)), "position 11")
            self.refused(lambda: w.add_state("p", MIXERS[0], [4, 8], sharded(whole)), "part conv",
                         "3 checkpoints (axis 0) for 2 positions")
            w.abandon()

    def test_rank_missing_a_part(self):
        whole = whole_state(1)
        engine = sharded(whole)
        del engine[1]["ssm"]
        with self.writer() as w:
            self.refused(lambda: w.add_state("p", MIXERS[0], [10], engine), "prompt p", MIXERS[0], "part ssm",
                         "rank 1 lacks")
            self.refused(lambda: w.add_state("p", MIXERS[0], [10], {0: sharded(whole)[0]}), "tp_size 2")
            w.abandon()

    def test_units_out_of_range_or_missing(self):
        whole = whole_state(1)
        with self.writer() as w:
            w.add_reference_state("p", "expected", MIXERS[0], [10], whole)
            engine = sharded(whole)
            engine[1]["ssm"] = (engine[1]["ssm"][0], [2, HEADS])
            self.refused(lambda: w.add_state("p", MIXERS[0], [10], engine), "prompt p", MIXERS[0], "part ssm",
                         f"unit {HEADS}", "out of range")
            engine = sharded(whole)
            engine[1]["ssm"] = (engine[1]["ssm"][0], [1, 0])  # head 2 and 3 held by nobody
            self.refused(lambda: w.add_state("p", MIXERS[0], [10], engine), "part ssm", "unit 2", "held by no rank")
            engine = sharded(whole)
            engine[0]["conv"] = (engine[0]["conv"][0], conv_units(0)[:-1])
            self.refused(lambda: w.add_state("p", MIXERS[0], [10], engine), "part conv", "9 units for 10 rows")
            w.abandon()

    def test_shape_that_does_not_match_the_reference(self):
        whole = whole_state(1)
        with self.writer() as w:
            w.add_state("p", MIXERS[0], [10], sharded(whole))
            wrong = dict(whole, conv=whole_state(1)["conv"][:, :, :2])
            self.refused(lambda: w.add_reference_state("p", "expected", MIXERS[0], [10], wrong),
                         "prompt p", MIXERS[0], "part conv", "trailing axes (3,)", "(2,)")
            self.refused(lambda: w.add_reference_state("p", "expected", MIXERS[0], [10], {"conv": whole["conv"]}),
                         "part ssm", "the engine holds it")
            w.abandon()

    def test_layer_not_in_a_mamba_group(self):
        whole = whole_state(1)
        with self.writer() as w:
            self.refused(lambda: w.add_state("p", ATTN[0], [10], sharded(whole)), "prompt p", ATTN[0],
                         "FullAttentionSpec group", "MambaSpec")
            self.refused(lambda: w.add_reference_state("p", "expected", "model.layers.9.mixer", [10], whole),
                         "model.layers.9.mixer", "belongs to no group")
            w.abandon()

    def test_dtypes_and_kinds(self):
        whole = whole_state(1)
        with self.writer() as w:
            engine = sharded(whole)
            engine[0]["ssm"] = (engine[0]["ssm"][0].astype(np.float64), ssm_units(0))
            self.refused(lambda: w.add_state("p", MIXERS[0], [10], engine), "rank 0, part ssm", "float64")
            engine = sharded(whole)
            engine[1]["ssm"] = (engine[1]["ssm"][0].astype(np.float16), ssm_units(1))
            self.refused(lambda: w.add_state("p", MIXERS[0], [10], engine), "part ssm", "rank 1 holds float16")
            self.refused(lambda: w.add_state("p", MIXERS[0], [10], sharded(whole), kind=""), "kind")
            self.refused(lambda: w.add_reference_state("p", "expected", MIXERS[0], [10], {"conv_units": whole["conv"]}),
                         "part conv_units", "_units")
            w.abandon()

    def test_engine_state_needs_its_expected_reference(self):
        whole = whole_state(1)
        w = self.writer()
        w.add_state("p", MIXERS[0], [10], sharded(whole))
        self.refused(w.close, "prompt p", MIXERS[0], "no expected reference state")
        w.abandon()

    def test_engine_only_takes_states_without_a_reference(self):
        whole = whole_state(1)
        with self.writer(engine_only=True) as w:
            w.add_state("p", MIXERS[0], [10], sharded(whole))
            self.refused(lambda: w.add_reference_state("p", "expected", MIXERS[0], [10], whole), "engine-only")
        with h5py.File(self.path, "r") as f:
            self.assertNotIn("reference", f["prompts/p"])
            self.assertIn(f"engine/states/{MIXERS[0]}", f["prompts/p"])


if __name__ == "__main__":
    unittest.main()
