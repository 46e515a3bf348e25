"""Out-of-tree replacements of vLLM's ``MRotaryEmbedding`` and ``MMEncoderAttention`` over the ops seam.

What a vision-language model runs differently on an NPU: its decoder's rotary embedding takes three
position axes (mrope: ``torch_npu.npu_mrope``), and its vision encoder's attention runs over packed
images or windows (``npu_fused_infer_attention_score`` in the TND layout). Registered by the
``ascend`` layer-ops choice beside the RMSNorm/rotary replacements (:mod:`.seam_layers`); elsewhere
the pure-torch reference runs them, which is how they are tested inside vLLM-CPU against transformers.
Cases the seam ops do not cover take vLLM's own path inside the same layer: mrope with per-token
offsets or no key; encoder attention over a batch of several packed rows, or in FP8.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from vllm.model_executor.custom_op import CustomOp
from vllm.model_executor.layers.attention.mm_encoder_attention import MMEncoderAttention
from vllm.model_executor.layers.rotary_embedding.mrope import MRotaryEmbedding

from ascend_kernel import kernel as kernel_mod
from ascend_kernel.ops import get_ops
from ascend_kernel.oot_ops import register_oot
from ascend_kernel.upstream import rotary_cache_for

_built: Counter[str] = Counter()
#: encoder attention calls through the seam, per layer (each encoder forward pass calls every block once)
_encoder_calls: Counter[str] = Counter()


def _ops() -> Any:
    kernel = kernel_mod.current()
    return get_ops(kernel.settings.ops_provider, kernel.device_info.kind)


class AscendMRotaryEmbedding(MRotaryEmbedding):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seam_ops = _ops()
        _built["MRotaryEmbedding"] += 1

    def forward_oot(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None = None,
                    offsets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        if key is None or offsets is not None:
            return self.forward_native(positions, query, key, offsets)
        return self.seam_ops.mrope(positions, query, key, rotary_cache_for(self, query), self.head_size,
                                   list(self.mrope_section or [0, 0, 0]), self.is_neox_style,
                                   bool(self.mrope_interleaved))

    forward_cpu = forward_oot


class AscendMMEncoderAttention(MMEncoderAttention):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seam_ops = _ops()
        _built["MMEncoderAttention"] += 1

    def forward_oot(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    cu_seqlens: torch.Tensor | None = None, max_seqlen: torch.Tensor | None = None,
                    sequence_lengths: torch.Tensor | None = None) -> torch.Tensor:
        bsz, q_len = query.shape[:2]
        if self.fp8_enabled or (cu_seqlens is not None and bsz != 1) or key.shape[1] != q_len:
            return self.forward_native(query, key, value, cu_seqlens, max_seqlen, sequence_lengths)
        if cu_seqlens is None:  # every row of the batch is one sequence
            cu_seqlens = torch.arange(0, (bsz + 1) * q_len, q_len, dtype=torch.int32, device=query.device)
        tokens = bsz * q_len
        out = self.seam_ops.mm_encoder_attention(
            query.reshape(tokens, self.num_heads, self.head_size),
            key.reshape(tokens, self.num_kv_heads, self.head_size),
            value.reshape(tokens, self.num_kv_heads, self.head_size), cu_seqlens, self.scale)
        _encoder_calls[self.layer_name] += 1
        return out.view(bsz, q_len, self.num_heads, self.head_size) if query.dim() == 4 else out.view(bsz, q_len, -1)

    forward_cpu = forward_oot


REPLACEMENTS: dict[str, type[CustomOp]] = {"MRotaryEmbedding": AscendMRotaryEmbedding,
                                            "MMEncoderAttention": AscendMMEncoderAttention}


def register() -> list[str]:
    """Register both replacements once per process; a different class already there is an error."""
    for name, cls in REPLACEMENTS.items():
        register_oot(name, cls, "set ASCEND_KERNEL_LAYER_OPS=vllm-native")
    return sorted(REPLACEMENTS)


def mrope_calls() -> dict[str, int]:
    """mrope calls the seam ran in this process, ``plain`` and ``interleaved`` (counted by the providers' bodies,
    so a compiled graph's calls count and vLLM's native forward, if it ran instead, does not)."""
    from ascend_kernel.ops.mm_ops import MROPE_CALLS

    return {variant: MROPE_CALLS[variant] for variant in ("plain", "interleaved")}


def built_counts() -> dict[str, int]:
    """How many layers of each replaced class this process built, and the vision encoder's forward passes."""
    return {**_built, **({"encoder_passes": max(_encoder_calls.values())} if _encoder_calls else {})}
