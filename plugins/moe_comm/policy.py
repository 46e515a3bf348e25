"""The Ascend MoE communication policy.

Without expert parallelism every rank holds every expert, so tokens are
all-gathered. With expert parallelism the choice depends on the SoC and the
batch: MC2 (fused dispatch/combine) while the batch fits its token capacity,
else all-gather on A2 (faster than all-to-all there; all-to-all for w4a8
weights, which all-gather EP cannot serve: known from the model config's
``moe_quantize`` or the checkpoint's quantization config) and all-to-all on A3. A prefill
batch that would all-gather uses naive multicast unless sequence parallelism
is on. PanguProMoE only supports all-gather. On a host without an Ascend SoC
(CPU) expert parallelism takes all-gather, the method without a capacity
(``ASCEND_KERNEL_SOC`` plans for A2/A3, ``ASCEND_KERNEL_MOE_COMM_METHOD``
forces any method). Expert parallelism on any other SoC (310P) is refused at
start-up, as the seed refused it.

The policy decides names; :class:`~ascend_kernel_plugins.moe_comm.selector.MethodSelector`
turns them into the method objects the MoE plugins registered.
"""

from __future__ import annotations

from typing import Any

from ascend_kernel_plugins.moe_comm.selector import MethodSelector

ALLGATHER = "allgather"
MC2 = "mc2"
ALLTOALL = "alltoall"
NAIVE_MULTICAST = "naive_multicast"

#: a model's int4 experts, as a model config (``moe_quantize``) or a quantization config names them
W4A8_DYNAMIC = "w4a8_dynamic"

#: graph capture never exceeds this many tokens, so neither does MC2's buffer
MC2_TOKEN_CAP = 512

#: the SoCs whose expert-parallel methods the rules know; None is a host without an Ascend SoC (CPU)
EXPERT_PARALLEL_SOCS = ("A2", "A3", None)


def refuse_unsupported_soc(soc: str | None, expert_parallel: bool, is_moe: bool) -> None:
    """Expert parallelism on an SoC the rules do not cover (310P, ...) stops start-up, as the seed's runner did.

    The seed raised per batch; here the configuration is refused once, before
    the model loads, naming the setting that makes it valid.
    """
    if is_moe and expert_parallel and soc not in EXPERT_PARALLEL_SOCS:
        from ascend_kernel.errors import SelectionError

        raise SelectionError(
            f"MoE comm: Unsupported soc_version: {soc}. Expert parallelism has MoE comm methods for Ascend A2 and "
            f"A3 only; this device is {soc}. Turn expert parallelism off (drop --enable-expert-parallel / "
            "enable_expert_parallel=False): without it every rank holds every expert and tokens are all-gathered.")


def is_moe_model(vllm_config: Any) -> bool:
    model = vllm_config.model_config
    return bool(model is not None and model.is_moe)


