"""A three-way capture as a user's looks, written by the Python writer with its defaults: a
Llama-shaped model (8 KV heads of 128), 16 layers, one 512-token prompt (448 prompt + 64
decoded), the engine's whole block pool stored (other sequences' blocks hold garbage), block
size 16, bf16 engine cache and expected reference, fp32 baseline. About 240 MB.

    PYTHONPATH=capture:capture/tests python3 tests/bench/python_writer_capture.py OUT.h5 [--layers 16] [--tokens 512]
"""

import argparse

import numpy as np
import torch

from engine_standin import PagedEngine
from kvscope_capture import BundleWriter


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--num-blocks", type=int, default=140)
    args = parser.parse_args()
    heads, dim, block = 8, 128, 16
    names = [f"model.layers.{i}.self_attn" for i in range(args.layers)]
    cfg = {"num_blocks": args.num_blocks, "tp_size": 1, "total_num_kv_heads": heads, "dcp_size": 1, "pcp_size": 1,
           "groups": [{"layer_names": names, "spec_type": "FullAttentionSpec", "block_size": block,
                       "sliding_window": None, "dtype": "torch.bfloat16", "num_kv_heads": heads, "head_size": dim}]}
    total, prompt_len = args.tokens, args.tokens - 64
    torch.manual_seed(0)
    baseline, expected, engine = {}, {}, {}
    for n in names:
        kv = [torch.randn(1, heads, total, dim) for _ in range(2)]
        baseline[n] = tuple(kv)
        expected[n] = tuple(t.to(torch.bfloat16) for t in kv)
        # The engine: the same values after other roundings (noise at bf16's level).
        engine[n] = tuple((t[0] * (1 + 2.0 ** -9 * torch.randn_like(t[0]))).to(torch.bfloat16) for t in kv)
    with BundleWriter(args.out, model="bench (Llama-shaped)", engine="stand-in") as w:
        w.set_kv_cache_config(cfg)
        w.add_prompt("p0", list(np.random.default_rng(0).integers(0, 128000, total)), prompt_len)
        rpc, tables = PagedEngine(cfg, seed=1).snapshot(engine, total)
        w.add_engine_snapshot("p0", rpc, tables, total)
        w.add_reference_kv("p0", "expected", expected)
        w.add_reference_kv("p0", "baseline", baseline)


if __name__ == "__main__":
    main()
