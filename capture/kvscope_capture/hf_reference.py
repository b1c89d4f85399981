"""The reference side: what a HuggingFace model's cache holds, per layer, whatever transformers'
version, and the MLA latents that HF's DeepSeek never caches."""


def hf_cache_layers(past):
    """(k, v) per layer, [batch, kv_heads, seq, head_dim], from HF past_key_values: a Cache with
    `layers[i].keys / .values` (transformers >= 4.54), an older DynamicCache (`key_cache` /
    `value_cache`, removed in 4.56), or the legacy tuple of (k, v)."""
    layers = getattr(past, "layers", None)
    if layers is not None:
        return tuple((layer.keys, layer.values) for layer in layers)
    if hasattr(past, "key_cache") and hasattr(past, "value_cache"):
        return tuple(zip(past.key_cache, past.value_cache))
    if hasattr(past, "to_legacy_cache"):
        past = past.to_legacy_cache()
    return tuple((layer[0], layer[1]) for layer in past)


def _mla_attentions(model):
    """HF's DeepSeek-V2/V3 attention modules (and Kimi K2's, the same code), in model order."""
    return [(name, module) for name, module in model.named_modules()
            if hasattr(module, "kv_a_layernorm") and hasattr(module, "kv_a_proj_with_mqa")]


def _interleave_pairs(x):
    """Rotary dims from halves order (x0..x{d/2-1}, y0..) back to pairs (x0, y0, x1, y1, ...)."""
    d = x.shape[-1]
    return x.reshape(*x.shape[:-1], 2, d // 2).transpose(-1, -2).reshape(x.shape)


def extract_hf_mla_latents(model, input_ids, teacher_tokens=(), rope_order="vllm", return_logits=False):
    """What vLLM's MLA cache holds, computed by HF's DeepSeek model over prompt + teacher tokens in
    one forward pass: per attention layer in model order, (c_kv [1, seq, kv_lora_rank],
    k_pe [1, seq, qk_rope_head_dim]).

    c_kv is the output of `self_attn.kv_a_layernorm` (a forward hook); k_pe is the rotary part of
    the keys HF caches (`past_key_values` keys [..., qk_nope_head_dim:], the same for every head),
    after RoPE. HF with `rope_interleave` rotates the de-interleaved (halves) order, vLLM the pairs
    (is_neox_style=False): rope_order "vllm" gives k_pe in vLLM's order, "hf" as HF caches it.
    return_logits: (logits, latents), the logits of the teacher positions [len(teacher_tokens),
    vocab] (step g predicts prompt_len + g), as extract_hf_kv_caches_teacher_forced gives them."""
    import torch

    if rope_order not in ("vllm", "hf"):
        raise ValueError(f"rope_order must be 'vllm' or 'hf', not {rope_order!r}")
    attentions = _mla_attentions(model)
    if not attentions:
        raise ValueError("the model has no MLA attention (modules with kv_a_layernorm and kv_a_proj_with_mqa)")
    latents = {}
    hooks = [module.kv_a_layernorm.register_forward_hook(
        lambda mod, args, out, name=name: latents.__setitem__(name, out.detach()))
        for name, module in attentions]
    ids = torch.cat([torch.as_tensor(input_ids).reshape(-1), torch.as_tensor(teacher_tokens, dtype=torch.long).reshape(-1)])
    try:
        with torch.no_grad():
            out = model(input_ids=ids.reshape(1, -1), use_cache=True)
    finally:
        for hook in hooks:
            hook.remove()
    cached = hf_cache_layers(out.past_key_values)
    if len(cached) != len(attentions):
        raise ValueError(f"the model cached {len(cached)} layers but has {len(attentions)} MLA attention modules")
    interleaved = bool(getattr(getattr(model, "config", None), "rope_interleave", False))
    result = []
    for (name, module), (keys, _) in zip(attentions, cached):
        k_pe = keys[:, 0, :, module.qk_nope_head_dim:]
        if rope_order == "vllm" and interleaved:
            k_pe = _interleave_pairs(k_pe)
        if name not in latents:
            raise ValueError(f"{name}.kv_a_layernorm did not run in the forward pass")
        result.append((latents[name], k_pe))
    if not return_logits:
        return tuple(result)
    start = torch.as_tensor(input_ids).numel() - 1
    return out.logits[0, start:start + len(teacher_tokens)], tuple(result)


def hf_state_layers(cache):
    """{layer index: (conv_states [batch, conv_dim, d_conv], the recurrent state [batch, heads,
    ...])} of the state-space layers in HF's cache: Mamba2's cache_params (Mamba2Cache,
    conv_states / ssm_states indexed by layer), the hybrid models' caches that keep the same two
    lists beside their KV (HybridMambaAttentionDynamicCache: NemotronH, Granite 4, Falcon-H1,
    Zamba2; Qwen3-Next's conv_states / recurrent_states [batch, heads, head_k_dim, head_v_dim]; an
    attention layer's entries empty), or a cache of per-layer objects holding conv_states and
    ssm_states or recurrent_states (transformers 5)."""
    conv = getattr(cache, "conv_states", None)
    ssm = getattr(cache, "ssm_states", None)
    if ssm is None:
        ssm = getattr(cache, "recurrent_states", None)  # Qwen3-Next's cache (Gated DeltaNet)
    pairs = None
    if conv is not None and ssm is not None:
        pairs = [(conv[i], ssm[i]) for i in range(len(conv))]
    elif getattr(cache, "layers", None) is not None:
        pairs = [(getattr(layer, "conv_states", None),
                  getattr(layer, "ssm_states", getattr(layer, "recurrent_states", None))) for layer in cache.layers]
    if pairs is None:
        raise ValueError(f"HF's cache ({type(cache).__name__}) holds no conv_states / ssm_states: not a state-space "
                         "model's cache")
    return {i: (c, s) for i, (c, s) in enumerate(pairs)
            if c is not None and s is not None and c.numel() and s.numel()}


def extract_hf_mamba_states(model, tokens, positions, state_part="ssm"):
    """The HF model's recurrent state of every state-space layer after each of `positions` tokens
    (increasing, each in 1..len(tokens)): {layer index: {'conv': [c, conv_dim, d_conv - 1] (the
    last d_conv - 1 columns of conv_states, oldest first), state_part: [c, heads, ...]}} (Mamba2's
    SSM state [heads, head_dim, d_state], "ssm"; Gated DeltaNet's [heads, head_k_dim, head_v_dim],
    "recurrent").

    HF's Mamba2 mixers continue a cached sequence one token at a time (a forward over several
    tokens with a cache position past 0 takes the single-step path), so each checkpoint is a
    prefill of its prefix from the start: the cost is the sum of the positions in tokens (one
    checkpoint at the end: one forward pass over the sequence), with the states of one checkpoint
    in memory at a time beside what is kept."""
    import torch

    ids = torch.as_tensor(tokens).reshape(1, -1)
    positions = [int(p) for p in positions]
    if any(b <= a for a, b in zip(positions, positions[1:])) or not positions or positions[0] < 1 \
            or positions[-1] > ids.shape[1]:
        raise ValueError(f"positions {positions[:8]} must increase within 1..{ids.shape[1]}")
    found = {}
    with torch.no_grad():
        for p in positions:
            out = model(input_ids=ids[:, :p], use_cache=True)
            cache = getattr(out, "cache_params", None)
            if cache is None:
                cache = getattr(out, "past_key_values", None)
            for index, (conv, ssm) in hf_state_layers(cache).items():
                entry = found.setdefault(index, {"conv": [], state_part: []})
                width = conv.shape[-1] - 1  # d_conv - 1
                entry["conv"].append(conv[0, :, conv.shape[-1] - width:].detach().cpu().clone())
                entry[state_part].append(ssm[0].detach().cpu().clone())
    return {index: {part: torch.stack(values) for part, values in entry.items()} for index, entry in found.items()}
