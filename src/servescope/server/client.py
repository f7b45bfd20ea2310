"""The one HTTP client of servescope (httpx, async): base URL, bearer API key, timeouts, SSE streaming.

Every module that talks to a server goes through :class:`ServerClient`; ruff bans ``httpx`` elsewhere.
Failures become our own one-line errors (:mod:`servescope.server.errors`), and the API key is never
printed: it lives in an :class:`ApiKey` whose ``repr`` hides it, and error text is redacted.

Shell twins, to check by hand::

    curl -s http://HOST:PORT/health -o /dev/null -w '%{http_code}\\n'
    curl -s http://HOST:PORT/v1/models -H "Authorization: Bearer $SERVESCOPE_API_KEY"
    curl -sN http://HOST:PORT/v1/completions -H 'Content-Type: application/json' \\
         -d '{"model": "M", "prompt": "Hi", "max_tokens": 4, "stream": true}'
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import msgspec

from servescope.core.errors import InputError
from servescope.core.redact import redact
from servescope.server.errors import (
    AuthRequired,
    EndpointNotFound,
    NotOpenAICompatible,
    ServerFailed,
    ServerTimeout,
    ServerUnreachable,
)

__all__ = [
    "API_KEY_ENV_VARS",
    "ApiKey",
    "ServerClient",
    "normalize_base_url",
    "resolve_api_key",
]

# VLLM_API_KEY is the engine's own: a rendered unit keeps its key there (EnvironmentFile=), and the
# readiness check it runs (ExecStartPost=servescope health) must send the key the server was started with.
API_KEY_ENV_VARS = ("SERVESCOPE_API_KEY", "VLLM_API_KEY", "OPENAI_API_KEY")
_NEED_KEY = "the server wants an API key: pass --api-key or set SERVESCOPE_API_KEY"
# A socket receive buffer big enough that hundreds of SSE streams are drained in few syscalls; the
# kernel caps it at net.core.rmem_max.
_RCVBUF_BYTES = 1 << 20
_ERROR_BODY_CHARS = 200


class ApiKey:
    """An API key and where it came from; ``repr`` and ``str`` never show the value."""

    __slots__ = ("_value", "source")

    def __init__(self, value: str, source: str) -> None:
        self._value = value
        self.source = source

    def reveal(self) -> str:
        """The key itself: only for the ``Authorization`` header."""
        return self._value

    def __repr__(self) -> str:
        return f"ApiKey(source={self.source!r}, value='***')"

    __str__ = __repr__


def resolve_api_key(explicit: str | None = None, *, env: Mapping[str, str] | None = None) -> ApiKey | None:
    """The API key to send: ``--api-key``, else ``$SERVESCOPE_API_KEY``, else ``$VLLM_API_KEY``, else
    ``$OPENAI_API_KEY``, else None.

    Empty values count as unset.
    """
    if explicit:
        return ApiKey(explicit, "--api-key")
    environ = os.environ if env is None else env
    for name in API_KEY_ENV_VARS:
        value = environ.get(name)
        if value:
            return ApiKey(value, name)
    return None


def normalize_base_url(url: str) -> str:
    """``url`` as ``scheme://host[:port][/prefix]`` without a trailing ``/`` or ``/v1``.

    Raises:
        InputError: not an ``http(s)://HOST[:PORT]`` URL (one line, naming the URL).
    """
    shown = _hide_userinfo(url.strip())
    try:
        parts = urlsplit(url.strip())
        port = parts.port  # raises ValueError for a port out of range or not a number
    except ValueError as exc:
        raise InputError(shown, f"not a server URL ({exc}); want http://HOST:PORT") from None
    if parts.scheme not in ("http", "https"):
        hint = f"; did you mean http://{url.strip()}?" if "://" not in url else ""
        raise InputError(shown, f"not a server URL (scheme must be http or https){hint}")
    if not parts.hostname:
        raise InputError(shown, "not a server URL (no host); want http://HOST:PORT")
    if parts.username is not None or parts.password is not None:
        raise InputError(shown, "credentials in the URL are not supported; pass --api-key or set SERVESCOPE_API_KEY")
    if parts.query or parts.fragment:
        raise InputError(shown, "not a server URL (has a query or fragment); want http://HOST:PORT")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    netloc = host if port is None else f"{host}:{port}"
    return urlunsplit((parts.scheme, netloc, path, "", ""))


def _hide_userinfo(url: str) -> str:
    """``url`` with any ``user:password@`` replaced by ``***@`` (for error text)."""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest.split("/", 1)[0]:
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


class ServerClient:
    """An async client for one OpenAI-compatible server; use as ``async with ServerClient(url) as c``.

    Args:
        base_url: ``http(s)://HOST:PORT`` (a trailing ``/v1`` is dropped; paths carry their own).
        api_key: sent as ``Authorization: Bearer …`` when given.
        connect_timeout_s: seconds to open a connection.
        read_timeout_s: seconds to wait for each read (for a stream: between chunks).
        max_connections: connection pool size (load tests raise it).

    Raises:
        InputError: ``base_url`` is malformed.
    """

    def __init__(self, base_url: str, *, api_key: ApiKey | None = None, connect_timeout_s: float = 5.0,
                 read_timeout_s: float = 30.0, max_connections: int = 100) -> None:
        self.base_url = normalize_base_url(base_url)
        self.api_key = api_key
        self.read_timeout_s = read_timeout_s
        self.connect_timeout_s = connect_timeout_s
        headers = {"Accept": "application/json", "User-Agent": "servescope"}
        if api_key is not None:
            headers["Authorization"] = f"Bearer {api_key.reveal()}"
        transport = httpx.AsyncHTTPTransport(
            socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, _RCVBUF_BYTES)],
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )
        # trust_env=False: a proxy from the environment would swallow requests to 127.0.0.1, and a
        # .netrc must not replace the bearer key.
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=headers, transport=transport, trust_env=False,
            timeout=httpx.Timeout(read_timeout_s, connect=connect_timeout_s), follow_redirects=False,
        )

    def __repr__(self) -> str:
        return f"ServerClient({self.base_url!r}, api_key={self.api_key!r})"

    async def __aenter__(self) -> ServerClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    def url_of(self, path: str) -> str:
        """The full URL of ``path`` (as errors name it)."""
        return self.base_url + path

    async def get_status(self, path: str) -> int:
        """The HTTP status of GET ``path`` (body ignored): for ``/health``, which answers an empty 200.

        Raises:
            ServerUnreachable, ServerTimeout: no answer.
        """
        response = await self._send("GET", path)
        return response.status_code

    async def get_json(self, path: str) -> Any:
        """The JSON body of GET ``path``.

        Raises:
            ServerUnreachable, ServerTimeout, AuthRequired, EndpointNotFound, ServerFailed,
            NotOpenAICompatible: see :mod:`servescope.server.errors`.
        """
        response = await self._send("GET", path)
        self._raise_for_status(path, response)
        return self._decode(path, response.content)

    async def get_text(self, path: str) -> str:
        """The body of GET ``path`` as text (for ``/metrics``; errors as for :meth:`get_json`)."""
        response = await self._send("GET", path)
        self._raise_for_status(path, response)
        return response.content.decode("utf-8", "replace")

    async def post_json(self, path: str, body: Mapping[str, Any], *, read_timeout_s: float | None = None) -> Any:
        """The JSON body of POST ``path`` with ``body`` as JSON (errors as for :meth:`get_json`)."""
        response = await self._send("POST", path, body, read_timeout_s=read_timeout_s)
        self._raise_for_status(path, response)
        return self._decode(path, response.content)

    async def stream_json(self, path: str, body: Mapping[str, Any]) -> AsyncIterator[Any]:
        """Each ``data:`` JSON chunk of a server-sent-event stream from POST ``path``, until ``[DONE]``.

        ``body`` should ask for a stream (``"stream": true``). Lines are split from raw reads (httpcore
        reads up to 64 KiB at a time; the socket buffer is 1 MiB), so a fast stream is not held up by
        the client. Comments, ``event:`` and ``id:`` lines are skipped.

        Raises:
            the errors of :meth:`get_json`; NotOpenAICompatible also for a stream that ends without
            ``[DONE]`` or a chunk that is not JSON.
        """
        url = self.url_of(path)
        try:
            async with self._http.stream("POST", path, json=body) as response:
                if response.status_code >= 400:
                    await response.aread()
                    self._raise_for_status(path, response)
                pending = b""
                async for raw in response.aiter_raw():
                    pending += raw
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        chunk = self._sse_data(url, line)
                        if chunk is _DONE:
                            return
                        if chunk is not _SKIP:
                            yield chunk
                if pending.strip():
                    chunk = self._sse_data(url, pending)
                    if chunk is _DONE:
                        return
                    if chunk is not _SKIP:
                        yield chunk
        except httpx.HTTPError as exc:
            raise self._map_transport_error(url, exc) from None
        raise NotOpenAICompatible(url, "the event stream ended without [DONE]")

    async def stream_completion(self, body: Mapping[str, Any]) -> AsyncIterator[Any]:
        """The chunks of a streamed ``/v1/completions`` (``stream: true`` is set for you)."""
        async for chunk in self.stream_json("/v1/completions", {**body, "stream": True}):
            yield chunk

    # ------------------------------------------------------------------------------------- internals

    async def _send(self, method: str, path: str, body: Mapping[str, Any] | None = None, *,
                    read_timeout_s: float | None = None) -> httpx.Response:
        url = self.url_of(path)
        timeout = (httpx.Timeout(read_timeout_s, connect=self.connect_timeout_s)
                   if read_timeout_s is not None else httpx.USE_CLIENT_DEFAULT)
        try:
            return await self._http.request(method, path, json=body, timeout=timeout)
        except httpx.HTTPError as exc:
            raise self._map_transport_error(url, exc, read_timeout_s=read_timeout_s) from None

    def _secrets(self) -> tuple[str | None, ...]:
        return (self.api_key.reveal() if self.api_key is not None else None,)

    def _map_transport_error(self, url: str, exc: httpx.HTTPError, *,
                             read_timeout_s: float | None = None) -> Exception:
        if isinstance(exc, httpx.ConnectTimeout):
            return ServerTimeout(url, f"no connection within {self.connect_timeout_s:g} s")
        if isinstance(exc, httpx.TimeoutException):
            limit = read_timeout_s if read_timeout_s is not None else self.read_timeout_s
            return ServerTimeout(url, f"no answer within {limit:g} s")
        cause = _root_os_error(exc)
        if isinstance(cause, ConnectionRefusedError) or getattr(cause, "errno", None) == errno.ECONNREFUSED:
            return ServerUnreachable(url, "connection refused", refused=True)
        if isinstance(cause, socket.gaierror):
            return ServerUnreachable(url, f"cannot resolve host ({cause.strerror or cause})")
        if isinstance(exc, httpx.RemoteProtocolError):
            return NotOpenAICompatible(url, "not an HTTP server, or it closed the connection mid-answer")
        detail = redact(str(cause or exc) or type(exc).__name__, self._secrets())
        return ServerUnreachable(url, detail)

    def _raise_for_status(self, path: str, response: httpx.Response) -> None:
        status = response.status_code
        if status < 400:
            return
        url = self.url_of(path)
        if status in (401, 403):
            if self.api_key is None:
                raise AuthRequired(url, f"HTTP {status}: {_NEED_KEY}")
            raise AuthRequired(url, f"HTTP {status}: the server rejected the API key from {self.api_key.source}")
        message = redact(_error_message(response.content), self._secrets())
        if status == 404:
            if message in ("", "Not Found"):  # FastAPI's default: a route the server does not have
                message = "no such endpoint (is this an OpenAI-compatible server?)"
            raise EndpointNotFound(url, f"HTTP 404: {message}")
        raise ServerFailed(url, f"HTTP {status}: {message or response.reason_phrase}", status=status)

    def _decode(self, path: str, content: bytes) -> Any:
        try:
            return msgspec.json.decode(content)
        except msgspec.DecodeError:
            raise NotOpenAICompatible(self.url_of(path),
                                      "not an OpenAI-compatible server (the answer is not JSON)") from None

    def _sse_data(self, url: str, line: bytes) -> Any:
        line = line.rstrip(b"\r")
        if not line.startswith(b"data:"):
            return _SKIP  # blank separator, ": comment", "event:", "id:", "retry:"
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return _DONE
        if not payload:
            return _SKIP
        try:
            return msgspec.json.decode(payload)
        except msgspec.DecodeError:
            raise NotOpenAICompatible(url, "not an OpenAI-compatible stream (a data: line is not JSON)") from None


_DONE = object()
_SKIP = object()


def _root_os_error(exc: BaseException) -> OSError | None:
    """The innermost OSError under ``exc`` (httpx wraps anyio's wrap of the socket error)."""
    found: OSError | None = None
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError):
            found = current
        current = current.__cause__ or current.__context__
    return found


def _error_message(content: bytes) -> str:
    """The message of an error body: OpenAI ``{"error": {"message"}}``, FastAPI ``{"detail"}``, or text."""
    try:
        doc = msgspec.json.decode(content)
    except msgspec.DecodeError:
        text = content.decode("utf-8", "replace").strip()
        if text.startswith("<"):
            return ""  # an HTML error page says nothing a one-line error can use
        return " ".join(text.split())[:_ERROR_BODY_CHARS]
    if isinstance(doc, dict):
        err = doc.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])[:_ERROR_BODY_CHARS]
        for key in ("detail", "message", "error"):
            if isinstance(doc.get(key), str):
                return str(doc[key])[:_ERROR_BODY_CHARS]
    return ""
