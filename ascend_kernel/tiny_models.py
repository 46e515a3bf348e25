"""Small random-weight Hugging Face models, built locally, for offline tests and demos.

The end-to-end tests compare vLLM against transformers token by token, and the
hosts that run them have no network. So every model here is written from
nothing: a byte-level BPE tokenizer trained on a short embedded English text,
a config small enough to build in a second, and weights drawn from a seeded
generator so that the same ``arch`` and ``seed`` always give the same bytes.

The configs are small but not arbitrary: vLLM's CPU attention only accepts
some head sizes (64 works, 16 does not), and its CPU MLA path needs DeepSeek's
real latent sizes (``kv_lora_rank=512``, ``qk_rope_head_dim=64``). Weights are
drawn wider than a real model's init (std 0.2) so that greedy decoding gives
varied tokens with clear margins instead of one token repeated or near-ties
that float rounding could flip.

Typical use::

    from ascend_kernel.tiny_models import create_tiny_model, tiny_model_cache_dir
    path = create_tiny_model("llama", tiny_model_cache_dir("llama"))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ascend_kernel.model_dirs import build_marked, read_marker

#: Architectures :func:`create_tiny_model` can build.
SUPPORTED_ARCHS: tuple[str, ...] = (
    "llama", "deepseek_v2", "deepseek_v32", "deepseek_mtp", "qwen2_moe", "mamba2", "falcon_h1", "qwen3_next",
    "gemma3n", "bert", "llama_eagle", "llama_eagle3",
)

#: Weight dtypes accepted for ``dtype`` (float32 is the one the tests compare in).
SUPPORTED_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")

#: Default parent of cached models (relative: resolved against the working directory).
DEFAULT_CACHE_BASE = Path(".cache/tiny-models")

#: Name of the marker that says a directory holds a finished tiny model, and which one.
MARKER_NAME = "tiny_model.json"

#: Bumped whenever the recipe changes, so stale cached models are rebuilt.
RECIPE_VERSION = 1

#: Std of the normal every weight matrix is drawn from (norm weights are ones).
INIT_STD = 0.2

#: Target vocabulary of the BPE tokenizer; the corpus decides the exact size.
TOKENIZER_VOCAB_TARGET = 1000

MAX_POSITIONS = 512

SPECIAL_TOKENS: dict[str, str] = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}

#: Simple role-prefixed chat format, so ``LLM.chat`` and ``apply_chat_template`` work too.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)

# Written for this module: plain English across common topics, so ordinary prompts
# ("The capital of France is", "Once upon a time") split into whole-word tokens.
_CORPUS = """\
The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is Rome.
The capital of Spain is Madrid. The capital of Japan is Tokyo. The capital of England is London.
Paris is a large city on the river Seine, and many people visit it every year to see the museums.
Once upon a time, there was a little girl who lived in a small house near the forest with her mother.
Once upon a time, there was a little boy who wanted to see the sea, so he walked for many days.
Every morning the little girl went to the river to get water, and every evening she read a book.
One day she found a small bird under a tree. The bird could not fly, so she took it home and cared for it.
After a week the bird was strong again. It sang a happy song and flew back into the bright blue sky.
The quick brown fox jumps over the lazy dog. The lazy dog did not move, and the quick brown fox ran away.
The quick brown fox jumps over the lazy dog and the quick brown fox jumps again over the sleeping cat.
A computer is a machine that can follow a list of instructions called a program. Programs are written
by people in languages such as Python, and a model is a program that learns from data to make predictions.
Large language models read text as tokens and predict the next token, one step at a time, until they stop.
The weather today is warm and sunny, but tomorrow it will be cold, with rain in the morning and wind at night.
In the spring the trees grow new green leaves, in the summer the days are long, and in the winter it snows.
My favourite food is bread with cheese, and my brother likes apples, oranges, rice and fresh fish from the market.
The students sat in the classroom and listened to their teacher, who explained why the earth goes around the sun.
Water boils at one hundred degrees and freezes at zero degrees. The moon is smaller than the earth.
There are seven days in a week and twelve months in a year. The first month is January and the last is December.
He opened the door, looked outside, and said that the train would arrive at the station in ten minutes.
She asked what time it was, and he answered that it was almost four o'clock in the afternoon.
Science helps us understand the world: how plants grow, why the sky is blue, and what the stars are made of.
Music, art and stories have been part of human life for thousands of years, in every country and culture.
The old man sat by the window, drank his tea, and remembered the summer when he first learned to swim.
If you want to learn something new, start with small steps, practice every day, and do not be afraid to ask.
Numbers like one, two, three, four, five, six, seven, eight, nine and ten are used to count things.
The dog barked at the postman, the cat slept on the warm chair, and the children played games in the garden.
We went to the mountains for a holiday, climbed to the top, and saw the whole valley below us in the light.
"""


def tiny_model_cache_dir(arch: str, seed: int = 0, base: str | Path = DEFAULT_CACHE_BASE) -> Path:
    """Default directory for one cached model: ``<base>/<arch>-seed<seed>``.

    One directory per (arch, seed) so several models can be cached side by side
    and :func:`create_tiny_model` can reuse them across runs.
    """
    return Path(base) / f"{arch}-seed{seed}"


def create_tiny_model(arch: str, out_dir: str | Path, *, seed: int = 0, dtype: str = "float32") -> Path:
    """Write (or reuse) a random-weight model for ``arch`` at ``out_dir`` and return its path.

    The directory holds ``config.json``, ``model.safetensors``, the tokenizer
    files, ``generation_config.json`` and a :data:`MARKER_NAME` marker, and
    loads offline in both transformers and vLLM. A directory whose marker
    already names this arch, seed, dtype and recipe is returned untouched; a
    tiny model built with other settings is replaced; any other non-empty
    directory is refused (it is not ours to overwrite). The model is built in a
    temporary sibling and renamed into place, so readers never see a half
    written model.
    """
    if arch not in _BUILDERS:
        raise ValueError(f"unknown tiny-model arch {arch!r}; allowed: {', '.join(SUPPORTED_ARCHS)}")
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"unsupported tiny-model dtype {dtype!r}; allowed: {', '.join(SUPPORTED_DTYPES)}")
    out = Path(out_dir)
    wanted = {"arch": arch, "seed": int(seed), "dtype": dtype, "recipe": RECIPE_VERSION}
    if read_marker(out, MARKER_NAME) == wanted:
        return out
    if out.exists() and read_marker(out, MARKER_NAME) is None and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not a tiny model; refusing to overwrite it")

    return build_marked(out, wanted, MARKER_NAME, lambda tmp: _build(arch, tmp, seed=int(seed), dtype=dtype))








# --------------------------------------------------------------------------- building


def _build(arch: str, out: Path, *, seed: int, dtype: str) -> None:
    """Write tokenizer, config, weights and generation config for ``arch`` into ``out``."""
    import torch
    from transformers import AutoModel, AutoModelForCausalLM, GenerationConfig

    tokenizer = _build_tokenizer()
    tokenizer.save_pretrained(out)
    ids = {name: tokenizer.convert_tokens_to_ids(tok) for name, tok in SPECIAL_TOKENS.items()}

    config = _BUILDERS[arch](len(tokenizer))
    config.bos_token_id = ids["bos_token"]
    config.eos_token_id = ids["eos_token"]
    config.pad_token_id = ids["pad_token"]

    torch.manual_seed(seed)
    # encoder-only (embedding) models have no LM head: the bare encoder is saved
    auto = AutoModel if arch in ENCODER_ARCHS else AutoModelForCausalLM
    model = auto.from_config(config, dtype=torch.float32)
    _init_weights(model, seed)
    torch_dtype = getattr(torch, dtype)
    model.to(torch_dtype)
    model.config.dtype = torch_dtype
    model.generation_config = GenerationConfig(
        bos_token_id=ids["bos_token"], eos_token_id=ids["eos_token"], pad_token_id=ids["pad_token"]
    )
    model.save_pretrained(out, safe_serialization=True)
    extra = _EXTRA_WEIGHTS.get(arch)
    if extra is not None:
        _add_weights(out / "model.safetensors", extra(config, seed), torch_dtype)
    if arch in DRAFT_HEAD_ARCHS:
        DRAFT_HEAD_ARCHS[arch](out / "model.safetensors", config, seed, torch_dtype)


def _add_weights(path: Path, tensors: dict[str, Any], dtype: Any) -> None:
    """Append ``tensors`` (cast to ``dtype``) to a single-file safetensors checkpoint."""
    from safetensors.torch import load_file, save_file

    state = load_file(path)
    clash = sorted(set(state) & set(tensors))
    if clash:
        raise ValueError(f"extra weights would overwrite {clash[:3]} in {path}")
    state.update({name: t.to(dtype).contiguous() for name, t in tensors.items()})
    save_file(state, path, metadata={"format": "pt"})


def _init_weights(model: Any, seed: int) -> None:
    """Draw every parameter from one seeded generator, in sorted-name order.

    Transformers' own init is replaced so that the scale (:data:`INIT_STD`) and
    the bytes depend only on the seed: norm weights are ones, everything else
    (projections, embeddings, router gates, biases) is ``N(0, INIT_STD)``.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters(), key=lambda item: item[0]):
            if param.ndim == 1 and "norm" in name:
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=gen, dtype=torch.float32) * INIT_STD)


