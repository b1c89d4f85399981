"""Capture from upstream vLLM (GPU): a worker extension with the KV-cache RPCs, a KV connector
that writes each finished request's blocks (kvscope_capture.vllm.connector, imported by vLLM
itself, since it needs vLLM), and the cache layout detected at run time."""

from .layout import CacheLayout, LayoutError, detect_layout
from .worker_extension import KvscopeWorkerExtension

__all__ = ["CacheLayout", "KvscopeWorkerExtension", "LayoutError", "detect_layout"]
