"""cpu-graph without an engine: the capture-size setting, the static wrapper driven by vLLM's dispatcher.

The wrapper is exercised the way vLLM's runner drives it: vLLM's
``CudagraphDispatcher`` (on a real ``VllmConfig`` resolved by the cpu-graph
plugin) picks the runtime mode and padded batch descriptor, vLLM's
``set_forward_context`` publishes them, and the wrapper captures or replays.
Artifacts are compiled with ``aot_eager`` here (the same capture path as
inductor, without a C++ compile per shape); the e2e test runs inductor.
"""

from __future__ import annotations

import os

import pytest
import torch

from ascend_kernel.errors import SettingsError
from ascend_kernel.settings import load_settings


def sizes_setting(value):
    return load_settings({"ascend_kernel": {"graph_capture_sizes": value}}).graph_capture_sizes


# -- the setting ------------------------------------------------------------------


@pytest.mark.parametrize("value", ["4,1,2", [4, 1, 2], " 1, 2 ,4,4", ["1", "2", "4"]])
def test_capture_sizes_parse_sorted_unique(value):
    assert sizes_setting(value) == [1, 2, 4]


@pytest.mark.parametrize("value, needle", [
    ([0], "0 is not a positive whole number"),
    ("1,-2", "'-2' is not a positive whole number"),
    ("1,x", "'x' is not a positive whole number"),
    ([1.5], "1.5 is not a positive whole number"),
    ([True], "True is not a positive whole number"),
    ([], "non-empty"),
])
def test_capture_sizes_refused_naming_value(value, needle):
    with pytest.raises(SettingsError) as info:
        sizes_setting(value)
    text = str(info.value)
    assert 'additional_config["ascend_kernel"]["graph_capture_sizes"]' in text
    assert needle in text and "positive whole numbers (e.g. 1,2,4)" in text


def test_capture_sizes_from_env(monkeypatch):
    monkeypatch.setenv("ASCEND_KERNEL_GRAPH_CAPTURE_SIZES", "8,2")
    assert load_settings().graph_capture_sizes == [2, 8]
    monkeypatch.setenv("ASCEND_KERNEL_GRAPH_CAPTURE_SIZES", "")
    with pytest.raises(SettingsError, match="ASCEND_KERNEL_GRAPH_CAPTURE_SIZES is set but empty"):
        load_settings()


def test_unset_means_the_modes_default():
    assert load_settings().graph_capture_sizes is None


# -- the mode's config and the platform's questions --------------------------------


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    """A real VllmConfig as the cpu-graph plugin leaves it (splitting ops set as vLLM does after the platform)."""
    from vllm.config import ModelConfig, VllmConfig

    from ascend_kernel.models import create_tiny_model
    from ascend_kernel_plugins.graph.cpu_graph import resolve_cpu_graph_config

    model = create_tiny_model("llama", tmp_path_factory.mktemp("cg") / "llama")
    config = VllmConfig(model_config=ModelConfig(model=str(model), max_model_len=128))
    with pytest.MonkeyPatch.context() as env:  # the mode turns vLLM's AOT compile off: not for the other tests
        env.delenv("VLLM_USE_AOT_COMPILE", raising=False)
        changes = resolve_cpu_graph_config(config, [1, 2, 4])
        config.aot_env = os.environ["VLLM_USE_AOT_COMPILE"]
    # in an engine vLLM chooses the splitting ops once, after the platform hook; this config already had them
    # chosen for the CPU platform's trace-once mode (none), so they are chosen again for piecewise
    config.compilation_config.splitting_ops = None
    config.compilation_config.set_splitting_ops_for_v1(all2all_backend="allgather_reducescatter")
    config.changes = changes
    return config


def test_config_is_piecewise_at_the_sizes(cfg):
    from vllm.config import CompilationMode
    from vllm.config.compilation import CUDAGraphMode

    comp = cfg.compilation_config
    assert comp.mode == CompilationMode.VLLM_COMPILE and comp.cudagraph_mode == CUDAGraphMode.PIECEWISE
    assert comp.cudagraph_capture_sizes == [1, 2, 4] and comp.max_cudagraph_capture_size == 4
    assert comp.is_attention_compiled_piecewise()
    assert all(c.reason for c in cfg.changes)
    assert {"compilation_config.cudagraph_capture_sizes", "env.VLLM_USE_AOT_COMPILE"} <= {c.path for c in cfg.changes}
    assert cfg.aot_env == "0"


