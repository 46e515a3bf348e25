"""``serve``'s media connector (ascend_kernel/cli/media.py): vLLM's, except that an image host the server cannot
connect to is a 400 naming it. vLLM's own connector, on the same URLs, is the oracle for everything else."""

from __future__ import annotations

import base64
import io
import os

import pytest

from tests.vlm_inputs import make_image

UNREACHABLE = "http://images.example.invalid/cat.png"  # .invalid never resolves (RFC 2606)


def _io():
    from vllm.multimodal.media import ImageMediaIO

    return ImageMediaIO()


def test_an_unreachable_image_host_is_a_validation_error_naming_it() -> None:
    """vLLM's connector raises the network error (HTTP 500 in the server) after its retries (about 5 s here);
    the sync path here, the server's async path in tests/e2e/test_vision_serving.py."""
    from vllm.exceptions import VLLMValidationError

    from ascend_kernel.cli.media import KernelMediaConnector

    with pytest.raises(VLLMValidationError, match="cannot reach images.example.invalid"):
        KernelMediaConnector().load_from_url(UNREACHABLE, _io())


def test_data_urls_load_as_vllms_connector_loads_them() -> None:
    from vllm.multimodal.media import MediaConnector

    from ascend_kernel.cli.media import KernelMediaConnector

    buffer = io.BytesIO()
    make_image(3, 40, 30).save(buffer, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    ours, theirs = KernelMediaConnector().load_from_url(url, _io()), MediaConnector().load_from_url(url, _io())
    assert ours.size == theirs.size == (40, 30) and ours.tobytes() == theirs.tobytes()


def test_serve_selects_the_connector_for_the_block_only_and_leaves_a_users_choice(monkeypatch) -> None:
    from vllm.multimodal.media import MEDIA_CONNECTOR_REGISTRY

    from ascend_kernel.cli.media import NAME, VARIABLE, KernelMediaConnector, connector_selected

    monkeypatch.delenv(VARIABLE, raising=False)
    with connector_selected():
        assert os.environ[VARIABLE] == NAME
        assert MEDIA_CONNECTOR_REGISTRY.name2class[NAME] is KernelMediaConnector
    assert VARIABLE not in os.environ
    monkeypatch.setenv(VARIABLE, "http")
    with connector_selected():
        assert os.environ[VARIABLE] == "http"
    assert os.environ[VARIABLE] == "http"
