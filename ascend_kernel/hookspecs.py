"""Hook specifications: the whole contract between the kernel and its plugins.

Two kinds of hooks exist, and the difference matters for speed:

* **Registration hooks** (plural nouns, e.g. :func:`ascend_kernel_drafters`)
  are called once per process at start-up. Each returns a list of
  :class:`~ascend_kernel.registry.Implementation` entries: named, with a
  ``supports(ctx)`` predicate and a ``priority``. The kernel collects the
  entries of every plugin, picks one per family (a forcing setting > highest
  priority among supported entries), keeps a decision record, and hands the
  runner the built object. The decode loop then calls that object's methods
  directly: **no pluggy dispatch happens per step**.
* **Lifecycle hooks** (verbs, e.g. :func:`ascend_kernel_configure`) run at
  fixed moments of start-up.
* **The declaration hook** :func:`ascend_kernel_settings` returns a plugin's
  settings model; the kernel reads it before it loads plugins, from every
  installed one.

All hooks are called for every registered plugin (collect semantics) unless
marked ``firstresult``. Arguments are passed by keyword; an implementation may
accept any subset of them. A plugin that implements a hook name not listed here
is rejected at start-up, with its name and entry point.

The selection context passed to every ``supports(ctx)`` and factory is an
:class:`ascend_kernel.kernel.SelectionContext` with ``vllm_config``,
``settings``, ``device`` (a :class:`ascend_kernel.device.DeviceInfo`) and
``subject`` (the KV-cache spec class for ``kv_cache``; None elsewhere).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import pydantic

    from ascend_kernel.device import DeviceInfo
    from ascend_kernel.registry import Implementation
    from ascend_kernel.settings import KernelSettings

PROJECT_NAME = "ascend_kernel"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


# ---------------------------------------------------------------------------
# settings
# ---------------------------------------------------------------------------


@hookspec
def ascend_kernel_settings() -> "type[pydantic.BaseModel] | None":
    """Declare this plugin's own settings: a pydantic model class, or None.

    Called once per :func:`ascend_kernel.settings.load_settings`, before any
    plugin is registered and before any other hook, on every *installed*
    plugin, enabled or not (the settings themselves say which plugins are
    enabled, so the set of settings cannot depend on them). Implement it as a
    plain function returning a class defined at module level (the settings
    are pickled to worker processes by reference to it).

    Each field becomes a setting exactly like the core's: environment
    variable ``ASCEND_KERNEL_<FIELD>``, key ``<field>`` of
    ``additional_config["ascend_kernel"]``, the same checks and error messages
    (a bad value, an empty value, a misspelt name). The kernel composes the
    core's model and every plugin's into one frozen object, so a plugin reads
    its setting as an attribute of the ``settings`` it is given
    (``ctx.settings.mc2_min_world_size``); that object is also an instance of
    the plugin's model. A disabled plugin's settings are still checked and
    have no effect.

    Give every field a ``description`` (``ascend-kernel settings`` and
    docs/settings.md show it) and, where the type does not say what is
    allowed in words, ``json_schema_extra={"allowed": "..."}``. Validators
    (``field_validator``) of the model apply.

    A model may also define a classmethod ``from_foreign_config(additional_config,
    model) -> {setting: value}``: the settings that keys *outside* the kernel's
    section (another project's configuration, e.g. vllm-ascend's) stand for.
    ``load_settings`` calls it for every installed model, in every process, and
    the kernel's own section wins over what it returns; it raises
    :class:`ascend_kernel.errors.SettingsError` to refuse a key by name.

    :return: the model class. A field name that the core or another plugin
        already declares stops start-up with a
        :class:`ascend_kernel.errors.SettingsError` naming both owners.
    """


# ---------------------------------------------------------------------------
# config
# ---------------------------------------------------------------------------


@hookspec
def ascend_kernel_configure(
    settings: "KernelSettings", vllm_config: Any, device: "DeviceInfo", requested: Any
) -> "list[Any] | None":
    """Validate and fix this plugin's slice of the vLLM configuration.

    Called once, by the platform's ``check_and_update_config``, after vLLM's
    own platform defaults were applied and before any family is chosen, so
    that a fix-up (say, disabling an op that is wrong for a model) is seen by
    every later decision.

    :param settings: the engine's typed kernel settings.
    :param vllm_config: vLLM's ``VllmConfig``; the plugin may change it.
    :param device: the device the kernel runs on (kind, Ascend SoC); fix-ups
        that only make sense on an NPU check ``device.kind``.
    :param requested: ``scheduler_config`` and ``cache_config`` as the user
        asked for them, before the base vLLM platform adjusted them (copies),
        so a plugin that can serve what the base platform turned off may turn
        it back on.
    :return: a list of :class:`ascend_kernel.config_changes.ConfigChange`, one
        per field the plugin changed (the kernel records and logs them), or
        None. To refuse a configuration, raise ``ascend_kernel.errors.KernelError``
        with a message that says what is wrong and what is allowed.
    """


@hookspec
def ascend_kernel_pre_register() -> "list[str] | None":
    """Register names vLLM must know before it builds any config.

    Called once per process by the platform's ``pre_register_and_update``
    (vLLM calls it before it parses its arguments or builds a ``VllmConfig``),
    with the plugins the environment enables (``additional_config`` is not
    known yet). For names vLLM checks while it builds its config, such as a
    quantization method (``--quantization ascend``) and the config class that
    reads its checkpoint files. Must be idempotent: a name already registered
    is left alone.

    :return: what was registered, in words (logged and shown in the report),
        or None.
    """


# ---------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------


@hookspec
def ascend_kernel_attention_backends() -> "list[Implementation]":
    """Offer attention-backend providers (family ``attention_backend``).

    The built object must provide
    ``backend_class_path(selected_backend, selector_config, num_heads, platform_default) -> str``,
    which the platform's ``get_attn_backend_cls`` returns to vLLM. It is
    called by vLLM once per distinct layer kind (MLA or not, sparse or not);
    ``platform_default`` is the base platform's own answer, for providers that
    delegate. A provider may also offer
    ``mla_prefill_backend_cls(selector_config, platform_default) -> type`` to
    choose vLLM's MLA prefill backend; without it the platform's is kept.
    And it may offer ``prepare_model(vllm_config) -> list[str]``, which the
    runner calls once, before the model is built (registrations through
    vLLM's own out-of-tree registry); it returns the dotted names it
    replaced, shown in the report. A backend that needs a model-level module
    of its own (a module that is not a vLLM custom op can only be swapped
    before construction, e.g. the SFA backend's lightning indexer) offers
    ``model_build_scope(vllm_config)`` instead: a context manager, entered
    while the runner builds the model and its drafter, that yields the
    dotted names it replaced and puts vLLM's back on exit.

    :return: entries for this family (may be empty).
    """


@hookspec
def ascend_kernel_attention_state_policies() -> "list[Implementation]":
    """Offer per-step attention-state policies (family ``attention_state``).

    The built object must provide ``decide(batch) -> AttentionState`` where
    ``batch`` is a :class:`ascend_kernel.step.StepBatch`. The runner calls it
    once per step, directly, and publishes the state to vLLM's forward context
    under ``"ascend_attn_state"``. The returned state must have ``name`` and
    ``is_prefill``. Reading the batch's facts (``fresh``, ``single_token``,
    ``single_valid``) costs a few scalar operations in a live step; its
    per-request arrays are computed on first read.

    A policy whose answer depends on those three facts alone should also
    provide ``decide_facts(fresh, single_token, single_valid) -> AttentionState``
    (pure, agreeing with ``decide``): the runner then calls it for the eight
    combinations at start-up and answers each step from that table, with no
    batch object and no policy call in the step.
    """


@hookspec
def ascend_kernel_attention_masks() -> "list[Implementation]":
    """Offer attention-mask builders (family ``attention_mask``).

    The built object must provide ``mask_for(state, seq_lens, positions, dtype, device)``
    returning the mask the backend needs for that attention state (or None),
    from caches that grow and are never rebuilt per step.
    """


# ---------------------------------------------------------------------------
# KV cache
# ---------------------------------------------------------------------------


@hookspec
def ascend_kernel_kv_cache_layouts() -> "list[Implementation]":
    """Offer KV-cache layouts (family ``kv_cache``, chosen once per spec type).

    The kernel chooses one layout for every ``KVCacheSpec`` class present in
    the model's ``KVCacheConfig``; ``ctx.subject`` is that class, so
    ``supports`` typically checks ``issubclass(ctx.subject, FullAttentionSpec)``.
    The built object must provide:

    * ``alignment(vllm_config) -> int``: the byte alignment every tensor it
      places needs (1 when none; 2 MiB with PD disaggregation);
    * ``views(backing, placement, spec, num_blocks, kernel_block_size) -> list[Tensor]``:
      one cache object per layer of a ``KVCacheTensor`` placement, as views of
      the shared backing buffer (nothing else is allocated).
    """


# ---------------------------------------------------------------------------
# MoE communication
# ---------------------------------------------------------------------------


@hookspec
def ascend_kernel_moe_comm_policies() -> "list[Implementation]":
    """Offer MoE communication policies (family ``moe_comm``: one is chosen).

    The built object must provide ``select(num_tokens, with_prefill) -> method | None``:
    the method object (from ``ctx.tables["moe_comm_method"]``) that moves this
    forward pass's tokens, or None for a model without experts. The runner
    calls it directly once per forward pass, publishes the object to vLLM's
    forward context under ``"moe_comm_method"`` (the MoE layers read it there)
    and counts ``trace.moe_methods[method.name]``. A policy that knows the
    model has no experts should say so with ``is_moe = False``: the runner
    then never calls ``select`` and publishes None, so a dense model pays
    nothing per forward pass.

    A policy decides *names*; the built-in moe-comm plugin's method selector
    turns a name into the method object, applies ``ASCEND_KERNEL_MOE_COMM_METHOD``
    and sends a batch over a method's capacity to its fallback (counted in the
    trace as ``moe_fallbacks``). At build time the policy must fail (raise)
    when a name it can return, or a fallback of one, is not in the table, so
    that a missing plugin stops start-up instead of a batch.

    An object may also provide ``prepare_model(vllm_config) -> list[str]``
    (see :func:`ascend_kernel_attention_backends`): the MoE policy uses it to
    install its MoE layer before the model is built.
    """


@hookspec
def ascend_kernel_moe_comm_methods() -> "list[Implementation]":
    """Offer MoE communication methods (family ``moe_comm_method``: a table, not one choice).

    Every supported entry is built at start-up into
    ``ctx.tables["moe_comm_method"]`` (name -> object) for the policy to choose
    from per batch. The object must provide:

    * ``name``: the method's name (the entry's name);
    * ``capacity``: the most tokens per forward pass it serves, or None;
    * ``fallback``: the method serving a batch over ``capacity`` (None without a capacity);
    * ``dispatch(hidden, topk_weights, topk_ids, experts, parallel) -> Dispatched``:
      move this rank's tokens ``hidden`` [T, H] (routed to global expert ids
      ``topk_ids`` [T, K] with ``topk_weights``) to the ranks that own their
      experts; return the rows this rank's experts must run, grouped by local
      expert, and one count per local expert. ``experts`` is a
      :class:`ascend_kernel.ops.moe_experts.LocalExperts`, ``parallel`` a
      :class:`ascend_kernel.ops.moe_parallel.MoEParallel`;
    * ``combine(expert_out, dispatched) -> Tensor [T, H]``: bring the outputs
      back, weighted by the routing weights and summed per token. Ranks that hold
      the same batch (tensor parallel) may each return part of the sum: vLLM's
      TP all-reduce after the layer adds them up.

    A method is called directly by the MoE layer; it may hold no per-batch state
    outside the ``Dispatched`` it returns (layers interleave).
    """


# ---------------------------------------------------------------------------
# speculative decoding
# ---------------------------------------------------------------------------


@hookspec
def ascend_kernel_drafters() -> "list[Implementation]":
    """Offer drafters (family ``drafter``; optional: unused without a speculative config).

    Resolved first of all families: the attention-state policy reads the
    chosen drafter's rules from ``ctx.chosen["drafter"]``. ``supports(ctx)``
    should check the speculative method the vLLM config asks for
    (``ctx.vllm_config.speculative_config.method``; a method vLLM does not
    know arrives as ``custom_class`` with the proposer's class path in
    ``speculative_config.model``). The built object must provide:

    * ``build(runner) -> proposer``: called once by the runner; the proposer
      replaces the one vLLM's runner built (``runner.drafter``) and must have
      the interface vLLM's runner dispatches to for that method
      (``propose(...)``, ``load_model(...)``); vLLM's proposer classes may be
      the base. Its draft model's forward passes build attention metadata
      through the chosen backend's ``build_for_drafting``;
    * ``single_token_state`` and ``verify_state``: names of
      ``AttentionState`` members for the target's batches of one-token
      decodes and of draft verification (the Ascend rules: ``DecodeOnly`` /
      ``SpecDecoding``; EAGLE verifies as ``ChunkedPrefill``; MTP decodes as
      ``SpecDecoding``);
    * ``kv_cache``: what KV cache the proposer needs, in words (shown in the
      report; its layers' caches come from the kernel's layouts).

    It may provide ``describe() -> dict`` for the report.
    """


# ---------------------------------------------------------------------------
# sampling
# ---------------------------------------------------------------------------


@hookspec
def ascend_kernel_samplers() -> "list[Implementation]":
    """Offer samplers (family ``sampler``).

    The built object must provide ``build(vllm_config) -> sampler``, a
    callable module with vLLM's ``Sampler`` interface
    (``sampler(logits=..., sampling_metadata=...) -> SamplerOutput``).
    """


@hookspec
def ascend_kernel_rejection_samplers() -> "list[Implementation]":
    """Offer rejection samplers (family ``rejection_sampler``; optional).

    The built object must provide ``build(sampler, vllm_config, device)``,
    returning a module with vLLM's ``RejectionSampler`` call interface.
    """


# ---------------------------------------------------------------------------
# sleep mode
# ---------------------------------------------------------------------------


@hookspec
def ascend_kernel_sleep_mode(worker: Any) -> Any:
    """Give ``worker`` the object that carries out its sleep mode (not a family: the first answer is used).

    A kernel worker's ``sleep(level)``, ``wake_up(tags)`` and
    ``discard(tags)`` (vLLM's executor calls them for ``LLM.sleep``,
    ``LLM.wake_up``, ``release_kv_cache_memory`` and the server's ``/sleep``
    and ``/wake_up`` routes) call the same methods of the returned object. It
    should return the same object for the same worker every time (it holds
    what is asleep), or None to leave the worker to another plugin. Levels
    and tags follow vLLM: level 1 frees the KV cache and moves the weights
    off the device, level 2 frees both; tags are ``"weights"`` and
    ``"kv_cache"``. The built-in ``sleep_mode`` plugin answers with tagged
    pools of tensor storages (docs/sleep_mode.md).
    """


# ---------------------------------------------------------------------------
# graph capture
# ---------------------------------------------------------------------------


@hookspec
def ascend_kernel_graph_modes() -> "list[Implementation]":
    """Offer graph-capture modes (family ``graph``).

    The built object must provide ``capture_sizes(vllm_config) -> list[int]``
    (the batch sizes it captures), ``capture(runner, base_capture) -> int``
    (capture at start-up, returns bytes used; ``base_capture`` is vLLM's
    ``capture_model``), ``padded_num_tokens(num_tokens) -> int`` (runtime
    dispatch: the captured size a batch runs at), and the platform's
    static-graph answers ``supports_static_graph() -> bool`` and
    ``static_graph_wrapper_cls() -> str`` (the dotted class vLLM wraps
    captured pieces in). Optional ``describe() -> dict``: the report's
    ``graph`` object (mode, captured sizes, capture time, replays). Optional
    ``wrap_model(model, vllm_config) -> model``: called once after vLLM loads
    the model, returns what the runner calls instead (a full-graph mode wraps
    the whole model in its static graph wrapper); the runner's ``get_model()``
    still returns the model itself (through the wrapper's ``unwrap()``).
    """


# ---------------------------------------------------------------------------
# model layer ops
# ---------------------------------------------------------------------------


@hookspec
def ascend_kernel_layer_ops() -> "list[Implementation]":
    """Offer implementations of vLLM's model-layer custom ops (family ``layer_ops``).

    vLLM builds norms and rotary embeddings as ``CustomOp`` layers that an
    out-of-tree platform may replace by class name. The chosen object must
    provide ``install() -> list[str]``: called once per process, before the
    model is built, it registers the replacements (idempotently) and returns
    the vLLM class names it replaced; and ``describe() -> dict``: what it
    installed and how many model layers were built with it (for the report).
    An implementation that replaces nothing returns ``[]``.
    """


# ---------------------------------------------------------------------------
# quantization
# ---------------------------------------------------------------------------


@hookspec
def ascend_kernel_quant_methods() -> "list[Implementation]":
    """Offer implementations of quantized checkpoint formats (family ``quantization``; optional).

    Resolved before the MoE policy, which may read the checkpoint's expert
    scheme from ``ctx.chosen["quantization"]``. ``supports(ctx)`` should check
    the format vLLM resolved (``ctx.vllm_config.model_config.quantization``:
    ``"ascend"``, ``"compressed-tensors"``...); an unquantized model leaves the
    family unused. The built object must provide ``format`` (the vLLM
    quantization name it serves) and ``describe() -> dict`` (the report). What
    it must do to change what runs depends on the format:

    * a format whose vLLM config class the plugin registers (see
      :func:`ascend_kernel_pre_register`) asks the chosen object for each
      layer's method: ``method_for(config, layer, prefix) -> QuantizeMethodBase | None``;
    * a format vLLM parses itself may install its own config on the engine's
      ``vllm_config`` in ``prepare_model(vllm_config) -> list[str]`` (called by
      the runner before the model is built; returns what it replaced).
    """


# ---------------------------------------------------------------------------
# model lifecycle and expert load balancing
# ---------------------------------------------------------------------------


@hookspec
def ascend_kernel_model_loaded(runner: Any) -> "list[str] | None":
    """Act on the loaded model, once per runner, before a graph mode wraps it.

    Called by the kernel runner's ``load_model`` after vLLM built the model
    and every layer processed its weights. For lifecycle work that needs the
    runner and the whole model (the EPLB plugin builds vLLM's ``EplbState``
    here and gives it to the runner, whose own step then drives it).

    :param runner: the kernel's model runner (a subclass of vLLM's runner).
    :return: what the plugin did, in words, or None.
    """


@hookspec
def ascend_kernel_eplb_policies() -> "list[Implementation]":
    """Offer expert-placement policies for dynamic EPLB (family ``eplb_policy``).

    Consulted only when EPLB is enabled (``--enable-eplb``). The chosen object
    is a vLLM EPLB policy: it provides
    ``rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_ranks,
    old_global_expert_indices) -> Tensor [layers, physical experts]`` (the
    logical expert each physical slot holds after the rearrangement; vLLM's
    ``AbstractEplbPolicy`` contract), and may provide ``describe()``. vLLM's
    ``EplbState`` calls it at every rearrangement and moves the weights.
    """


# ---------------------------------------------------------------------------
# graph fusion
# ---------------------------------------------------------------------------


@hookspec
def ascend_kernel_fusion_passes() -> "list[Implementation]":
    """Offer graph fusion passes (family ``fusion_pass``; a table: every supported pass is built and runs).

    The platform's pass manager (``get_pass_manager_cls``) runs the built passes, in the table's order, over every
    graph the kernel compiles (post-grad FX graphs of aten ops and the seam's registered ops). A pass that cannot
    apply (forced off by its setting, a dtype its fused kernel does not take) says why from ``supports(ctx)``, and
    ``explain`` shows it. The built object must provide ``__call__(graph: torch.fx.Graph) -> int`` (rewrite in
    place; return how many patterns it replaced, added to its ``matches``), ``name``, ``matches`` and ``describe()
    -> dict`` (the report's ``{name, enabled, matches, ...}``). A pass replaces a pattern only by a fused seam op
    that computes the same values (``plugins/fusion`` is the example).
    """


# ---------------------------------------------------------------------------
# the command line
# ---------------------------------------------------------------------------


@hookspec
def ascend_kernel_cli_value_checks() -> "dict[str, Callable[[str, str], Any]] | None":
    """Check command-line values before anything starts: ``{option name: check(text, flag)}``.

    The CLI never imports a plugin; where a plugin knows what a flag's value may be, it says so here. The option
    name is the flag's destination (``kv_transfer_config`` for vLLM serve's ``--kv-transfer-config``,
    ``mooncake_protocol`` for ``serve-pd``'s ``--mooncake-protocol``); the CLI calls ``check(text, flag)`` with the
    value as given and the flag as the user spelt it. A check raises :class:`ascend_kernel.errors.UsageError` naming
    the flag, the value, what is wrong and what is allowed (its return value is ignored). Enabled plugins only.
    """
