"""Contract of the ``layer_ops`` family: replaced vLLM layers compute what vLLM's own do.

The built object's ``install()`` runs with this process's kernel set to the
selection context's settings and device, inside vLLM's out-of-tree op
registry, which is restored afterwards (as is the process's kernel), then:

* ``interface``: ``install()`` returns a list of vLLM class names (a second
  call returns the same: it is idempotent) and ``describe()`` a dict;
* ``matches-vllm-native``: for every replaced class the kit has inputs for
  (``RMSNorm``, with and without a residual, float32 and bfloat16;
  ``RotaryEmbedding``, neox and GPT-J style, whole and partial rotary, with
  and without a key; ``MRotaryEmbedding``, sectioned and interleaved, 3-D and
  text-only positions; ``MMEncoderAttention``, packed sequences in 3-D and 4-D
  layouts), a layer vLLM builds is the replacement, and each of its
  forward paths that differs from vLLM's (``forward_oot``, ``forward_cpu``,
  ``forward_cuda``, ``forward_npu``, and the dispatched call) equals vLLM's
  ``forward_native``. A replaced class without kit inputs is named in a skip.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch

from ascend_kernel.conformance.base import build_under
from ascend_kernel.conformance.results import Checks, Skip, describe_exception

FAMILY = "layer_ops"
CONFIGS = ("llama",)
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
FORWARDS = ("forward_oot", "forward_cpu", "forward_cuda", "forward_npu")


@contextlib.contextmanager
def _installed_scope(ctx: Any) -> Iterator[None]:
    """This process's kernel = the context's; vLLM's out-of-tree registry restored on exit."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.custom_op import op_registry_oot

    from ascend_kernel import kernel as kernel_mod

    saved_registry, saved_kernel = dict(op_registry_oot), kernel_mod._current
    kernel_mod._current = kernel_mod.build_kernel(ctx.settings, ctx.device.kind)
    try:
        with set_current_vllm_config(VllmConfig()):
            yield
    finally:
        op_registry_oot.clear()
        op_registry_oot.update(saved_registry)
        kernel_mod._current = saved_kernel


def _same(a: Any, b: Any, dtype: torch.dtype, where: str) -> None:
    if isinstance(b, tuple):
        assert isinstance(a, tuple) and len(a) == len(b), f"{where}: returned {type(a).__name__}, vLLM a {len(b)}-tuple"
        for x, y in zip(a, b):
            _same(x, y, dtype, where)
        return
    if b is None:
        assert a is None, f"{where}: returned a tensor where vLLM returns None"
        return
    assert isinstance(a, torch.Tensor) and a.shape == b.shape, \
        f"{where}: shape {tuple(getattr(a, 'shape', ()))} vs vLLM's {tuple(b.shape)}"
    err = (a.float() - b.float()).abs().max().item() if b.numel() else 0.0
    assert err <= TOLERANCE[dtype] * (1 + b.float().abs().max().item()), \
        f"{where}: differs from vLLM's forward_native by up to {err:.3g}"


def _forwards(layer: Any, base: type) -> list[tuple[str, Callable[..., Any]]]:
    own = type(layer)
    paths = [(name, getattr(layer, name)) for name in FORWARDS
             if getattr(own, name, None) is not None and getattr(own, name) is not getattr(base, name, None)]
    return [*paths, ("__call__", layer)]


def _rms_norm(replacement: type) -> str:
    from vllm.model_executor.layers.layernorm import RMSNorm

    done = 0
    for dtype in (torch.float32, torch.bfloat16):
        gen = torch.Generator().manual_seed(0)
        layer = RMSNorm(96, eps=1e-5, dtype=dtype)
        assert type(layer) is replacement, \
            f"vLLM built {type(layer).__name__}, not the installed {replacement.__name__}"
        with torch.no_grad():
            layer.weight.copy_(torch.randn(96, generator=gen))
        x = torch.randn(7, 96, generator=gen).to(dtype)
        residual = torch.randn(7, 96, generator=gen).to(dtype)
        for res in (None, residual):
            want = RMSNorm.forward_native(layer, x.clone(), None if res is None else res.clone())
            for name, fn in _forwards(layer, RMSNorm):
                got = fn(x.clone(), None if res is None else res.clone())
                _same(got, want, dtype, f"RMSNorm.{name} ({dtype}, {'with' if res is not None else 'no'} residual)")
                done += 1
    return f"RMSNorm: {done} calls"


def _rotary(replacement: type) -> str:
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    done = 0
    for neox in (True, False):
        for rotary_dim in (64, 32):
            layer = RotaryEmbedding(64, rotary_dim, 256, 10000.0, neox, torch.float32)
            assert type(layer) is replacement, \
                f"vLLM built {type(layer).__name__}, not the installed {replacement.__name__}"
            gen = torch.Generator().manual_seed(rotary_dim + neox)
            positions = torch.randint(0, 256, (9,), generator=gen)
            q, k = torch.randn(9, 4 * 64, generator=gen), torch.randn(9, 2 * 64, generator=gen)
            for key in (k, None):
                want = RotaryEmbedding.forward_native(layer, positions, q.clone(), None if key is None else key.clone())
                for name, fn in _forwards(layer, RotaryEmbedding):
                    got = fn(positions, q.clone(), None if key is None else key.clone())
                    where = f"RotaryEmbedding.{name} (neox={neox}, rotary_dim={rotary_dim}, " \
                            f"{'with' if key is not None else 'no'} key)"
                    _same(got, want, torch.float32, where)
                    done += 1
    return f"RotaryEmbedding: {done} calls"


