"""Turning what the engine and HF hand over into numpy arrays, losslessly, with their dtype.

Accepted: torch tensors, numpy arrays, and torch.save bytes (decoded with torch, which is
needed only for that). bfloat16 and float8 have no numpy dtype: they travel as their raw bits
(uint16 / uint8) with the dtype name beside them.
"""

import io

import numpy as np

DTYPES = ("bfloat16", "float16", "float32", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "int8",
          "float4_e2m1fn", "int4_per_token_head")
# vLLM's 4-bit caches, one code (0..15) per byte: NVFP4 (e2m1 codes, e4m3 block scales, a global
# scale) and int4_per_token_head (codes of the rotated head, a scale and zero point per token and head).
NVFP4 = "float4_e2m1fn"
INT4_TOKEN_HEAD = "int4_per_token_head"
FOUR_BIT = (NVFP4, INT4_TOKEN_HEAD)
# Quantised caches: engines often allocate them as uint8 (vLLM does), the format named by the config.
QUANTISED = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "int8") + FOUR_BIT

# numpy dtype of the stored bits of each dtype
STORAGE = {
    "bfloat16": np.uint16,
    "float16": np.float16,
    "float32": np.float32,
    "float8_e4m3fn": np.uint8,
    "float8_e5m2": np.uint8,
    "float8_e4m3fnuz": np.uint8,
    "int8": np.int8,
    NVFP4: np.uint8,
    INT4_TOKEN_HEAD: np.uint8,
}


def canonical_dtype(name):
    """'torch.bfloat16' -> 'bfloat16'; None for names kvscope does not store."""
    name = str(name)
    if name.startswith("torch."):
        name = name[len("torch."):]
    aliases = {"half": "float16", "float": "float32", "fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn",
               "fp8_e5m2": "float8_e5m2", "fp8_e4m3fnuz": "float8_e4m3fnuz", "nvfp4": NVFP4,
               # vLLM's per-token-head modes: fp8 / int8 with a scale per token and head
               "fp8_per_token_head": "float8_e4m3fn", "int8_per_token_head": "int8"}
    name = aliases.get(name, name)
    return name if name in DTYPES else None


def load_torch_bytes(data, what):
    """Decodes torch.save bytes (what get_kv_caches / get_block_tables return)."""
    try:
        import torch
    except ImportError as e:  # pragma: no cover - torch is installed where bytes come from
        raise ValueError(f"{what}: torch is needed to decode torch.save bytes") from e
    try:
        return torch.load(io.BytesIO(bytes(data)), map_location="cpu")
    except Exception as e:
        raise ValueError(f"{what}: not torch.save bytes ({e})") from e


def to_array(value, what, declared=None):
    """A tensor-like value as (numpy array of the stored bits, dtype name).

    declared: the dtype the config gives a quantised cache, which then may come as uint8 bits
    (int8 codes as int8 or as their uint8 bits)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        value = load_torch_bytes(value, what)
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        if declared in QUANTISED and t.dtype in (torch.uint8, torch.int8):
            return t.view(torch.int8 if declared == "int8" else torch.uint8).numpy(), declared
        name = canonical_dtype(t.dtype)
        if name is None:
            raise ValueError(f"{what}: unsupported dtype {t.dtype} (kvscope stores {', '.join(DTYPES)})")
        if name == "bfloat16":
            return t.view(torch.int16).numpy().view(np.uint16), name
        if name.startswith("float8"):
            return t.view(torch.uint8).numpy(), name
        if name == "int8":
            return t.numpy(), name
        return t.numpy().astype(STORAGE[name], copy=False), name
    if isinstance(value, np.ndarray):
        if declared in QUANTISED and value.dtype in (np.uint8, np.int8):
            return np.ascontiguousarray(value).view(np.int8 if declared == "int8" else np.uint8), declared
        if value.dtype == np.float32:
            return np.ascontiguousarray(value), "float32"
        if value.dtype == np.float16:
            return np.ascontiguousarray(value), "float16"
        raise ValueError(f"{what}: numpy dtype {value.dtype} is ambiguous or unsupported; pass float32/float16, "
                         "or a torch tensor for bfloat16/float8")
    raise ValueError(f"{what}: expected a tensor, a numpy array or torch.save bytes, got {type(value).__name__}")


def to_int_array(value, what):
    """Block tables and token ids: any integer tensor, array or list, as int64."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        value = load_torch_bytes(value, what)
    try:
        import torch
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu().numpy()
    except ImportError:
        pass
    array = np.asarray(value)
    if array.dtype.kind not in "iu" and not (array.size == 0):
        raise ValueError(f"{what}: must hold integers, got {array.dtype}")
    return array.astype(np.int64)


def to_float32(value, what):
    """Logits: any float tensor or array, as float32 (bf16 converts exactly)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        value = load_torch_bytes(value, what)
    try:
        import torch
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu().float().numpy()
    except ImportError:
        pass
    array = np.asarray(value)
    if array.dtype.kind != "f":
        raise ValueError(f"{what}: must hold floats, got {array.dtype}")
    return array.astype(np.float32)
