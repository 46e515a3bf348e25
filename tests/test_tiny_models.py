"""The tiny local models: deterministic, reusable, and loadable by transformers offline.

vLLM itself is exercised by the end-to-end tests; these stay fast and engine-free.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ascend_kernel.models.tiny import (
    DRAFT_HEAD_ARCHS,
    MARKER_NAME,
    ENCODER_ARCHS,
    SUPPORTED_ARCHS,
    VISION_ARCHS,
    create_tiny_model,
    tiny_model_cache_dir,
)

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One model per arch, shared by the read-only tests in this module (image-text ones: tests/test_tiny_vlm.py)."""
    base = tmp_path_factory.mktemp("tiny")
    return {arch: create_tiny_model(arch, base / arch, seed=0)
            for arch in SUPPORTED_ARCHS if arch not in VISION_ARCHS}


def test_same_seed_gives_identical_bytes_and_other_seed_differs(tmp_path: Path) -> None:
    a = create_tiny_model("llama", tmp_path / "a", seed=0)
    b = create_tiny_model("llama", tmp_path / "b", seed=0)
    c = create_tiny_model("llama", tmp_path / "c", seed=1)
    weights = lambda p: (p / "model.safetensors").read_bytes()  # noqa: E731
    assert weights(a) == weights(b)
    assert weights(a) != weights(c)
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
    assert (a / "config.json").read_bytes() == (b / "config.json").read_bytes()


def test_directory_layout_and_marker(built: dict[str, Path]) -> None:
    for arch, path in built.items():
        names = {p.name for p in path.iterdir()}
        assert {"config.json", "model.safetensors", "tokenizer.json", MARKER_NAME} <= names
        assert arch in ENCODER_ARCHS or "generation_config.json" in names
        marker = json.loads((path / MARKER_NAME).read_text())
        assert (marker["arch"], marker["seed"], marker["dtype"]) == (arch, 0, "float32")
        assert not list(path.parent.glob(".*building*")), "temporary build directories were left behind"


def test_encoder_model_loads_and_embeds(built: dict[str, Path]) -> None:
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(built["bert"])
    model = AutoModel.from_pretrained(built["bert"]).eval()
    with torch.no_grad():
        hidden = model(**tok([PROMPT], return_tensors="pt")).last_hidden_state
    assert hidden.shape[-1] == model.config.hidden_size and torch.isfinite(hidden).all()


@pytest.mark.parametrize("arch", [a for a in SUPPORTED_ARCHS
                                  if a not in ENCODER_ARCHS | DRAFT_HEAD_ARCHS | VISION_ARCHS])
def test_loads_in_transformers_and_generates(built: dict[str, Path], arch: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = built[arch]
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    # DeepSeek-V3.2 has no transformers model: its checkpoint is a DeepSeek-V2 one plus indexer weights
    assert model.config.model_type.removesuffix("_text") == {"deepseek_v32": "deepseek_v2",
                                                             "deepseek_mtp": "deepseek_v3"}.get(arch, arch)
    assert model.config.vocab_size == len(tok)

    ids = tok(PROMPT, return_tensors="pt").input_ids
    assert ids[0, 0].item() == tok.bos_token_id
    assert ids.shape[1] >= 4 and tok.unk_token_id not in ids[0].tolist()
    assert tok.decode(ids[0], skip_special_tokens=True) == PROMPT

    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=8,
                             eos_token_id=None, pad_token_id=tok.pad_token_id)
    new = out[0, ids.shape[1]:].tolist()
    assert len(new) == 8
    assert all(0 <= t < len(tok) for t in new)


