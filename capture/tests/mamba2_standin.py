"""A small Mamba2 mixer in numpy (double precision), the state the stand-ins of vLLM and of the HF
reference hold for a hybrid model's state-space layers, and how vLLM shards that state over TP.

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
