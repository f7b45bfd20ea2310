"""A small real OpenAI-style SSE server for load-test tests: known token timings, logged as the truth.

Run as a script (its own process, real sockets): ``python sse_server.py [--ttft-ms T] [--interval-ms I]
[--engine-scale S]``; it prints ``PORT <n>`` once listening on 127.0.0.1. Standard library only.

- ``GET /v1/models``: one model, ``fake``; ``/tokenize`` is 404, so ``bench serve`` makes word prompts.
- ``POST /v1/completions`` (``stream``): waits ``T`` ms, then sends ``max_tokens`` text chunks ``I`` ms apart,
  each with ``usage`` (continuous usage stats), then ``[DONE]``. A prompt ending ``interval=N`` gets ``N``
  ms between its tokens instead. HTTP/1.1 keep-alive, chunked transfer encoding.
- ``GET /log``: every completion as this process timed it, ``time.perf_counter()`` stamps (the machine's
  ``CLOCK_MONOTONIC``): ``arrived`` (request read), ``sent`` (each token written), ``done``, ``prompt``.
- ``GET /metrics``: vLLM's histograms (``_sum``/``_count``) from those stamps, every duration multiplied by
  ``S``: ``S = 1`` is an engine that agrees with what it sent; ``S < 1`` an engine that says it was faster
  than its front end delivered.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

LOG: list[dict[str, Any]] = []
ARGS = argparse.Namespace()


def _histograms() -> str:
    done = [r for r in LOG if r["done"] is not None and r["sent"]]
    scale = ARGS.engine_scale
    series: dict[str, list[float]] = {
        "vllm:time_to_first_token_seconds": [(r["sent"][0] - r["arrived"]) * scale for r in done],
        "vllm:e2e_request_latency_seconds": [(r["done"] - r["arrived"]) * scale for r in done],
        "vllm:request_time_per_output_token_seconds": [
            (r["sent"][-1] - r["sent"][0]) / (len(r["sent"]) - 1) * scale for r in done if len(r["sent"]) > 1],
        "vllm:inter_token_latency_seconds": [(b - a) * scale for r in done
                                             for a, b in zip(r["sent"], r["sent"][1:], strict=False)],
    }
    lines = []
    for name, values in series.items():
        lines += [f"# HELP {name} test", f"# TYPE {name} histogram",
                  f'{name}_bucket{{le="+Inf",model_name="fake"}} {len(values)}',
                  f'{name}_sum{{model_name="fake"}} {sum(values)!r}',
                  f'{name}_count{{model_name="fake"}} {len(values)}']
    lines += ["# HELP vllm:request_success_total test", "# TYPE vllm:request_success_total counter",
              f'vllm:request_success_total{{model_name="fake"}} {len(done)}',
              "# HELP vllm:generation_tokens_total test", "# TYPE vllm:generation_tokens_total counter",
              f'vllm:generation_tokens_total{{model_name="fake"}} {sum(len(r["sent"]) for r in done)}']
    return "\n".join(lines) + "\n"


async def _reply(writer: asyncio.StreamWriter, status: int, body: bytes, kind: str = "application/json") -> None:
    reason = {200: "OK", 404: "Not Found"}[status]
    writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n\r\n"
                 .encode() + body)
    await writer.drain()


async def _event(writer: asyncio.StreamWriter, doc: Any) -> None:
    data = f"data: {doc if isinstance(doc, str) else json.dumps(doc)}\n\n".encode()
    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    await writer.drain()


async def _complete(writer: asyncio.StreamWriter, body: dict[str, Any], arrived: float) -> None:
    prompt = str(body.get("prompt", ""))
    record: dict[str, Any] = {"prompt": prompt, "arrived": arrived, "sent": [], "done": None}
    LOG.append(record)
    interval = ARGS.interval_ms
    if prompt.split() and prompt.split()[-1].startswith("interval="):  # the last word: a client draws the first anew
        interval = float(prompt.split()[-1].split("=")[1])
    tokens = int(body.get("max_tokens", 16))
    prompt_tokens = len(prompt.split())
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
    await asyncio.sleep(ARGS.ttft_ms / 1e3)
    start = time.perf_counter()
    for k in range(tokens):
        # absolute schedule: a late wake-up does not push the following tokens back
        delay = start + k * interval / 1e3 - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": k + 1, "total_tokens": prompt_tokens + k + 1}
        await _event(writer, {"id": "c", "object": "text_completion", "model": "fake",
                              "choices": [{"index": 0, "text": " tok", "finish_reason": None}], "usage": usage})
        record["sent"].append(time.perf_counter())
    await _event(writer, {"id": "c", "object": "text_completion", "model": "fake", "choices": [],
                          "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": tokens,
                                    "total_tokens": prompt_tokens + tokens}})
    await _event(writer, "[DONE]")
    writer.write(b"0\r\n\r\n")
    await writer.drain()
    record["done"] = time.perf_counter()


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            arrived = time.perf_counter()
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
            raw = await reader.readexactly(int(headers.get("content-length", "0")))
            path = target.split("?")[0]
            if method == "GET" and path == "/v1/models":
                await _reply(writer, 200, json.dumps({"object": "list", "data": [
                    {"id": "fake", "object": "model", "max_model_len": 100_000}]}).encode())
            elif method == "GET" and path == "/health":
                await _reply(writer, 200, b"")
            elif method == "GET" and path == "/metrics":
                await _reply(writer, 200, _histograms().encode(), "text/plain; version=0.0.4")
            elif method == "GET" and path == "/log":
                await _reply(writer, 200, json.dumps(LOG).encode())
            elif method == "POST" and path == "/v1/completions":
                await _complete(writer, json.loads(raw or b"{}"), arrived)
            else:
                await _reply(writer, 404, json.dumps({"detail": "Not Found"}).encode())
    except ConnectionError:
        return
    finally:
        writer.close()


async def _main() -> None:
    server = await asyncio.start_server(_serve, "127.0.0.1", 0, backlog=1024)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--interval-ms", type=float, default=20.0)
    parser.add_argument("--engine-scale", type=float, default=1.0)
    ARGS = parser.parse_args()
    asyncio.run(_main())
