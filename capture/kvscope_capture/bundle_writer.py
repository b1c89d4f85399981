"""BundleWriter: one kvscope capture bundle (HDF5, format v2) per capture session.

Every call checks its input completely (shapes, dtypes, layer names, consistency with the
KV cache config) and raises ValueError before writing anything. The file is written under
PATH.partial and moved to PATH only when close() (or the end of a `with` block) succeeds.
"""

import datetime
import json
import os

import h5py
import numpy as np

from ._version import __version__

from .kv_cache_config import KvCacheConfig
from . import recurrent_state
from .hf_reference import hf_cache_layers
from .tensors import FOUR_BIT, INT4_TOKEN_HEAD, NVFP4, QUANTISED, load_torch_bytes, to_array, to_float32, to_int_array

FORMAT_NAME = "kvscope-capture"
FORMAT_VERSION = 2
REFERENCE_ROLES = ("expected", "baseline")
LOGITS_ROLES = ("expected", "actual", "baseline")


def _valid_name(name):
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name


# Format v2: strings are fixed-length UTF-8 (no variable-length strings: their global-heap
# records are where corrupt files crash libhdf5), every dataset with data is chunked with a
# Fletcher32 checksum per chunk, and the file uses HDF5's newest format (checksummed metadata).

def _fixed_strings(values):
    encoded = [str(v).encode("utf-8") for v in values]
    dtype = h5py.string_dtype("utf-8", max([1] + [len(b) for b in encoded]))
    return np.array(encoded, dtype=dtype), dtype


def _set_string(obj, name, value):
    """A scalar string attribute, fixed-length."""
    array, dtype = _fixed_strings([value])
    obj.attrs.create(name, array[0], dtype=dtype)


def _dataset(group, name, data, dtype=None, chunk_rows=None, chunks=None):
    """A dataset, in checksummed chunks of `chunk_rows` rows (default: about 1 MiB), or of `chunks`."""
    data = np.asarray(data)
    if data.size == 0:
        return group.create_dataset(name, data=data, dtype=dtype)
    if chunks is None:
        row_bytes = max(1, data[0].nbytes if data.ndim else data.nbytes)
        rows = chunk_rows or max(1, (1 << 20) // row_bytes)
        chunks = (rows,) + data.shape[1:]
    chunks = tuple(max(1, min(c, n)) for c, n in zip(chunks, data.shape))
    return group.create_dataset(name, data=data, dtype=dtype, chunks=chunks, fletcher32=True)


def _scales(value, cache_shape, what):
    """A quantised cache's scales as (scalar scale, finer scales or None).

    value: None (not quantised: 1.0), a number or 0-d tensor (per tensor, vLLM's _k_scale), a
    [heads_per_rank] tensor (per head), or per token and head [num_blocks, heads_per_rank,
    block_size] (the cache's order) or [num_blocks, block_size, heads_per_rank]."""
    if value is None:
        return 1.0, None
    if isinstance(value, (int, float, np.floating, np.integer)):
        array = np.asarray(value, np.float64)
    else:
        try:
            import torch
            if isinstance(value, torch.Tensor):
                value = value.detach().cpu().to(torch.float32).numpy()
        except ImportError:
            pass
        array = np.asarray(value)
    if not np.all(np.isfinite(array)) or np.any(array < 0):
        raise ValueError(f"{what}: scales must be finite and not negative")
    blocks, heads, block_size, _ = cache_shape
    if array.size == 1:
        scale = float(array.reshape(()))
        if not scale > 0:
            raise ValueError(f"{what}: scale {scale} must be finite and positive")
        return scale, None
    array = array.astype(np.float32)
    if array.shape == (heads,):
        return 1.0, np.ascontiguousarray(array)
    if array.shape == (blocks, heads, block_size):
        return 1.0, np.ascontiguousarray(array)
    if array.shape == (blocks, block_size, heads):
        return 1.0, np.ascontiguousarray(array.transpose(0, 2, 1))
    raise ValueError(f"{what}: shape {array.shape}; scales are one number, per head ({heads},), or per token and "
                     f"head ({blocks}, {heads}, {block_size}) or ({blocks}, {block_size}, {heads})")


def _plain(value, what):
    """A tensor, array or number as a numpy array, its dtype kept."""
    try:
        import torch
        if isinstance(value, torch.Tensor):
            return value.detach().cpu().contiguous().numpy()
    except ImportError:
        pass
    if isinstance(value, (int, float, np.number, np.ndarray)):
        return np.asarray(value)
    raise ValueError(f"{what}: expected a tensor, an array or a number, got {type(value).__name__}")


def _at(mask):
    """The index of the first true element of `mask`, as a tuple of ints."""
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(mask)), mask.shape))


def _require_codes(array, what):
    """4-bit codes, one per byte: a byte above 15 is damage or a packed cache, not a code."""
    high = array > 15
    if high.any():
        at = _at(high)
        raise ValueError(f"{what}: code {int(array[at])} at {at} is outside 0..15 (one 4-bit code per byte; "
                         "unpack vLLM's two codes a byte first)")


