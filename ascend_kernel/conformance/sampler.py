"""Contract of the ``sampler`` family: vLLM's ``Sampler`` call interface, with its token semantics.

The built object's ``build(vllm_config)`` returns a module called as
``sampler(logits=..., sampling_metadata=...) -> SamplerOutput``. It is fed a
real vLLM ``SamplingMetadata`` for two batches (all greedy; greedy rows mixed
with temperature, top-k and top-p rows) and must give:

* ``token-ids``: ``sampled_token_ids`` of shape ``[rows, 1]``, an integer
  dtype, every id inside the vocabulary;
* ``greedy-argmax``: every greedy row (temperature 0) is the argmax of its logits;
* ``top-k``: a sampled row with top-k ``k`` picks one of its ``k`` largest logits;
* ``logprobs``: with ``max_num_logprobs = n`` asked for, ``logprobs_tensors``
  holds ``n + 1`` ids per row, the sampled token first (vLLM's layout).
"""

from __future__ import annotations

from typing import Any

import torch

from ascend_kernel.conformance.base import build_under
from ascend_kernel.conformance.results import Checks

FAMILY = "sampler"
CONFIGS = ("llama",)
VOCAB = 97
NUM_LOGPROBS = 2


def sampling_metadata(temperature: list[float], top_k: list[int] | None = None,
                      top_p: list[float] | None = None, max_num_logprobs: int | None = None) -> Any:
    """A real vLLM ``SamplingMetadata`` for ``len(temperature)`` rows (temperature 0: a greedy row)."""
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    rows = len(temperature)
    temps = torch.tensor(temperature, dtype=torch.float32)
    greedy = bool((temps < 1e-5).all())
    return SamplingMetadata(
        temperature=None if greedy else temps,
        all_greedy=greedy,
        all_random=bool((temps >= 1e-5).all()),
        top_p=torch.tensor(top_p, dtype=torch.float32) if top_p is not None else None,
        top_k=torch.tensor(top_k, dtype=torch.int32) if top_k is not None else None,
        generators={},
        max_num_logprobs=max_num_logprobs,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(rows),
        presence_penalties=torch.zeros(rows),
        repetition_penalties=torch.ones(rows),
        output_token_ids=[[] for _ in range(rows)],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )


def _logits(rows: int, seed: int) -> torch.Tensor:
    # distinct values per row: no ties, so argmax and the top-k sets are unambiguous
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(VOCAB, generator=gen).float() / 7.0 for _ in range(rows)])


def _sampled(out: Any, rows: int) -> torch.Tensor:
    ids = getattr(out, "sampled_token_ids", None)
    assert isinstance(ids, torch.Tensor), \
        f"the sampler returned {type(out).__name__} without a sampled_token_ids tensor"
    assert tuple(ids.shape) == (rows, 1), f"sampled_token_ids has shape {tuple(ids.shape)}, expected ({rows}, 1)"
    assert not ids.dtype.is_floating_point and ids.dtype != torch.bool, f"sampled_token_ids has dtype {ids.dtype}"
    bad = [int(v) for v in ids.flatten() if not 0 <= int(v) < VOCAB]
    assert not bad, f"token ids {bad} are outside the vocabulary [0, {VOCAB})"
    return ids[:, 0].long()


def check_entry(entry: Any, kit: Any, checks: Checks) -> None:
    built = build_under(entry, kit, checks, CONFIGS)
    if built:
        check(*built[0], checks)