def test_modes_answer_the_platform():
    from ascend_kernel_plugins.graph.cpu_graph import CpuGraphMode
    from ascend_kernel_plugins.graph.modes import EagerMode
    from ascend_kernel_plugins.graph.static_wrapper import StaticShapeWrapper

    mode = CpuGraphMode([4, 1, 2], "test")
    assert mode.supports_static_graph() and not EagerMode().supports_static_graph()
    module, _, name = mode.static_graph_wrapper_cls().rpartition(".")
    assert getattr(__import__(module, fromlist=[name]), name) is StaticShapeWrapper
    assert [mode.padded_num_tokens(n) for n in (1, 3, 4, 5)] == [1, 4, 4, 5]


# -- the wrapper, driven by vLLM's dispatcher ------------------------------------------


class Piece:
    """Shaped like a piece of vLLM's piecewise backend: a callable holding its FX graph; counts Python calls."""

    def __init__(self) -> None:
        def body(n: int, x: torch.Tensor, w: torch.Tensor):
            y = x @ w
            out = torch.empty_like(y)
            out.copy_(y.relu())
            return out, out.view(n, -1)  # a buffer and a view of it, as a piece hands attention

        self.graph = _trace(body)
        self.returns_tuple = True
        self.calls = 0

    def __call__(self, *args):
        self.calls += 1
        return self.graph(*args)


def _trace(fn):
    class M(torch.nn.Module):
        def forward(self, n, x, w):
            return fn(n, x, w)

    return torch.fx.symbolic_trace(M())


@pytest.fixture
def dispatch(cfg):
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

    dispatcher = CudagraphDispatcher(cfg)
    dispatcher.initialize_cudagraph_keys(CUDAGraphMode.PIECEWISE, 1)
    return dispatcher


def run(cfg, dispatcher, wrapper, x_buffer, w, num_tokens):
    """One forward pass as the runner makes it: dispatch, pad, publish the context, call the piece."""
    from vllm.forward_context import set_forward_context

    mode, descriptor = dispatcher.dispatch(num_tokens)
    n = descriptor.num_tokens
    with set_forward_context(None, cfg, num_tokens=n, cudagraph_runtime_mode=mode, batch_descriptor=descriptor):
        return wrapper(n, x_buffer[:n], w), mode, descriptor


@pytest.fixture
def wrapper(cfg):
    from vllm.config.compilation import CUDAGraphMode

    from ascend_kernel_plugins.graph.static_wrapper import CaptureBook, StaticShapeWrapper

    book = CaptureBook(backend="aot_eager")
    book.piece = Piece()
    return StaticShapeWrapper(book.piece, cfg, CUDAGraphMode.PIECEWISE, book=book)


def capture_all(cfg, dispatcher, wrapper, x, w):
    from vllm.compilation.monitor import set_cudagraph_capturing_enabled

    set_cudagraph_capturing_enabled(True)
    try:
        for _, descriptors in dispatcher.get_capture_descs():
            for d in descriptors:
                run(cfg, dispatcher, wrapper, x, w, d.num_tokens)
    finally:
        set_cudagraph_capturing_enabled(False)
    wrapper.book.serving = True


def test_capture_then_replay_pads_and_falls_back(cfg, dispatch, wrapper):
    from vllm.config.compilation import CUDAGraphMode

    torch.manual_seed(0)
    x, w = torch.randn(16, 8), torch.randn(8, 8)
    capture_all(cfg, dispatch, wrapper, x, w)
    book, piece = wrapper.book, wrapper.book.piece
    assert book.captured_sizes == {1, 2, 4} and book.artifacts == 3
    assert piece.calls == 0, "capture compiles the FX graph, not the dispatching object"

    (out, view), mode, descriptor = run(cfg, dispatch, wrapper, x, w, 3)  # padded up to 4
    assert mode == CUDAGraphMode.PIECEWISE and descriptor.num_tokens == 4
    torch.testing.assert_close(out, (x[:4] @ w).relu())
    assert view.data_ptr() == out.data_ptr(), "the view still aliases its buffer"
    x[:4] += 1  # new step's inputs written in place
    (out2, _), _, _ = run(cfg, dispatch, wrapper, x, w, 4)
    assert out2.data_ptr() == out.data_ptr(), "outputs live in the capture's own buffers"
    torch.testing.assert_close(out2, (x[:4] @ w).relu())
    assert piece.calls == 0 and book.replays == {4: 2}

    (big, _), mode, _ = run(cfg, dispatch, wrapper, x, w, 5)  # above the largest size: eager
    assert mode == CUDAGraphMode.NONE and piece.calls == 1 and book.eager_fallbacks == 1
    torch.testing.assert_close(big, (x[:5] @ w).relu())
    report = book.as_dict()
    assert report["captured_sizes"] == [1, 2, 4] and report["replays"] == {"4": 2}


