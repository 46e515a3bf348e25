"""Image URLs in ``serve``: a host the server cannot reach is the request's problem, answered HTTP 400 by name.

vLLM's media connector fetches an ``http(s)`` image URL itself. When the host cannot be resolved or
refuses the connection, it lets the connection error through, and the server answers HTTP 500 (vLLM keeps
network errors 5xx, for clients that retry). A server with no route to that host (an air-gapped cluster,
this test host) will not get there by a retry: the request names an image the server cannot fetch, which is
the client's to fix (send it inline, as a base64 data URL). :class:`KernelMediaConnector` is vLLM's
connector with that one difference: a connection error becomes vLLM's ``VLLMValidationError`` (HTTP 400)
naming the URL's host. Timeouts, HTTP errors from the host, data URLs, local files and
``--allowed-media-domains`` are vLLM's, unchanged. A ``video_url`` that is an animated WebP (FFmpeg, under
vLLM's OpenCV video decoder, reads its first frame only) is handed to vLLM's video loader as a lossless
video of its frames (:mod:`.animated_video`); every other video goes to vLLM's loader as sent.

vLLM picks its connector by name from ``VLLM_MEDIA_CONNECTOR``. ``ascend-kernel serve`` sets it to
:data:`NAME` for the life of vLLM's serve command (put back after it, and left alone when the user set
it), and the kernel's middleware, which vLLM imports in every API-server process, registers the class
there (:func:`register`).
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Iterator
from urllib.parse import urlsplit

from vllm.exceptions import VLLMValidationError
from vllm.multimodal.media import MEDIA_CONNECTOR_REGISTRY, MediaConnector

from ascend_kernel.cli.animated_video import aware
from ascend_kernel.scoped import setting_swapped

NAME = "ascend-kernel"
VARIABLE = "VLLM_MEDIA_CONNECTOR"
logger = logging.getLogger("ascend_kernel")


def _unreachable(url: str, exc: BaseException) -> VLLMValidationError | None:
    """The 400 for a connection error (DNS, refused, unreachable network), None for any other error."""
    import aiohttp
    import requests

    if not isinstance(exc, (aiohttp.ClientConnectorError, requests.exceptions.ConnectionError)):
        return None
    host = urlsplit(url).hostname or url
    return VLLMValidationError(f"image URL {url}: the server cannot reach {host} ({exc}); send the image inline "
                               "as a base64 data URL (data:image/png;base64,...)", parameter="image_url")


class KernelMediaConnector(MediaConnector):
    """vLLM's media connector; an image host the server cannot connect to is a 400 naming the host, and an
    animated WebP video is read frame for frame."""

    def load_from_url(self, url: str, media_io: Any, *, fetch_timeout: int | None = None) -> Any:
        try:
            return super().load_from_url(url, aware(media_io), fetch_timeout=fetch_timeout)
        except Exception as exc:
            refused = _unreachable(url, exc)
            if refused is None:
                raise
            raise refused from exc

    async def load_from_url_async(self, url: str, media_io: Any, *, fetch_timeout: int | None = None) -> Any:
        try:
            return await super().load_from_url_async(url, aware(media_io), fetch_timeout=fetch_timeout)
        except Exception as exc:
            refused = _unreachable(url, exc)
            if refused is None:
                raise
            raise refused from exc


def register() -> None:
    """Make :data:`NAME` known to vLLM's connector registry in this process (idempotent)."""
    MEDIA_CONNECTOR_REGISTRY.register(NAME)(KernelMediaConnector)


def _set(value: str | None) -> None:
    if value is None:
        os.environ.pop(VARIABLE, None)
    else:
        os.environ[VARIABLE] = value


@contextlib.contextmanager
def connector_selected() -> Iterator[None]:
    """``VLLM_MEDIA_CONNECTOR`` names the kernel's connector inside the block (API-server processes started
    in it inherit it), unless the user chose a connector; the previous value after."""
    import vllm.envs

    if vllm.envs.is_set(VARIABLE):  # the user's choice stands
        yield
        return
    register()
    logger.info("ascend-kernel serve: image URLs through the kernel's media connector (%s=%s): an image host the "
                "server cannot reach is HTTP 400 naming it", VARIABLE, NAME)
    with setting_swapped(lambda: None, _set, NAME):  # unset before (the user set none): unset after
        yield
