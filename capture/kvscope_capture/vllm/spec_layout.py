"""How one layer's cache is laid out in the vLLM that users run today, decided from the layer's KV
cache spec alone, and its blocks read out bit for bit.

Since the packed layout (vLLM #44455, July 2026) and the KV cache layout refactor (#51718, after
August 2026), every attention layer's cache is a 4-D view [B, H, N, C] in the spec's dtype
(vllm/v1/kv_cache_interface.py, create_kv_cache_views): B kernel blocks, H head slots, N states
(tokens) per kernel block, C the content of one (slot, token). The view may be strided into one
buffer that all layers share (the six KVCacheLayout stride orders of [L, B, H, N, C]); torch's
indexing reads it whatever its strides. What the content holds is the spec's to say:

    spec (AttentionSpec fields)                               H          content of one (h, t)
    kv_quant_mode NONE / FP8_PER_TENSOR                       kv heads   K[head_size] | V[head_size_v]
    num_head_slots 2, state_content_bytes heads*head_size*e   2          slot 0 K, slot 1 V, each block's
      (ROCm attention)                                                   slot as its kernels view it: K
                                                                         [heads][D/x][N][x], V [heads][D][N]
    INT8 / FP8_PER_TOKEN_HEAD (state_content_bytes set)       kv heads   K | K scale f32 | V | V scale f32
    INT4_PER_TOKEN_HEAD                                       kv heads   K nibbles | K scale f32 (zero
                                                                         point in its low 4 bits) | V ...
    NVFP4 (num_head_slots 2*kv heads, C = D/2 + D/16 bytes)   2*heads    one page per kernel block:
                                                                         K e2m1 | K e4m3 scales | V e2m1
                                                                         | V scales (swizzled)
    MLAAttentionSpec                                          1          the latent (576 values), or
                                                                         fp8_ds_mla's 656 bytes

Anything else (another quant mode, TurboQuant, several tokens per state, K and V of other widths)
is refused by name, with the spec fields that made it unknown: a guessed layout reads wrong
numbers without an error. Older vLLM, whose specs have no num_head_slots, goes through the
attention backend's get_kv_cache_shape instead (backend_layout.py)."""

# vLLM's KVQuantMode (vllm/v1/kv_cache_interface.py), by name: IntEnum values moved when modes
# were added (NVFP4 was 4, then 5).
NONE, FP8_PER_TENSOR = "NONE", "FP8_PER_TENSOR"
INT8_PER_TOKEN_HEAD, FP8_PER_TOKEN_HEAD, INT4_PER_TOKEN_HEAD = (
    "INT8_PER_TOKEN_HEAD", "FP8_PER_TOKEN_HEAD", "INT4_PER_TOKEN_HEAD")
NVFP4 = "NVFP4"

# vLLM's --kv-cache-dtype names of per-tensor fp8, as kvscope's config spells the stored format
# ("fp8" and "fp8_e4m3" are the platform's e4m3: see platform_fp8).
FP8_FORMATS = {"fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "fp8_inc": "float8_e4m3fn",
               "fp8_e5m2": "float8_e5m2", "fp8_ds_mla": "fp8_ds_mla"}
_PER_TOKEN_HEAD_FORMATS = {INT8_PER_TOKEN_HEAD: "int8", FP8_PER_TOKEN_HEAD: "float8_e4m3fn"}
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "uint8": 1, "int8": 1, "float8_e4m3fn": 1,
                "float8_e5m2": 1, "float8_e4m3fnuz": 1}
# vLLM's random Hadamard rotation of int4 per-token-head caches: its signs' generator seed for
# round 0 (vllm/v1/attention/ops/triton_quant_kv/_hadamard.py @ 3629cf05, _get_rht_signs).
RHT_SEED = 0x9E3779B9


def platform_fp8(name):
    """The stored format of an e4m3 cache: vLLM stores the platform's fp8 (current_platform.fp8_dtype()),
    e4m3fnuz on ROCm MI300 (vllm/platforms/rocm.py), e4m3fn elsewhere."""
    if name != "float8_e4m3fn":
        return name
    try:
        from vllm.platforms import current_platform
        fnuz = "fnuz" in str(current_platform.fp8_dtype())
    except Exception:  # no vLLM platform to ask (an offline reader)
        fnuz = False
    return "float8_e4m3fnuz" if fnuz else name


def is_mla_spec(spec):
    """Whether a spec is MLAAttentionSpec or one of its subclasses."""
    return any(c.__name__ == "MLAAttentionSpec" for c in type(spec).__mro__)