def _nvfp4_part(kv, part, array, shape, where):
    """An NVFP4 part: its e2m1 codes, the uint8 bits of its e4m3 block scales [rows, heads,
    block_size, head_size / 16] (unswizzled) and its fp32 global scale (vLLM's _k_scale / _v_scale),
    as (codes, dtype, global scale, block scale bits, extras)."""
    if not isinstance(kv, dict) or kv.get(f"{part}_scale") is None or kv.get(f"{part}_global_scale") is None:
        raise ValueError(f"{where}: an nvfp4 {part} needs '{part}_scale' (the e4m3 block scales' uint8 bits) and "
                         f"'{part}_global_scale' (vLLM's layer._{part}_scale)")
    _require_codes(array, f"{where}, {part}")
    what = f"{where}, {part}_scale"
    bits = _plain(kv[f"{part}_scale"], what)
    expected = tuple(shape[:3]) + (shape[3] // 16,)
    if bits.dtype != np.uint8 or bits.shape != expected:
        raise ValueError(f"{what}: must be the uint8 bits of the e4m3 block scales {expected} ([rows, heads_per_rank, "
                         f"block_size, head_size / 16]), got {bits.dtype} {tuple(bits.shape)}")
    nan, negative = (bits & 0x7F) == 0x7F, bits > 0x80
    if (nan | negative).any():
        at = _at(nan | negative)
        raise ValueError(f"{what}: block scale at {at} is {'NaN' if nan[at] else 'negative'} "
                         f"(e4m3 bits 0x{int(bits[at]):02x}); scales are finite and not negative")
    what = f"{where}, {part}_global_scale"
    value = _plain(kv[f"{part}_global_scale"], what)
    if value.size != 1:
        raise ValueError(f"{what}: one number per layer and part, got shape {tuple(value.shape)}")
    scale = float(np.float32(value.reshape(())))  # fp32 as vLLM keeps it, stored exactly
    if not (np.isfinite(scale) and scale > 0):
        raise ValueError(f"{what}: {scale} must be finite and positive")
    return array, NVFP4, scale, np.ascontiguousarray(bits), {}


def _int4_part(kv, part, array, shape, where):
    """An int4_per_token_head part: its codes (of the rotated head), float32 scales and uint8 zero
    points [rows, heads_per_rank, block_size], and the layer's RHT signs [head_size] of +-1, as
    (codes, dtype, 1.0, scales, extras)."""
    names = (f"{part}_scale", f"{part}_zero_point", "rht_signs")
    if not isinstance(kv, dict) or any(kv.get(n) is None for n in names):
        raise ValueError(f"{where}: an int4_per_token_head {part} needs {', '.join(repr(n) for n in names)}")
    _require_codes(array, f"{where}, {part}")
    rows = tuple(shape[:3])
    what = f"{where}, {part}_scale"
    scales = _plain(kv[names[0]], what)
    if scales.dtype != np.float32 or scales.shape != rows:
        raise ValueError(f"{what}: must be float32 {rows} ([rows, heads_per_rank, block_size], the zero point's bits "
                         f"cleared), got {scales.dtype} {tuple(scales.shape)}")
    bad = ~np.isfinite(scales) | (scales <= 0)
    if bad.any():
        at = _at(bad)
        raise ValueError(f"{what}: scale {float(scales[at])} at {at} must be finite and positive")
    what = f"{where}, {part}_zero_point"
    zero = _plain(kv[names[1]], what)
    if zero.dtype != np.uint8 or zero.shape != rows:
        raise ValueError(f"{what}: must be uint8 {rows}, got {zero.dtype} {tuple(zero.shape)}")
    if (zero > 15).any():
        at = _at(zero > 15)
        raise ValueError(f"{what}: zero point {int(zero[at])} at {at} is outside 0..15")
    what = f"{where}, rht_signs"
    signs = _plain(kv[names[2]], what)
    if signs.dtype.kind not in "iu" or signs.shape != (shape[3],):
        raise ValueError(f"{what}: must be integers ({shape[3]},) (head_size), got {signs.dtype} {tuple(signs.shape)}")
    if not np.all((signs == 1) | (signs == -1)):
        raise ValueError(f"{what}: holds {int(signs[_at((signs != 1) & (signs != -1))])}; the rotation's signs are +1 or -1")
    extras = {f"{part}_zero_point": (np.ascontiguousarray(zero), True),
              "rht_signs": (signs.astype(np.int8), False)}
    return array, INT4_TOKEN_HEAD, 1.0, np.ascontiguousarray(scales), extras


def _mla_layer(group, kv, rows, subset, where):
    """An MLA layer's cache as vLLM holds it, split into what a bundle stores: c_kv as the layer's
    K [rows, 1, block_size, kv_lora_rank] and k_pe as its V [rows, 1, block_size, qk_rope_head_dim],
    each (array, dtype, scale, finer scales). kv: the latent [rows, block_size, head_size] (a
    tensor, torch.save bytes, or {'latent': t[, 'k_scale': s, 'block_ids': ids]} as
    KvscopeWorkerExtension hands it over); fp8_ds_mla: uint8 [rows, block_size, 656-style
    bytes]: kv_lora_rank e4m3 values, an fp32 scale per 128 of them, qk_rope_head_dim bf16."""
    scale = None
    if isinstance(kv, dict):
        if "latent" not in kv:
            raise ValueError(f"{where}: an MLA layer's dict needs 'latent' (the cache [blocks, block_size, "
                             f"head_size]), has {sorted(kv)}")
        scale = kv.get("k_scale")
        kv = kv["latent"]
    rank, rope, block_size = group["kv_lora_rank"], group["qk_rope_head_dim"], group["block_size"]
    rows_text = "len(block_ids)" if subset else "num_blocks"
    if group["ds_mla"]:
        groups = rank // 128
        width = rank + 4 * groups + 2 * rope
        array, _ = to_array(kv, where, "float8_e4m3fn")
        if array.dtype != np.uint8 or array.shape != (rows, block_size, width):
            raise ValueError(f"{where}: an fp8_ds_mla latent must be uint8 [{rows_text}, block_size, {width}] "
                             f"({rank} e4m3 values, {groups} fp32 scales, {rope} bf16 values), got "
                             f"{array.dtype} {tuple(array.shape)}")
        array = np.ascontiguousarray(array)
        c_kv = array[..., :rank].reshape(rows, 1, block_size, rank)
        scales = array[..., rank:rank + 4 * groups].copy().view("<f4").reshape(rows, 1, block_size, groups)
        if not np.all(np.isfinite(scales)) or np.any(scales < 0):
            raise ValueError(f"{where}: fp8_ds_mla scales must be finite and not negative")
        k_pe = array[..., rank + 4 * groups:].copy().view("<u2").reshape(rows, 1, block_size, rope)
        return [(np.ascontiguousarray(c_kv), "float8_e4m3fn", 1.0, scales.astype(np.float32), {}),
                (np.ascontiguousarray(k_pe), "bfloat16", 1.0, None, {})]
    array, dtype = to_array(kv, where, group["dtype"])
    if array.shape != (rows, block_size, rank + rope):
        raise ValueError(f"{where}: an MLA latent must be [{rows_text}, block_size, head_size] = "
                         f"({rows}, {block_size}, {rank + rope}) (kv_lora_rank {rank} + qk_rope_head_dim {rope}), "
                         f"got {tuple(array.shape)}")
    if dtype != group["dtype"]:
        raise ValueError(f"{where}: {dtype} but the config says {group['dtype']}")
    quantised = dtype in QUANTISED
    if quantised and scale is None:
        raise ValueError(f"{where}: a {dtype} MLA cache needs its scale: pass {{'latent': t, 'k_scale': s}} "
                         "(vLLM: layer._k_scale, which quantises c_kv and k_pe alike)")
    shape = (rows, 1, block_size, rank)
    s, finer = _scales(scale if quantised else None, shape, f"{where}, k_scale")
    if finer is not None:
        raise ValueError(f"{where}: an MLA cache has one scale (vLLM's _k_scale), got {finer.shape}")
    return [(np.ascontiguousarray(array[..., :rank].reshape(shape)), dtype, s, None, {}),
            (np.ascontiguousarray(array[..., rank:].reshape(rows, 1, block_size, rope)), dtype, s, None, {})]


def _mla_reference(value, group, where):
    """An MLA layer's reference as (c_kv [batch, 1, seq, kv_lora_rank], k_pe [batch, 1, seq,
    qk_rope_head_dim]), from the latent [batch, seq, head_size] (c_kv then k_pe, as vLLM caches
    it) or the pair (c_kv [batch, seq, rank], k_pe [batch, seq, rope]) that
    extract_hf_mla_latents gives (either may carry the head axis of one)."""
    rank, rope = group["kv_lora_rank"], group["qk_rope_head_dim"]
    try:
        import torch
    except ImportError:
        torch = None

    def with_head_axis(x, width, what):
        if torch is not None and isinstance(x, torch.Tensor):
            x = x.detach().cpu()
            x = x.unsqueeze(1) if x.dim() == 3 else x
            shape = tuple(x.shape)
        else:
            x = np.asarray(x)
            x = x[:, None] if x.ndim == 3 else x
            shape = x.shape
        if len(shape) != 4 or shape[1] != 1 or shape[3] != width:
            raise ValueError(f"{where}, {what}: shape {shape}, expected [batch, seq, {width}] (or [batch, 1, seq, "
                             f"{width}])")
        return x

    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"{where}: expected the latent, or (c_kv, k_pe)")
        return with_head_axis(value[0], rank, "c_kv"), with_head_axis(value[1], rope, "k_pe")
    latent = with_head_axis(value, rank + rope, "latent")
    return latent[..., :rank], latent[..., rank:]


