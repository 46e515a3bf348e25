"""The LoRA ops of the seam (punica's bgmv/sgmv shrink and expand): contracts, schemas, fakes.

Both providers route these through registered torch ops
(:mod:`ascend_kernel.ops.opaque`), so a traced model sees one opaque call per
op whichever provider runs. The contracts are those of Ascend's LoRA kernels
(vLLM-Ascend's ``torch.ops._C_ascend`` ops, called by
:mod:`ascend_kernel.ops.lora_npu`), which skip rows without an adapter;
:mod:`ascend_kernel.ops.lora_reference` implements them in plain torch and
``tests/ops/test_lora_reference.py`` checks that against vLLM's own torch LoRA
ops (``vllm.lora.ops.torch_ops``) on every row those ops get right.

Weights are stacked per adapter slot: ``[slots, 1, rows, cols]`` (or without
the 1). An index is a slot, or ``-1`` for "no adapter".

* ``bgmv_shrink(x [T, H], a [S, 1, R, H], out [T, >=R], indices [T], scale)``:
  ``out[t, :R] = scale * x[t] @ a[i_t]^T`` where ``i_t >= 0``, and ``0`` where
  ``i_t < 0`` (the LoRA intermediate of a base row is nothing).
* ``bgmv_expand(x [T, R], b [S, 1, N, R], out [T', W], indices [T], offset, size, add_inputs)``:
  for the first ``min(T, T')`` rows with ``i_t >= 0``,
  ``out[t, offset:offset + size] (+)= (x[t] @ b[i_t]^T)[:size]`` (added with
  ``add_inputs``, else written); a row with ``i_t < 0`` keeps its output.
* ``sgmv_shrink`` / ``sgmv_expand``: the same, with the adapter given per group
  of consecutive tokens (``seq_indices [G]``, ``seq_lens [G]``) instead of per
  token; tokens past the groups count as ``-1``.

All products are in ``out``'s dtype (as vLLM's torch ops compute them).
"""

from __future__ import annotations

BGMV_SHRINK_SCHEMA = "Tensor x, Tensor weights, Tensor(a!) out, Tensor indices, float scale) -> ()"
BGMV_EXPAND_SCHEMA = ("Tensor x, Tensor weights, Tensor(a!) out, Tensor indices, int offset, int size, "
                      "bool add_inputs) -> ()")
SGMV_SHRINK_SCHEMA = ("Tensor x, Tensor weights, Tensor(a!) out, Tensor seq_indices, Tensor seq_lens, "
                      "float scale) -> ()")
SGMV_EXPAND_SCHEMA = ("Tensor x, Tensor weights, Tensor(a!) out, Tensor seq_indices, Tensor seq_lens, int offset, "
                      "int size, bool add_inputs) -> ()")
