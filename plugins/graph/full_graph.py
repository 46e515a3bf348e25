"""FULL and FULL_DECODE_ONLY: the whole model inside the platform's static graph wrapper.

When the resolved ``cudagraph_mode`` has full graphs, a uniform decode batch
runs as one captured graph with attention inside, instead of pieces with
attention between them. vLLM's GPU runner wraps the model for that itself,
but always in its own ``CUDAGraphWrapper`` (``torch.cuda`` graphs: wrong on an
NPU), and vLLM-CPU's runner never wraps it at all. Both graph modes that
capture therefore wrap the loaded model here, in the wrapper class the
platform names for the mode (ACL graphs on an NPU, static-shape artifacts on a
CPU), with runtime mode FULL. vLLM's dispatcher then decides per batch:
uniform decode batches of a captured size replay, everything else runs the
model plainly.
"""

from __future__ import annotations

from typing import Any


def wrap_whole_model(model: Any, vllm_config: Any, wrapper_cls: str) -> Any:
    """``model`` in ``wrapper_cls`` (runtime mode FULL) when the config captures full graphs, else unwrapped."""
    from vllm.compilation.cuda_graph import CUDAGraphWrapper
    from vllm.config import CUDAGraphMode
    from vllm.utils.import_utils import resolve_obj_by_qualname

    if isinstance(model, CUDAGraphWrapper):  # vLLM's GPU runner's own wrapping: CUDA graphs, not the platform's
        model = model.unwrap()
    mode = vllm_config.compilation_config.cudagraph_mode
    if mode is None or not mode.has_full_cudagraphs():
        return model
    wrapper = resolve_obj_by_qualname(wrapper_cls)
    return wrapper(model, vllm_config, runtime_mode=CUDAGraphMode.FULL)
