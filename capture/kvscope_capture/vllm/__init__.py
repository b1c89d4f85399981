"""Capture from upstream vLLM (GPU): a worker extension with the KV-cache RPCs, a KV connector
that writes each finished request's blocks (kvscope_capture.vllm.connector, imported by vLLM
itself, since it needs vLLM), and each layer's cache layout read from its spec (older vLLM: from
its attention backend)."""

from .backend_layout import CacheLayout, detect_layout
from .spec_layout import LayoutError, SpecLayout
from .worker_extension import KvscopeWorkerExtension

__all__ = ["CacheLayout", "KvscopeWorkerExtension", "LayoutError", "SpecLayout", "detect_layout"]
