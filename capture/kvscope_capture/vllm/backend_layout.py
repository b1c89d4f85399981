"""How one layer's cache is laid out in vLLM before its specs described the layout (before July
2026: specs without num_head_slots), found from the attention backend, and its blocks read out.

Those versions' per-layer tensors differ by backend (logical shapes, as
`AttentionBackend.get_kv_cache_shape` returns them; HND/NHD changes only the strides):

    FlashAttention (until spring 2026)  (2, num_blocks, block_size, num_kv_heads, head_size)
    FlashAttention (June 2026), FlashInfer, Triton
                                        (num_blocks, 2, block_size, num_kv_heads, head_size)
    packed K/V (Triton, CPU)            (num_blocks, num_kv_heads, block_size, 2 * head_size)
    MLA                                 (num_blocks, block_size, head_size)

The layout is read from the backend, by asking it for the shape of a cache whose sizes are
sentinels (distinct numbers, so that each axis names its role), never guessed from the tensor's
shape (with 2 KV heads several layouts share one shape). An MLA layer is the exception: its spec
says it holds one latent per token, which leaves one way to read a 3-D tensor. Anything else is
refused by name: a guessed layout would read the wrong numbers without any error.

The axes' roles:
    "kv"      K (0) and V (1)
    "blocks"  physical blocks, in units of the kernel's block size
    "tokens"  positions within a kernel block
    "heads"   KV heads of this rank
    "dim"     head dimension
    "kv_dim"  K then V packed on the last axis (2 * head_size)
"""

import inspect

# Sentinel sizes: distinct, and not sums or multiples of one another in ways that could be
# mistaken (2 * dim is its own role). The block size is a multiple of 16, which backends require.
_SENTINEL = {"blocks": 1009, "tokens": 32, "heads": 3, "dim": 88}

# The backends' layouts, in vLLM's logical order (for names and messages).
KNOWN_LAYOUTS = {
    "flash_attn": ("kv", "blocks", "tokens", "heads", "dim"),
    "flashinfer": ("blocks", "kv", "tokens", "heads", "dim"),
    "packed_kv": ("blocks", "heads", "tokens", "kv_dim"),
}
KNOWN_MLA_LAYOUTS = {
    "mla": ("blocks", "tokens", "dim"),
    "mla_heads": ("blocks", "heads", "tokens", "dim"),
}


from .spec_layout import LayoutError


def _roles_of_shape(shape, sizes):
    """The role of each axis of `shape`, given the sizes of blocks/tokens/heads/dim; None when an
    axis matches no role or several."""
    candidates = {"kv": 2, "kv_dim": 2 * sizes["dim"], **sizes}
    roles = []
    for extent in shape:
        matches = [role for role, size in candidates.items() if size == extent]
        if len(matches) != 1:
            return None
        roles.append(matches[0])
    return tuple(roles)


def _layout_name(roles):
    for name, known in {**KNOWN_LAYOUTS, **KNOWN_MLA_LAYOUTS}.items():
        if known == roles:
            return name
    return "backend"


