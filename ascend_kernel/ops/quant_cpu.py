"""Int8 linears on a CPU host through vLLM-CPU's own int8 GEMM kernels (oneDNN, or AMX where it serves).

Why: the reference provider's ``quant_matmul`` forms exact integer products in
float64, a readable definition but slower than the float32 model it replaces.
vLLM-CPU ships int8 kernels that keep the weights int8 in memory (prepacked)
and quantize activations inside the call, the way stock vLLM-CPU runs
compressed-tensors int8 checkpoints. They take bfloat16 or float16
activations only (``int8_scaled_mm_with_quant: expect A to be bfloat16 or
half``), so float32 models keep the reference ops.

The kernel is chosen by vLLM's public chooser (``init_int8_linear_kernel``)
from the same three facts stock uses (per-channel weights, static or dynamic
activations, symmetric or not) and is handed the same parameters stock would
load from the equivalent compressed-tensors checkpoint; so a layer computes
bit for bit what stock computes on those weights (checked end to end in
``tests/e2e/test_quantization.py``, and against the reference ops in
``tests/ops/test_quant_ops.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ascend_kernel.scoped import setting_swapped

#: the activation dtypes vLLM-CPU's int8 GEMMs take
ACTIVATION_DTYPES = (torch.bfloat16, torch.float16)


def unserved_reason(act_dtype: torch.dtype) -> str | None:
    """Why vLLM-CPU's int8 kernels cannot run a layer with these activations (None when they can)."""
    if act_dtype not in ACTIVATION_DTYPES:
        return f"activations are {act_dtype}; vLLM-CPU's int8 kernels take bfloat16 or float16"
    try:
        from vllm.platforms import current_platform
    except Exception as exc:  # noqa: BLE001 - no vLLM here
        return f"vLLM is not importable ({exc})"
    if not current_platform.is_cpu():
        return f"the platform is {current_platform.device_type}, not vLLM-CPU"
    return None


@dataclass(frozen=True, slots=True)
class CpuInt8Linear:
    """One linear layer's int8 weights, prepacked by vLLM-CPU's kernel, and that kernel."""

    holder: torch.nn.Module  # the parameters under the names vLLM's kernel reads
    kernel: Any
    out_features: int

    @classmethod
    def build(cls, weight: torch.Tensor, weight_scale: torch.Tensor, input_scale: torch.Tensor | None,
              zero_point: torch.Tensor | None, bias: torch.Tensor | None, act_dtype: torch.dtype) -> "CpuInt8Linear":
        """From int8 ``weight`` [N, K], per-channel ``weight_scale`` [N], the bias and the activations' scheme.

        ``input_scale`` None means dynamic per-token activations; ``zero_point``
        None means symmetric ones. The bias is fixed here because one of vLLM's
        kernels (AMX) keeps its own float32 copy of it, as stock does from the
        layer's bias; a call only says whether to add it. The kernel prepacks
        the weight and drops its own copy of the unpacked one.
        """
        from vllm.model_executor.kernels.linear import init_int8_linear_kernel

        static = input_scale is not None
        symmetric = zero_point is None
        holder = torch.nn.Module()
        holder.logical_widths = [weight.shape[0]]
        frozen = lambda t: torch.nn.Parameter(t, requires_grad=False)  # noqa: E731
        holder.register_parameter("weight", frozen(weight.contiguous()))
        holder.register_parameter("weight_scale", frozen(weight_scale.to(torch.float32).reshape(-1, 1).contiguous()))
        holder.register_parameter("input_scale", frozen(input_scale.to(torch.float32).reshape(1)) if static else None)
        holder.register_parameter("input_zero_point",
                                  None if symmetric else frozen(zero_point.reshape(1).to(torch.int8)))
        holder.register_parameter("azp_adj", None)
        holder.register_parameter("bias", None if bias is None else frozen(bias.to(act_dtype)))
        kernel = init_int8_linear_kernel(is_channelwise=True, is_static_input_scheme=static,
                                         input_symmetric=symmetric, module_name="ascend-kernel int8 linear")
        # the oneDNN handler's output type is the default dtype at build time: act_dtype for the call only
        with setting_swapped(torch.get_default_dtype, torch.set_default_dtype, act_dtype):
            kernel.process_weights_after_loading(holder)
        return cls(holder, kernel, weight.shape[0])

    def __call__(self, x: torch.Tensor, add_bias: bool) -> torch.Tensor:
        return self.kernel.apply_weights(self.holder, x, self.holder.bias if add_bias else None)

    def weight_bytes(self) -> int:
        """Bytes this layer keeps: parameters plus what the kernel holds packed (int8, one byte per weight)."""
        own = sum(p.numel() * p.element_size() for name, p in self.holder.named_parameters() if name != "bias")
        packed = getattr(getattr(self.kernel, "dnnl_handler", None), "k", 0) * self.out_features
        return own + packed
