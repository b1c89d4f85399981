"""A stand-in for the parts of vLLM that kvscope_capture touches, mirroring the objects and
signatures of vllm-project/vllm's sources (v1: vllm/distributed/kv_transfer/kv_connector/v1/base.py,
vllm/distributed/parallel_state.py). Only for tests: no GPU, no vLLM install."""