def _build_tokenizer() -> Any:
    """Train a byte-level BPE on :data:`_CORPUS` (bytes cover any text, so no ``<unk>``)."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    specials = [SPECIAL_TOKENS[k] for k in ("unk_token", "bos_token", "eos_token", "pad_token")]
    tok = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_TARGET,
        min_frequency=1,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS.splitlines(), trainer=trainer)
    bos = SPECIAL_TOKENS["bos_token"]
    # Llama-style: every encoded prompt starts with BOS, in transformers and vLLM alike.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        model_max_length=MAX_POSITIONS,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        **SPECIAL_TOKENS,
    )


def _llama_config(vocab_size: int) -> Any:
    """Llama with GQA; head_dim 64 because vLLM's CPU attention rejects smaller heads."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
        initializer_range=INIT_STD,
    )


def _deepseek_v2_config(vocab_size: int) -> Any:
    """DeepSeek-V2 with MLA and MoE; latent sizes are the real ones vLLM's CPU MLA needs."""
    from transformers import DeepseekV2Config

    return DeepseekV2Config(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        q_lora_rank=None,
        kv_lora_rank=512,
        qk_nope_head_dim=64,
        qk_rope_head_dim=64,
        v_head_dim=64,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        n_shared_experts=1,
        first_k_dense_replace=1,
        moe_layer_freq=1,
        topk_method="greedy",
        n_group=1,
        topk_group=1,
        norm_topk_prob=False,
        routed_scaling_factor=1.0,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
        initializer_range=INIT_STD,
    )


