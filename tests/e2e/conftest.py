"""Shared pieces of the end-to-end tests: the tiny model, CLI runs, the HF oracle.

vLLM fixes its platform when first imported in a process, so every engine
(kernel or stock) runs in its own subprocess through the ``ascend-kernel`` CLI,
exactly as a user would run it; the Hugging Face oracle runs in-process.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "ascend_kernel.cli.main"]
PROMPTS = [
    "The capital of France is",
    "Once upon a time, there was a little",
    "the quick brown fox jumps over the lazy dog and the quick brown fox",
]
ENGINE_TIMEOUT_S = 600


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_KERNEL_")}
    env.update({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    env.update(extra)
    return env


_zygotes: dict[str, Any] = {}


def _zygote(flavour: str) -> Any:
    """The session's zygote of ``flavour`` (started on first use; see tests/e2e/cli_zygote.py)."""
    from tests.e2e.cli_zygote import Zygote

    if flavour not in _zygotes:
        _zygotes[flavour] = Zygote(flavour, clean_env(), REPO)
        atexit.register(_zygotes[flavour].close)
    return _zygotes[flavour]


def run_cli(args: list[str], env: dict[str, str] | None = None, expect_rc: int = 0,
            zygote: str | None = None) -> subprocess.CompletedProcess:
    """``ascend-kernel ARGS`` in a process of its own: forked from a zygote that imported the stack, when one fits.

    ``zygote`` names the flavour for a command :func:`flavour_for` leaves to a fresh interpreter (a ``serve`` that
    must fail in start-up, after vLLM is imported); a test about what happens before vLLM is imported must not."""
    from tests.e2e.cli_zygote import flavour_for

    env = env or clean_env()
    flavour = zygote or flavour_for(args, env)
    if os.environ.get("ASCEND_KERNEL_TEST_ZYGOTE", "1") == "0":
        flavour = None
    if flavour is not None:
        proc = _zygote(flavour).run(list(args), env, REPO, ENGINE_TIMEOUT_S)
    else:
        proc = subprocess.run([*CLI, *args], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=ENGINE_TIMEOUT_S)
    if proc.returncode != expect_rc:
        raise AssertionError(f"ascend-kernel {' '.join(args)} exited {proc.returncode} (wanted {expect_rc})\n"
                             f"--- stderr tail ---\n{proc.stderr[-4000:]}")
    return proc


def fork_detached(argv: list[str], env: dict[str, str], log_path: Path, new_session: bool = True) -> Any:
    """A long-running ``ascend-kernel`` command (a server, a headless node) forked from the kernel's zygote, or
    None where it does not fit (not the CLI's command, not the zygote's platform, the zygote off, the parent's
    process group wanted): about 17 s of imports fewer per server (vLLM's engine core alone is 7 s). Its own
    process group, output to ``log_path``; the handle behaves as a ``subprocess.Popen``."""
    device = env.get("ASCEND_KERNEL_DEVICE", "auto").lower()
    if (argv[:len(CLI)] != CLI or not new_session or device not in ("cpu", "auto")
            or os.environ.get("ASCEND_KERNEL_TEST_ZYGOTE", "1") == "0"):
        return None
    return _zygote("kernel").start(argv[len(CLI):], env, REPO, log_path)


def zygote_server(argv: list[str], env: dict[str, str], log_path: Path, **kwargs: Any) -> Any:
    """A :class:`~ascend_kernel.cli.serving.LocalServer` forked from the zygote where :func:`fork_detached` can."""
    from ascend_kernel.cli.serving import LocalServer

    class ForkedServer(LocalServer):
        def launch(self) -> Any:
            return fork_detached(self.argv, self.env, self.log_path, self.new_session) or super().launch()

    return ForkedServer(argv, env, log_path, **kwargs)


