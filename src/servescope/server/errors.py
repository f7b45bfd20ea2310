"""What can go wrong talking to a server, as our own errors: one line naming the URL and the problem.

All are :class:`~servescope.core.errors.InputError`, so the CLI shows them as one line and exits 2. The
text never holds an API key: the client redacts it before raising.
"""

from __future__ import annotations

from servescope.core.errors import InputError

__all__ = [
    "AuthRequired",
    "EndpointNotFound",
    "NotOpenAICompatible",
    "ServerError",
    "ServerFailed",
    "ServerTimeout",
    "ServerUnreachable",
]


class ServerError(InputError):
    """A server answered, or failed to answer, in a way we cannot use. ``source`` is the URL."""


class ServerUnreachable(ServerError):
    """No connection: ``connection refused``, ``cannot resolve host``, or another socket error.

    ``reason`` is the short cause; ``refused`` is true when the port actively refused (nothing listening,
    or a vLLM still loading: it binds its port early and listens only once the engine is up).
    """

    def __init__(self, source: str, reason: str, *, refused: bool = False) -> None:
        super().__init__(source, reason)
        self.reason = reason
        self.refused = refused


class ServerTimeout(ServerError):
    """The connection or the answer took longer than the timeout."""


class AuthRequired(ServerError):
    """HTTP 401/403: the server wants an API key, or rejected the one sent."""


class EndpointNotFound(ServerError):
    """HTTP 404 on an endpoint an OpenAI-compatible server should have."""


class ServerFailed(ServerError):
    """HTTP 5xx, or another HTTP error status; ``status`` is the code."""

    def __init__(self, source: str, problem: str, *, status: int) -> None:
        super().__init__(source, problem)
        self.status = status


class NotOpenAICompatible(ServerError):
    """The body is not the JSON an OpenAI-compatible server sends."""
