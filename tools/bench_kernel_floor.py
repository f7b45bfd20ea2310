"""Per-kernel time floor of small kernels replayed from a CUDA graph on one GPU; write the JSON plan reads.

A decode step at small batch is mostly kernels too small to reach memory bandwidth: each costs its floor.
This times, inside one CUDA graph (as vLLM and the capture skeletons decode), chains of one kind of kernel
on batch-1 tensors of a 2048-wide model and divides by the chain's length:

- ``gemm``: ``[1, 2048] @ [2048, 64]`` bf16 matmuls (weights of 256 KiB: no bandwidth term to speak of);
- ``attention``: ``scaled_dot_product_attention`` of one query over one cached token, 16 heads of 128;
- ``other``: a mix of elementwise, reduction and copy kernels on ``[1, 2048]`` (add, mul, neg, cast, pow,
  mean, rsqrt, silu, copy, cat), the kinds a decoder layer runs between its GEMMs.

Median of ``--iters`` replays. ``plan`` reads the result from the hardware profile's ``[kernel_floor_us]``::

    python3 tools/bench_kernel_floor.py --out /tmp/kernel_floor_h200.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any


def _time_graph(torch: Any, body: Callable[[], None], *, iters: int) -> float:
    """Median µs of one replay of a CUDA graph that runs ``body`` once."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            body()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    for _ in range(10):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return float(statistics.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--chain", type=int, default=400, help="kernels per graph")
    args = parser.parse_args()
    import torch
    import torch.nn.functional as F

    dev, bf = "cuda", torch.bfloat16
    n = args.chain
    x = torch.randn(1, 2048, device=dev, dtype=bf)
    w = torch.randn(2048, 64, device=dev, dtype=bf)
    q = torch.randn(1, 16, 1, 128, device=dev, dtype=bf)
    kv = torch.randn(1, 16, 1, 128, device=dev, dtype=bf)
    out = torch.empty(1, 64, device=dev, dtype=bf)
    y = torch.empty_like(x)

    def gemm() -> None:
        for _ in range(n):
            torch.matmul(x, w, out=out)

    def attention() -> None:
        for _ in range(n):
            F.scaled_dot_product_attention(q, kv, kv)

    ops: list[Callable[[], Any]] = [
        lambda: torch.add(x, x, out=y), lambda: torch.mul(x, x, out=y), lambda: torch.neg(x, out=y),
        lambda: x.float(), lambda: x.pow(2), lambda: x.mean(-1, keepdim=True), lambda: torch.rsqrt(x),
        lambda: F.silu(x), lambda: y.copy_(x), lambda: torch.cat([x, x], dim=-1)]

    def other() -> None:
        for i in range(n):
            ops[i % len(ops)]()

    floors = {name: _time_graph(torch, body, iters=args.iters) / n
              for name, body in (("gemm", gemm), ("attention", attention), ("other", other))}
    doc = {"kind": "kernel_floor", "date": datetime.now(UTC).isoformat(timespec="seconds"),
           "device_name": torch.cuda.get_device_name(0), "torch_version": torch.__version__,
           "cuda_version": torch.version.cuda, "python": platform.python_version(),
           "options": {"iters": args.iters, "chain": n, "graph": True}, "kernel_floor_us": floors}
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")
    print(json.dumps(floors))


if __name__ == "__main__":
    main()