def _deepseek_v32_config(vocab_size: int) -> Any:
    """DeepSeek-V3.2-style sparse attention: the DeepSeek-V2 model plus a lightning indexer per layer.

    transformers has no V3.2 model, but vLLM builds one from a DeepSeek-V2
    config that carries ``index_topk``/``index_n_heads``/``index_head_dim``
    (and a low-rank query, which the indexer reads). transformers' DeepSeek-V2
    loads the same checkpoint and ignores the indexer weights: that is dense
    attention, which the sparse model equals whenever ``index_topk`` covers
    every position. ``index_topk`` is small (32) so that longer prompts really
    drop positions; 16 indexer heads make exact score ties (every head's relu
    at zero) rare.
    """
    config = _deepseek_v2_config(vocab_size)
    config.q_lora_rank = 64
    config.index_topk = 32
    config.index_n_heads = 16
    config.index_head_dim = 128
    return config


def _deepseek_v32_indexer_weights(config: Any, seed: int) -> dict[str, Any]:
    """The indexer of every layer, named as DeepSeek-V3.2 checkpoints name it (drawn from a seed of its own)."""
    import torch

    gen = torch.Generator().manual_seed(seed + 32)
    heads, dim = config.index_n_heads, config.index_head_dim
    weights = {}
    for layer in range(config.num_hidden_layers):
        prefix = f"model.layers.{layer}.self_attn.indexer"
        weights[f"{prefix}.wq_b.weight"] = torch.randn(heads * dim, config.q_lora_rank, generator=gen) * INIT_STD
        weights[f"{prefix}.wk.weight"] = torch.randn(dim, config.hidden_size, generator=gen) * INIT_STD
        weights[f"{prefix}.weights_proj.weight"] = torch.randn(heads, config.hidden_size, generator=gen) * INIT_STD
        weights[f"{prefix}.k_norm.weight"] = torch.ones(dim)
        weights[f"{prefix}.k_norm.bias"] = torch.randn(dim, generator=gen) * INIT_STD
    return weights


