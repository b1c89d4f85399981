"""`kvscope import DIR -o BUNDLE`: dumps written by Python's torch.save and by a safetensors
writer made here become a bundle that reconstructs to exactly the tensors dumped; the limits
of libtorch's pickle reader become clear errors naming the file. Needs KVSCOPE_BINARY."""

import io
import json
import os
import struct
import time
import subprocess
import tempfile
import unittest
import zipfile

import h5py
import numpy as np
import torch

from engine_standin import PagedEngine

BINARY = os.environ.get("KVSCOPE_BINARY")
LAYERS = ["model.layers.0.self_attn", "model.layers.1.self_attn", "model.layers.2.self_attn"]


def write_safetensors(path, tensors):
    """A minimal safetensors writer: little-endian header length, JSON header, raw data."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        if t.dtype == torch.bfloat16:
            raw, dtype = t.contiguous().view(torch.int16).numpy().tobytes(), "BF16"
        else:
            raw, dtype = t.contiguous().numpy().astype(np.float32).tobytes(), "F32"
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def config():
    return {"num_blocks": 30, "tp_size": 2, "total_num_kv_heads": 4, "dcp_size": 1, "pcp_size": 1,
            "groups": [
                {"layer_names": [LAYERS[0], LAYERS[2]], "spec_type": "SlidingWindowSpec", "block_size": 2,
                 "sliding_window": 5, "dtype": "torch.bfloat16", "num_kv_heads": 2, "head_size": 4},
                {"layer_names": [LAYERS[1]], "spec_type": "FullAttentionSpec", "block_size": 4,
                 "sliding_window": None, "dtype": "torch.bfloat16", "num_kv_heads": 2, "head_size": 4}]}


@unittest.skipUnless(BINARY, "KVSCOPE_BINARY is not set")
class Import(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = os.path.join(self.tmp.name, "dump")
        os.makedirs(self.dir)
        torch.manual_seed(3)
        self.total = 12
        self.truth = {n: (torch.randn(4, self.total, 4).to(torch.bfloat16), torch.randn(4, self.total, 4).to(torch.bfloat16))
                      for n in LAYERS}
        cfg = config()
        with open(os.path.join(self.dir, "kv_cache_config.json"), "w") as f:
            json.dump(cfg, f)
        rpc, tables = PagedEngine(cfg, seed=5).snapshot(self.truth, self.total)
        for r, caches in enumerate(rpc):  # what get_kv_caches returned, decoded and saved per rank
            torch.save({layer: torch.load(io.BytesIO(data)) for layer, data in caches.items()},
                       os.path.join(self.dir, f"kv_caches_rank{r}.pt"))
        torch.save([torch.load(io.BytesIO(t)) for t in tables], os.path.join(self.dir, "block_tables.pt"))
        with open(os.path.join(self.dir, "prompt.json"), "w") as f:
            json.dump({"prompt_id": "imported", "input_ids": list(range(self.total)), "prompt_len": 7,
                       "seq_len": self.total, "divergence_positions": [9], "model": "dumped"}, f)
        write_safetensors(os.path.join(self.dir, "expected.safetensors"),
                          {f"{n}.{p}": t.unsqueeze(0) for n, kv in self.truth.items() for p, t in zip("kv", kv)})
        torch.save(tuple((k.float().unsqueeze(0), v.float().unsqueeze(0)) for k, v in (self.truth[n] for n in LAYERS)),
                   os.path.join(self.dir, "baseline.pt"))
        self.logits = torch.randn(5, 11).to(torch.bfloat16)
        torch.save(self.logits, os.path.join(self.dir, "logits_actual.pt"))
        self.bundle = os.path.join(self.tmp.name, "imported.h5")

    def tearDown(self):
        self.tmp.cleanup()

    def kvscope(self, *args):
        return subprocess.run([BINARY, *args], capture_output=True, text=True)

    def test_import_reconstructs_the_dumped_tensors(self):
        result = self.kvscope("import", self.dir, "-o", self.bundle)
        self.assertEqual(result.returncode, 0, result.stderr)
        out = os.path.join(self.tmp.name, "export.h5")
        result = self.kvscope("export", self.bundle, out)
        self.assertEqual(result.returncode, 0, result.stderr)
        with h5py.File(self.bundle, "r") as b:
            self.assertEqual(b["prompts/imported/divergence_positions"][()].tolist(), [9])
            logits = b["prompts/imported/logits/actual"][()]
            np.testing.assert_array_equal(logits, self.logits.float().numpy())
        with h5py.File(out, "r") as f:
            for name in LAYERS:
                k_true = self.truth[name][0].float().numpy()
                engine = f[f"prompts/imported/engine/{name}"]
                present = engine["present"][()].astype(bool)
                self.assertFalse(present[-1])  # the last sampled token is never written
                self.assertTrue(present[-2])
                np.testing.assert_array_equal(engine["k"][()][:, present], k_true[:, present])
                np.testing.assert_array_equal(f[f"prompts/imported/expected/{name}/k"][()], k_true)
                np.testing.assert_array_equal(f[f"prompts/imported/baseline/{name}/v"][()],
                                              self.truth[name][1].float().numpy())

    def test_mla_dumps_go_through_the_writer(self):
        cfg = {"num_blocks": 8, "tp_size": 1, "total_num_kv_heads": 1, "groups": [
            {"layer_names": LAYERS, "spec_type": "MLAAttentionSpec", "block_size": 4, "num_kv_heads": 1,
             "head_size": 24, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "dtype": "torch.bfloat16"}]}
        with open(os.path.join(self.dir, "kv_cache_config.json"), "w") as f:
            json.dump(cfg, f)
        result = self.kvscope("import", self.dir, "-o", self.bundle)
        self.assertEqual(result.returncode, 2)
        self.assertIn("kv_cache_config.json: kv_cache_config: an MLA config", result.stderr)
        self.assertIn("kvscope_capture's BundleWriter", result.stderr)
        self.assertFalse(os.path.exists(self.bundle))

    def test_hybrid_model(self):
        """A state-space layer: its group is MambaSpec, its state is in the dump, its HF cache entry
        is empty. The import keeps the attention layers and indexes HF's cache by model layer."""
        cfg = config()
        mixer = "model.layers.3.mixer"
        cfg["groups"].append({"layer_names": [mixer], "spec_type": "MambaSpec", "block_size": 4})
        with open(os.path.join(self.dir, "kv_cache_config.json"), "w") as f:
            json.dump(cfg, f)
        for r in range(2):
            path = os.path.join(self.dir, f"kv_caches_rank{r}.pt")
            caches = torch.load(path)
            caches[mixer] = [torch.zeros(3, 8), torch.zeros(4, 8, 2)]  # (conv state, ssm state)
            torch.save(caches, path)
        tables = torch.load(os.path.join(self.dir, "block_tables.pt"))
        torch.save(tables + [torch.full((1, 3), -1, dtype=torch.int32)], os.path.join(self.dir, "block_tables.pt"))
        torch.save(tuple((k.float().unsqueeze(0), v.float().unsqueeze(0)) for k, v in (self.truth[n] for n in LAYERS))
                   + ((torch.zeros(1, 4, 0, 4), torch.zeros(1, 4, 0, 4)),), os.path.join(self.dir, "baseline.pt"))
        result = self.kvscope("import", self.dir, "-o", self.bundle)
        self.assertEqual(result.returncode, 0, result.stderr)
        out = os.path.join(self.tmp.name, "export.h5")
        self.assertEqual(self.kvscope("export", self.bundle, out).returncode, 0)
        with h5py.File(out, "r") as f:
            self.assertNotIn(mixer, f["prompts/imported/engine"])
            for name in LAYERS:
                np.testing.assert_array_equal(f[f"prompts/imported/baseline/{name}/v"][()],
                                              self.truth[name][1].float().numpy())
        result = self.kvscope("analyze", self.bundle)
        self.assertIn("not compared: state-space layers (1): model.layers.3.mixer", result.stdout)

    def assert_refused(self, file, words):
        result = self.kvscope("import", self.dir, "-o", self.bundle)
        self.assertEqual(result.returncode, 2, result.stdout)
        self.assertIn(file, result.stderr)
        self.assertIn(words, result.stderr)
        self.assertFalse(os.path.exists(self.bundle))

    def test_pickle_limits_are_clear_errors(self):
        rank0 = os.path.join(self.dir, "kv_caches_rank0.pt")
        torch.save({LAYERS[0]: torch.zeros(2)}, rank0)  # exactly one entry
        self.assert_refused(rank0, "exactly one entry")
        torch.save({"a": b"raw", "b": b"rpc bytes"}, rank0)
        self.assert_refused(rank0, "bytes objects")
        torch.save({"a": torch.zeros(1), "b": torch.zeros(1)}, rank0, _use_new_zipfile_serialization=False)
        self.assert_refused(rank0, "legacy torch.save format")
        torch.save({"a": torch.zeros(1), "b": torch.zeros(1)}, rank0, pickle_protocol=4)
        self.assert_refused(rank0, "pickle protocol above 2")
        torch.save({"a": torch.zeros(1), "b": torch.zeros(1)}, rank0)
        self.assert_refused(rank0, "layer 'a'")

    def test_damaged_archives_are_refused_before_libtorch_reads_them(self):
        # libtorch 1.13 trusts a zip's offsets (fuzzing found it reading past its buffer).
        rank0 = os.path.join(self.dir, "kv_caches_rank0.pt")
        torch.save({LAYERS[0]: torch.zeros(2), LAYERS[1]: torch.zeros(2)}, rank0)
        good = open(rank0, "rb").read()
        with open(rank0, "wb") as f:
            f.write(good[: len(good) // 2])
        self.assert_refused(rank0, "no end-of-archive record")
        directory = good.rfind(b"PK\x01\x02")  # the last central directory entry
        damaged = bytearray(good)
        damaged[directory + 42: directory + 46] = (len(good) - 10).to_bytes(4, "little")  # its local header offset
        with open(rank0, "wb") as f:
            f.write(bytes(damaged))
        self.assert_refused(rank0, "points to no local header")
        # A pickle string claiming 2 GB in a file of a few hundred bytes (libtorch would allocate it).
        with zipfile.ZipFile(rank0, "w", zipfile.ZIP_STORED) as z:
            z.writestr("archive/data.pkl", b"\x80\x02X\xff\xff\xff\x7fabc.")
            z.writestr("archive/version", b"3\n")
        self.assert_refused(rank0, "more than the pickle holds")
        with zipfile.ZipFile(rank0, "w", zipfile.ZIP_STORED) as z:  # a memo index of 2^31 - 1
            z.writestr("archive/data.pkl", b"\x80\x02K\x01r\xff\xff\xff\x7f.")
            z.writestr("archive/version", b"3\n")
        self.assert_refused(rank0, "puts memo entry 2147483647 after only 0")
        with zipfile.ZipFile(rank0, "w", zipfile.ZIP_STORED) as z:  # libtorch pops an empty stack (a crash)
            z.writestr("archive/data.pkl", b"\x80\x02\x85.")
            z.writestr("archive/version", b"3\n")
        self.assert_refused(rank0, "the opcode at byte 2 takes a value from an empty stack")
        # libtorch's zip reader finds "data.pkl" ignoring case: so must the check.
        with zipfile.ZipFile(rank0, "w", zipfile.ZIP_STORED) as z:
            z.writestr("archive/DATA.pkL", b"\x80\x02X\xff\xff\xff\x7fabc.")
            z.writestr("archive/version", b"3\n")
        self.assert_refused(rank0, "more than the pickle holds")
        with zipfile.ZipFile(rank0, "w", zipfile.ZIP_STORED) as z:
            z.writestr("archive/data.pkl", b"\x80\x02N.")
            z.writestr("archive/Data.pkl", b"\x80\x02N.")
        self.assert_refused(rank0, "two entries of the archive have this name")
        with zipfile.ZipFile(rank0, "w", zipfile.ZIP_DEFLATED) as z:  # libtorch allocates what it claims
            z.writestr("archive/data.pkl", b"\x80\x02N.")
        self.assert_refused(rank0, "is compressed (method 8)")
        # A tensor storage cut short (libtorch does not check the tensor against it).
        buffer = io.BytesIO()
        torch.save({LAYERS[0]: torch.zeros(64), LAYERS[1]: torch.zeros(2)}, buffer)
        with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as source, \
                zipfile.ZipFile(rank0, "w", zipfile.ZIP_STORED) as z:
            for item in source.infolist():
                data = source.read(item)
                z.writestr(item, data[:8] if item.filename.endswith("data/0") else data)
        self.assert_refused(rank0, "declares 256 bytes but its record holds 8")
        # The second storage names the first's record as a wider type; its 'storage' tag comes as
        # a memo get (torch.save memoizes repeated strings), which the walk must follow.
        buffer = io.BytesIO()
        torch.save({LAYERS[0]: torch.zeros(192, dtype=torch.bfloat16), LAYERS[1]: torch.zeros(192)}, buffer)
        with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as source, \
                zipfile.ZipFile(rank0, "w", zipfile.ZIP_STORED) as z:
            for item in source.infolist():
                data = source.read(item)
                if item.filename.endswith("data.pkl"):
                    self.assertEqual(data.count(b"X\x01\x00\x00\x001"), 1)
                    data = data.replace(b"X\x01\x00\x00\x001", b"X\x01\x00\x00\x000")
                z.writestr(item, data)
        self.assert_refused(rank0, "storage '0' declares 768 bytes but its record holds 384")

    def write_pickle(self, pickle, records=(), name="archive/data.pkl"):
        rank0 = os.path.join(self.dir, "kv_caches_rank0.pt")
        with zipfile.ZipFile(rank0, "w", zipfile.ZIP_STORED) as z:
            z.writestr(name, pickle)
            for record, data in records:
                z.writestr(record, data)
            z.writestr("archive/version", b"3\n")
        return rank0

    def test_hostile_pickles_are_refused_before_libtorch(self):
        # Each would crash, hang or exhaust libtorch 1.13's unpickler, or kvscope's walk of it.
        storage = lambda location: (b"\x80\x02}q\x00(X\x01\x00\x00\x00actorch._utils\n_rebuild_tensor_v2\nq\x01("
                                    b"(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X"
                                    + struct.pack("<I", len(location)) + location + b"K\x04tQK\x00K\x04\x85K\x01\x85\x89"
                                    b"ccollections\nOrderedDict\n)Rtq\x02Rq\x03X\x01\x00\x00\x00bh\x03u.")
        cases = [
            (b"\x80\x02NNNc torch", "has a line without its end"),  # libtorch reads on past the pickle
            (b"\x80\x02(NNNd.", "odd number of keys and values"),  # libtorch reads one past its stack
            (b"\x80\x02N" + b"\x85" * 1500 + b".", "nests containers more than 1000 deep"),
            (b"\x80\x02N" + b"q\x00h\x00h\x00\x86" * 40 + b".", None),  # doubling through memo gets: no blow-up
            (b"\x80\x02Nq\x05.", "puts memo entry 5 after only 0"),
            (b"\x80\x02ctorch._utils\n_rebuild_sparse_tensor\n.", "names 'torch._utils _rebuild_sparse_tensor'"),
            (storage(b"meta"), "is on device 'meta'"),
        ]
        for pickle, words in cases:
            rank0 = self.write_pickle(pickle, [("archive/data/0", b"\0" * 16)])
            start = time.monotonic()
            result = self.kvscope("import", self.dir, "-o", self.bundle)
            self.assertLess(time.monotonic() - start, 30)
            self.assertEqual(result.returncode, 2, result.stderr)
            if words:
                self.assertIn(words, result.stderr)
        # The same storage on the CPU is read (and then refused only for not being a layer's KV).
        self.write_pickle(storage(b"cpu"), [("archive/data/0", b"\0" * 16)])
        self.assertNotIn("device", self.kvscope("import", self.dir, "-o", self.bundle).stderr)
        # A NUL in a name: libtorch would read archive/data/0 for the key '0\0x'.
        rank0 = self.write_pickle(b"\x80\x02N.", [("archive/data/0Qx", b"\0" * 64)])
        with open(rank0, "rb") as f:
            data = f.read()
        with open(rank0, "wb") as f:  # (Python's zipfile cuts names at a NUL: put it in afterwards)
            f.write(data.replace(b"data/0Qx", b"data/0\0x"))
        self.assert_refused("kv_caches_rank0.pt", "name holds a NUL byte")
        # A second end record hidden in the first one's comment, which libtorch's reader would use.
        rank0 = self.write_pickle(b"\x80\x02N.")
        good = open(rank0, "rb").read()
        fake = b"PK\x05\x06" + b"\0" * 16 + b"\x07\x00"  # comment length that does not end the file
        with open(rank0, "wb") as f:
            f.write(good[:-2] + struct.pack("<H", len(fake)) + fake)
        self.assert_refused("kv_caches_rank0.pt", "comment length disagrees")

    def test_bad_files_name_themselves(self):
        expected = os.path.join(self.dir, "expected.safetensors")
        # Offsets that wrap around 2^64 must not point back into the header.
        text = json.dumps({f"{LAYERS[0]}.k": {"dtype": "BF16", "shape": [4],
                                               "data_offsets": [2 ** 64 - 10, 2 ** 64 - 2]}}).encode()
        with open(expected, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text + b"\0" * 64)
        self.assert_refused("expected.safetensors", "runs past the end")
        write_safetensors(expected, {f"{n}.{p}": t.unsqueeze(0) for n, kv in self.truth.items() for p, t in zip("kv", kv)})
        with open(expected, "r+b") as f:
            f.truncate(os.path.getsize(expected) - 10)
        self.assert_refused("expected.safetensors", "truncated")
        os.remove(os.path.join(self.dir, "kv_cache_config.json"))
        self.assert_refused("kv_cache_config.json", "missing")


if __name__ == "__main__":
    unittest.main()