def _ordered_group(parent, name):
    """parent[name], created (in creation order, as every group of a bundle) when not there yet."""
    return parent[name] if name in parent else parent.create_group(name, track_order=True)


def _string_dataset(group, name, values):
    array, dtype = _fixed_strings(values)
    return _dataset(group, name, array, dtype=dtype)


def _rope_scaling(params, cfg, rotary):
    """The `rope` attribute's scaling from transformers' rope_scaling / rope_parameters dict
    (None: the default rotation). Parameters as transformers' _compute_*_parameters read them
    (huggingface/transformers src/transformers/modeling_rope_utils.py, main as of 2025), with the
    defaults its standardize_rope_params fills in: original_max_position_embeddings from the
    config's own (Phi-3 keeps it outside rope_scaling, and it wins) or max_position_embeddings."""
    kind = params.get("rope_type", params.get("type")) or "default"
    section = params.get("mrope_section")
    out = {"type": kind}
    if section is not None:
        if not isinstance(section, (list, tuple)) or not all(isinstance(x, int) and x >= 0 for x in section):
            raise ValueError(f"rope: mrope_section must be a list of pair counts, not {section!r}")
        out["mrope_section"] = [int(x) for x in section]
    if kind == "mrope" and section is None:
        raise ValueError("rope: mrope scaling without mrope_section")

    def number(key, value=None):
        value = params.get(key) if value is None else value
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
            raise ValueError(f"rope: {kind} scaling needs a positive number {key}, not {value!r}")
        return float(value)

    def original():
        if kind == "longrope" and cfg.get("original_max_position_embeddings"):
            return int(cfg["original_max_position_embeddings"])
        value = params.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings") \
            or cfg.get("max_position_embeddings")
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"rope: {kind} scaling needs original_max_position_embeddings (or the config's "
                             f"max_position_embeddings), not {value!r}")
        return value

    def factor_or_ratio(orig):
        if params.get("factor") is not None:
            return number("factor")
        if not cfg.get("max_position_embeddings"):
            raise ValueError(f"rope: {kind} scaling needs factor or the config's max_position_embeddings")
        return number("factor", cfg["max_position_embeddings"] / orig)

    if kind == "default" or kind == "mrope":
        return out if section is not None else None
    if kind == "linear":
        out["factor"] = number("factor")
    elif kind == "llama3":
        for key in ("factor", "low_freq_factor", "high_freq_factor"):
            out[key] = number(key)
        out["original_max_position_embeddings"] = original()
    elif kind == "yarn":
        orig = original()
        out["factor"] = factor_or_ratio(orig)
        out["original_max_position_embeddings"] = orig
        for key in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor"):
            if params.get(key) is not None:
                out[key] = float(params[key])
        if params.get("truncate") is not None:
            out["truncate"] = bool(params["truncate"])
    elif kind == "longrope":
        orig = original()
        for key in ("short_factor", "long_factor"):
            values = params.get(key)
            if not isinstance(values, (list, tuple)) or not values:
                raise ValueError(f"rope: longrope scaling needs {key}, a list of numbers")
            if rotary is not None and len(values) != rotary // 2:
                raise ValueError(f"rope: longrope's {key} has {len(values)} factors for {rotary // 2} rotated pairs")
            out[key] = [float(x) for x in values]
        out["original_max_position_embeddings"] = orig
        out["factor"] = factor_or_ratio(orig)
        if params.get("attention_factor") is not None:
            out["attention_factor"] = number("attention_factor")
    elif kind == "dynamic":
        if params.get("alpha") is not None:
            raise ValueError("rope: dynamic scaling by alpha (vLLM's DynamicNTKAlpha) is not one transformers "
                             "defines; leave set_rope out for this model")
        out["factor"] = number("factor")
        out["max_position_embeddings"] = int(number("max_position_embeddings", cfg.get("max_position_embeddings")))
    else:
        raise ValueError(f"rope: scaling type {kind!r} is not one kvscope's RoPE hypotheses reproduce "
                         "(linear, llama3, yarn, longrope, dynamic, mrope or default); leave set_rope out for this model")
    return out