def test_replay_with_a_moved_input_names_it(cfg, dispatch, wrapper):
    from ascend_kernel_plugins.graph.static_wrapper import MovedInputError

    x, w = torch.randn(16, 8), torch.randn(8, 8)
    capture_all(cfg, dispatch, wrapper, x, w)
    moved = x.clone()  # the step's input rebound to a new tensor instead of written in place
    with pytest.raises(MovedInputError) as info:
        run(cfg, dispatch, wrapper, moved, w, 2)
    text = str(info.value)
    assert "input 1 (x)" in text and f"captured at {x.data_ptr():#x}" in text
    assert f"now at {moved.data_ptr():#x}" in text and "num_tokens=2" in text


class NextPiece(Piece):
    """The piece after attention: reads the buffer the piece before returned, and a weight of its own."""

    def __init__(self) -> None:
        def body(n: int, h: torch.Tensor, w: torch.Tensor):
            return (h @ w).tanh() + h

        self.graph = _trace(body)
        self.returns_tuple = False
        self.calls = 0


def test_inner_piece_hands_on_fresh_outputs_and_only_the_models_result_is_static(cfg, dispatch):
    """As vLLM builds a piecewise model: the first piece is inner (its output goes to the next piece), the last hands
    the model's result back. The inner piece's replay returns its artifact's tensors as they are; the next piece's
    input from it is not address-checked (it never leaves the model); the result stays in the capture's buffers,
    and a caller's tensor that moved is still named."""
    from vllm.compilation.cuda_graph import CUDAGraphOptions
    from vllm.compilation.monitor import set_cudagraph_capturing_enabled
    from vllm.config.compilation import CUDAGraphMode
    from vllm.forward_context import set_forward_context

    from ascend_kernel_plugins.graph.static_wrapper import CaptureBook, MovedInputError, StaticShapeWrapper

    book = CaptureBook(backend="aot_eager")
    first = StaticShapeWrapper(Piece(), cfg, CUDAGraphMode.PIECEWISE, book=book,
                               cudagraph_options=CUDAGraphOptions(debug_log_enable=True, weak_ref_output=False))
    last = StaticShapeWrapper(NextPiece(), cfg, CUDAGraphMode.PIECEWISE, book=book,
                              cudagraph_options=CUDAGraphOptions(debug_log_enable=False, weak_ref_output=True))
    torch.manual_seed(0)
    x, w, w2 = torch.randn(16, 8), torch.randn(8, 8), torch.randn(8, 8)

    def forward(num_tokens, weight2=w2):
        mode, descriptor = dispatch.dispatch(num_tokens)
        n = descriptor.num_tokens
        with set_forward_context(None, cfg, num_tokens=n, cudagraph_runtime_mode=mode, batch_descriptor=descriptor):
            h, view = first(n, x[:n], w)
            view.mul_(0.5)  # what attention does: writes into the buffer the piece before handed on
            return h, last(n, h, weight2)

    def expected(n):
        h = (x[:n] @ w).relu() * 0.5
        return (h @ w2).tanh() + h

    set_cudagraph_capturing_enabled(True)
    try:
        for _, descriptors in dispatch.get_capture_descs():
            for d in descriptors:
                forward(d.num_tokens)
    finally:
        set_cudagraph_capturing_enabled(False)
    assert first.entries and last.entries and book.carried, "the inner piece's capture outputs are named as carried"
    assert book.carried == set().union(*(e.produced for e in first.entries.values()))
    assert not any(e.produced & book.carried for e in last.entries.values()), "the result is not carried"

    h1, out1 = forward(4)
    kept = first.entries[next(d for d in first.entries if d.num_tokens == 4)]
    assert all(h1 is not t for t in kept.outputs), "an inner replay returns its artifact's tensors, not copies"
    torch.testing.assert_close(out1, expected(4))
    x[:4] += 1  # the next step's inputs, written in place
    h2, out2 = forward(4)
    torch.testing.assert_close(out2, expected(4))
    assert out2.data_ptr() == out1.data_ptr(), "the model's result lives in the capture's buffer"
    with pytest.raises(MovedInputError, match=r"input 2 \(w\)"):
        forward(4, weight2=w2.clone())  # a caller's tensor rebound: still named
    first.clear_graphs()
    assert not book.carried and not first.entries


