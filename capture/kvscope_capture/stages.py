"""Pipeline stages merged into one model: with pipeline parallelism each worker holds only its
stage's layers, and reports a KV cache config of those layers alone. vLLM orders workers by global
rank, pp_rank * tp_size + tp_rank (tensor parallelism innermost)."""

from .kv_cache_config import model_order


def merge_stage_configs(configs):
    """One KV cache config from the configs of every stage (any number of workers; their tp/pp
    ranks, when given, are dropped). Groups are matched by index: vLLM's scheduler gives every
    stage the same groups, with each stage's own layers."""
    configs = list(configs)
    if not configs:
        raise ValueError("kv_cache_config: no worker returned one")
    first = configs[0]
    merged = {k: v for k, v in first.items() if k not in ("groups", "tp_rank", "pp_rank")}
    merged["groups"] = [dict(g, layer_names=[]) for g in first["groups"]]
    for c, config in enumerate(configs):
        for key in ("num_blocks", "tp_size", "total_num_kv_heads"):
            if config.get(key) != first.get(key):
                raise ValueError(f"kv_cache_config of worker {c}: {key} {config.get(key)!r} differs from worker 0's "
                                 f"{first.get(key)!r}")
        if len(config["groups"]) != len(first["groups"]):
            raise ValueError(f"kv_cache_config of worker {c}: {len(config['groups'])} groups, worker 0 has "
                             f"{len(first['groups'])}")
        for g, group in enumerate(config["groups"]):
            target = merged["groups"][g]
            for key, value in group.items():
                if key != "layer_names" and target.get(key) != value:
                    raise ValueError(f"kv_cache_config of worker {c}, group {g}: {key} {value!r} differs from "
                                     f"worker 0's {target.get(key)!r}")
            for name in group["layer_names"]:
                if name not in target["layer_names"]:
                    target["layer_names"].append(name)
    for group in merged["groups"]:
        group["layer_names"] = model_order(group["layer_names"])
    return merged


def merge_stage_caches(per_worker, tp_size):
    """Per TP rank, the layers of every stage: per_worker[i] ({layer: kv}) is worker i, whose TP rank
    is i % tp_size. A layer held by two stages of one TP rank is an error."""
    per_worker = list(per_worker)
    if len(per_worker) % tp_size:
        raise ValueError(f"{len(per_worker)} workers' KV caches do not divide into tp_size {tp_size} ranks")
    merged = [dict() for _ in range(tp_size)]
    for i, layers in enumerate(per_worker):
        rank = merged[i % tp_size]
        for name, kv in layers.items():
            if name in rank:
                raise ValueError(f"layer {name!r}: held by two pipeline stages of TP rank {i % tp_size}")
            rank[name] = kv
    return merged