def run_script(script: Path, args: list[str], env: dict[str, str],
               timeout: float = ENGINE_TIMEOUT_S) -> subprocess.CompletedProcess:
    """``python SCRIPT ARGS`` (a helper script that builds an engine in-process), forked from the zygote whose
    platform its environment resolves to: ``ASCEND_KERNEL_DEVICE=cpu`` the kernel's, unset or ``auto`` stock
    vLLM's (the kernel stays off without an NPU); a plain subprocess otherwise or with zygotes off."""
    device = env.get("ASCEND_KERNEL_DEVICE", "auto").lower()
    flavour = {"cpu": "kernel", "auto": "stock"}.get(device)
    if flavour is not None and os.environ.get("ASCEND_KERNEL_TEST_ZYGOTE", "1") != "0":
        return _zygote(flavour).run(list(args), env, REPO, timeout, script=script)
    return subprocess.run([sys.executable, str(script), *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def generate(model: Path, *extra: str, env: dict[str, str] | None = None, max_tokens: int = 12,
             prompts: list[str] = PROMPTS) -> dict[str, Any]:
    args = ["generate", "--json", "--model", str(model), "--max-tokens", str(max_tokens)]
    for p in prompts:
        args += ["--prompt", p]
    proc = run_cli([*args, *extra], env=env)
    return json.loads(proc.stdout[proc.stdout.index("{"):])


def hf_greedy(model: Path, prompt_token_ids: list[list[int]], max_tokens: int,
              dtype: str = "float32") -> list[list[int]]:
    """Transformers' own greedy generation: the independent oracle."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype))
    hf.eval()
    out = []
    with torch.no_grad():
        for ids in prompt_token_ids:
            x = torch.tensor([ids])
            # No EOS: like vLLM's ignore_eos, the argmax is taken even when it is EOS.
            config = GenerationConfig(do_sample=False, max_new_tokens=max_tokens, eos_token_id=None,
                                      pad_token_id=0, bos_token_id=None)
            y = hf.generate(x, attention_mask=torch.ones_like(x), generation_config=config)
            out.append(y[0, len(ids):].tolist())
    return out


def tokens(result: dict[str, Any]) -> list[list[int]]:
    return [o["token_ids"] for o in result["outputs"]]


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ascend_kernel.models import create_tiny_model

    return create_tiny_model("llama", tmp_path_factory.mktemp("models") / "llama", seed=0)


def divergence_report(model: Path, prompt_ids: list[list[int]], ours: list[list[int]],
                      oracle: list[list[int]]) -> str:
    """For each differing sequence: where, and whether HF itself saw a near-tie there."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, torch_dtype=torch.float32)
    lines = []
    for ids, a, b in zip(prompt_ids, ours, oracle):
        if a == b:
            continue
        i = next(j for j, (x, y) in enumerate(zip(a, b)) if x != y)
        with torch.no_grad():
            logits = hf(torch.tensor([ids + b[:i]])).logits[0, -1].double().log_softmax(-1)
        gap = float(logits[b[i]] - logits[a[i]])
        kind = "float near-tie" if gap < 1e-4 else "LOGIC ERROR"
        lines.append(f"token {i}: ours {a[i]} vs HF {b[i]}, HF logprob gap {gap:.3g} -> {kind}")
    return "; ".join(lines)


def assert_same_tokens(model: Path, run: dict[str, Any], oracle: list[list[int]]) -> None:
    ours = tokens(run)
    if ours != oracle:
        prompt_ids = [o["prompt_token_ids"] for o in run["outputs"]]
        raise AssertionError("greedy tokens differ from HF: " + divergence_report(model, prompt_ids, ours, oracle))


#: inductor compiles every graph (no FX graph or AOT autograd cache hit) where a test counts the fusion passes'
#: matches: a graph served from the cache was rewritten when first compiled and is not rewritten again
INDUCTOR_COMPILES_EVERY_GRAPH = {"TORCHINDUCTOR_FX_GRAPH_CACHE": "0", "TORCHINDUCTOR_AUTOGRAD_CACHE": "0"}


def compiles_every_graph(tmp_path_factory) -> dict[str, str]:
    """:data:`INDUCTOR_COMPILES_EVERY_GRAPH` plus an empty inductor cache directory of the run's own.

    The switches alone do not reach a command the CLI zygote forks: it imported torch's inductor config (which
    reads them once, at import) before the command's environment is set. Inductor reads its cache directory
    per use, so an empty one means no cached graph either way (as on a fresh host)."""
    return {**INDUCTOR_COMPILES_EVERY_GRAPH, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path_factory.mktemp("inductor"))}


def moe_layers(model) -> int:
    """How many of a tiny DeepSeek's layers are MoE layers (the first ``first_k_dense_replace`` are dense)."""
    import json

    config = json.loads((model / "config.json").read_text())
    return config["num_hidden_layers"] - config["first_k_dense_replace"]
