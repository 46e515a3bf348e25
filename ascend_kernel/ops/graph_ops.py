"""Seam ops a captured device graph launches as single tasks, and which of their params a task bakes in.

Full-graph decode (FULL_DECODE_ONLY) captures the attention kernel inside the
graph. Ascend's paged-attention kernel takes the sequence lengths as a *host*
tensor: they are read while the task is built, so a captured task holds their
values, not their address, and a replay reuses them until the task's params
are updated (``Device.graph_task_update``). ``paged_attention_out`` writes into
a given buffer (the captured output), so a re-issued update lands where the
graph reads it; registered as one torch op, it is one task to a recorder.
The cache write a decode graph replays each step (``reshape_and_cache``) is
one registered op for the same reason: one kernel on the device, and one
task to a recorder, whose padding slots are skipped inside it.

MLA's decode kernel (``_npu_paged_attention_mla``) reads its lengths on the
host the same way, so it has an out-variant too, ``paged_attention_mla_out``.
It takes no workspace: torch_npu documents no workspace query for it (unlike
``_npu_paged_attention_get_workspace``) and captures of it elsewhere issue it
without one, so its task sizes what it needs itself.
"""

from __future__ import annotations

#: schema of ``ascend_kernel::paged_attention_out`` after its provider handle
PAGED_ATTENTION_OUT_SCHEMA = ("Tensor query, Tensor key_cache, Tensor value_cache, Tensor block_table, "
                              "Tensor context_lens, float scale, int num_heads, int num_kv_heads, "
                              "Tensor(a!) out, Tensor? workspace) -> ()")

#: schema of ``ascend_kernel::paged_attention_mla_out``: MLA decode over the latent cache (values are the first
#: ``v_head_size`` columns of each cached row), written into ``out`` [tokens, num_heads, v_head_size]
PAGED_ATTENTION_MLA_OUT_SCHEMA = ("Tensor query, Tensor kv_cache, Tensor block_table, Tensor context_lens, "
                                  "float scale, int num_heads, int v_head_size, Tensor(a!) out) -> ()")

#: schema of ``ascend_kernel::reshape_and_cache``: the K/V cache write, one task that reads the slots by address
#: (a padded batch's negative slots are skipped inside it, so its work depends on the data, not its shape)
RESHAPE_AND_CACHE_SCHEMA = ("Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
                            "Tensor slot_mapping) -> ()")

#: op -> the params a captured task holds by value (read on the host when the task is built)
HOST_PARAMS: dict[str, tuple[str, ...]] = {"ascend_kernel::paged_attention_out": ("context_lens",),
                                           "ascend_kernel::paged_attention_mla_out": ("context_lens",)}


def no_result(*args: object) -> None:
    """The fake of an op that only writes into its ``out`` argument."""
    return None
