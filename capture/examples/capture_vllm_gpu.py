"""Capture the KV cache of upstream vLLM on GPU, and its HF reference, into one kvscope bundle.

Two ways (capture/README.md):

    # the KV connector: every finished request's blocks, then the reference over the engine's tokens
    python capture_vllm_gpu.py connector --model meta-llama/Llama-3.1-8B-Instruct --out capture.h5

    # the worker extension: a teacher-forced loop that records a snapshot per generate call
    python capture_vllm_gpu.py validation --model meta-llama/Llama-3.1-8B-Instruct --out capture.h5

    kvscope capture.h5

Options: --tp/--pp, --kv-cache-dtype (auto, fp8, fp8_e5m2, int8_per_token_head, fp8_per_token_head,
int4_per_token_head, nvfp4), --kv-cache-dtype-skip-layers 0,31 (those layers stay bf16, and the bundle
says so layer by layer), --beside '{"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}'
(kvscope's connector runs next to that one inside vLLM's MultiConnector).

Needs vLLM, transformers and kvscope_capture (pip install ./capture) in one environment.

Checked against (by reading their sources; kvscope's tests run stand-ins of them, not a GPU): vLLM
main of late 2026 (the KV cache layout refactor, Model Runner V2 as the default for dense models),
the tree of 2026-08-19, and vLLM 0.10 to the spring of 2026 (the first model runner). Both runners
work; nothing to set.

What to expect: "wrote capture.h5: N prompts"; `kvscope capture.h5` (or `kvscope analyze capture.h5`)
then shows each layer's error in its format's noise floors. A clean bf16 run has no suspect: every
cell near 1 floor of bf16 noise. With a quantised cache (fp8, int8 / int4 per token-head, nvfp4) the
floors are that format's, so a clean run is quiet too. Where vLLM's KV departs from the reference,
the suspects name the layer, token, head and block. A model whose cache kvscope cannot read stops
at start-up with a message naming the layer and its spec.
"""

import json

import argparse
import sys
import tempfile

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from vllm import LLM, SamplingParams

from kvscope_capture import (BundleWriter, bundle_from_shards, extract_hf_kv_caches_teacher_forced,
                             extract_vllm_kv_cache_config, make_kv_extract_fn, wait_for_shards)


def cache_options(args):
    options = {"kv_cache_dtype": args.kv_cache_dtype}
    if args.kv_cache_dtype_skip_layers:
        options["kv_cache_dtype_skip_layers"] = args.kv_cache_dtype_skip_layers.split(",")
    return options


def with_connector(args, tokenizer, reference):
    from vllm.config import KVTransferConfig

    shards = args.shards or tempfile.mkdtemp(prefix="kv-shards-")
    kvscope = {"kv_connector": "KvscopeConnector", "kv_connector_module_path": "kvscope_capture.vllm.connector",
               "kv_role": "kv_producer", "kv_connector_extra_config": {"output_dir": shards}}
    if args.beside:  # both connectors, inside vLLM's MultiConnector
        transfer = KVTransferConfig(kv_connector="MultiConnector", kv_role="kv_both",
                                    kv_connector_extra_config={"connectors": [json.loads(args.beside), kvscope]})
    else:
        transfer = KVTransferConfig(**kvscope)
    llm = LLM(args.model, tensor_parallel_size=args.tp, pipeline_parallel_size=args.pp, dtype="bfloat16",
              kv_transfer_config=transfer, **cache_options(args))
    params = SamplingParams(max_tokens=args.new_tokens, temperature=0.0, ignore_eos=True)
    llm.generate(args.prompts, params)
    # The engine writes a request's shards in the step after it finished: wait for them.
    wait_for_shards(shards, len(args.prompts))
    del llm
    written = bundle_from_shards(shards, args.out, reference, tokenizer=tokenizer, model=args.model,
                                 log=lambda line: print(line, file=sys.stderr))
    print(f"wrote {args.out}: {len(written)} prompts (shards in {shards})")


def with_worker_extension(args, tokenizer, reference):
    """A teacher-forced loop: the engine decodes greedily; where its token differs from the
    reference's (the teacher), the snapshot so far is recorded and the engine is re-prefilled with
    the teacher's token there. One request at a time, prefix caching off."""
    llm = LLM(args.model, tensor_parallel_size=args.tp, pipeline_parallel_size=args.pp, dtype="bfloat16",
              enable_prefix_caching=False, worker_extension_cls="kvscope_capture.vllm.KvscopeWorkerExtension",
              **cache_options(args))
    with BundleWriter(args.out, model=args.model, engine="vLLM", notes="capture_vllm_gpu.py validation") as w:
        w.set_kv_cache_config(extract_vllm_kv_cache_config(llm))
        for i, text in enumerate(args.prompts):
            pid = f"prompt_{i}"
            prompt = tokenizer(text).input_ids
            with torch.no_grad():  # the teacher: the reference's greedy tokens
                ids = torch.tensor([prompt])
                for _ in range(args.new_tokens):
                    ids = torch.cat([ids, reference(input_ids=ids).logits[:, -1:].argmax(-1)], 1)
            teacher = ids[0, len(prompt):].tolist()
            tokens = prompt + teacher
            w.add_prompt(pid, tokens, len(prompt), token_strings=[tokenizer.decode([t]) for t in tokens])
            kv_extract_fn = make_kv_extract_fn(llm, w, pid)
            divergences, start = [], len(prompt)
            while start < len(tokens):
                n = len(tokens) - start
                out = llm.generate({"prompt_token_ids": tokens[:start]},
                                   SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
                got = out[0].outputs[0].token_ids
                d = next((k for k in range(len(got)) if got[k] != tokens[start + k]), None)
                # The engine's cache now holds positions [0, start + len(got) - 1).
                kv_extract_fn(start + len(got))
                if d is None:
                    break
                divergences.append(start + d)
                start = start + d + 1  # re-prefill with the teacher's token at the divergence
            w.set_divergence(pid, divergences)
            logits, kv = extract_hf_kv_caches_teacher_forced(reference, prompt, teacher, return_logits=True)
            w.add_reference_kv(pid, "expected", kv)
            w.add_logits(pid, "expected", logits)
    print(f"wrote {args.out}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["connector", "validation"])
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", default="capture.h5")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--kv-cache-dtype", default="auto",
                        help="auto, fp8, fp8_e5m2, int8_per_token_head, fp8_per_token_head, int4_per_token_head, nvfp4")
    parser.add_argument("--kv-cache-dtype-skip-layers", help="layers kept in bf16, e.g. 0,31")
    parser.add_argument("--beside", help="another connector's KVTransferConfig as JSON, run beside kvscope's")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--shards", help="the connector's output_dir (default: a new temporary folder)")
    parser.add_argument("prompts", nargs="*", default=["The capital of France is", "def fibonacci(n):"])
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    reference = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.bfloat16).eval()
    (with_connector if args.mode == "connector" else with_worker_extension)(args, tokenizer, reference)


if __name__ == "__main__":
    main()