def _llama_eagle_config(vocab_size: int) -> Any:
    """An EAGLE draft head for the tiny Llama: one Llama decoder layer over [embedding; target hidden]."""
    config = _llama_config(vocab_size)
    config.num_hidden_layers = 1
    return config


def _as_eagle_head(path: Path, config: Any, seed: int, dtype: Any) -> None:
    """Rewrite a saved one-layer Llama into an EAGLE-1 head checkpoint, as vLLM's EagleLlama loads it.

    The head keeps the decoder layer (without its input norm: EAGLE feeds the
    layer the fused input directly) and the embedding, adds ``fc`` ([hidden,
    2 * hidden], over the concatenated token embedding and target hidden
    state), and drops the final norm and LM head (the target's are used).
    Names carry no ``model.`` prefix, as published EAGLE heads do.
    """
    import torch
    from safetensors.torch import load_file, save_file

    state = load_file(path)
    head = {}
    for name, tensor in state.items():
        if name.startswith("model.layers.0.") and "input_layernorm" not in name:
            head[name.removeprefix("model.")] = tensor
        elif name == "model.embed_tokens.weight":
            head["embed_tokens.weight"] = tensor
    gen = torch.Generator().manual_seed(seed + 91)
    head["fc.weight"] = (torch.randn(config.hidden_size, 2 * config.hidden_size, generator=gen) * INIT_STD).to(dtype)
    path.unlink()
    save_file({k: v.contiguous() for k, v in head.items()}, path, metadata={"format": "pt"})


#: the tiny Llama's layers whose hidden states an EAGLE-3 head reads (vLLM's default assumes deeper models)
EAGLE3_AUX_LAYERS = [0, 1]


def _llama_eagle3_config(vocab_size: int) -> Any:
    """An EAGLE-3 draft head for the tiny Llama: it reads the target's hidden states of several layers."""
    config = _llama_eagle_config(vocab_size)
    config.eagle_config = {"eagle_aux_hidden_state_layer_ids": EAGLE3_AUX_LAYERS}
    return config


def _as_eagle3_head(path: Path, config: Any, seed: int, dtype: Any) -> None:
    """Rewrite a saved one-layer Llama into an EAGLE-3 head checkpoint, as vLLM's Eagle3Llama loads it.

    EAGLE-3 fuses the target's hidden states of :data:`EAGLE3_AUX_LAYERS`
    (``fc``: [hidden, layers * hidden]); its single decoder layer attends over
    [token embedding; fused hidden] (q/k/v take 2 * hidden inputs) with a
    ``hidden_norm`` beside the input norm; it has its own final ``norm`` and
    ``lm_head`` and borrows the target's embedding.
    """
    import torch
    from safetensors.torch import load_file, save_file

    state = load_file(path)
    gen = torch.Generator().manual_seed(seed + 93)
    hidden = config.hidden_size

    def draw(*shape: int) -> Any:
        return (torch.randn(*shape, generator=gen) * INIT_STD).to(dtype)

    head = {name.removeprefix("model."): tensor for name, tensor in state.items()
            if name.startswith("model.layers.0.") or name in ("model.norm.weight", "lm_head.weight")}
    for proj in ("q_proj", "k_proj", "v_proj"):
        name = f"layers.0.self_attn.{proj}.weight"
        head[name] = draw(head[name].shape[0], 2 * hidden)
    head["layers.0.hidden_norm.weight"] = torch.ones(hidden, dtype=dtype)
    head["fc.weight"] = draw(hidden, len(EAGLE3_AUX_LAYERS) * hidden)
    path.unlink()
    save_file({k: v.contiguous() for k, v in head.items()}, path, metadata={"format": "pt"})


