#!/usr/bin/env python3
"""The corpus of broken inputs: a valid bundle (BASE, from `kvscope synth`) damaged in each of
the ways files arrive broken, one file per kind, made fresh by this script (nothing binary is
checked in). Writes OUT/<kind>.h5 and OUT/manifest.json, one entry per kind:

  {"kind": ..., "file": ..., "expect": "error" | "partial", "object": ..., "problem": ...}

"error": opening or analysing fails with a message naming the file, the object and the
problem. "partial": the analysis runs and marks what it could not use with a problem naming the
object. "non_finite": the analysis runs and lists the NaN/Inf cells of that layer instead of
numbers. "any": an error or a marked part, whichever (truncations cut different objects).
And one good file: "same_as_base", the base bundle stored as format v1, which must read and
analyse to exactly the base's numbers. tests/robustness/tst_bad_inputs.cpp runs each.

usage: make_bad_bundles.py BASE OUT
"""
import json
import os
import shutil
import sys

import h5py
import numpy as np

P = "prompts/prompt_0"
SNAP = P + "/engine/snapshot_0"
L0, L1 = "model.layers.0.self_attn", "model.layers.1.self_attn"
ENGINE_K1 = f"{SNAP}/rank_1/{L1}/k"
EXPECTED = P + "/reference/expected"

KINDS = []


def kind(name, expect, obj, problem):
    def register(damage):
        KINDS.append((name, expect, obj, problem, damage))
        return damage
    return register


def put(f, path, data, like=None, dtype=None, checksum=True, attrs=None):
    """Replaces (or creates) a dataset, chunked with a checksum as format v2 stores it."""
    data = np.asarray(data) if data is not None else None
    kept = dict(f[like or path].attrs) if (like or path) in f else {}
    if path in f:
        del f[path]
    if data is not None and data.size and checksum:
        d = f.create_dataset(path, data=data, dtype=dtype, chunks=data.shape, fletcher32=True)
    else:
        d = f.create_dataset(path, data=data, dtype=dtype)
    for key, value in {**kept, **(attrs or {})}.items():
        set_attr(d, key, value)
    return d


def set_attr(obj, name, value):
    if name in obj.attrs:
        del obj.attrs[name]
    if isinstance(value, str):  # fixed-length UTF-8, as v2 writes it
        dtype = h5py.string_dtype("utf-8", max(1, len(value.encode())))
        obj.attrs.create(name, np.array(value.encode(), dtype=dtype), dtype=dtype)
    else:
        obj.attrs[name] = value


def config(f):
    return json.loads(f["kv_cache_config"][0])


def set_config(f, cfg_or_text):
    text = cfg_or_text if isinstance(cfg_or_text, str) else json.dumps(cfg_or_text)
    dtype = h5py.string_dtype("utf-8", max(1, len(text.encode())))
    put(f, "kv_cache_config", np.array([text.encode()], dtype=dtype), dtype=dtype)


def edit_config(**changes_per_group):
    def damage(f):
        cfg = config(f)
        for key, value in changes_per_group.items():
            if key.startswith("group_"):
                index, field = key[len("group_"):].split("__")
                cfg["groups"][int(index)][field] = value
            else:
                cfg[key] = value
        set_config(f, cfg)
    return damage


# --- the file itself ---------------------------------------------------------------------
@kind("not_hdf5", "error", "", "not an HDF5 file")
def _(path):
    open(path, "w").write("layer,value\n0,1\n")


@kind("empty_file", "error", "", "not an HDF5 file")
def _(path):
    open(path, "w").close()


for fraction in (0.02, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99):
    kind(f"truncated_{int(fraction * 100):02d}pct", "any", "", "")(
        lambda path, fraction=fraction: os.truncate(path, int(os.path.getsize(path) * fraction)))
kind("truncated_last_byte", "any", "", "")(lambda path: os.truncate(path, os.path.getsize(path) - 1))


@kind("hdf5_not_a_bundle", "error", "/", "not a kvscope capture bundle")
def _(path):
    os.remove(path)
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(4)


# --- root attributes and format version --------------------------------------------------
def in_file(damage):
    def on_path(path):
        with h5py.File(path, "r+") as f:
            damage(f)
    return on_path