def mc2_tokens_capacity(vllm_config: Any) -> int:
    """Largest batch MC2 serves: the largest graph size, rounded up to a multiple of TP."""
    capture_sizes = vllm_config.compilation_config.cudagraph_capture_sizes
    if capture_sizes:
        max_tokens = max(capture_sizes)
    else:
        spec = vllm_config.speculative_config
        decode_len = 1 + (spec.num_speculative_tokens if spec is not None else 0)
        max_tokens = min(vllm_config.scheduler_config.max_num_seqs * decode_len, MC2_TOKEN_CAP)
    tp = vllm_config.parallel_config.tensor_parallel_size
    return -(-max_tokens // tp) * tp


class AscendMoECommPolicy:
    """Per-batch method choice; all config facts are read once at build time."""

    __slots__ = ("is_moe", "expert_parallel", "soc", "capacity", "world_size", "min_mc2_world",
                 "w4a8", "allgather_only", "sequence_parallel", "selector", "select",
                 "experts_under_compile")

    def __init__(self, *, is_moe: bool, expert_parallel: bool, soc: str | None, capacity: int,
                 world_size: int, min_mc2_world: int, w4a8: bool, allgather_only: bool,
                 sequence_parallel: bool) -> None:
        self.is_moe = is_moe
        self.expert_parallel = expert_parallel
        self.soc = soc
        self.capacity = capacity
        self.world_size = world_size
        self.min_mc2_world = min_mc2_world
        self.w4a8 = w4a8
        self.allgather_only = allgather_only
        self.sequence_parallel = sequence_parallel
        self.selector: MethodSelector | None = None
        self.select = self.decide  # replaced by the selector's once bound to the methods table
        #: whether compiled MoE layers trace their routed experts, and why (traced_experts.record)
        self.experts_under_compile: dict[str, Any] | None = None

    def bind(self, table: Any, forced: str | None) -> "AscendMoECommPolicy":
        """Serve method objects from ``table``; checks every name this policy can return is in it."""
        self.selector = MethodSelector(table, self.decide, self.possible_methods(), forced, "ascend")
        self.select = self.selector.select
        return self

    def possible_methods(self) -> set[str]:
        """Every name :meth:`decide` can return for this configuration."""
        if not self.is_moe:
            return set()
        if self.allgather_only:
            return {ALLGATHER}
        if not self.expert_parallel or self.soc not in ("A2", "A3"):
            names = {ALLGATHER}
        elif self.soc == "A3":
            names = {MC2, ALLTOALL}
        else:
            names = {ALLTOALL if self.w4a8 else ALLGATHER}
            if self.world_size >= self.min_mc2_world:
                names.add(MC2)
        if ALLGATHER in names and not self.sequence_parallel:
            names.add(NAIVE_MULTICAST)
        return names

    def prepare_model(self, vllm_config: Any) -> list[str]:
        """Install the kernel's MoE layer (before the model is built) for models with experts."""
        if not self.is_moe:
            return []
        from ascend_kernel_plugins.moe_comm import layer

        return layer.register()

    def describe(self) -> dict[str, Any]:
        methods = self.selector.table if self.selector is not None else {}
        return {"methods": {name: m.describe() for name, m in sorted(methods.items())},
                "forced": self.selector.forced if self.selector is not None else None,
                # the rules' inputs: the EP world spans the DP ranks (world_size_across_dp)
                "expert_parallel": self.expert_parallel, "world_size": self.world_size,
                "experts_under_compile": self.experts_under_compile}

    @classmethod
    def from_context(cls, ctx: Any) -> "AscendMoECommPolicy":
        policy = cls.from_config(ctx)
        return policy.bind(ctx.tables.get("moe_comm_method", {}), ctx.settings.forced("moe_comm_method"))

    @classmethod
    def from_config(cls, ctx: Any) -> "AscendMoECommPolicy":
        """The rules alone (no methods table): what :meth:`decide` answers."""
        cfg = ctx.vllm_config
        hf = cfg.model_config.hf_config if cfg.model_config is not None else None
        expert_parallel = bool(cfg.parallel_config.enable_expert_parallel)
        refuse_unsupported_soc(ctx.device.soc, expert_parallel, is_moe_model(cfg))
        return cls(
            is_moe=is_moe_model(cfg),
            expert_parallel=expert_parallel,
            soc=ctx.device.soc,
            capacity=mc2_tokens_capacity(cfg),
            world_size=cfg.parallel_config.world_size_across_dp,
            min_mc2_world=ctx.settings.mc2_min_world_size,
            w4a8=W4A8_DYNAMIC in (getattr(hf, "moe_quantize", None), getattr(getattr(cfg, "quant_config", None), "moe_quantize", None)),
            allgather_only=getattr(hf, "model_type", None) == "PanguProMoE",
            # the TP-communication state (vllm-ascend's enable_flashcomm1); vLLM 0.32's PassConfig has no enable_sp
            sequence_parallel=bool(getattr(ctx.settings, "sequence_parallel", False)),
        )

    def decide(self, num_tokens: int, with_prefill: bool) -> str | None:
        """The method name for a batch (the seed runner's rules)."""
        if not self.is_moe:
            return None
        if self.allgather_only:
            return ALLGATHER
        if not self.expert_parallel or self.soc not in ("A2", "A3"):
            method = ALLGATHER
        elif self.soc == "A3":
            method = MC2 if num_tokens <= self.capacity else ALLTOALL
        elif num_tokens <= self.capacity and self.world_size >= self.min_mc2_world:
            method = MC2
        else:
            method = ALLTOALL if self.w4a8 else ALLGATHER
        if method == ALLGATHER and with_prefill and not self.sequence_parallel:
            return NAIVE_MULTICAST
        return method