def test_no_capture_outside_vllms_capture_loop(cfg, dispatch, wrapper):
    x, w = torch.randn(16, 8), torch.randn(8, 8)
    from vllm.compilation.monitor import set_cudagraph_capturing_enabled

    set_cudagraph_capturing_enabled(False)
    with pytest.raises(RuntimeError, match="(?i)captur"):
        run(cfg, dispatch, wrapper, x, w, 2)


def test_platform_asks_the_chosen_mode(monkeypatch):
    """The kernel platform's static-graph answers come from the plan's graph object (none before a plan)."""
    from types import SimpleNamespace

    from ascend_kernel import kernel as kernel_mod
    from ascend_kernel.platform.common import KernelPlatformMixin
    from ascend_kernel_plugins.graph.cpu_graph import WRAPPER_CLS, CpuGraphMode
    from ascend_kernel_plugins.graph.modes import EagerMode

    monkeypatch.setattr(kernel_mod, "_current", None)
    assert KernelPlatformMixin.support_static_graph_mode() is False
    for mode, supported in ((CpuGraphMode([1], "test"), True), (EagerMode(), False)):
        monkeypatch.setattr(kernel_mod, "_current", SimpleNamespace(plan=SimpleNamespace(graph=mode)))
        assert KernelPlatformMixin.support_static_graph_mode() is supported
        assert KernelPlatformMixin.get_static_graph_wrapper_cls() == mode.static_graph_wrapper_cls()
    assert CpuGraphMode([1], "test").static_graph_wrapper_cls() == WRAPPER_CLS


def test_cpu_graph_refuses_mla_on_vllms_cpu_mla_backend():
    """vLLM-CPU's MLA backend fails on padded batches; cpu-graph says so at start-up unless the Ascend backend serves."""
    from types import SimpleNamespace

    from ascend_kernel_plugins.graph.cpu_graph import cpu_graph_supported

    def ctx(use_mla: bool, backend: str, capture: str = "auto") -> SimpleNamespace:
        model = SimpleNamespace(enforce_eager=False, use_mla=use_mla, hf_text_config=SimpleNamespace())
        config = SimpleNamespace(model_config=model,
                                 compilation_config=SimpleNamespace(cudagraph_capture_sizes=[1, 2, 4]))
        return SimpleNamespace(device=SimpleNamespace(kind="cpu"), vllm_config=config,
                               settings=SimpleNamespace(attention_backend=backend, graph_capture_mode=capture))

    refusal = cpu_graph_supported(ctx(True, "auto"))
    assert refusal is not None and "ASCEND_KERNEL_ATTENTION_BACKEND=ascend" in refusal
    assert cpu_graph_supported(ctx(True, "ascend")) is None
    assert cpu_graph_supported(ctx(False, "auto")) is None
    # full_decode_only: both backends (vLLM's CPU attention through the kernel's full-graph subclass)
    assert cpu_graph_supported(ctx(False, "auto", "full_decode_only")) is None
    assert cpu_graph_supported(ctx(False, "ascend", "full_decode_only")) is None
    assert cpu_graph_supported(ctx(True, "auto", "full_decode_only")) is not None  # vLLM-CPU's MLA still refused
    assert cpu_graph_supported(ctx(True, "ascend", "piecewise")) is None


# -- full_decode_only: the whole model in the wrapper, called by keyword ---------------------------------