class LayoutError(ValueError):
    """A cache whose layout cannot be established; the message names the layer and what is unknown."""


def quant_mode_name(spec):
    """The spec's kv_quant_mode as its name ("NONE" when the spec has none)."""
    mode = getattr(spec, "kv_quant_mode", None)
    if mode is None:
        return NONE
    return getattr(mode, "name", str(mode).rsplit(".", 1)[-1])


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def spec_describes_layout(spec):
    """Whether `spec` comes from a vLLM whose specs say how the cache is packed (num_head_slots)."""
    return hasattr(spec, "num_head_slots")


def _describe(spec):
    fields = ("num_kv_heads", "head_size", "head_size_v", "dtype", "kv_quant_mode", "num_head_slots",
              "state_content_bytes", "tokens_per_state", "page_size_padded", "cache_dtype_str")
    return ", ".join(f"{f}={_dtype_name(getattr(spec, f)) if f == 'dtype' else getattr(spec, f)!r}"
                     for f in fields if hasattr(spec, f))


def rht_signs(head_size):
    """The +-1 signs vLLM multiplies an int4 per-token-head vector by before its Hadamard transform:
    vLLM's own function where it is importable, else the same computation."""
    import torch

    try:
        from vllm.v1.attention.ops.triton_quant_kv._hadamard import _get_rht_signs
        signs = _get_rht_signs(head_size, 0, "cpu")
    except ImportError:  # the same as vLLM's, round 0
        g = torch.Generator(device="cpu")
        g.manual_seed(RHT_SEED)
        signs = 2.0 * torch.bernoulli(torch.full((head_size,), 0.5), generator=g) - 1.0
    return signs.to("cpu", torch.int8)


def unpack_nibbles(packed):
    """uint8 [..., D/2] -> codes uint8 [..., D]: element 2i in the low nibble, 2i+1 in the high one
    (vLLM's pack_int4_nibbles; PTX cvt.rn.satfinite.e2m1x2.f32 for e2m1)."""
    import torch

    return torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(*packed.shape[:-1], 2 * packed.shape[-1])


def unswizzle_nvfp4_scales(stored, block_size, groups):
    """V's block scales of an NVFP4 page [heads, block_size, groups] back in token order: vLLM's
    reshape_and_cache_nvfp4 kernel stores the scale of (t, s) at (t // 4 * 4 + s // (S / 4),
    s % (S / 4) * 4 + t % 4), S = groups, for the SM100 trtllm-gen kernels."""
    import torch

    t = torch.arange(block_size)[:, None]
    s = torch.arange(groups)[None, :]
    quarter = groups // 4
    at_t = t // 4 * 4 + s // quarter
    at_s = s % quarter * 4 + t % 4
    return stored[:, at_t, at_s]


