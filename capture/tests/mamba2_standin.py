"""A small Mamba2 mixer and a small Gated DeltaNet in numpy (double precision), the states the
stand-ins of vLLM and of the HF reference hold for a hybrid model's state-space layers, and how
vLLM shards them over TP.

The recurrence is the published one (Dao and Gu, "Transformers are SSMs", 2024, the SSD layer;
transformers' Mamba2Mixer.torch_forward computes the same): for each token t,
    xBC_t = W_in e(token_t)                                  (conv_dim channels: x | B | C)
    window_t = the last d_conv inputs xBC_{t-d_conv+1..t}    (zeros before the sequence)
    u_t = silu(sum_k conv_w[:, k] * window_t[:, k] + conv_b), split into x (heads x head_dim), B, C
    dt_t = softplus(W_dt e(token_t) + dt_bias)                (per head)
    h_t[h] = exp(dt_t[h] A[h]) h_{t-1}[h] + dt_t[h] x_t[h] (outer) B_t[group of h]
The state after positions [0, p) is (the last d_conv - 1 inputs xBC, oldest first; h_{p-1}):
what vLLM's conv and SSM state blocks and HF's cache_params hold (conv_states keeps d_conv
columns, the newest last; the format keeps its last d_conv - 1)."""

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Mamba2Dims:
    heads: int = 4
    head_dim: int = 4
    d_state: int = 4
    n_groups: int = 1
    d_conv: int = 4
    vocab: int = 256
    hidden: int = 8

    @property
    def intermediate(self):
        return self.heads * self.head_dim

    @property
    def conv_dim(self):
        return self.intermediate + 2 * self.n_groups * self.d_state


