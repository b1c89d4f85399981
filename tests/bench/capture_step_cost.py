"""What capturing costs vLLM's engine step, on the stand-in of vLLM main (capture/tests/vllm_main.py):
requests of a Llama-shaped model (8 KV heads of 128, bf16, block size 16) run through KvscopeConnector;
for the step in which a finished request's blocks are copied out, the time of the step with the
shards written off the step (the connector as shipped) against the same step when the shard is
written before the step returns (what a synchronous writer costs). One process, one run: only the
ratio between the two means anything on another machine.

    PYTHONPATH=capture:capture/tests python3 tests/bench/capture_step_cost.py [--layers 16] [--tokens 2048] [--requests 4]
"""

import argparse
import statistics
import tempfile
import time

import torch

import vllm_main as vm
from kvscope_capture.vllm.connector import KvscopeConnector


def run(layers, tokens, requests, synchronous):
    names = [f"model.layers.{i}.self_attn.attn" for i in range(layers)]
    blocks_per_request = -(-tokens // 16)
    with tempfile.TemporaryDirectory() as out:
        engine = vm.Engine([vm.Group(names)], total_heads=8, head_size=128,
                           num_blocks=blocks_per_request * (requests + 1) + 1,
                           connector=(KvscopeConnector, {"output_dir": out, "max_pending_requests": requests}),
                           earlier_requests=False)
        connector = engine.workers[0].connector
        g = torch.Generator().manual_seed(0)
        data = {n: {p: torch.randn(8, tokens, 128, generator=g).to(torch.bfloat16) for p in "kv"} for n in names}
        step_times = []
        for i in range(requests):
            engine.add_request(f"r{i}", list(range(tokens - 1)), [1], data)
            while not all(r.done for r in engine.requests.values()) or engine.finished_pending:
                copying = any(  # a request finishes in this step: its blocks are copied out
                    not r.done and r.num_computed_tokens >= len(r.prompt_token_ids) + len(r.output_token_ids) - 1
                    for r in engine.requests.values())
                start = time.perf_counter()
                engine.step()
                if synchronous:
                    connector._writer.flush()
                elapsed = time.perf_counter() - start
                if copying:
                    step_times.append(elapsed)
        connector._writer.flush()
        return step_times


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--requests", type=int, default=4)
    args = parser.parse_args()
    size_mb = args.layers * 2 * 8 * args.tokens * 128 * 2 / 1e6
    print(f"{args.layers} layers x {args.tokens} tokens, 8 KV heads of 128, bf16: {size_mb:.0f} MB a request")
    results = {}
    for synchronous in (True, False):
        times = run(args.layers, args.tokens, args.requests, synchronous)
        results[synchronous] = statistics.median(times)
        print(f"  step that copies a finished request out, shard written {'in the step' if synchronous else 'off the step'}: "
              f"median {results[synchronous] * 1e3:.1f} ms over {len(times)} steps")
    print(f"  off the step / in the step: {results[False] / results[True]:.2f}")


if __name__ == "__main__":
    main()
