"""A small real server with a vLLM-like command line, for the tune loop's tests (its own process, real sockets).

``python toy_server.py --port P [--max-num-seqs N] [--api-server-count N] [--enforce-eager] [--speculative-config
C] [--startup-s S]``.
Unknown flags fail as vLLM's parser fails them (``error: unrecognized arguments``, exit 2). It serves what
``health --wait`` asks (``/health``, ``/v1/models``, one completion), ``/version``, and ``/config``: the flags it
runs with, which the tests' measurement reads. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ARGS = argparse.Namespace()


class Handler(BaseHTTPRequestHandler):
    def _send(self, body: dict[str, object], status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path == "/health":
            self._send({})
        elif self.path.startswith("/v1/models"):
            self._send({"object": "list", "data": [{"id": "toy", "object": "model", "max_model_len": 1024}]})
        elif self.path == "/version":
            self._send({"version": "0.26.0"})
        elif self.path == "/config":
            self._send(vars(ARGS))
        else:
            self._send({"error": "not found"}, 404)

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(length)
        if self.path.startswith("/v1/completions"):
            self._send({"id": "c", "object": "text_completion", "model": "toy",
                        "choices": [{"index": 0, "text": " hi", "finish_reason": "length"}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
        else:
            self._send({"error": "not found"}, 404)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        sys.stderr.write("toy: " + format % args + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(prog="toy_server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--api-server-count", type=int, default=1)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--async-scheduling", action="store_true")
    parser.add_argument("--no-async-scheduling", action="store_true")
    parser.add_argument("--speculative-config", default=None)
    parser.add_argument("--startup-s", type=float, default=0.0)
    parser.parse_args(namespace=ARGS)
    print(f"INFO toy server starting with {vars(ARGS)}", flush=True)
    time.sleep(ARGS.startup_s)
    server = ThreadingHTTPServer((ARGS.host, ARGS.port), Handler)
    print(f"INFO listening on {ARGS.host}:{ARGS.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
