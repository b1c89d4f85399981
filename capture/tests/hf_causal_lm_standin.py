"""A stand-in for a HuggingFace causal LM and its DynamicCache, for the impact tests (transformers
is not installed here). It mirrors the interface impact relies on, as read in huggingface/transformers:

- `LlamaAttention.forward` (src/transformers/models/llama/modeling_llama.py at 5dd4a635): RoPE on
  the row's query and key, then `key_states, value_states = past_key_value.update(key_states,
  value_states, self.layer_idx, cache_kwargs)`, and attention over what update returned
  (transformers 5 passes no cache_kwargs: `past_key_values.update(key_states, value_states,
  self.layer_idx)`);
- the model's call `model(input_ids, attention_mask=[batch, past + new] (1 keep, 0 padding),
  position_ids, past_key_values, use_cache)` returning `.logits` and `.past_key_values`, the
  cache's length from `get_seq_length()`; the causal and sliding-window masks on cache slots
  (masking_utils: kv_idx <= q_idx, q_idx - kv_idx < sliding_window);
- DynamicCache (src/transformers/cache_utils.py at 004999d9): `update(key_states, value_states,
  layer_idx, cache_kwargs=None)` creates the layer lazily (a DynamicLayer when built without a
  config), appends along dim -2 and returns the layer's whole keys and values; `get_seq_length()`;
  `layers[i].keys / .values` (what kvscope_capture.hf_reference.hf_cache_layers reads).

Llama's computation (RMSNorm, neox RoPE, grouped KV heads, SiLU MLP), tiny and in any dtype."""

import math
import types

import torch


class StandinLayerCache:
    def __init__(self):
        self.keys = None
        self.values = None


class StandinDynamicCache:
    def __init__(self):
        self.layers = []

    def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
        while len(self.layers) <= layer_idx:
            self.layers.append(StandinLayerCache())
        layer = self.layers[layer_idx]
        if layer.keys is None:
            layer.keys, layer.values = key_states, value_states
        else:
            layer.keys = torch.cat([layer.keys, key_states], dim=-2)
            layer.values = torch.cat([layer.values, value_states], dim=-2)
        return layer.keys, layer.values

    def get_seq_length(self, layer_idx=0):
        if len(self.layers) <= layer_idx or self.layers[layer_idx].keys is None:
            return 0
        return self.layers[layer_idx].keys.shape[-2]


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(x, positions, theta):
    """x [batch, heads, seq, dim] rotated by positions [batch, seq] (neox: rotated halves)."""
    dim = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = positions.to(torch.float64)[..., None] * inv_freq  # [batch, seq, dim / 2]
    angles = torch.cat([angles, angles], dim=-1)[:, None]
    return (x * angles.cos().to(x.dtype)) + (rotate_half(x) * angles.sin().to(x.dtype))


class StandinConfig:
    def __init__(self, vocab=40, hidden=16, heads=4, kv_heads=2, layers=3, intermediate=24, theta=10000.0,
                 sliding_windows=None):
        self.vocab_size, self.hidden_size = vocab, hidden
        self.num_attention_heads, self.num_key_value_heads = heads, kv_heads
        self.head_dim = hidden // heads
        self.num_hidden_layers, self.intermediate_size = layers, intermediate
        self.rope_theta = theta
        self.sliding_windows = sliding_windows or [None] * layers  # per layer, None: full attention
        self.rms_norm_eps = 1e-6


class RMSNorm(torch.nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class StandinAttention(torch.nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.config, self.layer_idx = config, layer_idx
        d, h, kv = config.head_dim, config.num_attention_heads, config.num_key_value_heads
        self.q_proj = torch.nn.Linear(config.hidden_size, h * d, bias=False)
        self.k_proj = torch.nn.Linear(config.hidden_size, kv * d, bias=False)
        self.v_proj = torch.nn.Linear(config.hidden_size, kv * d, bias=False)
        self.o_proj = torch.nn.Linear(h * d, config.hidden_size, bias=False)

    def forward(self, x, position_ids, keep, past_key_values):
        batch, seq, _ = x.shape
        d = self.config.head_dim
        query = self.q_proj(x).view(batch, seq, -1, d).transpose(1, 2)
        key_states = self.k_proj(x).view(batch, seq, -1, d).transpose(1, 2)
        value_states = self.v_proj(x).view(batch, seq, -1, d).transpose(1, 2)
        query = rope(query, position_ids, self.config.rope_theta)
        key_states = rope(key_states, position_ids, self.config.rope_theta)
        if past_key_values is not None:
            cache_kwargs = {"cache_position": None}
            key_states, value_states = past_key_values.update(key_states, value_states, self.layer_idx, cache_kwargs)
        total = key_states.shape[-2]
        groups = self.config.num_attention_heads // self.config.num_key_value_heads
        key_states = key_states.repeat_interleave(groups, dim=1)
        value_states = value_states.repeat_interleave(groups, dim=1)
        # Masks on cache slots, as HF's: the query of slot total - seq + i sees slots <= its own,
        # within the sliding window, and not padding.
        q_slot = torch.arange(total - seq, total)[:, None]
        kv_slot = torch.arange(total)[None, :]
        allowed = kv_slot <= q_slot
        window = self.config.sliding_windows[self.layer_idx]
        if window:
            allowed = allowed & (q_slot - kv_slot < window)
        allowed = allowed[None, None] & keep[:, None, None, :total]
        scores = query @ key_states.transpose(-1, -2) / math.sqrt(d)
        scores = scores.masked_fill(~allowed, float("-inf"))
        weights = torch.softmax(scores.float(), dim=-1).to(query.dtype)
        out = (weights @ value_states).transpose(1, 2).reshape(batch, seq, -1)
        return self.o_proj(out)


class StandinDecoderLayer(torch.nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = StandinAttention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.gate_proj = torch.nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = torch.nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = torch.nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x, position_ids, keep, past_key_values):
        x = x + self.self_attn(self.input_layernorm(x), position_ids, keep, past_key_values)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(torch.nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))


class StandinCausalLM(torch.nn.Module):
    def __init__(self, config, seed=0):
        super().__init__()
        self.config = config
        generator = torch.Generator().manual_seed(seed)
        self.embed_tokens = torch.nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = torch.nn.ModuleList(StandinDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if "norm" in name:
                    p.copy_(1 + 0.1 * torch.randn(p.shape, generator=generator))
                else:
                    p.copy_(torch.randn(p.shape, generator=generator) / math.sqrt(p.shape[-1]))
                    if "embed" in name:
                        p.mul_(math.sqrt(p.shape[-1]))

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=True):
        batch, seq = input_ids.shape
        if past_key_values is None and use_cache:
            past_key_values = StandinDynamicCache()
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + seq)[None].expand(batch, seq)
        keep = torch.ones(batch, past + seq, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, position_ids, keep, past_key_values)
        return types.SimpleNamespace(logits=self.lm_head(self.norm(x)), past_key_values=past_key_values)