class SpecLayout:
    """One layer's cache as its spec describes it. dtype: the layer's format as kvscope's config
    names it; kernel_blocks_per_block: kernel blocks (B of the view) per KV cache manager block."""

    def __init__(self, spec, cache_dtype, what):
        self.what = what
        self.spec = spec
        self.mode = quant_mode_name(spec)
        self.is_mla = is_mla_spec(spec)
        heads = int(spec.num_kv_heads)
        self.head_size = int(spec.head_size)
        head_size_v = getattr(spec, "head_size_v", None)
        if getattr(spec, "tokens_per_state", 1) not in (1, None):
            self._refuse(f"{spec.tokens_per_state} tokens per stored state (compressed or pooled states)")
        if not self.is_mla and head_size_v not in (None, self.head_size):
            self._refuse("K and V of different widths")
        element = _DTYPE_BYTES.get(_dtype_name(spec.dtype))
        if element is None:
            self._refuse(f"cache dtype {spec.dtype}")
        slots = getattr(spec, "num_head_slots", None)
        content = getattr(spec, "state_content_bytes", None)
        d = self.head_size
        if self.is_mla:
            self.kind = "mla"
            self.dtype = "fp8_ds_mla" if getattr(spec, "cache_dtype_str", None) == "fp8_ds_mla" else (
                _dtype_name(spec.dtype) if self.mode == NONE else platform_fp8(FP8_FORMATS.get(cache_dtype)))
            if self.mode not in (NONE, FP8_PER_TENSOR) or self.dtype is None or slots not in (None, 1):
                self._refuse("an MLA cache in a format kvscope does not read")
            width = content if content is not None else d * element
            expect_slots = 1
        elif self.mode in (NONE, FP8_PER_TENSOR) and slots is None and content is None:
            self.kind, expect_slots, width = "packed", heads, 2 * d * element
            self.dtype = _dtype_name(spec.dtype) if self.mode == NONE else FP8_FORMATS.get(cache_dtype)
            if cache_dtype != "fp8_inc":  # Gaudi's
                self.dtype = platform_fp8(self.dtype)
            if self.dtype is None or self.dtype == "fp8_ds_mla":
                self._refuse(f"an fp8 cache of --kv-cache-dtype {cache_dtype!r}")
        elif self.mode == NONE and slots == 2 and content == heads * d * element and (d * element) % 16 == 0:
            self.kind, expect_slots, width = "kv_slots", 2, content
            self.dtype = _dtype_name(spec.dtype)
        elif self.mode in _PER_TOKEN_HEAD_FORMATS and slots is None and content == 2 * d + 8 and element == 1:
            self.kind, expect_slots, width = "per_token_head", heads, content
            self.dtype = platform_fp8(_PER_TOKEN_HEAD_FORMATS[self.mode])
        elif self.mode == INT4_PER_TOKEN_HEAD and slots is None and content == d + 8 and element == 1 and d % 2 == 0:
            self.kind, expect_slots, width = "int4_per_token_head", heads, content
            self.dtype = "int4_per_token_head"
            self.signs = rht_signs(d)
        elif self.mode == NVFP4 and slots == 2 * heads and content == d // 2 + d // 16 and element == 1 \
                and d % 64 == 0:
            self.kind, expect_slots, width = "nvfp4", 2 * heads, content
            self.dtype = "nvfp4"
        else:
            self._refuse(f"kv_quant_mode {self.mode} with {slots} head slots of {content} bytes")
        self.heads = heads
        self.slots, self.content_bytes, self.element = expect_slots, width, element

    def _refuse(self, what):
        raise LayoutError(f"{self.what}: kvscope does not read {what} ({type(self.spec).__name__}: "
                          f"{_describe(self.spec)})")

    def check(self, tensor, num_blocks):
        """Checks that the registered view is what the spec says, [B, H, N, C] in the spec's dtype
        (an MLA view may come without its one head slot, as vLLM before #51718 gave it), and
        learns its kernel block size. Returns self."""
        slots, width, element = self.slots, self.content_bytes, self.element
        shape = tuple(int(s) for s in tensor.shape)
        if self.is_mla and len(shape) == 3:
            shape = (shape[0], 1) + shape[1:]
        if len(shape) != 4 or _dtype_name(tensor.dtype) != _dtype_name(self.spec.dtype):
            raise LayoutError(f"{self.what}: the cache is {tuple(tensor.shape)} {_dtype_name(tensor.dtype)}, not the "
                              f"[blocks, {slots}, tokens, {width // element}] {_dtype_name(self.spec.dtype)} view its "
                              f"spec describes ({_describe(self.spec)})")
        blocks, got_slots, tokens, got_width = shape
        block_size = int(self.spec.block_size)
        if tokens < 1 or block_size % tokens or blocks != num_blocks * (block_size // tokens) \
                or got_slots != slots or got_width * element != width:
            raise LayoutError(f"{self.what}: the cache has shape {tuple(tensor.shape)}; its spec describes "
                              f"[{num_blocks} blocks x kernel blocks, {slots}, a divisor of {block_size}, "
                              f"{width // element}] ({_describe(self.spec)})")
        if tensor.stride(-1) != 1:
            raise LayoutError(f"{self.what}: the cache's content axis has stride {tensor.stride(-1)}, not 1")
        if self.kind == "nvfp4":
            # A page's bytes go K data, K scales, V data, V scales over the whole block, which the
            # kernels address as head-major pages; other orders are not worked out here.
            if tensor.stride(2) != got_width or tensor.stride(1) != tokens * got_width:
                raise LayoutError(f"{self.what}: an NVFP4 cache with strides {tuple(tensor.stride())}: kvscope reads "
                                  "NVFP4 pages only in a head-major layout (VLLM_KV_CACHE_LAYOUT=HND)")
        if self.kind == "kv_slots" and tensor.stride(2) != got_width:
            # The kernels view each slot's [N, C] as one contiguous run (PagedAttention.split_kv_cache).
            raise LayoutError(f"{self.what}: K/V head slots with strides {tuple(tensor.stride())}: each slot's "
                              "tokens must be one contiguous run, as ROCm attention's kernels view them")
        self.kernel_block_size = tokens
        self.kernel_blocks_per_block = block_size // tokens
        return self

    def __repr__(self):
        return (f"SpecLayout({self.what}: {self.kind}, {self.dtype}, kernel blocks of {self.kernel_block_size} tokens, "
                f"{self.kernel_blocks_per_block} per KV cache block)")

    def read_blocks(self, tensor, block_ids):
        """The given KV cache blocks (the manager's ids) on the CPU, in kvscope's order: a dict of
        'k', 'v' [n, heads, block_size, head_size] (codes for quantised formats) with their
        scales, or for MLA {'latent': [n, block_size, width]}."""
        import torch

        if self.is_mla and tensor.dim() == 3:
            tensor = tensor.unsqueeze(1)
        ids = torch.as_tensor(list(block_ids), dtype=torch.long)
        r = self.kernel_blocks_per_block
        # Kernel block j of KV cache block b is b * r + j (vLLM's group_kernel_blocks).
        kernel_ids = (ids[:, None] * r + torch.arange(r)[None, :]).reshape(-1).to(tensor.device)
        picked = tensor.index_select(0, kernel_ids)
        if tensor.device.type != "cpu":
            torch.cuda.synchronize(tensor.device)
        picked = picked.cpu().contiguous()
        n = len(ids)

        def blocks_of(x):
            # [n * r, heads, tokens, width] -> [n, heads, r * tokens, width]: kernel blocks merged.
            _, h, t, w = x.shape
            return x.reshape(n, r, h, t, w).permute(0, 2, 1, 3, 4).reshape(n, h, r * t, w).contiguous()

        def scale_of(x):
            # 4 bytes of each (head, token) -> float32 [n, heads, block_size].
            return blocks_of(x.contiguous().view(torch.float32)).squeeze(-1)

        if self.kind == "mla":
            return {"latent": blocks_of(picked)[:, 0]}
        if self.kind == "packed":
            return {"k": blocks_of(picked[..., :self.head_size]), "v": blocks_of(picked[..., self.head_size:])}
        if self.kind == "kv_slots":
            # vllm/v1/attention/ops/paged_attn.py, split_kv_cache: x = 16 bytes of elements; a block's
            # K slot is [heads][D/x][N][x], its V slot [heads][D][N].
            tokens, d = self.kernel_block_size, self.head_size
            x = 16 // picked.element_size()
            k = picked[:, 0].reshape(n * r, self.heads, d // x, tokens, x).permute(0, 1, 3, 2, 4)
            v = picked[:, 1].reshape(n * r, self.heads, d, tokens).permute(0, 1, 3, 2)
            return {"k": blocks_of(k.reshape(n * r, self.heads, tokens, d)), "v": blocks_of(v)}
        raw = picked.view(torch.uint8)
        d = self.head_size
        if self.kind == "per_token_head":
            codes = picked if self.dtype == "int8" else raw
            return {"k": blocks_of(codes[..., :d]), "k_scale": scale_of(raw[..., d:d + 4]),
                    "v": blocks_of(codes[..., d + 4:2 * d + 4]), "v_scale": scale_of(raw[..., 2 * d + 4:])}
        if self.kind == "int4_per_token_head":
            half = d // 2
            out = {"rht_signs": self.signs.clone()}
            for part, start in (("k", 0), ("v", half + 4)):
                bits = blocks_of(raw[..., start + half:start + half + 4].contiguous().view(torch.int32)).squeeze(-1)
                out[part] = blocks_of(unpack_nibbles(raw[..., start:start + half]))
                out[part + "_zero_point"] = (bits & 0xF).to(torch.uint8)
                out[part + "_scale"] = (bits & ~0xF).view(torch.float32)
            return out
        return self._read_nvfp4_pages(raw, blocks_of)

    def _read_nvfp4_pages(self, raw, blocks_of):
        import torch

        h, d = self.heads, self.head_size
        tokens = self.kernel_block_size
        groups = d // 16
        pages = raw.reshape(raw.shape[0], 2, h * tokens * self.content_bytes)  # K side, V side
        out = {}
        for i, part in enumerate("kv"):
            side = pages[:, i]
            data = side[:, :h * tokens * d // 2].reshape(-1, h, tokens, d // 2)
            scales = side[:, h * tokens * d // 2:].reshape(-1, h, tokens, groups)
            if part == "v":
                scales = torch.stack([unswizzle_nvfp4_scales(page, tokens, groups) for page in scales])
            out[part] = blocks_of(unpack_nibbles(data))
            out[part + "_scale"] = blocks_of(scales.contiguous())
        return out