def mamba2_states(tokens, dims, seed=0):
    """Every position's state, float64: conv [T, conv_dim, d_conv - 1] and ssm [T, heads, head_dim,
    d_state]; row p - 1 is the state after the positions [0, p)."""
    rng = np.random.default_rng(seed)
    embed = rng.standard_normal((dims.vocab, dims.hidden))
    w_in = rng.standard_normal((dims.conv_dim, dims.hidden)) / np.sqrt(dims.hidden)
    w_dt = rng.standard_normal((dims.heads, dims.hidden)) / np.sqrt(dims.hidden)
    conv_w = rng.standard_normal((dims.conv_dim, dims.d_conv)) / np.sqrt(dims.d_conv)
    conv_b = rng.standard_normal(dims.conv_dim) * 0.1
    dt_bias = rng.uniform(-3.0, -1.0, dims.heads)
    a = -np.exp(rng.uniform(-1.0, 1.0, dims.heads))
    per_group = dims.heads // dims.n_groups
    window = np.zeros((dims.conv_dim, dims.d_conv))
    h = np.zeros((dims.heads, dims.head_dim, dims.d_state))
    conv_out, ssm_out = [], []
    for token in tokens:
        e = embed[int(token) % dims.vocab]
        window = np.concatenate([window[:, 1:], (w_in @ e)[:, None]], axis=1)
        pre = (conv_w * window).sum(axis=1) + conv_b
        u = pre / (1.0 + np.exp(-pre))
        x = u[:dims.intermediate].reshape(dims.heads, dims.head_dim)
        b = u[dims.intermediate:dims.intermediate + dims.n_groups * dims.d_state].reshape(dims.n_groups, dims.d_state)
        dt = np.log1p(np.exp(w_dt @ e + dt_bias))
        for head in range(dims.heads):
            h[head] = np.exp(dt[head] * a[head]) * h[head] + dt[head] * np.outer(x[head], b[head // per_group])
        conv_out.append(window[:, 1:].copy())
        ssm_out.append(h.copy())
    return np.stack(conv_out), np.stack(ssm_out)


def rank_units(dims, tp, rank):
    """The whole model's conv channels and SSM heads that TP rank `rank` holds, in its order, as
    vLLM's MambaMixer2 shards them (vllm/model_executor/layers/mamba/mamba_mixer2.py): its share of
    x, then of B's and C's groups; with n_groups not a multiple of tp (vLLM allows it only for one
    group) every rank holds the group whole (extra_groups_for_head_shards)."""
    share = dims.intermediate // tp
    x = list(range(rank * share, (rank + 1) * share))
    if dims.n_groups % tp == 0:
        per = dims.n_groups // tp
        groups = range(rank * per, (rank + 1) * per)
    else:
        assert dims.n_groups == 1
        groups = range(1)
    b = [dims.intermediate + g * dims.d_state + j for g in groups for j in range(dims.d_state)]
    c = [dims.intermediate + (dims.n_groups + g) * dims.d_state + j for g in groups for j in range(dims.d_state)]
    heads = dims.heads // tp
    return x + b + c, list(range(rank * heads, (rank + 1) * heads))


# --- Gated DeltaNet (Qwen3-Next, Qwen3.5) ------------------------------------------------------------
@dataclass(frozen=True)
class GdnDims:
    """A Gated DeltaNet layer: num_k_heads q/k heads of head_k_dim, num_v_heads value heads of
    head_v_dim (several value heads share a key head), a causal conv over q | k | v."""
    num_k_heads: int = 2
    num_v_heads: int = 4
    head_k_dim: int = 4
    head_v_dim: int = 3
    d_conv: int = 4
    vocab: int = 256
    hidden: int = 8

    @property
    def conv_dim(self):
        return 2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim


def gdn_states(tokens, dims, seed=0):
    """Every position's state, float64: conv [T, conv_dim, d_conv - 1] (channels q | k | v) and
    recurrent [T, num_v_heads, head_k_dim, head_v_dim]; the gated delta rule (Yang, Kautz and
    Hatamizadeh, "Gated Delta Networks", 2024), as transformers' torch_recurrent_gated_delta_rule
    keeps it: S <- exp(g) S; S <- S + k (outer) beta (v - S^T k), with q and k L2-normalised after
    the conv's silu, g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b)."""
    rng = np.random.default_rng(seed)
    embed = rng.standard_normal((dims.vocab, dims.hidden))
    w_in = rng.standard_normal((dims.conv_dim, dims.hidden)) / np.sqrt(dims.hidden)
    w_a = rng.standard_normal((dims.num_v_heads, dims.hidden)) / np.sqrt(dims.hidden)
    w_b = rng.standard_normal((dims.num_v_heads, dims.hidden)) / np.sqrt(dims.hidden)
    conv_w = rng.standard_normal((dims.conv_dim, dims.d_conv)) / np.sqrt(dims.d_conv)
    dt_bias = rng.uniform(-1.0, 1.0, dims.num_v_heads)
    a_log = rng.uniform(-1.0, 1.0, dims.num_v_heads)
    key = dims.num_k_heads * dims.head_k_dim
    per_k = dims.num_v_heads // dims.num_k_heads
    window = np.zeros((dims.conv_dim, dims.d_conv))
    s = np.zeros((dims.num_v_heads, dims.head_k_dim, dims.head_v_dim))
    conv_out, state_out = [], []
    for token in tokens:
        e = embed[int(token) % dims.vocab]
        window = np.concatenate([window[:, 1:], (w_in @ e)[:, None]], axis=1)
        pre = (conv_w * window).sum(axis=1)
        u = pre / (1.0 + np.exp(-pre))
        k = u[key:2 * key].reshape(dims.num_k_heads, dims.head_k_dim)
        k = k / np.sqrt((k * k).sum(axis=1, keepdims=True) + 1e-6)
        v = u[2 * key:].reshape(dims.num_v_heads, dims.head_v_dim)
        g = -np.exp(a_log) * np.log1p(np.exp(w_a @ e + dt_bias))
        beta = 1.0 / (1.0 + np.exp(-(w_b @ e)))
        for h in range(dims.num_v_heads):
            kh = k[h // per_k]
            s[h] = np.exp(g[h]) * s[h]
            s[h] = s[h] + np.outer(kh, beta[h] * (v[h] - s[h].T @ kh))
        conv_out.append(window[:, 1:].copy())
        state_out.append(s.copy())
    return np.stack(conv_out), np.stack(state_out)


def gdn_rank_units(dims, tp, rank):
    """The conv channels and value heads TP rank `rank` holds, as vLLM shards a Gated DeltaNet
    (vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py: conv1d's q, k and v each split
    over the ranks by mamba_v2_sharded_weight_loader, no replication)."""
    key, q_share, v_share = dims.num_k_heads * dims.head_k_dim, dims.num_k_heads * dims.head_k_dim // tp, \
        dims.num_v_heads * dims.head_v_dim // tp
    q = list(range(rank * q_share, (rank + 1) * q_share))
    k = [key + c for c in q]
    v = list(range(2 * key + rank * v_share, 2 * key + (rank + 1) * v_share))
    heads = dims.num_v_heads // tp
    return q + k + v, list(range(rank * heads, (rank + 1) * heads))