def file_kind(name, expect, obj, problem):
    def register(damage):
        kind(name, expect, obj, problem)(in_file(damage))
        return damage
    return register


file_kind("future_format_version", "error", "/", "format_version 3 is not supported")(
    lambda f: set_attr(f, "format_version", np.int64(3)))
file_kind("format_version_zero", "error", "/", "format_version 0 is not supported")(
    lambda f: set_attr(f, "format_version", np.int64(0)))
file_kind("format_version_a_string", "error", "/", "'format_version' must be a single integer")(
    lambda f: set_attr(f, "format_version", "2"))
file_kind("wrong_format_name", "error", "/", "format is 'something-else'")(
    lambda f: set_attr(f, "format", "something-else"))


@file_kind("variable_length_string_in_v2", "error", "/", "attribute 'model' is a variable-length string")
def _(f):
    del f.attrs["model"]
    f.attrs.create("model", "a model", dtype=h5py.string_dtype("utf-8"))


@file_kind("dataset_without_checksum", "error", P + "/input_ids", "without its Fletcher32 checksum")
def _(f):
    put(f, P + "/input_ids", f[P + "/input_ids"][()], checksum=False)


@kind("flipped_bit_in_engine_block", "partial", ENGINE_K1, "Fletcher32 checksum")
def _(path):
    with h5py.File(path, "r") as f:
        offset = f[ENGINE_K1].id.get_chunk_info(0).byte_offset
    with open(path, "r+b") as raw:
        raw.seek(offset + 3)
        byte = raw.read(1)[0]
        raw.seek(offset + 3)
        raw.write(bytes([byte ^ 0x20]))


# --- the KV cache config -------------------------------------------------------------------
file_kind("config_missing", "error", "/kv_cache_config", "missing")(lambda f: f.__delitem__("kv_cache_config"))
file_kind("config_not_json", "error", "/kv_cache_config", "not valid JSON")(
    lambda f: set_config(f, '{"num_blocks": 17, "groups": ['))
file_kind("config_number_overflow", "error", "/kv_cache_config", "number overflow")(
    lambda f: set_config(f, f["kv_cache_config"][0].decode().replace('"num_blocks":17', '"num_blocks":1e999')))
file_kind("config_unknown_spec", "error", "/kv_cache_config", "'FullAtentionSpec' is not supported")(
    edit_config(group_1__spec_type="FullAtentionSpec"))
file_kind("config_nothing_compared", "error", "/kv_cache_config", "no group kvscope compares (only MambaSpec, CrossAttentionSpec layers)")(
    edit_config(group_0__spec_type="MambaSpec", group_1__spec_type="CrossAttentionSpec"))
file_kind("config_mla_without_widths", "error", "/kv_cache_config", "kv_lora_rank: missing")(
    edit_config(group_0__spec_type="MLAAttentionSpec", group_1__spec_type="MLAAttentionSpec", total_num_kv_heads=1))
file_kind("config_block_size_disagrees", "partial", f"{SNAP}/rank_0/{L1}/k", "shape")(edit_config(group_1__block_size=32))
# A latent of the wrong width: the config says c_kv is 6 wide (and k_pe 2), the cache holds 8.
file_kind("config_mla_latent_wrong_width", "partial", f"{SNAP}/rank_0/{L0}/k", "kv_lora_rank")(
    edit_config(group_0__spec_type="MLAAttentionSpec", group_1__spec_type="MLAAttentionSpec", group_0__kv_lora_rank=6,
                group_0__qk_rope_head_dim=2, group_1__kv_lora_rank=6, group_1__qk_rope_head_dim=2,
                group_0__sliding_window=None))
file_kind("config_heads_disagree", "error", "/kv_cache_config", "disagrees with total_num_kv_heads 4")(edit_config(total_num_kv_heads=4))
file_kind("config_negative_num_blocks", "error", "/kv_cache_config", "value -5 outside")(edit_config(num_blocks=-5))
file_kind("config_huge_head_size", "error", "/kv_cache_config", "value 1099511627776 outside")(
    edit_config(group_0__head_size=2 ** 40, group_1__head_size=2 ** 40))
