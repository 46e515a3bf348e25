"""Config fix-up for KV transfer: vLLM's Mooncake connector through the kernel's subclass, or a refusal.

Runs in the platform's ``check_and_update_config`` (every process that builds
the config: the API server, the engine core), before any family is chosen.
With ``kv_transfer_config.kv_connector == "MooncakeConnector"`` it

* refuses, in one paragraph, a missing transfer engine (the ``pd`` extra,
  ``libibverbs.so.1``), what the kernel cannot hand the connector
  (models with recurrent state: the kernel's Mamba layout gives the runner
  per-state views, while the connector registers one raw page per layer and
  vLLM has validated it only for GDN; not run here), a ``mooncake_protocol``
  the transfer engine does not have (it would silently fall back to TCP; see
  :mod:`~ascend_kernel_plugins.kv_transfer.config_check`) and a pull timeout
  (``ASCEND_KERNEL_KV_TRANSFER_PULL_TIMEOUT_S``) that a live producer could
  outlast, and
* points the config at :class:`~ascend_kernel_plugins.kv_transfer.mooncake.KernelMooncakeConnector`
  (``kv_connector`` and ``kv_connector_module_path``, two recorded changes):
  the same connector, built so that it starts on a CPU host and counts the
  pages it moves for ``/ascend-kernel/report``.

Other connectors pass through untouched.
"""

from __future__ import annotations

from typing import Any, Callable

from ascend_kernel.config_changes import ConfigChange, change
from ascend_kernel.errors import KernelError, SettingsError
from ascend_kernel.hookspecs import hookimpl
from ascend_kernel_plugins.kv_transfer.config_check import (
    check_kv_transfer_config,
    check_mooncake_protocol,
    mooncake_protocol_problem,
)
from ascend_kernel_plugins.kv_transfer.settings import KVTransferSettings

MOONCAKE = "MooncakeConnector"


@hookimpl
def ascend_kernel_settings() -> type[KVTransferSettings]:
    return KVTransferSettings


@hookimpl
def ascend_kernel_cli_value_checks() -> dict[str, Callable[[str, str], Any]]:
    """The CLI checks ``--kv-transfer-config`` (serve) and ``--mooncake-protocol`` (serve-pd) through these."""
    return {"kv_transfer_config": check_kv_transfer_config, "mooncake_protocol": check_mooncake_protocol}


class KVTransferUnsupported(KernelError):
    """The configured KV connector cannot serve this model on the kernel (names what and why)."""


def unsupported_reason(vllm_config: Any) -> str | None:
    """Why the kernel refuses Mooncake transfer for this model, or None."""
    model = getattr(vllm_config, "model_config", None)
    if model is not None and getattr(model, "has_inner_state", False):
        return (f"the model ({model.architecture}) keeps recurrent (Mamba-style) state: the kernel's Mamba "
                f"layout hands the runner per-state views, while {MOONCAKE} registers one raw page per layer "
                "and transfers whole pages; that pairing has not been built or run. Serve it without "
                "--kv-transfer-config, or use a model with full-attention or MLA layers only")
    return None


def transfer_engine_missing(on_npu: bool = False) -> str | None:
    """Why the Mooncake transfer engine cannot load in this environment, or None.

    vLLM only logs a warning when ``mooncake.engine`` fails to import and
    fails later, inside a worker; the kernel says it before any engine starts.
    An NPU host needs Mooncake's Ascend build (the ``pd-npu`` extra), others
    the CPU one (``pd``, which links libibverbs even for TCP).
    """
    try:
        from mooncake.engine import TransferEngine  # noqa: F401
    except (ImportError, OSError) as exc:
        if on_npu:
            return (f"the Mooncake transfer engine does not load ({type(exc).__name__}: {exc}); on an Ascend host "
                    "install its NPU build, the `pd-npu` extra (pip install 'ascend-kernel[pd-npu]': "
                    "mooncake-transfer-engine-npu, with CANN's runtime on the library path)")
        return (f"the Mooncake transfer engine does not load ({type(exc).__name__}: {exc}); install the `pd` extra "
                "(pip install 'ascend-kernel[pd]') and the system library libibverbs.so.1 it links even for TCP "
                "(Debian/Ubuntu: apt-get install libibverbs1)")
    return None