def _deepseek_mtp_config(vocab_size: int) -> Any:
    """DeepSeek-V3 (MLA, sigmoid-scored MoE with a correction bias) with one next-token-prediction layer.

    The MTP layer is stored as layer ``num_hidden_layers`` (see
    :func:`_deepseek_mtp_layer_weights`); transformers' DeepSeek-V3 ignores it,
    vLLM's MTP drafter loads it. ``topk_method``/``scoring_func`` are written
    for vLLM (transformers' V3 always scores with sigmoid and the bias).
    """
    from transformers import DeepseekV3Config

    return DeepseekV3Config(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, q_lora_rank=None, kv_lora_rank=512,
        qk_nope_head_dim=64, qk_rope_head_dim=64, v_head_dim=64, n_routed_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=64, n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1,
        norm_topk_prob=True, routed_scaling_factor=1.0, max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False,
        initializer_range=INIT_STD, num_nextn_predict_layers=1, topk_method="noaux_tc", scoring_func="sigmoid",
    )


def _deepseek_mtp_layer_weights(config: Any, seed: int) -> dict[str, Any]:
    """The MTP layer as DeepSeek-V3 checkpoints store it: a decoder layer plus its projection and head.

    Its experts are saved one tensor per expert (``experts.{e}.gate_proj``...),
    the layout vLLM's MTP loader reads (it does not read transformers' fused
    ``experts.gate_up_proj``). Drawn from a seed of its own.
    """
    import torch

    gen = torch.Generator().manual_seed(seed + 77)
    hidden, heads, lora = config.hidden_size, config.num_attention_heads, config.kv_lora_rank
    nope, rope, v_dim = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
    inter, shared = config.moe_intermediate_size, config.moe_intermediate_size * config.n_shared_experts
    shapes = {
        "self_attn.q_proj.weight": (heads * (nope + rope), hidden),
        "self_attn.kv_a_proj_with_mqa.weight": (lora + rope, hidden),
        "self_attn.kv_b_proj.weight": (heads * (nope + v_dim), lora),
        "self_attn.o_proj.weight": (hidden, heads * v_dim),
        "mlp.gate.weight": (config.n_routed_experts, hidden),
        "mlp.gate.e_score_correction_bias": (config.n_routed_experts,),
        "mlp.shared_experts.gate_proj.weight": (shared, hidden),
        "mlp.shared_experts.up_proj.weight": (shared, hidden),
        "mlp.shared_experts.down_proj.weight": (hidden, shared),
        "eh_proj.weight": (hidden, 2 * hidden),
        "shared_head.head.weight": (config.vocab_size, hidden),
    }
    for e in range(config.n_routed_experts):
        shapes[f"mlp.experts.{e}.gate_proj.weight"] = (inter, hidden)
        shapes[f"mlp.experts.{e}.up_proj.weight"] = (inter, hidden)
        shapes[f"mlp.experts.{e}.down_proj.weight"] = (hidden, inter)
    prefix = f"model.layers.{config.num_hidden_layers}"
    weights = {f"{prefix}.{name}": torch.randn(shape, generator=gen) * INIT_STD for name, shape in shapes.items()}
    for norm, size in (("self_attn.kv_a_layernorm", lora), ("input_layernorm", hidden),
                       ("post_attention_layernorm", hidden), ("enorm", hidden), ("hnorm", hidden),
                       ("shared_head.norm", hidden)):
        weights[f"{prefix}.{norm}.weight"] = torch.ones(size)
    return weights


def _qwen2_moe_config(vocab_size: int) -> Any:
    """Qwen2-MoE: 4 experts top-2 plus a gated shared expert, head_dim 64."""
    from transformers import Qwen2MoeConfig

    return Qwen2MoeConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=128,
        num_experts=4,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        norm_topk_prob=False,
        max_position_embeddings=MAX_POSITIONS,
        max_window_layers=2,
        use_sliding_window=False,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
        initializer_range=INIT_STD,
    )