@pytest.fixture(scope="module")
def full_cfg(tmp_path_factory):
    from vllm.config import ModelConfig, VllmConfig

    from ascend_kernel.models import create_tiny_model
    from ascend_kernel_plugins.graph.cpu_graph import resolve_cpu_graph_config

    model = create_tiny_model("llama", tmp_path_factory.mktemp("cg_full") / "llama")
    config = VllmConfig(model_config=ModelConfig(model=str(model), max_model_len=128))
    config.changes = resolve_cpu_graph_config(config, [1, 2, 4], "full_decode_only")
    return config


class TinyModel(torch.nn.Module):
    """Called as vLLM calls a model (keyword inputs); like vLLM's MoE layers it finishes its set-up on first call."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.scale: float | None = None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self.scale is None:
            self.scale = 2.0
        return self.proj(torch.nn.functional.one_hot(input_ids, 8).float()) * self.scale + positions[:, None]


def full_pass(cfg, dispatcher, model, ids, pos, num_tokens):
    from vllm.forward_context import set_forward_context

    mode, descriptor = dispatcher.dispatch(num_tokens, uniform_decode=True)
    n = descriptor.num_tokens
    with set_forward_context(None, cfg, num_tokens=n, cudagraph_runtime_mode=mode, batch_descriptor=descriptor):
        return model(input_ids=ids[:n], positions=pos[:n]), mode


def test_full_decode_only_config_and_whole_model_replays(full_cfg):
    from vllm.compilation.monitor import set_cudagraph_capturing_enabled
    from vllm.config import CompilationMode
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

    from ascend_kernel_plugins.graph.full_graph import wrap_whole_model
    from ascend_kernel_plugins.graph.static_wrapper import CaptureBook, MovedInputError, StaticShapeWrapper

    comp = full_cfg.compilation_config
    assert comp.mode == CompilationMode.NONE and comp.cudagraph_mode == CUDAGraphMode.FULL_DECODE_ONLY
    dispatcher = CudagraphDispatcher(full_cfg)
    dispatcher.initialize_cudagraph_keys(CUDAGraphMode.FULL_DECODE_ONLY, 1)
    torch.manual_seed(0)
    inner = TinyModel()
    model = wrap_whole_model(inner, full_cfg, "ascend_kernel_plugins.graph.static_wrapper.StaticShapeWrapper")
    assert isinstance(model, StaticShapeWrapper) and model.unwrap() is inner and model.proj is inner.proj
    model.book = CaptureBook(backend="aot_eager")
    ids, pos = torch.randint(0, 8, (16,)), torch.arange(16, dtype=torch.float32)
    set_cudagraph_capturing_enabled(True)
    try:
        for _, descriptors in dispatcher.get_capture_descs():
            for d in descriptors:
                full_pass(full_cfg, dispatcher, model, ids, pos, d.num_tokens)
    finally:
        set_cudagraph_capturing_enabled(False)
    assert model.book.captured_sizes == {1, 2, 4} and inner.scale == 2.0

    ids[:4] = torch.tensor([1, 2, 3, 4])  # the step's inputs written in place
    out, mode = full_pass(full_cfg, dispatcher, model, ids, pos, 3)  # a uniform decode batch of 3, padded to 4
    assert mode == CUDAGraphMode.FULL and model.book.replays == {4: 1}
    torch.testing.assert_close(out, inner.proj(torch.nn.functional.one_hot(ids[:4], 8).float()) * 2.0 + pos[:4, None])

    moved = pos.clone()  # rebound instead of written in place
    with pytest.raises(MovedInputError, match="keyword positions moved since capture"):
        full_pass(full_cfg, dispatcher, model, ids, moved, 2)

    def no_python(*args, **kwargs):
        raise AssertionError("the model's Python ran")

    inner.forward = no_python  # a replay is a call into the artifact, as a device graph's replay would be
    out, mode = full_pass(full_cfg, dispatcher, model, ids, pos, 4)
    assert mode == CUDAGraphMode.FULL and model.book.replays == {4: 2}
    with pytest.raises(AssertionError, match="the model's Python ran"):  # above the largest size: plain run
        full_pass(full_cfg, dispatcher, model, ids, pos, 5)
