"""Runs ON THE LENT GPU (`tools/gpu_vllm/bench_agree.sh form`): one `bench serve` point of LOAD streams, 4 x LOAD
requests (256 in / 128 out), with the prompts sent as token ids (servescope's default: the API server does not
tokenize them, and each request's first tokens are drawn anew) or as text (as a client such as vLLM's bench sends
them: the API server tokenizes each; 4 x LOAD + 2 distinct texts, so that no prompt repeats). An experiment: the text
form is made by taking the server's token ids away from the session, not an option of the tool.

  python3 prompt_form.py URL ids|text LOAD OUT.json
"""

from __future__ import annotations

import sys
from pathlib import Path

import msgspec

import servescope.bench.serve.session as session
from servescope.bench.serve.api import ServeRequest, bench_serve
from servescope.bench.serve.point import LoadSpec


def main() -> None:
    url, form, load, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
    if form == "text":
        async def _no_ids(*_: object, **__: object) -> None:
            return None

        session.prompt_ids = _no_ids  # type: ignore[assignment]
        session._PROMPT_POOL_MAX = 4 * load + 2  # noqa: SLF001  every request a prompt of its own
    spec = LoadSpec(url=url, input_tokens=256, output_tokens=128, concurrency=(load,), requests=4 * load)
    result = bench_serve(ServeRequest(load=spec))
    out.write_bytes(msgspec.json.encode(result))
    p = result.points[0]
    print(f"{form}: {p.duration_s:.2f} s, {p.requests} requests, {p.output_tokens_per_s:.1f} tok/s, "
          f"ttft p99 {p.ttft_ms.p99:.1f} ms, tpot mean {p.tpot_ms.mean:.2f} ms, itl p99 {p.itl_ms.p99:.1f} ms, "
          f"prompt mean {p.tokens.prompt_mean}, prompts: {result.options.prompt_source}")


if __name__ == "__main__":  # the load workers are spawned: they import this file again, and must not run it
    main()