file_kind("config_head_size_overflows", "error", "/kv_cache_config", "value 9223372036854775807 outside")(
    edit_config(group_0__head_size=2 ** 63 - 1, group_1__head_size=2 ** 63 - 1))


@file_kind("config_duplicate_layer", "error", "/kv_cache_config", f"layer '{L0}' appears in more than one place")
def _(f):
    cfg = config(f)
    cfg["groups"][1]["layer_names"].append(L0)
    set_config(f, cfg)


@file_kind("config_layer_without_tensors", "partial", f"{SNAP}/rank_0/model.layers.2.self_attn/k", "missing")
def _(f):
    cfg = config(f)
    cfg["groups"][1]["layer_names"].append("model.layers.2.self_attn")
    set_config(f, cfg)


# Decode context parallelism that cannot hold: DCP over heads TP does not copy, and runs of positions
# that do not fit a block.
file_kind("config_dcp_over_partitioned_heads", "error", "/kv_cache_config", "needs each KV head on a multiple of 2")(
    edit_config(dcp_size=2))
file_kind("config_dcp_interleave_not_dividing", "error", "/kv_cache_config",
          "cp_kv_cache_interleave_size: 3 does not divide groups[0].block_size 4")(
    edit_config(tp_size=4, total_num_kv_heads=1, group_0__num_kv_heads=1, group_1__num_kv_heads=1, dcp_size=2,
                cp_kv_cache_interleave_size=3))
file_kind("config_tp_size_disagrees", "partial", f"{SNAP}/rank_2/{L0}/k", "missing")(
    edit_config(tp_size=4, group_0__num_kv_heads=1, group_1__num_kv_heads=1, total_num_kv_heads=4))

# --- engine KV --------------------------------------------------------------------------------
file_kind("engine_layer_missing_on_a_rank", "partial", ENGINE_K1, "missing")(lambda f: f.__delitem__(ENGINE_K1))
file_kind("engine_bits_stored_as_int32", "partial", ENGINE_K1, "signed integers")(
    lambda f: put(f, ENGINE_K1, f[ENGINE_K1][()].astype(np.int32)))
file_kind("engine_dtype_unsupported", "partial", ENGINE_K1, "unsupported dtype 'int4'")(
    lambda f: set_attr(f[ENGINE_K1], "dtype", "int4"))
file_kind("engine_dtype_missing", "partial", ENGINE_K1, "attribute 'dtype' is missing")(
    lambda f: f[ENGINE_K1].attrs.__delitem__("dtype"))
file_kind("engine_wrong_head_size", "partial", ENGINE_K1, "shape")(
    lambda f: put(f, ENGINE_K1, np.zeros(f[ENGINE_K1].shape[:3] + (7,), np.uint16)))
file_kind("engine_scale_negative", "partial", ENGINE_K1, "must be finite and positive")(
    lambda f: set_attr(f[ENGINE_K1], "scale", -1.0))


def engine_values(f, path, value, where):
    data = f[path][()]
    bits = np.frombuffer(np.float32(value).tobytes(), np.uint32)[0] >> 16
    data[where] = bits
    put(f, path, data)


file_kind("engine_nan", "non_finite", L1, "")(
    lambda f: [engine_values(f, f"{SNAP}/rank_{r}/{L1}/{p}", np.nan, np.s_[:, :, :, 0]) for r in (0, 1) for p in "kv"])
file_kind("reference_inf", "non_finite", L1, "")(
    lambda f: put(f, f"{EXPECTED}/{L1}/v", np.full(f[f"{EXPECTED}/{L1}/v"].shape, 0x7f80, np.uint16)))


def table_entry(group, column, value):
    def damage(f):
        path = f"{SNAP}/block_tables/group_{group}"
        t = f[path][()]
        t[0, column] = value
        put(f, path, t)
    return damage


file_kind("block_id_beyond_num_blocks", "partial", SNAP, "physical block 99, outside [0, num_blocks=17)")(table_entry(1, 0, 99))
file_kind("block_id_minus_one_where_data_is_needed", "partial", SNAP, "the null block (-1) but its data is needed")(
    table_entry(1, 0, -1))


