"""Where lm-head tensor parallelism applies, refused with a reason at start-up elsewhere; and its sizes.

The rules follow vllm-ascend's (``finegrained_tp_config.lmhead_tensor_parallel_size``): pure DP (TP=1), an MoE
model, N dividing the DP size. The kernel adds: no drafter (its passes run on busy ranks only), one pipeline stage (the head lives on the last stage only, whose
group would not be the DP group), untied word embeddings (a tied head is the full embedding, whose weight cannot be
a vocab shard).
"""

from __future__ import annotations

from typing import Any

from ascend_kernel.errors import KernelError

ASKED = ("ASCEND_KERNEL_LMHEAD_TENSOR_PARALLEL_SIZE (vllm-ascend's additional_config "
         "finegrained_tp_config.lmhead_tensor_parallel_size)")
#: vLLM's DEFAULT_VOCAB_PADDING_SIZE: the vocabulary is padded to a multiple of it before it is sharded
VOCAB_PADDING = 64


def requested_size(settings: Any) -> int:
    """The lm-head group size asked for (1: off)."""
    return int(getattr(settings, "lmhead_tensor_parallel_size", None) or 1)


def _size(config: Any, name: str) -> int:
    return int(getattr(getattr(config, "parallel_config", None), name, 1) or 1)


def problems(size: int, vllm_config: Any) -> list[str]:
    """Why lm-head TP of ``size`` cannot run on this configuration (empty: it can)."""
    if size <= 1:
        return []
    found = []
    tp, dp, pp = (_size(vllm_config, n) for n in ("tensor_parallel_size", "data_parallel_size",
                                                  "pipeline_parallel_size"))
    if tp > 1:
        found.append(f"tensor parallelism {tp}: lm-head TP is for pure data parallelism (vLLM's own lm head is "
                     "already vocab-parallel over the TP group); leave the key out, or run with TP=1")
    if size > dp:
        found.append(f"the lm-head group ({size}) is larger than the data-parallel size ({dp}); use a size that "
                     "divides the DP size (--data-parallel-size)")
    elif dp % size:
        found.append(f"{size} does not divide the data-parallel size {dp}; use a divisor of {dp}")
    if pp > 1:
        found.append(f"pipeline parallelism {pp}: the lm head lives on the last stage only; run with PP=1")
    if getattr(vllm_config, "speculative_config", None) is not None:
        found.append("speculative decoding: the drafter's logits are computed on busy ranks only, where the lm-head "
                     "group needs every rank; leave the key out, or run without a drafter")
    model = getattr(vllm_config, "model_config", None)
    if model is not None and not getattr(model, "is_moe", False):
        found.append("a dense model: lm-head TP applies to MoE models (as in vllm-ascend); leave the key out")
    vocab = int(model.get_vocab_size()) if model is not None and hasattr(model, "get_vocab_size") else 0
    if vocab and padded_vocab(vocab) % size:
        found.append(f"the padded vocabulary ({padded_vocab(vocab)} rows) does not split into {size} equal shards; "
                     "use a size that divides it (2, 4, 8 ...)")
    text = getattr(model, "hf_text_config", None) if model is not None else None
    if text is not None and getattr(text, "tie_word_embeddings", False):
        found.append("tied word embeddings: the head is the full embedding, which cannot be one vocab shard; "
                     "leave the key out")
    return found


def check(settings: Any, vllm_config: Any) -> None:
    """Refuse lm-head TP at start-up where it cannot apply, naming the key and what to use instead."""
    size = requested_size(settings)
    found = problems(size, vllm_config)
    if found:
        raise KernelError(f"lm-head tensor parallelism of size {size} (asked by {ASKED}) cannot run here:\n"
                          + "\n".join(f"- {p}" for p in found))


def padded_vocab(vocab: int, padding: int = VOCAB_PADDING) -> int:
    """The vocabulary rows vLLM allocates (padded to a multiple of ``padding``)."""
    return -(-vocab // padding) * padding


def head_shape(vocab: int, hidden: int, tp_size: int) -> dict[str, int]:
    """``{vocab_per_rank, weight_elements}`` of one rank's lm-head weight at group size ``tp_size``."""
    rows = padded_vocab(vocab) // tp_size
    return {"vocab_per_rank": rows, "weight_elements": rows * hidden}


def head_report(vocab: int, hidden: int, tp_size: int, element_bytes: int) -> dict[str, int]:
    """The report's ``lm_head`` object: ``{tp_size, vocab_per_rank, bytes}`` (this rank's weight bytes)."""
    shape = head_shape(vocab, hidden, tp_size)
    return {"tp_size": tp_size, "vocab_per_rank": shape["vocab_per_rank"],
            "bytes": shape["weight_elements"] * element_bytes}