def test_draft_checkpoints_have_the_layouts_vllm_loads(built: dict[str, Path]) -> None:
    """The MTP layer sits after the last decoder layer, experts per tensor; the EAGLE head is fc + one layer."""
    import json

    from safetensors.torch import load_file

    mtp = load_file(built["deepseek_mtp"] / "model.safetensors")
    config = json.loads((built["deepseek_mtp"] / "config.json").read_text())
    assert (config["num_nextn_predict_layers"], config["scoring_func"], config["topk_method"]) == (1, "sigmoid", "noaux_tc")
    layer = f"model.layers.{config['num_hidden_layers']}"
    hidden = config["hidden_size"]
    assert mtp[f"{layer}.eh_proj.weight"].shape == (hidden, 2 * hidden)
    assert mtp[f"{layer}.shared_head.head.weight"].shape == (config["vocab_size"], hidden)
    assert all(f"{layer}.mlp.experts.{e}.{p}.weight" in mtp
               for e in range(config["n_routed_experts"]) for p in ("gate_proj", "up_proj", "down_proj"))
    eagle = load_file(built["llama_eagle"] / "model.safetensors")
    assert eagle["fc.weight"].shape == (hidden, 2 * hidden)
    assert not any(k.startswith("model.") or "input_layernorm" in k or k.startswith("lm_head") for k in eagle)
    assert {k.split(".")[1] for k in eagle if k.startswith("layers.")} == {"0"}
    eagle3 = load_file(built["llama_eagle3"] / "model.safetensors")
    aux = json.loads((built["llama_eagle3"] / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert eagle3["fc.weight"].shape == (hidden, len(aux) * hidden)
    assert eagle3["layers.0.self_attn.q_proj.weight"].shape[1] == 2 * hidden  # [embedding; fused hidden]
    assert {"layers.0.hidden_norm.weight", "norm.weight", "lm_head.weight"} <= set(eagle3)


def test_deepseek_v32_checkpoint_carries_an_indexer_per_layer(built: dict[str, Path]) -> None:
    """vLLM builds the lightning indexer from these names and shapes; transformers ignores them."""
    from safetensors.torch import load_file

    path = built["deepseek_v32"]
    config = json.loads((path / "config.json").read_text())
    weights = load_file(path / "model.safetensors")
    heads, dim, hidden = config["index_n_heads"], config["index_head_dim"], config["hidden_size"]
    assert config["index_topk"] > 0 and config["q_lora_rank"] > 0
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}.self_attn.indexer."
        shapes = {k[len(p):]: tuple(v.shape) for k, v in weights.items() if k.startswith(p)}
        assert shapes == {"wq_b.weight": (heads * dim, config["q_lora_rank"]), "wk.weight": (dim, hidden),
                          "weights_proj.weight": (heads, hidden), "k_norm.weight": (dim,), "k_norm.bias": (dim,)}


def test_unknown_arch_names_the_allowed_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as info:
        create_tiny_model("gpt5", tmp_path / "x")
    message = str(info.value)
    assert "gpt5" in message
    assert all(arch in message for arch in SUPPORTED_ARCHS)
    assert not (tmp_path / "x").exists()


def test_unknown_dtype_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="float32"):
        create_tiny_model("llama", tmp_path / "x", dtype="int3")


def test_existing_model_is_reused_unchanged(tmp_path: Path) -> None:
    path = create_tiny_model("llama", tmp_path / "m", seed=3)
    before = (path / "model.safetensors").stat()
    again = create_tiny_model("llama", str(tmp_path / "m"), seed=3)
    after = (again / "model.safetensors").stat()
    assert again == path
    assert (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)


def test_other_seed_replaces_an_existing_tiny_model(tmp_path: Path) -> None:
    path = create_tiny_model("llama", tmp_path / "m", seed=0)
    old = (path / "model.safetensors").read_bytes()
    create_tiny_model("llama", tmp_path / "m", seed=1)
    assert json.loads((path / MARKER_NAME).read_text())["seed"] == 1
    assert (path / "model.safetensors").read_bytes() != old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_foreign_directory_is_not_overwritten(tmp_path: Path) -> None:
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        create_tiny_model("llama", target)
    assert (target / "notes.txt").read_text() == "keep me"


def test_empty_existing_directory_is_filled(tmp_path: Path) -> None:
    target = tmp_path / "empty"
    target.mkdir()
    assert (create_tiny_model("llama", target) / "model.safetensors").is_file()


def test_cache_dir_names_arch_and_seed(tmp_path: Path) -> None:
    assert tiny_model_cache_dir("llama") == Path(".cache/tiny-models/llama-seed0")
    assert tiny_model_cache_dir("qwen2_moe", 7, base=tmp_path) == tmp_path / "qwen2_moe-seed7"


def test_overrides_widen_the_model_and_are_part_of_its_identity(tmp_path: Path) -> None:
    """A benchmark's wide MoE: the fields reach the config and the weights, and the marker tells it apart."""
    from safetensors.torch import load_file

    wide = {"hidden_size": 256, "num_experts": 8, "num_experts_per_tok": 4}
    path = create_tiny_model("qwen2_moe", tmp_path / "wide", overrides=wide)
    config = json.loads((path / "config.json").read_text())
    assert {k: config[k] for k in wide} == wide
    weights = load_file(path / "model.safetensors")
    assert weights["model.embed_tokens.weight"].shape[1] == 256
    experts = {k.split(".")[5] for k in weights if k.startswith("model.layers.0.mlp.experts.")}
    assert experts == {str(e) for e in range(8)}
    assert weights["model.layers.0.mlp.gate.weight"].shape == (8, 256)
    assert json.loads((path / MARKER_NAME).read_text())["overrides"] == wide
    # the same call reuses it; without overrides the default model replaces it
    assert create_tiny_model("qwen2_moe", tmp_path / "wide", overrides=wide) == path
    create_tiny_model("qwen2_moe", tmp_path / "wide")
    assert "overrides" not in json.loads((path / MARKER_NAME).read_text())


def test_unknown_override_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'hidden_sise'") as info:
        create_tiny_model("llama", tmp_path / "x", overrides={"hidden_sise": 512})
    assert "llama" in str(info.value)
    assert not (tmp_path / "x").exists()