class CacheLayout:
    """One layer's cache layout: the role of each axis, the kernel's block size (which may be a
    fraction of the KV cache manager's block size), and whether it is MLA (one latent vector per
    token, no K/V and no head axis)."""

    def __init__(self, roles, kernel_block_size, manager_block_size, name):
        self.roles = tuple(roles)
        self.kernel_block_size = kernel_block_size
        self.manager_block_size = manager_block_size
        self.kernel_blocks_per_block = manager_block_size // kernel_block_size
        self.name = name
        self.is_mla = "kv" not in self.roles and "kv_dim" not in self.roles

    def __repr__(self):
        return (f"CacheLayout({self.name}: ({', '.join(self.roles)}), kernel blocks of {self.kernel_block_size} "
                f"tokens, {self.kernel_blocks_per_block} per KV cache block)")

    def read_blocks(self, tensor, block_ids):
        """The given KV cache blocks (the manager's ids) as CPU tensors in kvscope's order:
        (k, v) each [n, heads, block_size, head_size], or for MLA the latent [n, block_size, head_size]."""
        import torch

        ids = torch.as_tensor(list(block_ids), dtype=torch.long)
        r = self.kernel_blocks_per_block
        # Kernel block j of KV cache block b is b * r + j (vLLM's BlockTable.map_to_kernel_blocks).
        kernel_ids = (ids[:, None] * r + torch.arange(r)[None, :]).reshape(-1).to(tensor.device)
        picked = tensor.index_select(self.roles.index("blocks"), kernel_ids)
        if tensor.device.type != "cpu":
            torch.cuda.synchronize(tensor.device)
        picked = picked.cpu()
        n = len(ids)

        def to_kvscope(x, roles):
            # x has axes `roles` without kv: gather to [n*r, heads, tokens, dim], then merge kernel blocks.
            order = [roles.index(a) for a in ("blocks", "heads", "tokens", "dim")]
            x = x.permute(*order).contiguous()
            _, heads, tokens, dim = x.shape
            x = x.reshape(n, r, heads, tokens, dim).permute(0, 2, 1, 3, 4)
            return x.reshape(n, heads, r * tokens, dim).contiguous()

        if self.is_mla:
            roles = self.roles
            if "heads" in roles:  # one head slot
                picked, roles = picked.select(roles.index("heads"), 0), tuple(a for a in roles if a != "heads")
            order = [roles.index(a) for a in ("blocks", "tokens", "dim")]
            x = picked.permute(*order).contiguous()
            return x.reshape(n, r * x.shape[1], x.shape[2]).contiguous()
        if "kv" in self.roles:
            axis = self.roles.index("kv")
            rest = tuple(a for a in self.roles if a != "kv")
            return tuple(to_kvscope(picked.select(axis, i), rest) for i in (0, 1))
        axis = self.roles.index("kv_dim")
        dim = picked.shape[axis] // 2
        rest = tuple("dim" if a == "kv_dim" else a for a in self.roles)
        return tuple(to_kvscope(part, rest) for part in picked.split(dim, dim=axis))


