"""The HTTP client: SSE streaming from the real vLLM server, timeouts, non-OpenAI servers, keys, URLs."""

from __future__ import annotations

import asyncio
import functools
import http.server
import json
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from httpd import serving
from servescope.core.redact import redact
from servescope.server.client import ApiKey, ServerClient, normalize_base_url, resolve_api_key
from servescope.server.errors import EndpointNotFound, NotOpenAICompatible, ServerTimeout
from servescope.server.health import HealthRequest, check_health

from .conftest import LiveServer


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.mark.no_server
@pytest.mark.parametrize(("url", "base"), [
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
    ("http://127.0.0.1:8000/", "http://127.0.0.1:8000"),
    ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000"),
    ("https://example.org/serve/v1/", "https://example.org/serve"),
    ("http://[::1]:8000", "http://[::1]:8000"),
])
def test_normalize_base_url(url: str, base: str) -> None:
    assert normalize_base_url(url) == base


@pytest.mark.no_server
def test_api_key_order_flag_then_servescope_then_vllm_then_openai() -> None:
    env = {"SERVESCOPE_API_KEY": "s", "VLLM_API_KEY": "v", "OPENAI_API_KEY": "o"}
    sources = [resolve_api_key(flag, env=e) for flag, e in
               [("f", env), (None, env), (None, {**env, "SERVESCOPE_API_KEY": ""}),
                (None, {"SERVESCOPE_API_KEY": "", "VLLM_API_KEY": "", "OPENAI_API_KEY": "o"})]]
    assert [(k.source, k.reveal()) for k in sources if k is not None] == [
        ("--api-key", "f"), ("SERVESCOPE_API_KEY", "s"), ("VLLM_API_KEY", "v"), ("OPENAI_API_KEY", "o")]
    assert resolve_api_key(None, env={}) is None


@pytest.mark.no_server
def test_client_repr_hides_the_key() -> None:
    client = ServerClient("http://127.0.0.1:1", api_key=ApiKey("sk-very-secret", "OPENAI_API_KEY"))
    try:
        assert "sk-very-secret" not in repr(client)
        assert "OPENAI_API_KEY" in repr(client)
    finally:
        _run(client.aclose())


@pytest.mark.no_server
def test_redact_known_and_shaped_secrets() -> None:
    text = "Authorization: Bearer abc123 --api-key=k1 --hf-token k2 HF_TOKEN=k3 'api_key': 'k4' max_tokens=5 s3cr"
    assert redact(text, ["s3cr"]) == ("Authorization: Bearer *** --api-key=*** --hf-token *** HF_TOKEN=*** "
                                      "'api_key': '***' max_tokens=5 ***")


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A real socket that listens but never accepts: connections open, answers never come."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield int(s.getsockname()[1])


@pytest.mark.no_server
def test_read_timeout_is_our_error(silent_port: int) -> None:
    async def go() -> None:
        async with ServerClient(f"http://127.0.0.1:{silent_port}", read_timeout_s=0.3) as client:
            await client.get_json("/v1/models")

    started = time.monotonic()
    with pytest.raises(ServerTimeout, match=r"/v1/models: no answer within 0.3 s$"):
        _run(go())
    assert time.monotonic() - started < 2.0


@pytest.fixture
def static_site(tmp_path: Path) -> Iterator[str]:
    """Python's own http.server over a folder: a real web server that is not OpenAI-compatible."""
    (tmp_path / "health").write_text("ok")
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "models").write_text("<html><body>models page</body></html>")
    handler = functools.partial(_QuietHandler, directory=str(tmp_path))
    with serving(handler) as url:
        yield url


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass


@pytest.mark.no_server
def test_a_non_json_answer_is_not_openai(static_site: str) -> None:
    with pytest.raises(NotOpenAICompatible) as info:
        check_health(HealthRequest(url=static_site))
    assert str(info.value) == f"{static_site}/v1/models: not an OpenAI-compatible server (the answer is not JSON)"


@pytest.mark.no_server
def test_a_missing_endpoint_is_404(static_site: str) -> None:
    async def go() -> None:
        async with ServerClient(static_site) as client:
            await client.get_json("/metrics")

    with pytest.raises(EndpointNotFound) as info:
        _run(go())
    assert str(info.value) == (f"{static_site}/metrics: HTTP 404: no such endpoint "
                               "(is this an OpenAI-compatible server?)")


def test_stream_completion_yields_chunks_until_done(ready_server: LiveServer) -> None:
    tokens = 8

    async def go() -> list[Any]:
        async with ServerClient(ready_server.url, api_key=ApiKey(ready_server.api_key, "test")) as client:
            body = {"model": ready_server.model, "prompt": "Once upon a time", "max_tokens": tokens,
                    "min_tokens": tokens, "ignore_eos": True, "temperature": 0.0,
                    "stream_options": {"include_usage": True}}
            return [chunk async for chunk in client.stream_completion(body)]

    chunks = _run(go())
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == tokens  # the count we asked for, as the server reports it
    text_chunks = [c for c in chunks if c["choices"]]
    assert text_chunks[-1]["choices"][0]["finish_reason"] == "length"
    # The same request without streaming, through urllib: the same greedy text.
    req = urllib.request.Request(
        f"{ready_server.url}/v1/completions", method="POST",
        data=json.dumps({"model": ready_server.model, "prompt": "Once upon a time", "max_tokens": tokens,
                         "min_tokens": tokens, "ignore_eos": True, "temperature": 0.0}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {ready_server.api_key}"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        whole = json.load(resp)["choices"][0]["text"]
    assert "".join(c["choices"][0]["text"] for c in text_chunks) == whole


def test_http_error_carries_the_servers_message(ready_server: LiveServer) -> None:
    async def go() -> None:
        async with ServerClient(ready_server.url, api_key=ApiKey(ready_server.api_key, "test")) as client:
            await client.post_json("/v1/completions", {"model": "no-such-model", "prompt": "x", "max_tokens": 1})

    with pytest.raises(EndpointNotFound) as info:
        _run(go())
    assert "The model `no-such-model` does not exist" in str(info.value)
    assert ready_server.api_key not in str(info.value)