class BundleWriter:
    def __init__(self, path, model="", engine="", notes="", engine_only=False, **metadata):
        """engine_only: the engine's side alone, without reference KV (docs/bundle-format.md,
        "Engine-only bundles"): kvscope diff A B compares it against A's reference."""
        self.path = os.fspath(path)
        self._partial = self.path + ".partial"
        self._engine_only = bool(engine_only)
        for key in metadata:
            if key in ("format", "format_version", "writer"):
                raise ValueError(f"metadata key {key!r} is reserved")
        self._file = h5py.File(self._partial, "w", track_order=True, libver="latest")
        root = self._file
        _set_string(root, "format", FORMAT_NAME)
        root.attrs["format_version"] = np.int64(FORMAT_VERSION)
        _set_string(root, "model", model)
        _set_string(root, "engine", engine)
        _set_string(root, "created", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
        _set_string(root, "notes", notes)
        _set_string(root, "writer", "kvscope_capture " + __version__)
        if self._engine_only:
            root.attrs["engine_only"] = np.int64(1)
        for key, value in metadata.items():
            _set_string(root, key, value)
        self._file.create_group("prompts", track_order=True)
        self._config = None
        self._prompts = {}  # id -> {"prompt_len", "snapshots": [...], "references": {role: set}, "divergences"}
        self._closed = False

    # --- context manager -------------------------------------------------------------
    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abandon()
        return False

    # --- the KV cache config ---------------------------------------------------------
    def set_kv_cache_config(self, cfg):
        """The dict `get_kv_cache_config` returns (or its JSON text)."""
        if isinstance(cfg, (str, bytes)):
            try:
                cfg = json.loads(cfg)
            except json.JSONDecodeError as e:
                raise ValueError(f"kv_cache_config: not valid JSON ({e})") from e
        config = KvCacheConfig(cfg)
        if self._config is not None:
            raise ValueError("kv_cache_config: already set")
        try:
            text = json.dumps(cfg, allow_nan=False)  # strict JSON, as the reader parses it
        except (TypeError, ValueError) as e:
            raise ValueError(f"kv_cache_config: cannot be written as JSON ({e})") from e
        _string_dataset(self._file, "kv_cache_config", [text])
        self._config = config

    @property
    def is_mla(self):
        """Whether the config's layers are MLA (their reference: extract_hf_mla_latents)."""
        return any(g["compared"] and g["mla"] for g in self._need_config().groups)

    @property
    def kv_cache_config(self):
        """The config given to set_kv_cache_config (a dict), or None."""
        return None if self._config is None else self._config.raw

    # --- the model's RoPE (optional: the suspects' RoPE hypotheses need it) ---------------
    def set_rope(self, hf_config):
        """The model's rotary embedding, from its HF config (a transformers PretrainedConfig or
        its dict): rope_theta, the rotary dims (rotary_dim, or partial_rotary_factor of
        head_dim), and the scaling, read as transformers reads it (modeling_rope_utils.py): from
        `rope_parameters` (transformers 5) or `rope_scaling`, its type in rope_type (or the older
        type): linear, llama3, yarn, longrope, dynamic, and Qwen2-VL's mrope (mrope_section, which
        text positions reduce to the default rotation). Written as the root attribute `rope`
        (JSON, docs/bundle-format.md). style: "neox" (rotated halves, HF's rotate_half, vLLM
        is_neox_style) unless the config says otherwise. Refused (ValueError) only what kvscope
        cannot reproduce: another scaling type, or a RoPE per layer type."""
        cfg = hf_config if isinstance(hf_config, dict) else hf_config.to_dict()
        params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        if not isinstance(params, dict):
            raise ValueError(f"rope: rope_scaling must be a dict, not {params!r}")
        if params and all(isinstance(v, dict) for v in params.values()):
            raise ValueError(f"rope: one RoPE per layer type ({', '.join(params)}) is not one the bundle's `rope` "
                             "can say; leave set_rope out for this model")
        theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
        if not isinstance(theta, (int, float)) or theta <= 1:
            raise ValueError(f"rope: rope_theta must be a number above 1, not {theta!r}")
        head_dim = cfg.get("head_dim") or (cfg["hidden_size"] // cfg["num_attention_heads"]
                                          if "hidden_size" in cfg and "num_attention_heads" in cfg else None)
        rotary = cfg.get("rotary_dim")
        partial = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor")) or 1.0
        if rotary is None and head_dim is not None:
            rotary = int(head_dim * partial)
        rope = {"theta": float(theta), "rotary_dim": rotary,
                "style": "neox" if cfg.get("rope_is_neox_style", True) else "gptj"}
        scaling = _rope_scaling(params, cfg, rotary)
        if scaling is not None:
            rope["scaling"] = scaling
        _set_string(self._file, "rope", json.dumps(rope))

    # --- prompts -----------------------------------------------------------------------
    def add_prompt(self, prompt_id, input_ids, prompt_len, teacher_tokens=None, token_strings=None):
        """`input_ids`: the prompt, or the whole sequence (then the tokens past prompt_len are the
        teacher tokens unless given)."""
        pid = str(prompt_id)
        if not _valid_name(pid):
            raise ValueError(f"prompt id {pid!r} cannot be an HDF5 name")
        if pid in self._prompts:
            raise ValueError(f"prompt {pid!r} added twice")
        ids = to_int_array(input_ids, f"prompt {pid}: input_ids").reshape(-1)
        if not isinstance(prompt_len, (int, np.integer)) or not 1 <= prompt_len <= len(ids):
            raise ValueError(f"prompt {pid}: prompt_len {prompt_len!r} outside 1..{len(ids)} (the input_ids)")
        prompt_len = int(prompt_len)
        teacher = ids[prompt_len:] if teacher_tokens is None else to_int_array(teacher_tokens, f"prompt {pid}: teacher_tokens").reshape(-1)
        strings = None
        if token_strings is not None:
            strings = [str(s) for s in token_strings]
            if len(strings) != prompt_len + len(teacher):
                raise ValueError(f"prompt {pid}: {len(strings)} token_strings for {prompt_len + len(teacher)} positions")
            for i, s in enumerate(strings):  # HDF5 strings are NUL-terminated UTF-8
                try:
                    s.encode("utf-8")
                except UnicodeEncodeError as e:
                    raise ValueError(f"prompt {pid}: token string {i} is not valid UTF-8 ({e})") from e
                if "\0" in s:
                    raise ValueError(f"prompt {pid}: token string {i} holds a NUL character; escape it (e.g. '<0x00>')")
        group = self._file["prompts"].create_group(pid, track_order=True)
        group.attrs["prompt_len"] = np.int64(prompt_len)
        _dataset(group, "input_ids", ids[:prompt_len])
        if len(teacher):
            _dataset(group, "teacher_tokens", teacher)
        if strings is not None:
            _string_dataset(group, "token_strings", strings)
        self._prompts[pid] = {"prompt_len": prompt_len, "positions": prompt_len + len(teacher), "snapshots": [],
                              "references": {}, "divergences": None, "states": {}, "reference_states": {}}

    def _prompt(self, prompt_id):
        pid = str(prompt_id)
        if pid not in self._prompts:
            raise ValueError(f"prompt {pid!r} was not added (add_prompt first)")
        return pid, self._prompts[pid]

    # --- where each position's KV came from (optional) -----------------------------------
    PROVENANCE_KINDS = ("prefill", "prefix_cache", "external", "decode", "spec_accepted", "recomputed", "unknown")
    _PROVENANCE_DETAILS = {"chunk": int, "step": int, "preemption": int, "blocks": list, "connector": str}

    def set_provenance(self, prompt_id, ranges):
        """Where each position's KV came from: `ranges` a list of (start, end, kind, details),
        positions [start, end) in order and not overlapping (positions left out are of unknown
        source). kind: "prefill" (details {"chunk": i}), "prefix_cache" ({"blocks": [physical
        ids]}), "external" ({"connector": "LMCacheConnectorV1"}, required), "decode" ({"step":
        s}), "spec_accepted" ({"step": s}), "recomputed" ({"preemption": i}) or "unknown"; details
        may be None or {}. Written as the prompt's attribute `provenance` (JSON,
        docs/bundle-format.md); kvscope inspect shows it."""
        pid, prompt = self._prompt(prompt_id)
        positions = prompt["positions"]
        records, end = [], 0
        for i, item in enumerate(ranges):
            try:
                start, stop, kind, details = item
            except (TypeError, ValueError):
                raise ValueError(f"prompt {pid}: provenance range {i} is not (start, end, kind, details)") from None
            if not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in (start, stop)):
                raise ValueError(f"prompt {pid}: provenance range {i}: start and end must be integers")
            if not 0 <= start < stop <= positions:
                raise ValueError(f"prompt {pid}: provenance range {i}: positions {start}-{stop} are not within the "
                                 f"prompt's {positions} positions")
            if start < end:
                raise ValueError(f"prompt {pid}: provenance range {i} starts at {start}, before the previous range ends "
                                 f"({end}): ranges go in order and do not overlap")
            if kind not in self.PROVENANCE_KINDS:
                raise ValueError(f"prompt {pid}: provenance range {i}: kind {kind!r} is not one of "
                                 + ", ".join(self.PROVENANCE_KINDS))
            record = {"start": int(start), "end": int(stop), "kind": kind}
            for key, value in (details or {}).items():
                expected = self._PROVENANCE_DETAILS.get(key)
                if expected is None:
                    raise ValueError(f"prompt {pid}: provenance range {i}: unknown detail {key!r} (one of "
                                     + ", ".join(self._PROVENANCE_DETAILS) + ")")
                if expected is int and (not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0):
                    raise ValueError(f"prompt {pid}: provenance range {i}: {key} must be a non-negative integer")
                if expected is list:
                    value = [int(b) for b in value]
                    if any(b < 0 for b in value):
                        raise ValueError(f"prompt {pid}: provenance range {i}: blocks must be non-negative ids")
                if expected is str and not isinstance(value, str):
                    raise ValueError(f"prompt {pid}: provenance range {i}: {key} must be a string")
                record[key] = int(value) if expected is int else value
            if kind == "external" and not record.get("connector"):
                raise ValueError(f"prompt {pid}: provenance range {i}: an external range names its connector")
            records.append(record)
            end = stop
        _set_string(self._file["prompts"][pid], "provenance", json.dumps(records))

    def _need_config(self):
        if self._config is None:
            raise ValueError("set_kv_cache_config first: shapes are checked against it")
        return self._config

    # --- the engine ----------------------------------------------------------------------
    def add_engine_snapshot(self, prompt_id, per_rank_kv, block_tables, seq_len, validated_until=None,
                            batch_row=0, keep_only_referenced=False):
        """One generate call's engine state.

        per_rank_kv: one entry per TP rank, as `collective_rpc("get_kv_caches")` returns it:
            {layer_name: torch.save({'k': k, 'v': v}) bytes}, or {layer_name: {'k': k, 'v': v}},
            or {layer_name: (k, v)}; k and v [num_blocks, heads_per_rank, block_size, head_size].
            A dict may hand over only some blocks: {'k': k, 'v': v, 'block_ids': ids} with k and v
            [len(ids), ...] and ids increasing (what KvscopeWorkerExtension and the shards give);
            every layer of every rank then gives the same ids, and the tables reference only them.
            Quantised caches come with their scales: {'k_scale': s, 'v_scale': s} (fp8 / int8: one
            number, per head, or per token and head); vLLM's 4-bit caches one code per byte (uint8)
            with, for nvfp4, 'k_scale' / 'v_scale' the uint8 bits of the e4m3 block scales
            [n, heads, block_size, head_size // 16] and 'k_global_scale' / 'v_global_scale', and
            for int4_per_token_head float32 'k_scale' / 'v_scale' and uint8 'k_zero_point' /
            'v_zero_point' [n, heads, block_size] and int8 'rht_signs' [head_size]
            (docs/bundle-format.md). A group's `v_dtype` gives V its own format.
        block_tables: one per KV cache group, as `collective_rpc("get_block_tables")` returns it
            for one rank (torch.save bytes), or tensors / arrays [batch, max_blocks] (-1 = null).
        seq_len: tokens in this prompt's sequence (block-table row `batch_row`), counting the
            last sampled token whose KV is not written yet.
        validated_until: exclusive end of the positions this snapshot validates; by default it
            is derived at close() from the divergences (set_divergence), else seq_len - 1.
        keep_only_referenced: store only the blocks some block-table entry references.
        """
        pid, prompt = self._prompt(prompt_id)
        cfg = self._need_config()
        where = f"prompt {pid}, snapshot {len(prompt['snapshots'])}"

        if len(block_tables) != len(cfg.groups):
            raise ValueError(f"{where}: {len(block_tables)} block tables for {len(cfg.groups)} KV cache groups")
        tables = [to_int_array(t, f"{where}: block table of group {g}") for g, t in enumerate(block_tables)]
        for g, t in enumerate(tables):
            if t.ndim == 1:
                tables[g] = t = t.reshape(1, -1)
            if t.ndim != 2:
                raise ValueError(f"{where}: block table of group {g} must be [batch, max_blocks], got {t.shape}")
            if t.shape[0] != tables[0].shape[0]:
                raise ValueError(f"{where}: block tables disagree on the batch size ({t.shape[0]} vs {tables[0].shape[0]})")
            bad = t[(t < -1) | (t >= cfg.num_blocks)]
            if bad.size:
                raise ValueError(f"{where}: block table of group {g} holds {int(bad[0])}, neither -1 nor a block id "
                                 f"below num_blocks {cfg.num_blocks}")
        batch = tables[0].shape[0]
        if not 0 <= batch_row < batch:
            raise ValueError(f"{where}: batch_row {batch_row} outside a batch of {batch}")
        if not isinstance(seq_len, (int, np.integer)) or seq_len < 1:
            raise ValueError(f"{where}: seq_len must be a positive integer, got {seq_len!r}")
        if validated_until is not None and not 0 <= validated_until <= seq_len:
            raise ValueError(f"{where}: validated_until {validated_until} outside 0..seq_len {seq_len}")

        if len(per_rank_kv) != cfg.tp_size:
            raise ValueError(f"{where}: {len(per_rank_kv)} ranks of KV, the config has tp_size {cfg.tp_size}")
        ranks = []
        for r, caches in enumerate(per_rank_kv):
            if not isinstance(caches, dict):
                raise ValueError(f"{where}, rank {r}: must be a dict {{layer_name: kv}}")
            layers = {}
            for layer, kv in caches.items():
                if layer not in cfg.layer_to_group:
                    raise ValueError(f"{where}, rank {r}: layer {layer!r} belongs to no group of the KV cache config")
                if not cfg.is_compared(layer):
                    continue  # a state-space layer's state: listed by the config, not stored
                layers[layer] = self._engine_layer(cfg, layer, kv, f"{where}, rank {r}, layer {layer}")
            missing = [name for name in cfg.layer_names() if name not in layers]
            if missing:
                raise ValueError(f"{where}, rank {r}: layers missing: {', '.join(missing[:4])}"
                                 + (" ..." if len(missing) > 4 else ""))
            ranks.append(layers)

        # Blocks given: the whole pool (row b is block b), or the blocks listed in 'block_ids'
        # (the worker extension and the connector hand over only a request's blocks).
        given = {tuple(ids) if ids is not None else None
                 for layers in ranks for (_, ids) in layers.values()}
        if len(given) != 1:
            raise ValueError(f"{where}: layers hand over different blocks ('block_ids'); every layer of every rank "
                             "must give the same blocks")
        given = given.pop()
        referenced = np.unique(np.concatenate([t[t >= 0].ravel() for t in tables] + [np.zeros(0, np.int64)]))
        stored = None
        if given is not None:
            missing = np.setdiff1d(referenced, np.asarray(given, np.int64))
            if missing.size:
                raise ValueError(f"{where}: block tables reference block {int(missing[0])}, which the KV handed over "
                                 "does not hold ('block_ids')")
            stored = np.asarray(given, np.int64)
            ranks = [{name: parts for name, (parts, _) in layers.items()} for layers in ranks]
            if keep_only_referenced:
                rows = np.searchsorted(stored, referenced)
                stored = referenced.astype(np.int64)
                ranks = [{name: [(a[rows], d, sc, f[rows] if f is not None and f.ndim >= 3 else f,
                                  {n: (x[rows] if paged else x, paged) for n, (x, paged) in extras.items()})
                                 for (a, d, sc, f, extras) in parts] for name, parts in layers.items()} for layers in ranks]
            row_of = None
        else:
            ranks = [{name: parts for name, (parts, _) in layers.items()} for layers in ranks]
            row_of = referenced.astype(np.int64) if keep_only_referenced else None
            if row_of is not None:
                stored = row_of

        # Everything checked: write.
        index = len(prompt["snapshots"])
        snap = self._file["prompts"][pid].require_group("engine").create_group(f"snapshot_{index}", track_order=True)
        snap.attrs["batch_row"] = np.int64(batch_row)
        seq_lens = np.full(batch, -1, np.int64)
        seq_lens[batch_row] = int(seq_len)
        _dataset(snap, "seq_lens", seq_lens)
        if stored is not None:
            _dataset(snap, "physical_block_ids", stored)
        bt = snap.create_group("block_tables", track_order=True)
        for g, t in enumerate(tables):
            _dataset(bt, f"group_{g}", t.astype(np.int32))
        for r, layers in enumerate(ranks):
            rank_group = snap.create_group(f"rank_{r}", track_order=True)
            for layer in cfg.layer_names():
                lg = rank_group.create_group(layer)
                for part, (array, dtype, scale, finer, extras) in zip("kv", layers[layer]):
                    data = array if row_of is None else array[row_of]
                    # One block per chunk (several only when blocks are under 4 KiB): a
                    # checksum covers a whole chunk, so one block can be read and verified alone.
                    block_bytes = array[0].nbytes if len(array) else 1
                    chunk_rows = max(1, 4096 // max(1, block_bytes))
                    ds = _dataset(lg, part, data, chunk_rows=chunk_rows)
                    _set_string(ds, "dtype", dtype)
                    ds.attrs["scale"] = float(scale)
                    if finer is not None:  # per head [heads], per token and head [blocks, heads, block_size],
                        # or per group of a token's values [blocks, heads, block_size, groups] (fp8_ds_mla)
                        if finer.ndim >= 3 and row_of is not None:
                            finer = finer[row_of]
                        sd = _dataset(lg, part + "_scale", finer, chunk_rows=chunk_rows if finer.ndim >= 3 else None)
                        # (NVFP4's block scales are the bits of e4m3 values)
                        _set_string(sd, "dtype", "float8_e4m3fn" if finer.dtype == np.uint8 else "float32")
                    for name, (extra, paged) in extras.items():  # int4: zero points, the layer's RHT signs
                        if name in lg:
                            continue  # rht_signs: one for K and V
                        _dataset(lg, name, extra if row_of is None or not paged else extra[row_of],
                                 chunk_rows=chunk_rows if paged else None)
        prompt["snapshots"].append({"seq_len": int(seq_len), "validated_until": validated_until})

    def _engine_layer(self, cfg, layer, kv, where):
        group = cfg.group_of(layer)
        if isinstance(kv, (bytes, bytearray, memoryview)):
            kv = load_torch_bytes(kv, where)
        block_ids = None
        if isinstance(kv, dict) and kv.get("block_ids") is not None:
            block_ids = to_int_array(kv["block_ids"], f"{where}, block_ids").reshape(-1)
            if block_ids.size == 0 or np.any(np.diff(block_ids) <= 0) or block_ids[0] < 0 \
                    or block_ids[-1] >= cfg.num_blocks:
                raise ValueError(f"{where}: block_ids must be increasing block ids in [0, num_blocks "
                                 f"{cfg.num_blocks}), got {block_ids[:8].tolist()}")
        rows = cfg.num_blocks if block_ids is None else len(block_ids)
        given = None if block_ids is None else tuple(int(b) for b in block_ids)
        if group["mla"]:
            return _mla_layer(group, kv, rows, block_ids is not None, where), given
        scales = (None, None)
        raw = kv  # the dict, whose other keys the 4-bit formats read
        if isinstance(kv, dict):
            if "k" not in kv or "v" not in kv:
                raise ValueError(f"{where}: a dict needs 'k' and 'v', has {sorted(kv)}")
            scales = (kv.get("k_scale"), kv.get("v_scale"))
            kv = (kv["k"], kv["v"])
        if not isinstance(kv, (tuple, list)) or len(kv) != 2:
            raise ValueError(f"{where}: expected (k, v), {{'k': k, 'v': v}} or torch.save bytes of that")
        out = []
        expected = (rows, group["heads_per_rank"], group["block_size"], group["head_size"])
        for part, value, scale, declared in zip("kv", kv, scales, group["part_dtypes"]):
            quantised = declared in QUANTISED and declared not in FOUR_BIT
            if quantised and scale is None:
                raise ValueError(f"{where}: a {declared} cache needs its dequantisation scales: pass "
                                 "{'k': k, 'v': v, 'k_scale': s, 'v_scale': s} (vLLM: layer._k_scale, layer._v_scale)")
            array, dtype = to_array(value, f"{where}, {part}", declared)
            if tuple(array.shape) != expected:
                raise ValueError(f"{where}, {part}: shape {tuple(array.shape)}, the config implies {expected} "
                                 + ("[num_blocks, " if block_ids is None else "[len(block_ids), ")
                                 + "heads_per_rank, block_size, head_size]")
            if dtype != declared:
                raise ValueError(f"{where}, {part}: {dtype} but the config says {declared}")
            if declared == NVFP4:
                out.append(_nvfp4_part(raw, part, array, expected, where))
            elif declared == INT4_TOKEN_HEAD:
                out.append(_int4_part(raw, part, array, expected, where))
            else:
                out.append((array, dtype) + _scales(scale if quantised else None, expected, f"{where}, {part}_scale")
                           + ({},))
        return out, given

    # --- the reference -------------------------------------------------------------------
    def add_reference_kv(self, prompt_id, role, kv, batch_row=0):
        """HF past_key_values: a tuple per layer (k, v) in model order, or {layer_name: (k, v)};
        k and v [batch, heads, seq, head_dim], torch or numpy. role: "expected" or "baseline"."""
        pid, prompt = self._prompt(prompt_id)
        cfg = self._need_config()
        if self._engine_only:
            raise ValueError(f"prompt {pid}: an engine-only bundle holds no reference KV")
        if role not in REFERENCE_ROLES:
            raise ValueError(f"prompt {pid}: reference role {role!r} is neither 'expected' nor 'baseline'")
        if role in prompt["references"]:
            raise ValueError(f"prompt {pid}: {role} reference added twice")
        if not isinstance(kv, dict):
            kv = hf_cache_layers(kv)
        names = cfg.layer_names()
        if isinstance(kv, dict):
            unknown = [name for name in kv if name not in cfg.layer_to_group]
            if unknown:
                raise ValueError(f"prompt {pid}, {role}: layer {unknown[0]!r} belongs to no group of the KV cache config")
            pairs = kv
        else:
            kv = list(kv)
            every = cfg.all_layer_names()  # hybrid models' HF caches hold an entry for every layer
            if len(kv) not in (len(names), len(every)):
                raise ValueError(f"prompt {pid}, {role}: {len(kv)} layers of past_key_values, the config has "
                                 f"{len(names)}" + (f" compared of {len(every)}" if len(every) != len(names) else ""))
            pairs = dict(zip(names if len(kv) == len(names) else every, kv))
        missing = [name for name in names if name not in pairs]
        if missing:
            raise ValueError(f"prompt {pid}, {role}: layers missing: {', '.join(missing[:4])}")
        arrays = {}
        for name in names:
            group = cfg.group_of(name)
            pair = _mla_reference(pairs[name], group, f"prompt {pid}, {role}, layer {name}") if group["mla"] \
                else pairs[name]
            if not isinstance(pair, (tuple, list)) or len(pair) < 2:
                raise ValueError(f"prompt {pid}, {role}, layer {name}: expected (k, v)")
            arrays[name] = []
            for part, value, width in zip(group["part_names"], pair[:2], group["part_widths"]):
                array, dtype = to_array(value, f"prompt {pid}, {role}, layer {name}, {part}")
                if array.ndim != 4 or array.shape[1] != group["total_kv_heads"] or array.shape[3] != width:
                    raise ValueError(f"prompt {pid}, {role}, layer {name}, {part}: shape {tuple(array.shape)}, expected "
                                     f"[batch, {group['total_kv_heads']}, seq, {width}]")
                if not 0 <= batch_row < array.shape[0]:
                    raise ValueError(f"prompt {pid}, {role}, layer {name}: batch_row {batch_row} outside the batch")
                arrays[name].append((array, dtype))
            if arrays[name][0][0].shape[:3] != arrays[name][1][0].shape[:3]:
                raise ValueError(f"prompt {pid}, {role}, layer {name}: {group['part_names'][0]} and "
                                 f"{group['part_names'][1]} differ in batch, heads or seq")
        # HF trims a sliding-window layer's past_key_values to its window (W - 1 positions in
        # transformers' DynamicSlidingWindowLayer, W in some versions): such a layer holds the last
        # positions of the sequence, and kvscope reads the last W - 1 of them.
        longest = max(arrays[name][0][0].shape[2] for name in names)
        for name in names:
            held = arrays[name][0][0].shape[2]
            window = cfg.group_of(name)["sliding_window"]
            if held == longest or cfg.group_of(name)["attention_chunk_size"]:
                continue  # a chunked-local layer's reference may hold only its latest positions
            if not window or held < window - 1:
                raise ValueError(f"prompt {pid}, {role}, layer {name}: {held} positions, other layers hold {longest}"
                                 + (f" and its sliding window {window} needs at least {window - 1}" if window else ""))
            arrays[name] = [(a[:, :, held - (window - 1):], d) for a, d in arrays[name]]
        ref = _ordered_group(self._file["prompts"][pid].require_group("reference"), role)  # its states may be there
        ref.attrs["batch_row"] = np.int64(batch_row)
        for name in names:
            lg = ref.create_group(name)
            for part, (array, dtype) in zip("kv", arrays[name]):
                # A batch row as one chunk up to 4,096 positions (kvscope reads it whole, straight
                # from the file); past that, chunks of about 1 MiB along the positions
                # ([1, heads, rows, width]), so that a window of tokens of a long context reads
                # only its own.
                _, heads, positions, width = array.shape
                rows = positions if positions <= 4096 else max(1, (1 << 20) // max(1, heads * width * array.dtype.itemsize))
                ds = _dataset(lg, part, array, chunks=(1, heads, rows, width))
                _set_string(ds, "dtype", dtype)
                ds.attrs["scale"] = 1.0
        prompt["references"][role] = True

    # --- recurrent state of state-space layers (hybrid models) ---------------------------------
    def add_state(self, prompt_id, layer, positions, per_rank, kind="mamba2"):
        """The engine's recurrent state of a state-space layer (one of a MambaSpec group's) at its
        checkpoints: checkpoint i is the state after the positions [0, positions[i]) (increasing,
        each >= 1). per_rank: {rank: {part: (tensor, units)}} for every TP rank, tensor [c, units_r,
        ...] (float32, bfloat16 or float16; torch or numpy) and units the whole model's unit (axis 1
        of the reference's part) of each of its rows; Mamba2's parts are "conv" [c, conv_dim_r,
        d_conv - 1] and "ssm" [c, heads_r, head_dim, d_state] (docs/bundle-format.md, "Recurrent
        state"). kind: the state's model, free text ("mamba2", "gated_delta_net", ...)."""
        pid, prompt = self._prompt(prompt_id)
        cfg = self._need_config()
        where = f"prompt {pid}, layer {layer}"
        recurrent_state.check_layer(cfg, layer, where)
        if layer in prompt["states"]:
            raise ValueError(f"{where}: the engine's state added twice")
        positions = recurrent_state.check_positions(positions, prompt["positions"], where)
        record = recurrent_state.engine_record(layer, positions, per_rank, cfg.tp_size, kind, where)
        for (role, name), reference in prompt["reference_states"].items():
            if name == layer:
                recurrent_state.check_against(record, reference, pid, layer)
        group = _ordered_group(self._file["prompts"][pid].require_group("engine"), "states").create_group(
            layer, track_order=True)
        recurrent_state.write_engine(group, record, cfg.tp_size, _dataset, _set_string)
        prompt["states"][layer] = record

    def add_reference_state(self, prompt_id, role, layer, positions, parts):
        """The reference model's recurrent state of a state-space layer, whole (unsharded), at its
        checkpoints (compared where they equal the engine's): parts {part: tensor [c, units, ...]}
        (HF's Mamba2 cache_params at each checkpoint: "conv" the last d_conv - 1 columns of
        conv_states, "ssm" the ssm_states). role: "expected" or "baseline"."""
        pid, prompt = self._prompt(prompt_id)
        cfg = self._need_config()
        where = f"prompt {pid}, {role}, layer {layer}"
        if self._engine_only:
            raise ValueError(f"prompt {pid}: an engine-only bundle holds no reference state")
        if role not in REFERENCE_ROLES:
            raise ValueError(f"prompt {pid}: reference role {role!r} is neither 'expected' nor 'baseline'")
        recurrent_state.check_layer(cfg, layer, where)
        if (role, layer) in prompt["reference_states"]:
            raise ValueError(f"{where}: the reference's state added twice")
        positions = recurrent_state.check_positions(positions, prompt["positions"], where)
        record = recurrent_state.reference_record(layer, positions, parts, where)
        if layer in prompt["states"]:
            recurrent_state.check_against(prompt["states"][layer], record, pid, layer)
        group = _ordered_group(_ordered_group(self._file["prompts"][pid].require_group("reference"), role),
                               "states").create_group(layer, track_order=True)
        recurrent_state.write_reference(group, record, _dataset, _set_string)
        prompt["reference_states"][(role, layer)] = record

    # --- logits and divergences ------------------------------------------------------------
    def add_logits(self, prompt_id, role, logits):
        """[steps, vocab] (a leading batch of 1 is dropped); step g predicts prompt_len + g."""
        pid, _ = self._prompt(prompt_id)
        if role not in LOGITS_ROLES:
            raise ValueError(f"prompt {pid}: logits role {role!r} is not one of {', '.join(LOGITS_ROLES)}")
        array = to_float32(logits, f"prompt {pid}: {role} logits")
        if array.ndim == 3 and array.shape[0] == 1:
            array = array[0]
        if array.ndim != 2:
            raise ValueError(f"prompt {pid}: {role} logits must be [steps, vocab], got {array.shape}")
        logits_group = self._file["prompts"][pid].require_group("logits")
        if role in logits_group:
            raise ValueError(f"prompt {pid}: {role} logits added twice")
        _dataset(logits_group, role, array, chunk_rows=1)

    def set_divergence(self, prompt_id, positions):
        """Absolute positions where the engine's token differed from the teacher's."""
        pid, prompt = self._prompt(prompt_id)
        values = to_int_array(positions, f"prompt {pid}: divergence positions").reshape(-1)
        if np.any(values < prompt["prompt_len"]):
            raise ValueError(f"prompt {pid}: divergence positions must be decode positions (>= prompt_len "
                             f"{prompt['prompt_len']}), got {values.tolist()}")
        prompt["divergences"] = np.sort(values)

    # --- finishing ---------------------------------------------------------------------------
    def close(self):
        if self._closed:
            return
        if self._config is None:
            raise ValueError("no kv_cache_config was set")
        for pid, prompt in self._prompts.items():
            if not prompt["snapshots"]:
                raise ValueError(f"prompt {pid}: no engine snapshot")
            if "expected" not in prompt["references"] and not self._engine_only:
                raise ValueError(f"prompt {pid}: no expected reference KV")
            for layer in prompt["states"]:
                if not self._engine_only and ("expected", layer) not in prompt["reference_states"]:
                    raise ValueError(f"prompt {pid}, layer {layer}: the engine's state has no expected reference "
                                     "state (add_reference_state)")
        for pid, prompt in self._prompts.items():
            group = self._file["prompts"][pid]
            divergences = prompt["divergences"]
            if divergences is not None:
                _dataset(group, "divergence_positions", divergences.astype(np.int64))
            # validated_until: given, else the first divergence after where this snapshot starts
            # (the divergence it starts at was re-prefilled with the teacher token), else
            # everything written.
            start = 0
            for index, snap in enumerate(prompt["snapshots"]):
                until = snap["validated_until"]
                if until is None:
                    until = snap["seq_len"] - 1
                    if divergences is not None:
                        later = divergences[divergences > start]
                        if later.size and later[0] < until:
                            until = int(later[0])
                if until < start:
                    raise ValueError(f"prompt {pid}, snapshot {index}: validated_until {until} goes back before {start}")
                group["engine"][f"snapshot_{index}"].attrs["validated_until"] = np.int64(until)
                start = until
        self._file.close()
        os.replace(self._partial, self.path)
        self._closed = True

    def abandon(self):
        """Drops the partial file (after an error)."""
        if not self._closed:
            self._file.close()
            if os.path.exists(self._partial):
                os.remove(self._partial)
            self._closed = True
