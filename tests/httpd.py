"""A local HTTP server on a thread, for tests that need a real server with a behaviour they write (a handler)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["serving"]


@contextmanager
def serving(handler: Callable[..., BaseHTTPRequestHandler], host: str = "127.0.0.1") -> Iterator[str]:
    """``http://HOST:PORT`` of ``handler`` served on a free port until the block ends (then shut down, its socket
    closed and its thread joined)."""
    server = ThreadingHTTPServer((host, 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
