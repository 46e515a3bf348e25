"""Contract of the ``drafter`` family: the declared interface, and proposals when they can be made here.

A drafter builds its proposer from the model runner (``build(runner)``), and
vLLM's proposers take engine-side inputs, so the kit checks what it can
without an engine, under the first kit config whose speculative method it accepts (n-gram, a
draft model, EAGLE, MTP; ``num_speculative_tokens`` = 3), and says what it
did not check:

* ``interface``: the built object has a callable ``build`` taking the runner,
  and the attributes the hookspec asks of it: ``single_token_state`` and
  ``verify_state`` (names of ``AttentionState`` members, checked against the
  core's contract enum :class:`ascend_kernel.step.AttentionState`) and ``kv_cache`` (words);
* ``proposals``: ``build`` is given a stand-in runner holding only
  ``vllm_config``; when that gives a proposer with the n-gram ``propose``
  signature (``num_speculative_tokens, sampled_token_ids, num_tokens_no_spec,
  token_ids_cpu``), it proposes for three requests (two with repeated
  n-grams) and every proposal must be a list of token ids inside the
  vocabulary, no longer than asked. Otherwise (the proposer needs the real
  runner, a draft model, or engine-side inputs) the contract is skipped,
  saying so: only the declared interface was checked.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any

import numpy as np

from ascend_kernel.conformance.base import build_under
from ascend_kernel.conformance.results import Checks, Skip

FAMILY = "drafter"
CONFIGS = ("llama-ngram", "llama-draft-model", "llama-eagle", "qwen3_next-mtp")
NGRAM_PARAMETERS = ("num_speculative_tokens", "sampled_token_ids", "num_tokens_no_spec", "token_ids_cpu")


def _attention_states() -> set[str]:
    from ascend_kernel.step import AttentionState

    return set(AttentionState.__members__)


def check_entry(entry: Any, kit: Any, checks: Checks) -> None:
    built = build_under(entry, kit, checks, CONFIGS)
    if not built:
        return
    found, drafter = built[0]

    def interface() -> str:
        build = getattr(drafter, "build", None)
        assert callable(build), f"{type(drafter).__name__} has no build(runner) method"
        try:
            inspect.signature(build).bind(None)
        except TypeError as exc:
            raise AssertionError(f"build cannot be called with the runner alone: {exc}") from exc
        except ValueError:
            pass
        states = _attention_states()
        for attr in ("single_token_state", "verify_state"):
            value = getattr(drafter, attr, None)
            assert isinstance(value, str) and value, f"{attr} is {value!r}, not the name of an attention state"
            assert value in states, f"{attr} is {value!r}, not one of {sorted(states)}"
        kv_cache = getattr(drafter, "kv_cache", None)
        assert isinstance(kv_cache, str) and kv_cache, f"kv_cache is {kv_cache!r}, not a description"
        return (f"build(runner); single_token_state {drafter.single_token_state}, verify_state "
                f"{drafter.verify_state}, kv_cache {kv_cache!r}")

    def proposals() -> str:
        cfg = found.ctx.vllm_config
        try:
            proposer = drafter.build(SimpleNamespace(vllm_config=cfg))
        except Exception as exc:
            raise Skip(f"needs an engine's model runner to build its proposer ({type(exc).__name__}: {exc}); "
                       "only the declared interface was checked") from exc
        propose = getattr(proposer, "propose", None)
        if not callable(propose):
            raise Skip(f"the proposer built from a stand-in runner ({type(proposer).__name__}) has no propose(); "
                       "only the declared interface was checked")
        try:
            params = tuple(inspect.signature(propose).parameters)
        except (TypeError, ValueError):
            params = ()
        if params[:len(NGRAM_PARAMETERS)] != NGRAM_PARAMETERS:
            raise Skip(f"{type(proposer).__name__}.propose{params} takes engine-side inputs; "
                       "only the declared interface was checked")
        k = cfg.speculative_config.num_speculative_tokens
        vocab = cfg.model_config.get_vocab_size()
        rows = [[5, 6, 7, 8, 5, 6, 7], [1, 2, 3, 1, 2, 3, 1, 2], [9, 4, 11, 20]]
        tokens = np.zeros((len(rows), cfg.model_config.max_model_len), dtype=np.int32)
        for i, row in enumerate(rows):
            tokens[i, :len(row)] = row
        lengths = np.array([len(r) for r in rows], dtype=np.int32)
        drafts = propose(k, [[r[-1]] for r in rows], lengths, tokens)
        drafts = list(drafts)
        assert len(drafts) == len(rows), f"{len(drafts)} proposals for {len(rows)} requests"
        for i, draft in enumerate(drafts):
            ids = [int(t) for t in draft]
            assert len(ids) <= k, f"request {i}: {len(ids)} draft tokens, more than the {k} asked for"
            bad = [t for t in ids if not 0 <= t < vocab]
            assert not bad, f"request {i}: draft ids {bad} are outside the vocabulary [0, {vocab})"
        return f"proposals {[list(map(int, d)) for d in drafts]} (at most {k} ids each, inside the vocabulary)"

    checks.run("interface", interface)
    checks.run("proposals", proposals)
