"""One rank of ``bench comm``: time collectives in a fresh process group and hand the raw times to rank 0's file.

Started by torchrun, one process per GPU (or per CPU rank under gloo), once per NCCL env variant, because NCCL
reads its environment when the communicator is made::

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m servescope.bench.comm_worker \
        --spec SPEC.json --out RAW.json

SPEC.json: ``{"backend", "dtype", "ops", "sizes" (bytes, nccl-tests semantics), "iters", "warmup", "graph"}``.
RAW.json (rank 0 writes it again after every finished curve, atomically, so an interrupted run keeps what it
finished): ``{"meta": {...}, "curves": [{"op", "graph", "error", "points": [{"bytes", "times_us",
"ops_per_sample"}]}]}``
where ``times_us[i]`` is the slowest rank's time of one op in sample ``i``.

Timing: on a GPU each sample sits between two CUDA events; eager samples launch one op (so the launch is part
of it, as in an eager server), graph samples replay a graph of several captured ops and divide. On a CPU each
sample starts after a barrier and is timed with ``perf_counter``. Every rank's per-sample times are
all-reduced with MAX, as a collective finishes only when its slowest rank does.

Imports only the standard library and torch (no servescope dependencies), so it runs on a bare GPU image.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["main"]

_ELEM_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
_GRAPH_OPS_SMALL = 10        # ops captured per graph below _GRAPH_BIG_BYTES
_GRAPH_OPS_BIG = 2
_GRAPH_BIG_BYTES = 4 << 20


def main(argv: list[str] | None = None) -> int:
    """Run the spec on this rank; rank 0 writes RAW.json. Errors go to ``RAW.json.rank<N>.err``."""
    parser = argparse.ArgumentParser(prog="servescope.bench.comm_worker")
    parser.add_argument("--spec", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    _exit_when_orphaned()
    try:
        spec = json.loads(Path(args.spec).read_text(encoding="utf-8"))
        _run(spec, Path(args.out), rank)
    except Exception as exc:  # noqa: BLE001 - reported to the parent as one line, with the traceback beside it
        first = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        _write_json(Path(f"{args.out}.rank{rank}.err"), {"error": first, "traceback": traceback.format_exc()})
        return 1
    return 0


def _exit_when_orphaned() -> None:
    """Leave at once if torchrun dies (killed hard): no rank outlives its launcher."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