def _mamba2_config(vocab_size: int) -> Any:
    """Mamba2: attention-free, its KV cache is the conv and SSM state per layer."""
    from transformers import Mamba2Config

    return Mamba2Config(
        vocab_size=vocab_size,
        hidden_size=128,
        num_hidden_layers=2,
        num_heads=4,
        head_dim=64,
        state_size=16,
        n_groups=1,
        expand=2,
        conv_kernel=4,
        chunk_size=64,
        layer_norm_epsilon=1e-6,
        tie_word_embeddings=False,
        initializer_range=INIT_STD,
    )


def _falcon_h1_config(vocab_size: int) -> Any:
    """Falcon-H1: every layer runs attention and a Mamba2 mixer side by side (a hybrid KV cache)."""
    from transformers import FalconH1Config

    return FalconH1Config(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        mamba_d_ssm=128,
        mamba_n_heads=2,
        mamba_d_head=64,
        mamba_n_groups=1,
        mamba_d_state=16,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_chunk_size=64,
        mamba_rms_norm=False,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        initializer_range=INIT_STD,
    )


def _qwen3_next_config(vocab_size: int) -> Any:
    """Qwen3-Next: gated delta-net linear attention + full attention, MoE (vLLM-CPU runs it in bfloat16)."""
    from transformers import Qwen3NextConfig

    return Qwen3NextConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        partial_rotary_factor=0.25,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=64,
        decoder_sparse_step=1,
        norm_topk_prob=True,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        initializer_range=INIT_STD,
    )


def _gemma3n_config(vocab_size: int) -> Any:
    """Gemma3n text model whose last two layers reuse layer 1's KV cache (cross-layer KV sharing)."""
    from transformers import Gemma3nTextConfig

    layers = 4
    return Gemma3nTextConfig(
        vocab_size=vocab_size,
        vocab_size_per_layer_input=vocab_size,
        hidden_size=128,
        hidden_size_per_layer_input=16,
        intermediate_size=256,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        layer_types=["full_attention"] * layers,
        sliding_window=MAX_POSITIONS,
        num_kv_shared_layers=2,
        laurel_rank=8,
        altup_num_inputs=2,
        activation_sparsity_pattern=[0.0] * layers,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        initializer_range=INIT_STD,
    )


def _bert_config(vocab_size: int) -> Any:
    """BERT encoder for embeddings: encoder-only attention, no KV cache at all."""
    from transformers import BertConfig

    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=256,
        max_position_embeddings=MAX_POSITIONS,
        initializer_range=INIT_STD,
    )


#: architectures saved as bare encoders (embedding models) rather than causal LMs
ENCODER_ARCHS = frozenset({"bert"})


_BUILDERS: dict[str, Callable[[int], Any]] = {
    "llama": _llama_config,
    "deepseek_v2": _deepseek_v2_config,
    "deepseek_v32": _deepseek_v32_config,
    "deepseek_mtp": _deepseek_mtp_config,
    "qwen2_moe": _qwen2_moe_config,
    "mamba2": _mamba2_config,
    "falcon_h1": _falcon_h1_config,
    "qwen3_next": _qwen3_next_config,
    "gemma3n": _gemma3n_config,
    "bert": _bert_config,
    "llama_eagle": _llama_eagle_config,
    "llama_eagle3": _llama_eagle3_config,
}
assert tuple(_BUILDERS) == SUPPORTED_ARCHS

#: draft heads: saved like their base model, then rewritten into the head's checkpoint layout
DRAFT_HEAD_ARCHS: dict[str, Callable[[Path, Any, int, Any], None]] = {
    "llama_eagle": _as_eagle_head, "llama_eagle3": _as_eagle3_head,
}

#: weights transformers' model class does not have, added to the checkpoint for vLLM
_EXTRA_WEIGHTS: dict[str, Callable[[Any, int], dict[str, Any]]] = {
    "deepseek_v32": _deepseek_v32_indexer_weights,
    "deepseek_mtp": _deepseek_mtp_layer_weights,
}
