"""bench comm: collective latency curves on this box, one fresh torchrun launch per NCCL env variant.

Each variant (``NCCL_PROTO=LL``, ``NCCL_PROTO=Simple,NCCL_ALGO=Tree`` …) runs ``servescope.bench.comm_worker``
under ``python -m torch.distributed.run`` with that env, because NCCL reads its env when the communicator is
made. The raw per-sample times come back through a file; here they become nccl-tests-style points (median
time, algbw, busbw) in a ``servescope.comm-curves/1`` document, written atomically after every variant so an
interrupted run keeps the variants it finished. To check a figure by hand: nccl-tests'
``all_reduce_perf -b 1K -e 64M -f 2 -g 1`` under ``mpirun -np N`` prints the same size/time/algbw/busbw columns.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servescope.bench.torchrun import read_raw, run_torchrun
from servescope.core.atomic import write_text_atomic
from servescope.core.comm import (
    OPS,
    CurveDoc,
    CurvePoint,
    OpCurve,
    bus_factor,
    curve_doc_to_json,
    size_text,
    time_us_at,
)
from servescope.core.comm_result import CommResultDoc, DecodeChoiceRow
from servescope.core.errors import InputError, require_extra

__all__ = [
    "DTYPES",
    "ELEM_BYTES",
    "CommBenchResult",
    "CommRequest",
    "CommRun",
    "Variant",
    "bench_comm",
    "best_at_decode",
    "environment_lines",
    "parse_sizes",
    "parse_variant",
    "run_comm_bench",
]

ELEM_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
DTYPES = tuple(ELEM_BYTES)
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
# NVLink multicast stays off unless a variant sets these (it can take a shared host's GPUs out of service).
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
RDZV_FLAGS = ("nnodes", "node_rank", "rdzv_endpoint", "rdzv_backend", "rdzv_id", "master_addr", "master_port")

Progress = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class Variant:
    """An env variant: its name as given (``default`` for none) and the variables it sets."""

    name: str
    env: dict[str, str]


@dataclass(frozen=True, kw_only=True)
class CommRequest:
    """What ``servescope bench comm`` is asked, as its options give it (checked by :func:`bench_comm`).

    Attributes:
        ops: collectives, some of :data:`~servescope.core.comm.OPS`.
        sizes: bytes as nccl-tests gives them, ``LOW:HIGH[:FACTOR]`` or a list (:func:`parse_sizes`).
        variants: env variants (:func:`parse_variant`); ``default`` is always run first.
        graph: also time each op replayed from a CUDA graph (nccl only).
        nproc: processes (GPUs) per node; ``None``: every GPU under nccl, 2 under gloo.
        backend: ``auto``, ``nccl`` or ``gloo``.
        dtype, iters, warmup: the element type; timed samples and untimed ops per size.
        model: a preset or config.json whose hidden size adds the decode all_reduce sizes of ``batches``
            and picks the best variant there; ``tp``, when given, must equal the world size.
        rendezvous: torchrun's multi-node flags, underscored (``nnodes``, ``master_addr`` … :data:`RDZV_FLAGS`).
        output: the curve file, rewritten after every variant.
        timeout_s: seconds per variant launch; ``keep_going``: go on after a failed variant.
    """

    ops: tuple[str, ...] = OPS
    sizes: str = "1K:64M"
    variants: tuple[str, ...] = ()
    graph: bool = False
    nproc: int | None = None
    backend: str = "auto"
    dtype: str = "bfloat16"
    iters: int = 50
    warmup: int = 10
    model: str | None = None
    tp: int | None = None
    batches: tuple[int, ...] = (1, 8, 32)
    rendezvous: Mapping[str, str] = field(default_factory=dict)
    output: Path | None = None
    timeout_s: float = 900.0
    keep_going: bool = False


@dataclass(frozen=True, kw_only=True)
class CommRun:
    """A ``bench comm`` run as :func:`bench_comm` resolved it: everything that changes a number (sizes aligned to
    the world size, variants parsed, the backend chosen)."""

    ops: tuple[str, ...] = OPS
    sizes: tuple[int, ...]
    variants: tuple[Variant, ...]
    nproc: int
    backend: str                     # nccl or gloo (auto resolved by the caller via resolve_backend)
    dtype: str = "bfloat16"
    iters: int = 50
    warmup: int = 10
    graph: bool = False
    rendezvous: dict[str, str] = field(default_factory=dict)   # torchrun flag (underscored) -> value
    output: Path | None = None
    timeout_s: float = 900.0
    keep_going: bool = False


@dataclass(frozen=True, kw_only=True)
class CommBenchResult:
    """The curve document and what failed (variants or single op curves), one line each."""

    doc: CurveDoc
    failures: tuple[str, ...]
    output: str | None


def parse_sizes(text: str) -> tuple[int, ...]:
    """Byte sizes from ``1K:64M`` (doubling; ``1K:64M:4`` steps ×4) or ``1K,8K,1M``.

    Raises:
        InputError: a size is not ``<number>[B|K|M|G]``, the range is empty or the step is < 2.
    """
    def one(token: str) -> int:
        m = re.fullmatch(r"\s*(\d+)\s*([KMGB]?)i?B?\s*", token.upper())
        if not m or int(m.group(1)) == 0:
            raise InputError("--sizes", f"not a size like 1K or 64M: {token!r}")
        return int(m.group(1)) * _UNITS[m.group(2)]

    if ":" in text:
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise InputError("--sizes", f"expected LOW:HIGH[:FACTOR], got {text!r}")
        low, high = one(parts[0]), one(parts[1])
        factor = int(parts[2]) if len(parts) == 3 and parts[2].strip().isdigit() else 2
        if len(parts) == 3 and not parts[2].strip().isdigit() or factor < 2 or high < low:
            raise InputError("--sizes", f"expected LOW ≤ HIGH and an integer FACTOR ≥ 2, got {text!r}")
        sizes, s = [], low
        while s <= high:
            sizes.append(s)
            s *= factor
        return tuple(sizes)
    return tuple(sorted({one(t) for t in text.split(",") if t.strip()}))


def parse_variant(text: str) -> Variant:
    """``default`` or comma-separated ``NAME=VALUE`` pairs of env variables.

    Raises:
        InputError: a pair lacks ``=``, a name is not an env variable name, or a name repeats.
    """
    text = text.strip()
    if text == "default":
        return Variant(name="default", env={})
    env: dict[str, str] = {}
    for pair in text.split(","):
        name, sep, value = pair.strip().partition("=")
        if not sep or not _ENV_NAME.match(name) or name in env or not value or any(c in value for c in " \n\"'"):
            raise InputError("--variant", f"{text!r}: expected NAME=VALUE[,NAME=VALUE…] with upper-case env names, "
                                          "unique, values without spaces or quotes, or 'default'")
        env[name] = value
    return Variant(name=",".join(f"{k}={v}" for k, v in env.items()), env=env)


def align_sizes(sizes: Sequence[int], *, world_size: int, dtype: str) -> tuple[int, ...]:
    """Each size rounded down (up for the smallest) to a whole number of elements per rank; duplicates dropped."""
    unit = world_size * ELEM_BYTES[dtype]
    return tuple(sorted({max(unit, s // unit * unit) for s in sizes}))


def resolve_backend(backend: str) -> str:
    """``nccl`` when CUDA and NCCL are there (for ``auto``), else ``gloo``; checks an explicit choice.

    Raises:
        InputError: torch is not installed (one line naming the ``bench`` extra), or a bad choice.
    """
    require_extra("torch", "bench", "bench comm")
    import torch
    import torch.distributed as dist

    gpu = torch.cuda.is_available() and dist.is_nccl_available()
    if backend == "auto":
        return "nccl" if gpu else "gloo"
    if backend == "nccl" and not gpu:
        raise InputError("--backend", "nccl needs CUDA GPUs and a torch built with NCCL; this machine has none")
    if backend not in ("nccl", "gloo"):
        raise InputError("--backend", f"{backend!r}: expected auto, nccl or gloo")
    return backend


def default_nproc(backend: str) -> int:
    """All visible GPUs under nccl, two ranks under gloo."""
    import torch

    return max(torch.cuda.device_count(), 1) if backend == "nccl" else 2


def run_comm_bench(req: CommRun, progress: Progress | None = None) -> CommBenchResult:
    """Curves of every op × variant (× eager/graph), one torchrun launch per variant.

    Raises:
        InputError: a worker failed (its first error line), or ``--graph`` without nccl; with ``keep_going``
            failed variants are listed in the result instead.
    """
    if req.graph and req.backend != "nccl":
        raise InputError("--graph", "CUDA graphs need GPUs and the nccl backend; this run uses gloo")
    if req.nproc < 1:
        raise InputError("--gpus", "at least one process per node")
    curves: list[OpCurve] = []
    failures: list[str] = []
    meta: dict[str, Any] = {}
    date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    doc = _doc(req, meta, curves, date)
    if progress:
        progress(measuring_line(req))
    with tempfile.TemporaryDirectory(prefix="servescope-comm-") as tmp:
        for i, variant in enumerate(req.variants):
            label = f"variant {i + 1}/{len(req.variants)} {variant.name}"
            if progress:
                progress(f"{label}: starting {req.nproc} processes (torchrun)")
            raw_path = Path(tmp) / f"raw{i}.json"
            started = time.monotonic()
            try:
                _launch(req, variant, Path(tmp) / f"spec{i}.json", raw_path,
                        on_curve=None if progress is None else _curve_progress(progress, label, req, started))
                if progress:
                    progress(f"{label}: done in {time.monotonic() - started:.0f} s")
            except InputError as exc:
                raw = read_raw(raw_path)     # keep the curves this variant finished before it failed
                if raw:
                    meta = meta or raw["meta"]
                    curves += _curves(raw, variant, meta["world_size"], failures)
                    doc = _doc(req, meta, curves, date)
                    _save(req, doc)
                if not req.keep_going:
                    raise
                failures.append(str(exc))
                continue
            raw = read_raw(raw_path)
            if raw is None and req.rendezvous:
                continue                      # several nodes: global rank 0 ran on another node and wrote there
            if raw is None:
                raise InputError(f"variant {variant.name}", "the workers exited without writing results")
            meta = meta or raw["meta"]
            curves += _curves(raw, variant, meta["world_size"], failures)
            doc = _doc(req, meta, curves, date)
            _save(req, doc)
    return CommBenchResult(doc=doc, failures=tuple(failures), output=str(req.output) if req.output else None)


def measuring_line(req: CommRun) -> str:
    """What a run measures, in one line (its first progress line)."""
    sizes = sorted(req.sizes)
    span = size_text(sizes[0]) if len(sizes) == 1 else f"{size_text(sizes[0])}..{size_text(sizes[-1])}"
    modes = " (eager and CUDA graph)" if req.graph else ""
    return (f"timing {', '.join(req.ops)}{modes} at {len(sizes)} sizes ({span} bytes), {req.dtype}, "
            f"{req.warmup} warm-up + {req.iters} timed per size, {req.backend} over {req.nproc} processes, "
            f"{len(req.variants)} variant{'s' if len(req.variants) != 1 else ''}")


def _curve_progress(progress: Progress, label: str, req: CommRun, started: float) -> Callable[[str], None]:
    total = len(req.ops) * (2 if req.graph else 1)
    seen: list[str] = []

    def report(curve: str) -> None:
        seen.append(curve)
        progress(f"{label}: {curve} timed ({len(seen)}/{total}, {time.monotonic() - started:.0f} s)")

    return report


def _save(req: CommRun, doc: CurveDoc) -> None:
    if req.output is not None:
        write_text_atomic(req.output, curve_doc_to_json(doc))


def _doc(req: CommRun, meta: dict[str, Any], curves: list[OpCurve], date: str) -> CurveDoc:
    world = int(meta.get("world_size", req.nproc))
    base = " ".join(f"{k}={v}" for k, v in SAFE_ENV.items()) if req.backend == "nccl" else "none"
    inherited = " ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")) or "none"
    provenance = (f"measured by servescope bench comm: {req.backend}, {world} ranks, {req.iters} timed samples "
                  f"after {req.warmup} warm-up per size; time = median over samples of the slowest rank; base env "
                  f"{base}; NCCL_* inherited from the caller: {inherited}")
    return CurveDoc(source="measured", provenance=provenance, device=str(meta.get("device", "unknown")),
                    interconnect=str(meta.get("interconnect", "unknown")), backend=req.backend,
                    versions={"torch": str(meta.get("torch", "unknown")), "nccl": meta.get("nccl")}, date=date,
                    host=meta.get("host"), world_size=world, dtype=req.dtype, curves=tuple(curves))


def _curves(raw: dict[str, Any], variant: Variant, world: int, failures: list[str]) -> list[OpCurve]:
    out = []
    for c in raw["curves"]:
        label = f"{c['op']} {variant.name}{' [graph]' if c['graph'] else ''}"
        if c["error"]:
            failures.append(f"{label}: {c['error']}")
        points = []
        for p in c["points"]:
            t = statistics.median(p["times_us"])
            algbw = p["bytes"] / (t * 1e-6) / 1e9 if t > 0 else 0.0
            points.append(CurvePoint(bytes=p["bytes"], time_us=round(t, 3), algbw_gbps=round(algbw, 4),
                                     busbw_gbps=round(algbw * bus_factor(c["op"], world), 4),
                                     iters=len(p["times_us"]) * p["ops_per_sample"]))
        if points:
            out.append(OpCurve(op=c["op"], variant=variant.name, env=dict(variant.env), graph=c["graph"],
                               points=tuple(sorted(points, key=lambda p: p.bytes))))
    return out


def _launch(req: CommRun, variant: Variant, spec_path: Path, raw_path: Path, *,
            on_curve: Callable[[str], None] | None = None) -> None:
    """One torchrun for one variant (:func:`~servescope.bench.torchrun.run_torchrun`).

    Raises:
        InputError: a worker failed (the first rank's error line), or the variant ran past ``req.timeout_s``.
    """
    spec = {"backend": req.backend, "dtype": req.dtype, "ops": list(req.ops), "iters": req.iters,
            "warmup": req.warmup, "graph": req.graph, "sizes": list(req.sizes)}
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    if req.backend == "nccl":
        for k, v in SAFE_ENV.items():
            env.setdefault(k, v)
    env.update(variant.env)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(req.nproc)]
    if req.rendezvous:
        for key, value in req.rendezvous.items():
            cmd += [f"--{key.replace('_', '-')}", value]
    else:
        cmd.append("--standalone")
    cmd += ["-m", "servescope.bench.comm_worker", "--spec", str(spec_path), "--out", str(raw_path)]
    run_torchrun(cmd, env, raw_path, timeout_s=req.timeout_s, source=f"variant {variant.name}", on_curve=on_curve)


def best_at_decode(doc: CurveDoc, *, hidden: int, batches: Sequence[int]) -> list[DecodeChoiceRow]:
    """Per batch, the all_reduce curve (variant, eager/graph) fastest at ``hidden × batch × elem`` bytes.

    Times at sizes between measured points follow :func:`servescope.core.comm.time_us_at`.
    """
    elem = ELEM_BYTES.get(doc.dtype, 2)
    curves = [c for c in doc.curves if c.op == "all_reduce" and c.points]
    out = []
    for b in batches:
        nbytes = hidden * b * elem
        if not curves:
            break
        best = min(curves, key=lambda c: time_us_at(c, nbytes))
        default = doc.curve("all_reduce", variant="default", graph=best.graph)
        out.append(DecodeChoiceRow(batch=b, bytes=nbytes, variant=best.variant, graph=best.graph,
                                   time_us=time_us_at(best, nbytes),
                                   default_time_us=time_us_at(default, nbytes) if default else None))
    return out


def environment_lines(doc: CurveDoc, choices: Sequence[DecodeChoiceRow]) -> list[str]:
    """systemd ``Environment=`` lines for the variant that wins most decode batches (ties: the smaller total)."""
    if not choices:
        return []
    wins: dict[str, int] = {}
    for c in choices:
        wins[c.variant] = wins.get(c.variant, 0) + 1

    def total_us(variant: str) -> float:
        """The variant's all_reduce time summed over the decode sizes (its faster of eager / graph)."""
        curves = [c for c in doc.curves if c.op == "all_reduce" and c.variant == variant and c.points]
        return sum(min(time_us_at(c, ch.bytes) for c in curves) for ch in choices)

    top = min(wins, key=lambda v: (-wins[v], total_us(v), v))
    env = next((c.env for c in doc.curves if c.variant == top), {})
    lines = [f"# servescope bench comm: best all_reduce variant at decode sizes: {top} ({doc.device}, "
             f"{doc.world_size} ranks, {doc.date})"]
    lines += [f"Environment={k}={v}" for k, v in env.items()]
    if doc.backend == "nccl" and "NCCL_NVLS_ENABLE" not in env:
        lines.append("Environment=NCCL_NVLS_ENABLE=0")
    return lines


def bench_comm(request: CommRequest, *, progress: Progress | None = None) -> CommResultDoc:
    """What ``servescope bench comm`` measures: the curves, the best all_reduce at decode sizes and its unit lines.

    ``progress`` gets one line as each op and variant finishes.

    Raises:
        InputError: a bad option (one line naming its flag), a missing ``bench`` extra, or a failed worker
            (with ``keep_going``, failed variants are listed in ``failures`` instead).

    Example:
        >>> doc = bench_comm(CommRequest(ops=("all_reduce",), sizes="1K:64K", backend="gloo",
        ...                              model="llama-3-70b", batches=(1, 8)))          # doctest: +SKIP
        >>> doc.best_at_decode[0].variant                                               # doctest: +SKIP
    """
    r = request
    op_list = tuple(o.strip() for o in r.ops if o.strip())
    bad = [o for o in op_list if o not in OPS]
    if bad or not op_list:
        raise InputError("--ops", f"unknown {', '.join(bad) or '(none)'}; expected some of {', '.join(OPS)}")
    if r.dtype not in DTYPES:
        raise InputError("--dtype", f"{r.dtype!r}: expected bfloat16, float16 or float32")
    chosen_variants = [parse_variant("default")] + [parse_variant(v) for v in r.variants if v.strip() != "default"]
    hidden = None
    if r.model is not None:
        from servescope.plan.model import load_model_arch

        hidden = load_model_arch(r.model).hidden
    chosen = resolve_backend(r.backend)
    per_node = r.nproc if r.nproc is not None else default_nproc(chosen)
    rdzv = {k: v for k, v in r.rendezvous.items() if v is not None}
    unknown = set(rdzv) - set(RDZV_FLAGS)
    if unknown:
        raise ValueError(f"unknown rendezvous keys {sorted(unknown)}; expected some of {', '.join(RDZV_FLAGS)}")
    nodes = rdzv.get("nnodes", "").split(":")[-1]
    world = per_node * int(nodes) if nodes.isdigit() else per_node
    if r.tp is not None and r.tp != world:
        raise InputError("--tp", f"{r.tp}, but the bench runs {world} ranks; time the TP group's size (--gpus {r.tp})")
    size_list = list(parse_sizes(r.sizes))
    if hidden is not None:
        size_list += [hidden * b * ELEM_BYTES[r.dtype] for b in r.batches]
    run = CommRun(ops=op_list, sizes=align_sizes(size_list, world_size=world, dtype=r.dtype),
                  variants=tuple(chosen_variants), nproc=per_node, backend=chosen, dtype=r.dtype, iters=r.iters,
                  warmup=r.warmup, graph=r.graph, rendezvous=rdzv, output=r.output, timeout_s=r.timeout_s,
                  keep_going=r.keep_going)
    result = run_comm_bench(run, progress)
    choices = best_at_decode(result.doc, hidden=hidden, batches=r.batches) if hidden else []
    return CommResultDoc(curves=result.doc, best_at_decode=choices,
                         environment=environment_lines(result.doc, choices) if choices else [],
                         failures=list(result.failures), output=result.output)
