"""The TP-communication family: the per-pass choice (thresholds, padding, MoE always), its policies' support and
records, and sequence parallelism's arithmetic on two real gloo ranks against the all-reduce it replaces."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from ascend_kernel.errors import SelectionError
from ascend_kernel.registry import choose as choose_impl
from ascend_kernel.settings import load_settings
from ascend_kernel.step import StepTrace
from ascend_kernel_plugins.tp_comm import (
    ALL_REDUCE, SEQUENCE_PARALLEL, STEP_COUNTER, SequenceParallelPass, choose, min_tokens_for,
)
from ascend_kernel_plugins.tp_comm.plugin import ascend_kernel_tp_comm_policies
from ascend_kernel_plugins.tp_comm.policy import SequenceParallelPolicy

from tests.gloo_ranks import run_ranks

# -- the decision ------------------------------------------------------------------------------------------------


def test_dense_models_run_sequence_parallel_from_1000_tokens_by_default():
    floor = min_tokens_for(None, is_moe=False)
    assert floor == 1000
    assert choose(999, floor) == ALL_REDUCE and choose(1000, floor) == SEQUENCE_PARALLEL
    assert choose(32768, floor) == SEQUENCE_PARALLEL and choose(1, floor) == ALL_REDUCE


def test_moe_models_run_sequence_parallel_on_every_pass_by_default():
    floor = min_tokens_for(None, is_moe=True)
    assert floor == 1
    assert all(choose(n, floor) == SEQUENCE_PARALLEL for n in (1, 2, 7, 4096))
    assert choose(0, floor) == ALL_REDUCE  # an empty pass has nothing to shard


def test_the_setting_moves_the_threshold_for_either_kind():
    assert min_tokens_for(8, is_moe=False) == 8 and min_tokens_for(64, is_moe=True) == 64
    assert choose(7, 8) == ALL_REDUCE and choose(8, 8) == SEQUENCE_PARALLEL
    assert choose(63, 64) == ALL_REDUCE  # a MoE model under an explicit threshold all-reduces too
    assert load_settings({"ascend_kernel": {"sp_min_tokens": 8}}).sp_min_tokens == 8
    with pytest.raises(Exception, match="sp_min_tokens"):
        load_settings({"ascend_kernel": {"sp_min_tokens": 0}})


@pytest.mark.parametrize("tokens, tp, padded, shard", [(13, 2, 14, 7), (14, 2, 14, 7), (5, 4, 8, 2), (1, 2, 2, 1),
                                                      (9, 1, 9, 9)])
def test_tokens_are_padded_to_a_multiple_of_tp(tokens, tp, padded, shard):
    record = SequenceParallelPass.of(tokens, tp)
    assert (record.padded_tokens, record.shard_tokens, record.pad_size) == (padded, shard, padded - tokens)
    assert record.padded_tokens % tp == 0 and 0 <= record.pad_size < tp


def test_the_policy_counts_scheduled_steps_by_choice_and_publishes_a_record_only_for_sequence_parallel():
    policy = SequenceParallelPolicy(tp_size=2, is_moe=False, min_tokens=8)
    trace = StepTrace()
    first = policy.select(13, trace)
    assert first == SequenceParallelPass(13, 14, 2) and policy.select(13, trace) is first
    assert policy.select(2, trace) is None and policy.select(7, trace) is None
    assert policy.select(100, None) is not None  # a dummy or profile pass: chosen, not counted
    assert trace.as_dict()[STEP_COUNTER] == {SEQUENCE_PARALLEL: 2, ALL_REDUCE: 2}
    assert policy.describe() == {"policy": "sequence-parallel", "tp_size": 2, "model_kind": "dense", "min_tokens": 8}


def test_the_sequence_parallel_policy_meets_the_familys_contract():
    """The conformance kit builds policies under its own contexts, where sequence parallelism is not asked for."""
    from ascend_kernel.conformance.results import Checks
    from ascend_kernel.conformance.tp_comm import check

    checks = Checks("tp-comm", "tp_comm", "sequence-parallel")
    check(SequenceParallelPolicy(tp_size=4, is_moe=True, min_tokens=1), checks)
    assert [(r.contract, r.status) for r in checks.results] == [("interface", "pass"), ("pass-record", "pass")]
    assert checks.results[1].reason == "8 of 8 passes sequence parallel"


# -- which policy, and why -----------------------------------------------------------------------------------------


class _SeamLayers:
    sequence_parallel_layers = True


def _ctx(sequence_parallel=True, layers=_SeamLayers(), moe=False, arch="LlamaForCausalLM", eager=True, tp=2, pp=1,
         min_tokens=None, spec=None):
    settings = load_settings({"ascend_kernel": {"sequence_parallel": sequence_parallel, "sp_min_tokens": min_tokens}})
    model = SimpleNamespace(is_moe=moe, enforce_eager=eager, hf_config=SimpleNamespace(architectures=[arch]))
    config = SimpleNamespace(model_config=model, parallel_config=SimpleNamespace(tensor_parallel_size=tp,
                                                                                  pipeline_parallel_size=pp),
                             speculative_config=None if spec is None else SimpleNamespace(method=spec))
    return SimpleNamespace(vllm_config=config, settings=settings, chosen={"layer_ops": layers})


def _pick(ctx):
    impl, record = choose_impl("tp_comm", ascend_kernel_tp_comm_policies(), ctx, forced=None,
                               forcing_setting="ASCEND_KERNEL_TP_COMM")
    return impl.build(ctx), record


def test_all_reduce_is_chosen_when_sequence_parallelism_is_not_asked_for_and_costs_nothing_per_pass():
    policy, record = _pick(_ctx(sequence_parallel=False))
    assert record.chosen == "all-reduce" and not hasattr(policy, "select")  # the runner then calls nothing per pass
    assert "not asked for" in next(c.reason for c in record.candidates if c.name == "sequence-parallel")


def test_sequence_parallel_is_chosen_when_asked_for_and_reads_the_threshold():
    policy, record = _pick(_ctx(min_tokens=8))
    assert record.chosen == "sequence-parallel" and policy.shards_tokens
    assert (policy.tp_size, policy.min_tokens, policy.is_moe) == (2, 8, False)
    assert "sequence parallelism is asked for" in next(c.reason for c in record.candidates if c.name == "all-reduce")
    assert _pick(_ctx())[0].min_tokens == 1000


def test_compiled_models_are_supported_the_choice_is_made_at_run_time():
    assert _pick(_ctx(eager=False))[1].chosen == "sequence-parallel"


@pytest.mark.parametrize("method", ["ngram", "eagle", "mtp", "draft_model"])
def test_drafters_that_read_only_the_final_hidden_states_are_supported(method):
    assert _pick(_ctx(spec=method))[1].chosen == "sequence-parallel"


@pytest.mark.parametrize("arch", ["Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "DeepseekV2ForCausalLM"])
def test_moe_models_are_supported_and_run_sequence_parallel_on_every_pass(arch):
    policy, record = _pick(_ctx(moe=True, arch=arch, eager=False))
    assert record.chosen == "sequence-parallel" and policy.is_moe and policy.min_tokens == 1


@pytest.mark.parametrize("change, words", [
    (dict(layers=object()), "ASCEND_KERNEL_LAYER_OPS=ascend"),
    (dict(arch="Gemma2ForCausalLM"), "Gemma2ForCausalLM"),
    (dict(pp=2), "pipeline parallelism"),
    (dict(tp=1), "tensor parallel size 1"),  # was a model-load RuntimeError about the decoder's shape
    (dict(spec="eagle3"), "speculative method eagle3: its drafter reads the target's hidden states"),
])
def test_asked_for_where_its_mechanism_cannot_run_is_an_error_with_the_reason_never_a_silent_all_reduce(change, words):
    with pytest.raises(SelectionError) as info:
        _pick(_ctx(**change))
    message = str(info.value)
    assert words in message and "sequence parallelism is asked for" in message


# -- the arithmetic on two ranks -----------------------------------------------------------------------------------

WORLD, TOKENS, HIDDEN, INTER = 2, 5, 8, 6  # 5 tokens: one pad row at TP=2


def _weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"embed": torch.randn(TOKENS, HIDDEN, generator=g, dtype=torch.float64),
            "o": torch.randn(HIDDEN, HIDDEN, generator=g, dtype=torch.float64) / 3,
            "down": torch.randn(HIDDEN, INTER, generator=g, dtype=torch.float64) / 3,
            "up": torch.randn(INTER, HIDDEN, generator=g, dtype=torch.float64) / 3,
            "w1": 1 + torch.randn(HIDDEN, generator=g, dtype=torch.float64) / 10,
            "w2": 1 + torch.randn(HIDDEN, generator=g, dtype=torch.float64) / 10,
            "w3": 1 + torch.randn(HIDDEN, generator=g, dtype=torch.float64) / 10}


class _Norms:
    """RMSNorm in float64 as the seam's ops compute it (per token: a rank's shard needs nothing from other tokens)."""

    @staticmethod
    def rms_norm(x, weight, eps):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight, None

    def add_rms_norm(self, x, residual, weight, eps):
        added = x + residual
        return self.rms_norm(added, weight, eps)[0], added


def _worker(rank: int, port: int, out_dir: str) -> None:
    """One decoder layer (row-parallel o and down projections) and the final norm, both ways, on this rank."""
    import torch.distributed as dist

    from ascend_kernel.ops.sequence_parallel import all_gather_tokens, reduce_scatter_tokens, token_shard

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    ops, w, eps = _Norms(), _weights(), 1e-6
    o_cols = slice(rank * HIDDEN // WORLD, (rank + 1) * HIDDEN // WORLD)  # row-parallel: this rank's input columns
    d_cols = slice(rank * INTER // WORLD, (rank + 1) * INTER // WORLD)

    def o_partial(h):  # the attention's output columns of this rank through its o_proj rows
        return h[:, o_cols] @ w["o"][:, o_cols].T

    def down_partial(h):
        return torch.relu(h @ w["up"].T)[:, d_cols] @ w["down"][:, d_cols].T

    def all_reduce(t):
        t = t.clone()
        dist.all_reduce(t)
        return t

    x = w["embed"]
    # all-reduce: every rank every token
    h = ops.rms_norm(x, w["w1"], eps)[0]
    y, res = ops.add_rms_norm(all_reduce(o_partial(h)), x.clone(), w["w2"], eps)
    y, res = ops.add_rms_norm(all_reduce(down_partial(y)), res, w["w3"], eps)
    # sequence parallel: reduce-scatter, norm + residual on the shard, all-gather before the next column layer
    padded = SequenceParallelPass.of(TOKENS, WORLD).padded_tokens
    h_sp = ops.rms_norm(x, w["w1"], eps)[0]  # the first norm has no residual yet: the embedding's full tokens
    shard = reduce_scatter_tokens(o_partial(h_sp), padded, None, WORLD)
    out, res_sp = ops.add_rms_norm(shard, token_shard(x, padded, rank, WORLD), w["w2"], eps)
    y_sp = all_gather_tokens(out, TOKENS, None, WORLD)
    out, res_sp = ops.add_rms_norm(reduce_scatter_tokens(down_partial(y_sp), padded, None, WORLD), res_sp, w["w3"],
                                   eps)
    torch.save({"all_reduce": (y, res), "sequence_parallel": (all_gather_tokens(out, TOKENS, None, WORLD), res_sp),
                "shard_rows": shard.shape[0]}, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return run_ranks(_worker, WORLD, tmp_path_factory.mktemp("tp_comm"))


def test_sequence_parallel_gives_every_rank_the_all_reduce_result(ranks):
    for got in ranks:
        (expected, _), (gathered, _) = got["all_reduce"], got["sequence_parallel"]
        assert gathered.shape == (TOKENS, HIDDEN) and got["shard_rows"] == 3
        torch.testing.assert_close(gathered, expected, rtol=1e-12, atol=1e-12)


def test_each_rank_keeps_its_shard_of_the_residual_padding_last(ranks):
    padded = SequenceParallelPass.of(TOKENS, WORLD).padded_tokens
    residual = ranks[0]["all_reduce"][1]
    shards = [got["sequence_parallel"][1] for got in ranks]
    assert [s.shape[0] for s in shards] == [padded // WORLD] * WORLD
    torch.testing.assert_close(torch.cat(shards)[:TOKENS], residual, rtol=1e-12, atol=1e-12)
    assert torch.equal(torch.cat(shards)[TOKENS:], torch.zeros(padded - TOKENS, HIDDEN, dtype=torch.float64))


# -- the opaque op: one traced graph, both choices, on two ranks -----------------------------------------------------

OP_TOKENS = (5, 4, 1)  # odd (one pad row), even, a single token (rank 1's shard is all padding)


def _op_worker(rank: int, port: int, out_dir: str) -> None:
    """``ascend_kernel::tp_add_rms_norm`` compiled once (fullgraph), called with the choice flipped per call."""
    import torch.distributed as dist

    from ascend_kernel.ops.opaque import provider_handle
    from ascend_kernel.ops.sequence_parallel import GroupComm
    from ascend_kernel_plugins.layers import sequence_parallel as sp

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    choice = {"record": None}
    sp.current_pass = lambda: choice["record"]  # what the forward context would hold
    sp.tp_group = lambda: GroupComm()
    sp.step_trace = lambda: trace
    trace = StepTrace()
    norm = SimpleNamespace(seam_ops=_NormProvider(), weight=torch.nn.Parameter(requires_grad=False, data=1 + torch.arange(HIDDEN,
                           dtype=torch.float64) / 10), variance_epsilon=1e-6)
    norm.sp_handle, norm.sp_reduced = provider_handle(norm.seam_ops), False  # as sp.mark does (a separate matmul)

    def layer(partial, residual):
        normed, residual = sp.tp_add_rms_norm(norm, partial * 1.0, residual)
        return normed * 2.0, residual

    compiled = torch.compile(layer, fullgraph=True, dynamic=True, backend="aot_eager")  # traced, op opaque
    results = {}
    for tokens in OP_TOKENS:
        g = torch.Generator().manual_seed(tokens)
        residual = torch.randn(tokens, HIDDEN, generator=g, dtype=torch.float64)
        partial = torch.randn(tokens, HIDDEN, generator=g, dtype=torch.float64) * (rank + 1)
        for name, record in (("all_reduce", None), ("sequence_parallel", SequenceParallelPass.of(tokens, WORLD))):
            choice["record"] = record
            results[(tokens, name, "compiled")] = compiled(partial, residual)
            results[(tokens, name, "eager")] = layer(partial, residual)
        summed = partial / (rank + 1) * sum(r + 1 for r in range(WORLD))
        results[(tokens, "oracle")] = _Norms().add_rms_norm(summed, residual, norm.weight.detach(), 1e-6)
    results["trace"] = trace.as_dict()
    results["compiles"] = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


class _NormProvider(_Norms):
    name = "tp-comm-test-norms"


@pytest.fixture(scope="module")
def op_ranks(tmp_path_factory) -> list[dict]:
    return run_ranks(_op_worker, WORLD, tmp_path_factory.mktemp("tp_op"))


def test_the_op_gives_the_all_reduce_result_either_way_compiled_or_eager(op_ranks):
    for got in op_ranks:
        for tokens in OP_TOKENS:
            expected, residual = got[(tokens, "oracle")]
            for name in ("all_reduce", "sequence_parallel"):
                for mode in ("compiled", "eager"):
                    normed, _ = got[(tokens, name, mode)]
                    assert normed.shape == (tokens, HIDDEN)
                    torch.testing.assert_close(normed, 2 * expected, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(got[(tokens, "all_reduce", "compiled")][1], residual, rtol=1e-12, atol=1e-12)


def test_in_a_sequence_parallel_call_each_rank_keeps_its_shard_of_the_residual(op_ranks):
    """The other rows are never read (the next norm reads this rank's again), so they are left unwritten."""
    for tokens in OP_TOKENS:
        shard = SequenceParallelPass.of(tokens, WORLD).shard_tokens
        residual = op_ranks[0][(tokens, "oracle")][1]
        for rank, got in enumerate(op_ranks):
            rows = slice(rank * shard, min((rank + 1) * shard, tokens))
            for mode in ("compiled", "eager"):
                out = got[(tokens, "sequence_parallel", mode)][1]
                assert out.shape == (tokens, HIDDEN)
                torch.testing.assert_close(out[rows], residual[rows], rtol=1e-12, atol=1e-12)


def test_one_traced_graph_serves_both_choices_and_the_trace_counts_calls_and_bytes(op_ranks):
    for got in op_ranks:
        assert got["compiles"] <= 2  # dynamic shapes: the first size, then one symbolic graph; never per choice
        trace = got["trace"]
        calls = 2 * len(OP_TOKENS)  # compiled and eager per choice and size
        assert trace["sequence_parallel_norm_ops"] == {"all_reduce": calls, "sequence_parallel": calls}
        row = HIDDEN * 8  # float64
        # ring: an all-reduce sends 2 (p-1)/p of the tensor; reduce-scatter + all-gather the same of the padded one
        ar = sum(2 * (WORLD - 1) * t * row // WORLD for t in OP_TOKENS)
        sp = sum(2 * (WORLD - 1) * SequenceParallelPass.of(t, WORLD).padded_tokens * row // WORLD for t in OP_TOKENS)
        assert trace["tp_comm_bytes_sent"] == {"all_reduce": 2 * ar, "sequence_parallel": 2 * sp}


def test_vllms_moe_runner_skips_its_final_all_reduce_when_asked_after_construction():
    """The contract mark() relies on for MoE layers: the config field exists and the runner reads it when it runs."""
    import dataclasses
    import inspect

    from vllm.model_executor.layers.fused_moe.config import FusedMoEConfig
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

    assert "skip_final_all_reduce" in {f.name for f in dataclasses.fields(FusedMoEConfig)}
    source = inspect.getsource(MoERunner)
    assert "self.moe_config.skip_final_all_reduce" in source and "tensor_model_parallel_all_reduce" in source