def npu_protocol(vllm_config: Any) -> ConfigChange | None:
    """On an NPU, an unset ``mooncake_protocol`` becomes ``ascend`` (vLLM's connector would ask for ``rdma``).

    Ascend hosts move KV pages between NPUs with Mooncake's Ascend transport
    (device memory, HCCS within a node, RoCE across nodes); ``rdma`` would
    need host-memory registration of NPU pages, which the NPU build does not do.
    """
    kv = vllm_config.kv_transfer_config
    extra = dict(kv.kv_connector_extra_config or {})
    if extra.get("mooncake_protocol") is not None:
        return None
    return change(vllm_config, "kv_transfer_config.kv_connector_extra_config", {**extra, "mooncake_protocol": "ascend"},
                  "Mooncake's transport between Ascend NPUs (vLLM's connector defaults to rdma)")


def pull_timeout_problem(settings: Any) -> str | None:
    """Why ``kv_transfer_pull_timeout_s`` cannot bound a pull safely, or None.

    A producer gives up on a request after ``VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT``
    and answers the consumer so; until then it may still write the pages into
    the consumer's blocks. A consumer that stopped waiting earlier would have
    freed those blocks, possibly for another request.
    """
    timeout = getattr(settings, "kv_transfer_pull_timeout_s", None)
    if timeout is None:
        return None
    import vllm.envs as envs

    abort = envs.VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT
    if timeout > abort:
        return None
    return (f"Invalid ascend-kernel setting: ASCEND_KERNEL_KV_TRANSFER_PULL_TIMEOUT_S={timeout:g} is not allowed with "
            f"VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT={abort}: a producer may write a request's pages until its abort "
            f"timeout, so a consumer must wait longer than that before it frees the blocks; allowed: a number of "
            f"seconds > {abort}, or unset (vLLM's own bound, {abort} + 60 s).")


def mooncake_fixups(vllm_config: Any, settings: Any = None, on_npu: bool = False) -> list[ConfigChange]:
    """Refuse what cannot run; otherwise route ``MooncakeConnector`` to the kernel's subclass."""
    from ascend_kernel_plugins.kv_transfer.mooncake import CONNECTOR_CLASS, CONNECTOR_MODULE

    kv = vllm_config.kv_transfer_config
    timeout_problem = pull_timeout_problem(settings)
    if timeout_problem is not None:
        raise SettingsError(timeout_problem)
    reason = (unsupported_reason(vllm_config)
              or mooncake_protocol_problem(kv.kv_connector_extra_config, on_npu=on_npu)
              or transfer_engine_missing(on_npu))
    if reason is not None:
        raise KVTransferUnsupported(
            f"ascend-kernel cannot run kv_transfer_config.kv_connector={MOONCAKE!r} (kv_role {kv.kv_role!r}) "
            f"here: {reason}.")
    why = (f"vLLM's {MOONCAKE}, built by the kernel: a device index on a CPU host "
           "(torch.accelerator has none) and counted transfers for /ascend-kernel/report")
    changes = [npu_protocol(vllm_config) if on_npu else None,
               change(vllm_config, "kv_transfer_config.kv_connector_module_path", CONNECTOR_MODULE, why),
               change(vllm_config, "kv_transfer_config.kv_connector", CONNECTOR_CLASS, why)]
    return [c for c in changes if c is not None]


@hookimpl
def ascend_kernel_configure(settings: Any, vllm_config: Any, device: Any) -> list[ConfigChange] | None:
    kv = getattr(vllm_config, "kv_transfer_config", None)
    if kv is None or kv.kv_connector != MOONCAKE or kv.kv_connector_module_path:
        return None
    return mooncake_fixups(vllm_config, settings, on_npu=getattr(device, "kind", None) == "npu")
