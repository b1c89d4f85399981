"""Capture what kvscope needs from a vLLM run and its HF reference, in one bundle.

The whole workflow of the seed tool's run_kv_cache_analysis example, writing a kvscope capture
bundle instead of comparing in Python. It needs vLLM (with the KV-cache RPCs: get_kv_caches,
get_kv_cache_config, get_block_tables) and transformers; every kvscope_capture function it
calls is tested against stand-ins in capture/tests.

    python run_kv_cache_capture.py --model meta-llama/Llama-3.1-8B-Instruct --out capture.h5
    kvscope capture.h5            # or: kvscope analyze capture.h5
"""

import argparse

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from vllm import LLM, SamplingParams
from vllm_neuron.accuracy import logit_validation  # or your engine's teacher-forced validation loop

from kvscope_capture import (BundleWriter, extract_hf_kv_caches_teacher_forced, extract_vllm_kv_cache_config,
                             generate_hf_logits_and_kv, make_kv_extract_fn)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", default="capture.h5")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--three-way", action="store_true", help="also run an fp32 baseline")
    parser.add_argument("prompts", nargs="*", default=["The capital of France is", "def fibonacci(n):"])
    args = parser.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    llm = LLM(args.model, tensor_parallel_size=args.tp, dtype="bfloat16", enable_prefix_caching=False)
    expected_model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.bfloat16)
    baseline_model = (AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.float32)
                      if args.three_way else None)

    with BundleWriter(args.out, model=args.model, engine="vLLM", notes="run_kv_cache_capture.py") as writer:
        writer.set_kv_cache_config(extract_vllm_kv_cache_config(llm))
        for i, text in enumerate(args.prompts):
            prompt_id = f"prompt_{i}"
            input_ids = tokenizer(text, return_tensors="pt").input_ids[0]
            # Teacher tokens: the baseline's greedy decode (three-way), else the expected model's.
            teacher_model = baseline_model or expected_model
            teacher_logits, _ = generate_hf_logits_and_kv(teacher_model, input_ids, args.new_tokens)
            teacher = teacher_logits.argmax(-1)
            expected_logits, expected_kv = extract_hf_kv_caches_teacher_forced(
                expected_model, input_ids, teacher, return_logits=True)
            tokens = torch.cat([input_ids, teacher])
            writer.add_prompt(prompt_id, tokens, len(input_ids),
                              token_strings=[tokenizer.decode([t]) for t in tokens.tolist()])
            writer.add_reference_kv(prompt_id, "expected", expected_kv)
            writer.add_logits(prompt_id, "expected", expected_logits)
            baseline_logits = None
            if baseline_model is not None:
                baseline_logits, baseline_kv = extract_hf_kv_caches_teacher_forced(
                    baseline_model, input_ids, teacher, return_logits=True)
                writer.add_reference_kv(prompt_id, "baseline", baseline_kv)
                writer.add_logits(prompt_id, "baseline", baseline_logits)

            def generate_fn(ids, num_tokens):
                params = SamplingParams(max_tokens=num_tokens, temperature=0.0, logprobs=20)
                return llm.generate({"prompt_token_ids": ids}, params)

            # One engine snapshot per generate call of the teacher-forced loop.
            passed, results, _ = logit_validation(
                input_ids=input_ids.tolist(), generate_fn=generate_fn, expected_logits=expected_logits,
                baseline_logits=baseline_logits, kv_extract_fn=make_kv_extract_fn(llm, writer, prompt_id))
            divergences = [r["index"] + len(input_ids) for r in results if r.get("diverged")]
            writer.set_divergence(prompt_id, divergences)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
