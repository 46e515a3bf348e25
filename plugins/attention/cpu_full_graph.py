"""vLLM's CPU attention, declared safe inside cpu-graph's whole-model artifacts.

vLLM dispatches full graphs (FULL_DECODE_ONLY) only to attention backends
whose metadata builder declares full-graph support, and its CPU attention
declares none: a CPU has no device graphs to replay its kernels from. Under
the kernel's ``cpu-graph`` mode nothing is replayed from a device graph: the
whole-model artifact calls attention as an opaque op, which runs vLLM's C++
kernels at every replay with the metadata built for that step. So the same
backend is safe there for any uniform batch, and this subclass says so
(nothing else differs). The vllm-native provider hands it out only when
cpu-graph captures whole decode batches; otherwise vLLM's class is used as is.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.attention.backend import AttentionCGSupport
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend, CPUAttentionMetadataBuilder

NAME = "CPU_ATTN_FULL_GRAPH"
PATH = f"{__name__}.CPUAttentionFullGraphBackend"


class CPUAttentionFullGraphMetadataBuilder(CPUAttentionMetadataBuilder):
    @classmethod
    def get_cudagraph_support(cls, vllm_config: Any, kv_cache_spec: Any) -> AttentionCGSupport:
        return AttentionCGSupport.UNIFORM_BATCH


class CPUAttentionFullGraphBackend(CPUAttentionBackend):
    @staticmethod
    def get_name() -> str:
        return NAME

    @staticmethod
    def get_builder_cls() -> type[CPUAttentionFullGraphMetadataBuilder]:
        return CPUAttentionFullGraphMetadataBuilder
