"""vllm/v1/attention/ops/triton_quant_kv/_hadamard.py (vllm-project/vllm @ 3629cf05): the +-1 signs
of the randomized Hadamard transform of int4 per-token-head caches, and the transform's CPU path."""

import torch

_RHT_SIGNS_CACHE = {}


def _get_rht_signs(d, round_idx, device):
    key = (d, round_idx, str(device))
    if key not in _RHT_SIGNS_CACHE:
        gen = torch.Generator(device="cpu")
        gen.manual_seed(0x9E3779B9 + round_idx * 0x517CC1B7)
        signs = 2.0 * torch.bernoulli(torch.full((d,), 0.5, device="cpu"), generator=gen) - 1.0
        _RHT_SIGNS_CACHE[key] = signs.to(device)
    return _RHT_SIGNS_CACHE[key]


def fast_hadamard_transform(x):
    """Unnormalised Walsh-Hadamard transform along the last axis (H_d H_d = d I)."""
    d = x.shape[-1]
    h = 1
    while h < d:
        xv = x.reshape(*x.shape[:-1], d // (2 * h), 2, h)
        a, b = xv[..., 0, :], xv[..., 1, :]
        x = torch.stack([a + b, a - b], dim=-2).reshape(x.shape)
        h <<= 1
    return x


def single_rht(x, inverse=False):
    d1 = _get_rht_signs(x.shape[-1], 0, x.device)
    return fast_hadamard_transform(x) * d1 if inverse else fast_hadamard_transform(x * d1)