def _mrope(replacement: type) -> str:
    from vllm.model_executor.layers.rotary_embedding.mrope import MRotaryEmbedding

    done = 0
    for interleaved in (False, True):
        layer = MRotaryEmbedding(64, 64, 128, 10000.0, True, torch.float32, mrope_section=[8, 12, 12],
                                 mrope_interleaved=interleaved)
        assert type(layer) is replacement, \
            f"vLLM built {type(layer).__name__}, not the installed {replacement.__name__}"
        gen = torch.Generator().manual_seed(int(interleaved))
        positions = torch.randint(0, 512, (3, 9), generator=gen)
        q, k = torch.randn(9, 4 * 64, generator=gen), torch.randn(9, 2 * 64, generator=gen)
        for pos in (positions, positions[0]):
            want = MRotaryEmbedding.forward_native(layer, pos, q.clone(), k.clone())
            for name, fn in _forwards(layer, MRotaryEmbedding):
                where = f"MRotaryEmbedding.{name} (interleaved={interleaved}, {pos.ndim}-D positions)"
                _same(fn(pos, q.clone(), k.clone()), want, torch.float32, where)
                done += 1
    return f"MRotaryEmbedding: {done} calls"


def _encoder_attention(replacement: type) -> str:
    from vllm.model_executor.layers.attention.mm_encoder_attention import MMEncoderAttention

    layer = MMEncoderAttention(num_heads=2, head_size=80, scale=80 ** -0.5)
    assert type(layer) is replacement, \
        f"vLLM built {type(layer).__name__}, not the installed {replacement.__name__}"
    gen, done = torch.Generator().manual_seed(0), 0
    cu = torch.tensor([0, 8, 9, 24], dtype=torch.int32)
    for shape in ((1, 24, 160), (1, 24, 2, 80)):
        q, k, v = (torch.randn(shape, generator=gen) for _ in range(3))
        want = MMEncoderAttention.forward_native(layer, q, k, v, cu)
        for name, fn in _forwards(layer, MMEncoderAttention):
            _same(fn(q, k, v, cu), want, torch.float32, f"MMEncoderAttention.{name} ({len(shape)}-D, 3 sequences)")
            done += 1
    return f"MMEncoderAttention: {done} calls"


ORACLES: dict[str, Callable[[type], str]] = {"RMSNorm": _rms_norm, "RotaryEmbedding": _rotary,
                                             "MRotaryEmbedding": _mrope, "MMEncoderAttention": _encoder_attention}


def check_entry(entry: Any, kit: Any, checks: Checks) -> None:
    built = build_under(entry, kit, checks, CONFIGS)
    if not built:
        return
    found, ops = built[0]
    try:
        scope = _installed_scope(found.ctx)
        scope.__enter__()
    except Exception as exc:  # noqa: BLE001
        checks.failed("interface", f"the kit could not set up vLLM's op registry: {describe_exception(exc)}")
        return
    try:
        _check(ops, checks)
    finally:
        scope.__exit__(None, None, None)


def _check(ops: Any, checks: Checks) -> None:
    from vllm.model_executor.custom_op import op_registry_oot

    state: dict[str, Any] = {}

    def interface() -> str:
        for method in ("install", "describe"):
            assert callable(getattr(ops, method, None)), f"{type(ops).__name__} has no {method}() method"
        names = ops.install()
        assert isinstance(names, list) and all(isinstance(n, str) for n in names), \
            f"install() returned {names!r}, not a list of class names"
        again = ops.install()
        assert sorted(again) == sorted(names), f"a second install() returned {again!r}, the first {names!r}"
        described = ops.describe()
        assert isinstance(described, dict), f"describe() returned {type(described).__name__}, not a dict"
        state["names"] = names
        return f"replaces {names or 'nothing'}"

    def matches() -> str:
        if "names" not in state:
            raise Skip("install() did not succeed (see contract 'interface')")
        names = state["names"]
        if not names:
            return "replaces nothing: vLLM's own layers run"
        done, unknown = [], []
        for name in names:
            replacement = op_registry_oot.get(name)
            assert replacement is not None, f"install() says it replaced {name}, but vLLM's registry has no {name}"
            if name not in ORACLES:
                unknown.append(name)
                continue
            done.append(ORACLES[name](replacement))
        if not done:
            raise Skip(f"the kit has no inputs for {', '.join(unknown)}")
        return "; ".join(done) + (f"; not checked (no kit inputs): {', '.join(unknown)}" if unknown else "")

    checks.run("interface", interface)
    checks.run("matches-vllm-native", matches)
