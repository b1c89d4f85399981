"""python3 -m kvscope_capture bundle --shards DIR --model HF_MODEL --out capture.h5

Turns the shards KvscopeConnector wrote during a vLLM run into a bundle, with the reference model
(HuggingFace transformers, bf16; --baseline adds an fp32 run for three-way analysis) teacher-forced
over the engine's own tokens. Then: kvscope capture.h5. With --engine-only, no reference: each end
of a KV transfer (the producer's and the consumer's shards), for kvscope transfer.

python3 -m kvscope_capture impact capture.h5 --model HF_MODEL

Puts the engine's KV into the reference model, per layer and from each layer on, and records per
decode step the KL of the next-token distribution and whether its argmax moved
(docs/bundle-format.md, "Impact")."""

import argparse
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m kvscope_capture")
    commands = parser.add_subparsers(dest="command", required=True)
    bundle = commands.add_parser("bundle", help="a bundle from KvscopeConnector's shards and a HF reference")
    bundle.add_argument("--shards", required=True, help="the connector's output_dir")
    bundle.add_argument("--model", help="HF model id or path (the reference)")
    bundle.add_argument("--engine-only", action="store_true",
                        help="no reference: the engine's KV alone (each end of a KV transfer)")
    bundle.add_argument("--out", required=True, help="the bundle to write (.h5)")
    bundle.add_argument("--baseline", action="store_true", help="also an fp32 baseline (three-way)")
    bundle.add_argument("--requests", nargs="*", help="request id prefixes to take (default: all)")
    impact = commands.add_parser("impact", help="the engine's KV put into the reference: KL per decode step")
    impact.add_argument("bundle", help="the capture bundle (.h5); its prompts get an impact/ group")
    impact.add_argument("--model", required=True, help="HF model id or path (the reference)")
    impact.add_argument("--device", help="torch device (default: cuda when available, else cpu)")
    impact.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"),
                        help="the model's dtype (default bfloat16, as the reference ran)")
    impact.add_argument("--engine-kv", help="`kvscope export BUNDLE OUT.h5` made beforehand (default: run kvscope, "
                                            "found by $KVSCOPE_BINARY or PATH)")
    impact.add_argument("--prompt", action="append", help="a prompt id (repeatable; default: every prompt with "
                                                          "teacher tokens)")
    impact.add_argument("--layers", help="the layers given `layer` and `from` rows: names or index ranges, "
                                         "comma-separated (default: every attention layer)")
    impact.add_argument("--schemes", help="also the reference's own KV of each layer quantised: "
                                          "fp8_e4m3/tensor,fp8_e5m2/tensor")
    impact.add_argument("--step-batch", type=int, help="decode steps per forward (default: as many as 1 GiB of "
                                                       "cache holds)")
    args = parser.parse_args(argv)
    if args.command == "impact":
        from .impact import load_and_run
        try:
            results = load_and_run(args)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        for pid, (transplants, kl, top1) in results.items():
            print(f"{pid}: {len(transplants)} transplants x {kl.shape[1]} steps, KL up to {kl.max():.3g} nats, "
                  f"top-1 changed at {int(top1.any(axis=0).sum())} of {kl.shape[1]} steps in some transplant")
        print(f"wrote the impact of {len(results)} prompts into {args.bundle}")
        return 0
    if not args.model and not args.engine_only:
        parser.error("bundle: --model (the reference) or --engine-only")

    if args.engine_only:
        from .from_shards import bundle_from_shards
        try:
            written = bundle_from_shards(args.shards, args.out, None, request_ids=args.requests, model=args.model or "",
                                         log=lambda line: print(line, file=sys.stderr))
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"wrote {args.out} (engine-only): {len(written)} prompts")
        return 0

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .from_shards import bundle_from_shards

    def load(dtype):
        return AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=dtype).eval()

    try:
        written = bundle_from_shards(args.shards, args.out, load(torch.bfloat16),
                                     load(torch.float32) if args.baseline else None,
                                     tokenizer=AutoTokenizer.from_pretrained(args.model),
                                     request_ids=args.requests, model=args.model,
                                     log=lambda line: print(line, file=sys.stderr))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: {len(written)} prompts ({', '.join(written[:5])}{' ...' if len(written) > 5 else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