def _run(spec: dict[str, Any], out: Path, rank: int) -> None:
    import torch
    import torch.distributed as dist

    backend = spec["backend"]
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    try:
        world = dist.get_world_size()
        dtype = getattr(torch, spec["dtype"])
        doc: dict[str, Any] = {"meta": _meta(backend, local_rank, world), "curves": []}
        if rank == 0:
            _write_json(out, doc)
        timer = _Timer(dist, torch, device, backend, world)
        for graph in ([False, True] if spec["graph"] else [False]):
            for op in spec["ops"]:
                curve: dict[str, Any] = {"op": op, "graph": graph, "error": None, "points": []}
                try:
                    for nbytes in spec["sizes"]:
                        times, per_sample = timer.time_op(op, nbytes, dtype, spec["iters"], spec["warmup"], graph)
                        curve["points"].append({"bytes": nbytes, "times_us": times, "ops_per_sample": per_sample})
                except Exception as exc:  # noqa: BLE001 - e.g. NCCL has no algorithm for this op under NCCL_ALGO
                    curve["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
                doc["curves"].append(curve)
                if rank == 0:
                    _write_json(out, doc)
    finally:
        dist.destroy_process_group()


class _Timer:
    """Sample times of one op at one size on this rank, max-reduced over ranks."""

    def __init__(self, dist: Any, torch: Any, device: Any, backend: str, world: int) -> None:
        self.dist, self.torch, self.device, self.backend, self.world = dist, torch, device, backend, world

    def _op(self, op: str, nbytes: int, dtype: Any) -> Callable[[], None]:
        torch, dist, n = self.torch, self.dist, self.world
        elems = nbytes // _ELEM_BYTES[str(dtype).removeprefix("torch.")]
        if elems % n or elems == 0:
            raise ValueError(f"{nbytes} bytes is not a multiple of {n} elements")
        full = torch.ones(elems, dtype=dtype, device=self.device)
        part = torch.ones(elems // n, dtype=dtype, device=self.device)
        if op == "all_reduce":
            return lambda: dist.all_reduce(full)
        if op == "all_gather":
            return lambda: dist.all_gather_into_tensor(full, part)
        if op == "reduce_scatter":
            return lambda: dist.reduce_scatter_tensor(part, full)
        if op == "all_to_all":
            recv = torch.empty_like(full)
            return lambda: dist.all_to_all_single(recv, full)
        raise ValueError(f"unknown op {op!r}")

    def _sync(self) -> None:
        if self.backend == "nccl":
            self.dist.all_reduce(self.torch.zeros(1, device=self.device))
            self.torch.cuda.synchronize()
        else:
            self.dist.barrier()

    def time_op(self, op: str, nbytes: int, dtype: Any, iters: int, warmup: int,
                graph: bool) -> tuple[list[float], int]:
        """Per-sample µs of one op (slowest rank), and the ops each sample ran."""
        run = self._op(op, nbytes, dtype)
        if graph:
            local, per_sample = self._time_graph(run, nbytes, iters, warmup)
        elif self.backend == "nccl":
            local, per_sample = self._time_cuda_eager(run, iters, warmup), 1
        else:
            local, per_sample = self._time_cpu(run, iters, warmup), 1
        t = self.torch.tensor(local, dtype=self.torch.float64, device=self.device)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return [float(x) for x in t.tolist()], per_sample

    def _time_cpu(self, run: Callable[[], None], iters: int, warmup: int) -> list[float]:
        for _ in range(warmup):
            run()
        times = []
        for _ in range(iters):
            self.dist.barrier()
            t0 = time.perf_counter()
            run()
            times.append((time.perf_counter() - t0) * 1e6)
        return times

    def _time_cuda_eager(self, run: Callable[[], None], iters: int, warmup: int) -> list[float]:
        cuda = self.torch.cuda
        for _ in range(warmup):
            run()
        starts = [cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [cuda.Event(enable_timing=True) for _ in range(iters)]
        self._sync()
        for s, e in zip(starts, ends, strict=True):
            s.record()
            run()
            e.record()
        cuda.synchronize()
        return [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends, strict=True)]

    def _time_graph(self, run: Callable[[], None], nbytes: int, iters: int, warmup: int) -> tuple[list[float], int]:
        torch = self.torch
        if self.backend != "nccl":
            raise ValueError("CUDA graphs need the nccl backend")
        per_sample = _GRAPH_OPS_SMALL if nbytes < _GRAPH_BIG_BYTES else _GRAPH_OPS_BIG
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # NCCL must have run on the capture stream before capture
            for _ in range(max(warmup, 1)):
                run()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(per_sample):
                run()
        for _ in range(max(warmup // per_sample, 1)):
            g.replay()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        self._sync()
        for s, e in zip(starts, ends, strict=True):
            s.record()
            g.replay()
            e.record()
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) * 1e3 / per_sample for s, e in zip(starts, ends, strict=True)]
        del g
        return times, per_sample


def _meta(backend: str, local_rank: int, world: int) -> dict[str, Any]:
    import torch

    nccl = None
    device = "cpu (gloo)"
    interconnect = "unknown"
    if backend == "nccl":
        nccl = ".".join(str(v) for v in torch.cuda.nccl.version())  # type: ignore[no-untyped-call]
        device = torch.cuda.get_device_name(local_rank)
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        interconnect = _interconnect(local_world) if local_world > 1 else "unknown"
    return {"device": device, "interconnect": interconnect, "torch": torch.__version__, "nccl": nccl,
            "host": socket.gethostname(), "world_size": world, "python": sys.version.split()[0]}


def _interconnect(local_gpus: int) -> str:
    """``nvlink`` if any pair of the first ``local_gpus`` GPUs is NV-linked, ``pcie`` if none, else ``unknown``.

    Reads ``nvidia-smi topo -m`` (cheap, no NVML binding needed); CUDA_VISIBLE_DEVICES remapping is ignored.
    """
    try:
        text = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=15,
                              check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    links: list[str] = []
    for line in text.splitlines():
        cells = line.split()
        if not cells or not cells[0].startswith("GPU") or not cells[0][3:].isdigit():
            continue
        i = int(cells[0][3:])
        if i >= local_gpus:
            continue
        links += [c for j, c in enumerate(cells[1:1 + local_gpus]) if j != i]
    if any(c.startswith("NV") for c in links):
        return "nvlink"
    if links and all(c in {"PIX", "PXB", "PHB", "NODE", "SYS"} for c in links):
        return "pcie"
    return "unknown"


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