@file_kind("block_not_stored", "partial", SNAP, "which the bundle does not store")
def _(f):
    stored = set(f[f"{SNAP}/physical_block_ids"][()].tolist())
    free = next(b for b in range(config(f)["num_blocks"]) if b not in stored)
    table_entry(1, 0, free)(f)


@file_kind("physical_block_id_beyond_num_blocks", "error", f"{SNAP}/physical_block_ids", "outside [0, num_blocks)")
def _(f):
    ids = f[f"{SNAP}/physical_block_ids"][()]
    ids[-1] = 1000
    put(f, f"{SNAP}/physical_block_ids", ids)


file_kind("block_table_missing", "partial", f"{SNAP}/block_tables/group_1", "missing")(
    lambda f: f.__delitem__(f"{SNAP}/block_tables/group_1"))

# --- prompts, sequence lengths, snapshots ------------------------------------------------------
file_kind("seq_len_zero", "error", f"{SNAP}/seq_lens", "sequence length 0 is not plausible")(lambda f: put(f, f"{SNAP}/seq_lens", [0]))
file_kind("seq_len_absurd", "error", f"{SNAP}/seq_lens", "not plausible")(
    lambda f: put(f, f"{SNAP}/seq_lens", [2 ** 40]))
file_kind("seq_len_shorter_than_prompt", "partial", P + "/engine, snapshot 0", "validated_until 8 exceeds seq_len 3")(lambda f: put(f, f"{SNAP}/seq_lens", [3]))
file_kind("prompt_len_disagrees", "error", P + "/input_ids", "prompt_len is 10")(
    lambda f: set_attr(f[P], "prompt_len", np.int64(10)))


@file_kind("zero_length_prompt", "error", P + "/input_ids", "0 ids but prompt_len is 0")
def _(f):
    set_attr(f[P], "prompt_len", np.int64(0))
    put(f, P + "/input_ids", np.zeros(0, np.int64))


file_kind("validated_until_beyond_seq_len", "partial", P + "/engine, snapshot 0", "validated_until 100 exceeds seq_len 9")(
    lambda f: set_attr(f[SNAP], "validated_until", np.int64(100)))
file_kind("batch_row_negative", "error", SNAP, "batch_row -1")(lambda f: set_attr(f[SNAP], "batch_row", np.int64(-1)))
file_kind("no_engine_snapshot", "error", SNAP, "at least one engine snapshot")(lambda f: f.__delitem__(P + "/engine"))
file_kind("no_prompt", "error", "/prompts", "holds no prompt")(lambda f: f.__delitem__(P))
file_kind("divergence_beyond_sequence", "error", P + "/divergence_positions", "position 1000 is not a decode position")(
    lambda f: put(f, P + "/divergence_positions", np.array([1000], np.int64)))
file_kind("token_strings_count_disagrees", "error", P + "/token_strings", "3 strings for 9 positions")(
    lambda f: put(f, P + "/token_strings", np.array([b"a", b"b", b"c"], dtype=h5py.string_dtype("utf-8", 1)),
                  dtype=h5py.string_dtype("utf-8", 1)))

# --- reference KV and logits ---------------------------------------------------------------------
file_kind("reference_layer_missing", "partial", f"{EXPECTED}/{L1}/k", "missing")(lambda f: f.__delitem__(f"{EXPECTED}/{L1}"))
file_kind("expected_reference_missing", "error", EXPECTED, "the expected reference KV is required")(
    lambda f: f.__delitem__(EXPECTED))
file_kind("reference_too_short", "partial", f"{EXPECTED}/{L1}/v", "differs from k's")(
    lambda f: put(f, f"{EXPECTED}/{L1}/k", f[f"{EXPECTED}/{L1}/k"][:, :, :5, :]))
file_kind("reference_stored_as_float64", "partial", f"{P}/reference/baseline/{L0}/v", "cannot hold float32")(
    lambda f: put(f, f"{P}/reference/baseline/{L0}/v", f[f"{P}/reference/baseline/{L0}/v"][()].astype(np.float64)))
