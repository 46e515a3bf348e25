"""Contract of the ``attention_backend`` family: a provider that names an importable vLLM backend class.

The built provider's ``backend_class_path(selected_backend, selector_config,
num_heads, platform_default)`` is asked, with vLLM's own
``AttentionSelectorConfig``, for the layer kinds of the kit's configs it
accepts (a dense decoder layer; an MLA layer for an MLA model):

* ``interface``: ``backend_class_path`` is callable (and, when present,
  ``mla_prefill_backend_cls`` and ``prepare_model`` are callable);
* ``backend-class``: the answer is the platform default (the provider
  delegates) or a dotted path to an importable class that has vLLM's
  ``AttentionBackend`` methods ``get_name`` and ``get_impl_cls``.
"""

from __future__ import annotations

import importlib
from typing import Any

from ascend_kernel.conformance.base import build_under
from ascend_kernel.conformance.results import Checks, Skip

FAMILY = "attention_backend"
CONFIGS = ("llama", "deepseek_v2")
PLATFORM_DEFAULT = "<platform default>"


def check_entry(entry: Any, kit: Any, checks: Checks) -> None:
    built = build_under(entry, kit, checks, CONFIGS, each_config=True)
    if not built:
        return

    def interface() -> str:
        for _, provider in built:
            assert callable(getattr(provider, "backend_class_path", None)), \
                f"{type(provider).__name__} has no backend_class_path(...) method"
            for optional in ("mla_prefill_backend_cls", "prepare_model"):
                if hasattr(provider, optional):
                    assert callable(getattr(provider, optional)), f"{optional} is not callable"
        return "backend_class_path(selected_backend, selector_config, num_heads, platform_default)"

    def backend_class() -> str:
        from vllm.v1.attention.selector import AttentionSelectorConfig

        answers = []
        for found, provider in built:
            cfg = found.ctx.vllm_config
            model = cfg.model_config
            use_mla = bool(model.use_mla)
            head_size = model.get_head_size()
            selector = AttentionSelectorConfig(head_size=head_size, dtype=model.dtype,
                                               kv_cache_dtype=cfg.cache_config.cache_dtype,
                                               block_size=cfg.cache_config.block_size, use_mla=use_mla)
            path = provider.backend_class_path(None, selector, model.get_num_attention_heads(cfg.parallel_config),
                                               lambda: PLATFORM_DEFAULT)
            where = f"{'MLA' if use_mla else 'dense'} layer under {found.label}"
            if path == PLATFORM_DEFAULT:
                answers.append(f"{where}: the platform's default")
                continue
            assert isinstance(path, str) and "." in path, f"{where}: returned {path!r}, not a dotted class path"
            module, _, name = path.rpartition(".")
            try:
                backend = getattr(importlib.import_module(module), name)
            except Exception as exc:
                raise AssertionError(f"{where}: {path} cannot be imported: {type(exc).__name__}: {exc}") from exc
            missing = [m for m in ("get_name", "get_impl_cls") if not callable(getattr(backend, m, None))]
            assert not missing, f"{where}: {path} lacks vLLM's AttentionBackend methods {missing}"
            answers.append(f"{where}: {name}")
        if not answers:
            raise Skip("no layer kind to ask about")
        return "; ".join(answers)

    checks.run("interface", interface)
    checks.run("backend-class", backend_class)
