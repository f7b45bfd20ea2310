"""Per-kernel time floor of small kernels replayed from a CUDA graph on one GPU; write the JSON plan reads.

A decode step at small batch is mostly kernels too small to reach memory bandwidth: each costs its floor.
This captures, in one CUDA graph (as vLLM and the capture skeletons decode), chains of one kind of kernel and
measures each kernel's own duration with the profiler (CUPTI, as in a capture), plus the graph's replay time
per kernel (which adds the gap between two kernels of a graph):

- ``gemm``: ``[1, H] @ [H, 64]`` bf16 matmuls (weights of 256 KiB at H = 2048: no bandwidth term);
- ``attention``: ``scaled_dot_product_attention`` of one query over one cached token, 16 heads of 128;
- ``other``: the kernels a Llama decoder layer runs between its GEMMs and attention, written as the
  reference PyTorch layer writes them, on activation-sized tensors: two RMSNorms (cast, pow, mean, add,
  rsqrt, mul, cast, mul by the weight), rotary embedding of q and k (mul, neg of a half, cat, mul, add), the
  KV-cache writes (``index_copy_``), two residual adds and SiLU × up. Measured at batch 1 (the floor) and,
  under ``other_by_batch``, at each ``--batches`` size (activation-sized kernels change their launch shape
  with the batch; their bytes stay far below what the HBM moves in a floor's time).

``kernel_floor_us`` holds the mean kernel duration (the gaps between kernels are not in it: a capture's
analysis counts them as idle time, apart from its kernels). ``chain_us_per_kernel`` holds graph replay time ÷
kernels, which includes the gaps; ``other_mix_us`` the earlier generic mix (add, mul, neg, cast, pow, mean,
rsqrt, silu, copy, cat on ``[1, H]``), for comparison. ``plan`` reads ``kernel_floor_us`` and
``other_by_batch`` from the hardware profile's ``[kernel_floor_us]`` and ``[other_floor_by_batch_us]``::

    python3 tools/bench_kernel_floor.py --out /tmp/kernel_floor_h200.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import statistics
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any


def _graph(torch: Any, body: Callable[[], None]) -> Any:
    """A CUDA graph that runs ``body`` once (after warm-up on a side stream)."""
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
    return graph


def _replay_us(torch: Any, graph: Any, *, iters: int) -> float:
    """Median µs of one replay of ``graph``."""
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return float(statistics.median(times))


def _kernel_us(torch: Any, graph: Any, *, replays: int) -> tuple[float, int]:
    """(mean kernel duration in µs, kernels per replay) of ``graph``, from the profiler's kernel events."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as fh:
            events = json.load(fh)["traceEvents"]
    finally:
        os.unlink(path)
    durs = [float(e["dur"]) for e in events if e.get("cat") == "kernel"]
    if not durs:
        raise SystemExit("the profiler recorded no kernels inside the graph replays")
    return sum(durs) / len(durs), len(durs) // replays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--chain", type=int, default=400, help="gemm and attention kernels per graph")
    parser.add_argument("--layers", type=int, default=12, help="decoder layers' small ops per 'other' graph")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--intermediate", type=int, default=5632)
    parser.add_argument("--cache-len", type=int, default=256, help="KV-cache slots per request (index_copy_)")
    parser.add_argument("--batches", default="1,2,4,8,16,32,64,128,256")
    args = parser.parse_args()
    import torch
    import torch.nn.functional as F

    dev, bf = "cuda", torch.bfloat16
    n, h = args.chain, args.hidden
    x = torch.randn(1, h, device=dev, dtype=bf)
    w = torch.randn(h, 64, device=dev, dtype=bf)
    q = torch.randn(1, 16, 1, 128, device=dev, dtype=bf)
    kv = torch.randn(1, 16, 1, 128, device=dev, dtype=bf)
    out = torch.empty(1, 64, device=dev, dtype=bf)

    def gemm() -> None:
        for _ in range(n):
            torch.matmul(x, w, out=out)

    def attention() -> None:
        for _ in range(n):
            F.scaled_dot_product_attention(q, kv, kv)

    def layer_ops(b: int) -> Callable[[], None]:
        """The small ops of ``--layers`` Llama decoder layers at batch ``b`` (reference PyTorch layer)."""
        hd, nh, nkv = args.head_dim, args.heads, args.kv_heads
        hid = torch.randn(b, 1, h, device=dev, dtype=bf)
        res = torch.randn(b, 1, h, device=dev, dtype=bf)
        norm_w = torch.randn(h, device=dev, dtype=bf)
        qs = torch.randn(b, nh, 1, hd, device=dev, dtype=bf)
        ks = torch.randn(b, nkv, 1, hd, device=dev, dtype=bf)
        vs = torch.randn(b, nkv, 1, hd, device=dev, dtype=bf)
        cos = torch.randn(b, 1, 1, hd, device=dev, dtype=bf)
        sin = torch.randn(b, 1, 1, hd, device=dev, dtype=bf)
        k_cache = torch.zeros(b, nkv, args.cache_len, hd, device=dev, dtype=bf)
        v_cache = torch.zeros_like(k_cache)
        pos = torch.tensor([args.cache_len // 2], device=dev)
        gate = torch.randn(b, 1, args.intermediate, device=dev, dtype=bf)
        up = torch.randn_like(gate)

        def rms_norm(t: Any) -> Any:
            tf = t.to(torch.float32)
            var = tf.pow(2).mean(-1, keepdim=True)
            tf = tf * torch.rsqrt(var + 1e-6)
            return norm_w * tf.to(bf)

        def rotate_half(t: Any) -> Any:
            return torch.cat((-t[..., hd // 2:], t[..., : hd // 2]), dim=-1)

        def body() -> None:
            for _ in range(args.layers):
                rms_norm(hid)
                qs * cos + rotate_half(qs) * sin
                ks * cos + rotate_half(ks) * sin
                k_cache.index_copy_(2, pos, ks)
                v_cache.index_copy_(2, pos, vs)
                hid + res
                rms_norm(hid)
                F.silu(gate) * up
                hid + res

        return body

    floors: dict[str, float] = {}
    chain: dict[str, float] = {}
    calls: dict[str, int] = {}
    y = torch.empty_like(x)
    mix: list[Callable[[], Any]] = [  # the earlier "other": a mix of small kernels on [1, H], kept for comparison
        lambda: torch.add(x, x, out=y), lambda: torch.mul(x, x, out=y), lambda: torch.neg(x, out=y),
        lambda: x.float(), lambda: x.pow(2), lambda: x.mean(-1, keepdim=True), lambda: torch.rsqrt(x),
        lambda: F.silu(x), lambda: y.copy_(x), lambda: torch.cat([x, x], dim=-1)]

    def other_mix() -> None:
        for i in range(n):
            mix[i % len(mix)]()

    bodies: list[tuple[str, Callable[[], None]]] = [("gemm", gemm), ("attention", attention),
                                                     ("other_mix", other_mix)]
    batches = [int(b) for b in args.batches.split(",")]
    bodies += [(f"other@{b}", layer_ops(b)) for b in batches]
    for name, body in bodies:
        graph = _graph(torch, body)
        kernel_us, count = _kernel_us(torch, graph, replays=5)
        floors[name], calls[name] = kernel_us, count
        chain[name] = _replay_us(torch, graph, iters=args.iters) / count
        del graph
    by_batch = {str(b): floors[f"other@{b}"] for b in batches}
    doc = {"kind": "kernel_floor", "date": datetime.now(UTC).isoformat(timespec="seconds"),
           "device_name": torch.cuda.get_device_name(0), "torch_version": torch.__version__,
           "cuda_version": torch.version.cuda, "python": platform.python_version(),
           "options": {"iters": args.iters, "chain": n, "graph": True, "layers": args.layers, "hidden": h,
                       "heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim,
                       "intermediate": args.intermediate, "cache_len": args.cache_len, "batches": batches},
           "kernel_floor_us": {"gemm": floors["gemm"], "attention": floors["attention"],
                               "other": floors[f"other@{batches[0]}"]},
           "other_by_batch": by_batch, "other_mix_us": floors["other_mix"],
           "chain_us_per_kernel": {k.replace("other@", "other_b"): v for k, v in chain.items()},
           "kernels_per_graph": {k.replace("other@", "other_b"): v for k, v in calls.items()}}
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")
    print(json.dumps({"kernel_floor_us": doc["kernel_floor_us"], "other_by_batch": by_batch,
                      "chain_us_per_kernel": doc["chain_us_per_kernel"]}))


if __name__ == "__main__":
    main()