file_kind("logits_declared_huge", "partial", P + "/logits/actual", "absurd size")(
    lambda f: (f.__delitem__(P + "/logits/actual"),
               f.create_dataset(P + "/logits/actual", shape=(2 ** 20, 2 ** 20), dtype=np.float32, chunks=(1, 1024),
                                fletcher32=True)))
@file_kind("engine_declared_overflowing", "partial", ENGINE_K1, "shape")
def _(f):
    del f[ENGINE_K1]
    d = f.create_dataset(ENGINE_K1, shape=(2 ** 62, 2 ** 62, 4, 8), dtype=np.uint16, chunks=(1, 1, 4, 8), fletcher32=True)
    set_attr(d, "dtype", "bfloat16")


@file_kind("engine_declared_never_written", "partial", f"{SNAP}/rank_0/{L0}/k", "never written")
def _(f):
    # The shape the config implies: 1 GiB of blocks declared in a file of a few KiB, their
    # chunks never written. Only the blocks the tables name are read, and found missing.
    cfg = config(f)
    cfg["num_blocks"] = 2 ** 23
    set_config(f, cfg)
    del f[SNAP + "/physical_block_ids"]
    for r in (0, 1):
        for layer, block in ((L0, 4), (L1, 8)):
            for part in "kv":
                path = f"{SNAP}/rank_{r}/{layer}/{part}"
                del f[path]
                d = f.create_dataset(path, shape=(2 ** 23, 1, block, 8), dtype=np.uint16, chunks=(1, 1, block, 8),
                                     fletcher32=True)
                set_attr(d, "dtype", "bfloat16")
@file_kind("reference_declared_beyond_the_file", "partial", f"{EXPECTED}/{L1}/k", "more than the whole file holds")
def _(f):
    # A batch of 60000 rows (17 MB) in a file of 34 KB: refused before anything is allocated.
    path = f"{EXPECTED}/{L1}/k"
    shape = (60000,) + f[path].shape[1:]
    del f[path]
    d = f.create_dataset(path, shape=shape, dtype=np.uint16, chunks=(1,) + shape[1:], fletcher32=True)
    set_attr(d, "dtype", "bfloat16")


file_kind("logits_nan", "partial", P + "/logits/actual", "holds NaN or infinity")(
    lambda f: put(f, P + "/logits/actual", np.full(f[P + "/logits/actual"].shape, np.nan, np.float32)))


def write_v1(src, dst):
    """The same bundle stored as format v1 (any HDF5 format bounds, variable-length strings, no
    checksums): kvscope still reads those, with the same numbers."""
    def copy_attrs(a, b):
        for key, value in a.attrs.items():
            b.attrs[key] = value.decode() if isinstance(value, bytes) else value

    with h5py.File(src, "r") as s, h5py.File(dst, "w", track_order=True) as d:
        copy_attrs(s, d)
        d.attrs["format_version"] = np.int64(1)

        def visit(name, obj):
            if isinstance(obj, h5py.Group):
                copy_attrs(obj, d.create_group(name, track_order=True))
                return
            data = obj[()]
            if name == "kv_cache_config":
                out = d.create_dataset(name, data=data[0].decode(), dtype=h5py.string_dtype())
            elif obj.dtype.kind == "S":
                out = d.create_dataset(name, data=[x.decode() for x in data], dtype=h5py.string_dtype())
            else:
                rows = max(1, 65536 // max(1, data[0].nbytes)) if data.size else 0
                out = d.create_dataset(name, data=data, chunks=(min(len(data), rows),) + data.shape[1:] if rows else None)
            copy_attrs(obj, out)

        s.visititems(visit)


def main():
    base, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    manifest = []
    for name, expect, obj, problem, damage in KINDS:
        path = os.path.join(out, name + ".h5")
        shutil.copy(base, path)
        damage(path)
        manifest.append({"kind": name, "file": path, "expect": expect, "object": obj, "problem": problem})
    v1 = os.path.join(out, "format_v1.h5")
    write_v1(base, v1)
    manifest.append({"kind": "format_v1", "file": v1, "expect": "same_as_base", "base": os.path.abspath(base),
                     "object": "", "problem": ""})
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"{len(manifest)} inputs in {out}")


if __name__ == "__main__":
    main()