def _check_fits(roles, shape, num_blocks, block_size, heads, dim, what):
    """The kernel block size this tensor's shape implies for `roles`, or a LayoutError."""
    tokens = shape[roles.index("tokens")]
    if tokens < 1 or block_size % tokens:
        raise LayoutError(f"{what}: blocks of {tokens} tokens do not divide the KV cache's block size {block_size}")
    want = {"kv": 2, "blocks": num_blocks * (block_size // tokens), "tokens": tokens, "heads": heads,
            "dim": dim, "kv_dim": 2 * dim}
    expected = tuple(want[role] for role in roles)
    if tuple(shape) != expected:
        raise LayoutError(f"{what}: shape {tuple(shape)} is not the layout ({', '.join(roles)}) = {expected} "
                          f"for {num_blocks} blocks of {block_size} tokens, {heads} heads of {dim}")
    return tokens


def _mla_from_tensor(shape, num_blocks, block_size, width, what):
    """An MLA cache's layout: one latent of `width` per token, with or without a head slot of one."""
    for name, roles in KNOWN_MLA_LAYOUTS.items():
        if len(roles) == len(shape):
            tokens = _check_fits(roles, shape, num_blocks, block_size, 1, width, what)
            return CacheLayout(roles, tokens, block_size, name)
    raise LayoutError(f"{what}: an MLA cache of shape {shape}, neither [blocks, tokens, {width}] nor "
                      f"[blocks, 1, tokens, {width}]")


# Backends whose kernels do not read the cache the way get_kv_cache_shape describes it: vLLM's
# ROCm attention reinterprets the bytes (PagedAttention.split_kv_cache: K as [B, H, D/x, N, x], V
# as [B, H, D, N]) in the versions read, and vLLM does not let connectors use it either.
REFUSED_BACKENDS = {"ROCM_ATTN": "its kernels reinterpret the cache's bytes, so its reported shape does not "
                                 "describe them"}


def _cache_shape(backend, sizes, cache_dtype_str):
    """backend.get_kv_cache_shape for `sizes`; older backends take no cache_dtype_str."""
    args = (sizes["blocks"], sizes["tokens"], sizes["heads"], sizes["dim"])
    try:
        params = inspect.signature(backend.get_kv_cache_shape).parameters
    except (TypeError, ValueError):
        params = {}
    if "cache_dtype_str" in params:
        return tuple(backend.get_kv_cache_shape(*args, cache_dtype_str=cache_dtype_str))
    return tuple(backend.get_kv_cache_shape(*args))


def _backend_roles(backend, block_size, num_kv_heads, head_size, cache_dtype_str, what):
    """The roles of the axes of the cache `backend` allocates, from its shape for sentinel sizes;
    None when the backend cannot say (it refuses both the sentinels and the layer's own sizes)."""
    name = getattr(backend, "__name__", type(backend).__name__)
    get_name = getattr(backend, "get_name", None)
    vllm_name = get_name() if callable(get_name) else None
    if vllm_name in REFUSED_BACKENDS:
        raise LayoutError(f"{what}: backend {vllm_name} ({name}): {REFUSED_BACKENDS[vllm_name]}; kvscope does not "
                          "read its cache")
    template = None
    # Backends may refuse sizes they do not serve; ask with the layer's own sizes then.
    for sizes in (dict(_SENTINEL),
                  {"blocks": _SENTINEL["blocks"], "tokens": block_size, "heads": num_kv_heads, "dim": head_size}):
        try:
            template = _cache_shape(backend, sizes, cache_dtype_str)
            break
        except Exception:
            continue
    if template is None:
        return None, name
    roles = _roles_of_shape(template, sizes)
    if roles is None or roles.count("blocks") != 1 or roles.count("tokens") != 1 or len(set(roles)) != len(roles) \
            or not ("dim" in roles or "kv_dim" in roles):
        raise LayoutError(f"{what}: backend {name} reports a cache of shape {template} for sizes {sizes} "
                          "(blocks, tokens, heads, dim): a layout kvscope does not know how to read")
    if "kv" not in roles and "kv_dim" not in roles and "heads" in roles and num_kv_heads != 1:
        raise LayoutError(f"{what}: backend {name} reports a cache of shape {template}: heads but no K/V axis")
    return roles, name


def detect_layout(tensor_shape, num_blocks, block_size, num_kv_heads, head_size, backend=None,
                  cache_dtype_str="auto", mla=False, what="KV cache"):
    """The CacheLayout of a layer's cache tensor of shape `tensor_shape`.

    num_blocks, block_size, num_kv_heads, head_size: the layer's KV cache spec as the KV cache
    manager sees it (vLLM's kv_cache_config: num_blocks, spec.block_size, spec.num_kv_heads,
    spec.head_size); mla: an MLAAttentionSpec layer (one latent per token). backend: the layer's
    attention backend class (anything with vLLM's `get_kv_cache_shape(num_blocks, block_size,
    num_kv_heads, head_size, cache_dtype_str)`); without one only an MLA cache can be read."""
    shape = tuple(int(s) for s in tensor_shape)
    if mla:
        return _mla_from_tensor(shape, num_blocks, block_size, head_size, what)
    if backend is None or not hasattr(backend, "get_kv_cache_shape"):
        raise LayoutError(f"{what}: no attention backend that reports its cache shape, and a spec without "
                          f"num_head_slots: kvscope does not guess a layout from the shape {shape}")
    roles, name = _backend_roles(backend, block_size, num_kv_heads, head_size, cache_dtype_str, what)
    if roles is None:
        raise LayoutError(f"{what}: backend {name} would not report its cache shape, for sentinel sizes nor for "
                          "the layer's own")
    if len(shape) == len(roles):
        try:
            tokens = _check_fits(roles, shape, num_blocks, block_size, num_kv_heads, head_size, what)
            return CacheLayout(roles, tokens, block_size, f"{_layout_name(roles)} ({name})")
        except LayoutError as e:
            raise LayoutError(f"{e} (backend {name})") from None
    raise LayoutError(f"{what}: the tensor has shape {shape}, not backend {name}'s layout ({', '.join(roles)})")
