"""Encoder-only (embedding) models through the kernel: no KV cache at all, CLS embeddings == HF."""

from __future__ import annotations

import json

import pytest
import torch

from tests.e2e.conftest import REPO, clean_env, run_script

pytestmark = pytest.mark.e2e
PROMPTS = ["The capital of France is", "Hello world! How are you today?"]


def embed(model, env):
    proc = run_script(REPO / "tests" / "e2e" / "scripts" / "embed.py", [str(model), *PROMPTS], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_bert_embeddings_match_hf_and_stock_with_no_kv_cache(tmp_path):
    from transformers import AutoModel, AutoTokenizer

    from ascend_kernel.models import create_tiny_model

    model = create_tiny_model("bert", tmp_path / "bert")
    ours = embed(model, clean_env(ASCEND_KERNEL_DEVICE="cpu"))
    stock = embed(model, clean_env())
    assert stock["report"] is None
    tok, hf = AutoTokenizer.from_pretrained(model), AutoModel.from_pretrained(model).eval()
    for prompt, got, theirs in zip(PROMPTS, ours["embeddings"], stock["embeddings"]):
        with torch.no_grad():
            cls = hf(**tok([prompt], return_tensors="pt")).last_hidden_state[0, 0]
        expected = torch.nn.functional.normalize(cls, dim=-1)
        torch.testing.assert_close(torch.tensor(got), expected, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(torch.tensor(got), torch.tensor(theirs), rtol=1e-5, atol=1e-6)
    kv = ours["report"]["kv_cache"]
    assert kv["requested_bytes"] == kv["allocated_bytes"] == 0 and kv["layouts"] == []
    assert ours["report"]["trace"]["attention_states"] == {"PrefillNoCache": 1}
