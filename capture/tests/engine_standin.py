"""Stand-ins for what the tests cannot have here: a vLLM engine (its RPC results, exactly as the
workers return them) and an HF model (the HF call interface), both small and deterministic."""

import io
import types

import numpy as np
import torch


def torch_save_bytes(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


class PagedEngine:
    """Lays per-layer contiguous KV ([heads, seq, dim], bf16) into a vLLM-like paged cache:
    a shuffled block pool (block 0 is the null block), one table per group, SlidingWindowSpec
    blocks out of the window freed (-1), TP shards partitioned or replicated. Written
    independently of kvscope's own layout code, so that reading it back tests the reader."""

    def __init__(self, config, seed):
        self.config = config
        self.rng = np.random.default_rng(seed)

    def heads_of_rank(self, rank, group):
        # A group of another KV head count than the model's carries its own total.
        total = group.get("total_num_kv_heads") or self.config["total_num_kv_heads"]
        tp = self.config["tp_size"]
        if total >= tp:
            per = total // tp
            return list(range(rank * per, (rank + 1) * per))
        return [rank // (tp // total)]

    def snapshot(self, layers, seq_len, scales=None, pinned=None):
        """layers: {name: (k, v)} contiguous [heads, >= seq_len - 1, dim] bf16 (or uint8 codes of a
        quantised cache, with `scales` {name: (k_scale, v_scale)}, each a number, per head [heads],
        or per token and head [heads, >= seq_len - 1]). Returns the RPC results (per-rank dicts of
        torch.save bytes, per-group table bytes) and the tables. pinned: {group: {logical block:
        physical block}} placed where a prefix-cache hit finds them."""
        cfg = self.config
        written = seq_len - 1
        pool = list(self.rng.permutation(np.arange(1, cfg["num_blocks"])))
        tables = []
        for group in cfg["groups"]:
            bs = group["block_size"]
            cols = (seq_len + bs - 1) // bs + 2  # rows are longer than the sequence
            row = [-1] * cols
            if group["spec_type"] == "MambaSpec":  # its state lives elsewhere; nothing per token
                tables.append(np.array([row], dtype=np.int32))
                continue
            # Prefix caching: pinned {group: {logical: physical}} blocks another request wrote.
            fixed = (pinned or {}).get(len(tables), {})
            pool = [b for b in pool if b not in fixed.values()]
            for b in range((written + bs - 1) // bs):
                row[b] = int(fixed[b]) if b in fixed else int(pool.pop())
            first_held = 0
            if group["spec_type"] == "SlidingWindowSpec":
                first_held = max(0, written - group["sliding_window"] + 1)
            if group["spec_type"] == "ChunkedLocalAttentionSpec":  # the next token's chunk
                first_held = written // group["attention_chunk_size"] * group["attention_chunk_size"]
            for b in range(first_held // bs):
                row[b] = -1  # freed: the null block
            tables.append(np.array([row], dtype=np.int32))
        per_rank = []
        for rank in range(cfg["tp_size"]):
            caches = {}
            for g, group in enumerate(cfg["groups"]):
                heads = self.heads_of_rank(rank, group)
                bs = group["block_size"]
                if group["spec_type"] == "MambaSpec":
                    continue
                for name in group["layer_names"]:
                    k, v = layers[name]
                    shape = (cfg["num_blocks"], len(heads), bs, group["head_size"])
                    # Garbage everywhere first: other sequences' data.
                    if k.dtype == torch.uint8:
                        kc = torch.randint(0, 0x70, shape, dtype=torch.uint8)
                        vc = torch.randint(0, 0x70, shape, dtype=torch.uint8)
                    else:
                        kc = torch.randn(shape).to(torch.bfloat16)
                        vc = torch.randn(shape).to(torch.bfloat16)
                    paged_scales = []
                    for s in (scales or {}).get(name, ()):
                        s = torch.as_tensor(s, dtype=torch.float32)
                        paged_scales.append(s if s.dim() == 0 else s[heads] if s.dim() == 1
                                            else torch.ones(shape[:3]))
                    for b, phys in enumerate(tables[g][0]):
                        if phys < 0:
                            continue
                        for o in range(bs):
                            p = b * bs + o
                            if p < written:
                                kc[phys, :, o] = k[heads, p]
                                vc[phys, :, o] = v[heads, p]
                                for paged, given in zip(paged_scales, scales[name] if scales else ()):
                                    if paged.dim() == 3:
                                        paged[phys, :, o] = torch.as_tensor(given)[heads, p]
                    entry = {"k": kc, "v": vc}
                    if paged_scales:
                        entry["k_scale"], entry["v_scale"] = paged_scales
                    caches[name] = torch_save_bytes(entry)
            per_rank.append(caches)
        table_bytes = [torch_save_bytes(torch.from_numpy(t)) for t in tables]
        return per_rank, table_bytes


class FakeLLM:
    """Answers collective_rpc as vLLM workers do: one result per TP rank."""

    def __init__(self, config, per_rank, table_bytes):
        self.config, self.per_rank, self.table_bytes = config, per_rank, table_bytes

    def collective_rpc(self, method):
        if method == "get_kv_cache_config":
            return [self.config] * self.config["tp_size"]
        if method == "get_kv_caches":
            return self.per_rank
        if method == "get_block_tables":
            return [self.table_bytes] * self.config["tp_size"]
        raise AttributeError(method)


class TinyHFModel(torch.nn.Module):
    """A two-layer attention model with the HF call interface: model(input_ids=...,
    past_key_values=..., use_cache=True) -> .logits [1, n, vocab], .past_key_values."""

    def __init__(self, vocab=32, heads=2, dim=4, layers=2, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.heads, self.dim, self.vocab = heads, dim, vocab
        hidden = heads * dim
        self.embed = torch.randn(vocab, hidden, generator=g)
        self.wk = [torch.randn(hidden, hidden, generator=g) / hidden ** 0.5 for _ in range(layers)]
        self.wv = [torch.randn(hidden, hidden, generator=g) / hidden ** 0.5 for _ in range(layers)]
        self.wq = [torch.randn(hidden, hidden, generator=g) / hidden ** 0.5 for _ in range(layers)]
        self.head = torch.randn(hidden, vocab, generator=g)

    def forward(self, input_ids, past_key_values=None, use_cache=True):
        x = self.embed[input_ids[0]]
        n = x.shape[0]
        past = past_key_values or [None] * len(self.wk)
        new_past = []
        for layer, (wq, wk, wv) in enumerate(zip(self.wq, self.wk, self.wv)):
            q = (x @ wq).view(n, self.heads, self.dim).transpose(0, 1)
            k = (x @ wk).view(n, self.heads, self.dim).transpose(0, 1).unsqueeze(0)
            v = (x @ wv).view(n, self.heads, self.dim).transpose(0, 1).unsqueeze(0)
            if past[layer] is not None:
                k = torch.cat([past[layer][0], k], 2)
                v = torch.cat([past[layer][1], v], 2)
            total = k.shape[2]
            scores = q @ k[0].transpose(1, 2) / self.dim ** 0.5
            mask = torch.arange(total)[None, :] > (torch.arange(n)[:, None] + total - n)
            scores = scores.masked_fill(mask, float("-inf"))
            x = x + (scores.softmax(-1) @ v[0]).transpose(0, 1).reshape(n, -1)
            new_past.append((k, v))
        return types.SimpleNamespace(logits=(x @ self.head).unsqueeze(0), past_key_values=tuple(new_past))