def check(found: Any, obj: Any, checks: Checks) -> None:
    vllm_config = found.ctx.vllm_config
    state: dict[str, Any] = {}

    def interface() -> str:
        build = getattr(obj, "build", None)
        assert callable(build), f"{type(obj).__name__} has no build(vllm_config) method"
        module = build(vllm_config)
        assert callable(module), f"build(vllm_config) returned {type(module).__name__}, which is not callable"
        state["sampler"] = module
        return f"build(vllm_config) -> {type(module).__name__}"

    checks.run("interface", interface)
    sampler = state.get("sampler")
    if sampler is None:
        for contract in ("token-ids", "greedy-argmax", "top-k", "logprobs"):
            checks.skipped(contract, "no sampler module was built (see contract 'interface')")
        return

    greedy_rows = 6
    mixed_temps = [0.0, 0.8, 0.0, 1.0, 0.0, 0.7, 1.3]
    mixed_top_k = [VOCAB, 5, VOCAB, 3, VOCAB, VOCAB, 1]
    mixed_top_p = [1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 1.0]
    runs: dict[str, tuple[torch.Tensor, Any]] = {}

    def call(name: str, logits: torch.Tensor, metadata: Any) -> tuple[torch.Tensor, Any]:
        if name not in runs:
            out = sampler(logits=logits.clone(), sampling_metadata=metadata)
            runs[name] = (_sampled(out, logits.shape[0]), out)
        return runs[name]

    greedy_logits = _logits(greedy_rows, 0)
    mixed_logits = _logits(len(mixed_temps), 1)

    def token_ids() -> str:
        call("greedy", greedy_logits, sampling_metadata([0.0] * greedy_rows))
        call("mixed", mixed_logits, sampling_metadata(mixed_temps, mixed_top_k, mixed_top_p))
        return f"shape [rows, 1], ids in [0, {VOCAB}) for an all-greedy and a mixed batch"

    def greedy_argmax() -> str:
        ids, _ = call("greedy", greedy_logits, sampling_metadata([0.0] * greedy_rows))
        want = greedy_logits.argmax(dim=-1)
        assert torch.equal(ids, want), f"all-greedy batch: sampled {ids.tolist()}, argmax is {want.tolist()}"
        ids, _ = call("mixed", mixed_logits, sampling_metadata(mixed_temps, mixed_top_k, mixed_top_p))
        rows = [i for i, t in enumerate(mixed_temps) if t == 0.0]
        got, want = ids[rows].tolist(), mixed_logits[rows].argmax(dim=-1).tolist()
        assert got == want, f"mixed batch, greedy rows {rows}: sampled {got}, argmax is {want}"
        return "greedy rows equal argmax (all-greedy and mixed batches)"

    def top_k() -> str:
        ids, _ = call("mixed", mixed_logits, sampling_metadata(mixed_temps, mixed_top_k, mixed_top_p))
        for row, (temp, k) in enumerate(zip(mixed_temps, mixed_top_k)):
            if temp > 0.0 and k < VOCAB:
                allowed = set(mixed_logits[row].topk(k).indices.tolist())
                assert int(ids[row]) in allowed, \
                    f"row {row} (top_k={k}) sampled {int(ids[row])}, not among its top-{k} tokens {sorted(allowed)}"
        return "sampled rows stay within their top-k"

    def logprobs() -> str:
        logits = _logits(4, 2)
        ids, out = call("logprobs", logits, sampling_metadata([0.0] * 4, max_num_logprobs=NUM_LOGPROBS))
        tensors = getattr(out, "logprobs_tensors", None)
        if tensors is None:
            raise AssertionError(f"max_num_logprobs={NUM_LOGPROBS} was asked for but logprobs_tensors is None")
        token_ids = tensors.logprob_token_ids
        assert tuple(token_ids.shape) == (4, NUM_LOGPROBS + 1), \
            f"logprob_token_ids has shape {tuple(token_ids.shape)}, expected (4, {NUM_LOGPROBS + 1})"
        assert torch.equal(token_ids[:, 0].long(), ids), "the first logprob id of each row is not the sampled token"
        return f"{NUM_LOGPROBS} + 1 logprob ids per row, sampled token first"

    checks.run("token-ids", token_ids)
    checks.run("greedy-argmax", greedy_argmax)
    checks.run("top-k", top_k)
    checks.run("logprobs", logprobs)

