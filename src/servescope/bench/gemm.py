"""Time a decode step's GEMMs with torch, beside the measured copy and matmul ceilings and a datasheet.

Each distinct ``(M, N, K)`` runs as ``torch.mm(A, W.T, out=C)`` (the cuBLAS call behind ``F.linear``) on
random operands. A timed sample is a run of back-to-back calls, each on its own copy of W, so the weights
stream from memory as a real step's layers do instead of sitting in L2; on a GPU the run is captured once in
a CUDA graph and replayed between two CUDA events (vLLM decodes in graphs, so launch cost stays out), on a
CPU it is timed with ``perf_counter``. A shape's time is the median per-call time over ``iters`` samples.

This module imports only the standard library at load time and torch inside functions: the base install has
no torch, and ``tools/bench_gemm_device.py`` imports it on a GPU machine without our other dependencies.
To check a figure by hand: time the same ``torch.mm`` with ``torch.utils.benchmark.Timer``; the GPU a
datasheet is matched to is ``nvidia-smi --query-gpu=name,memory.total --format=csv``.

Example:
    >>> from servescope.plan.model import gemm_shapes, load_model_arch
    >>> shapes = gemm_shapes(load_model_arch("llama-3-70b"), tp=8, batch=16)
    >>> doc = run_gemm_bench(shapes, device="cuda", iters=50, warmup=10)   # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import platform
import statistics
import sys
import time
import tomllib
from collections.abc import Callable, Sequence
from importlib.resources import files
from pathlib import Path
from typing import Any

from servescope import __version__
from servescope.core.errors import InputError, require_extra
from servescope.core.files import HARDWARE_DIR, hardware_profile_names
from servescope.core.gemm import (
    GEMM_SCHEMA_VERSION,
    CopyCeiling,
    Datasheet,
    GemmBenchDoc,
    GemmBenchOptions,
    GemmShape,
    GemmTiming,
    MatmulCeiling,
)

__all__ = ["DTYPES", "list_hardware_profiles", "load_datasheet", "run_gemm_bench", "run_model_gemm_bench"]

DTYPES = ("bfloat16", "float16", "float32")
_ELEM_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# Defaults per device type: cold span of weight copies, copy-ceiling buffer, matmul-ceiling size.
_DEFAULTS = {"cuda": (512 << 20, 1 << 30, 8192), "cpu": (64 << 20, 64 << 20, 1024)}
_MIN_CALLS = 4        # calls per sample at least, so two events bracket more than one kernel
_MAX_COPIES = 512     # weight copies per shape at most (tiny weights: 512 distinct copies is cold enough)
# A ceiling's samples stop after this many seconds on a CPU (a 1024^3 bf16 matmul takes ~0.7 s there); at least 3.
_CPU_CEILING_BUDGET_S = 5.0

Progress = Callable[[int, int], None]


def run_gemm_bench(shapes: Sequence[GemmShape], *, device: str = "auto", dtype: str = "bfloat16",
                   iters: int = 50, warmup: int = 10, hardware: str | None = "auto", cold_bytes: int | None = None,
                   copy_bytes: int | None = None, matmul_size: int | None = None, seed: int = 0,
                   progress: Progress | None = None) -> GemmBenchDoc:
    """Timings of each distinct GEMM shape, the measured ceilings and the datasheet fractions.

    Args:
        shapes: GEMMs to time (``servescope.plan.model.gemm_shapes``); equal ``(M, N, K)`` are timed once.
        device: ``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``.
        dtype: one of :data:`DTYPES`, for A, W and C (the model's own storage type is on each shape).
        iters: timed samples per shape and per ceiling; warmup: untimed ones first.
        hardware: a ``data/hardware`` profile name, ``auto`` (the profile whose ``match`` is in the GPU's name,
            none on a CPU) or ``None``.
        cold_bytes: the span of weight copies a sample cycles through (default 512 MiB on a GPU, 64 MiB on
            a CPU; 0: one copy, L2-warm).
        copy_bytes: the copy ceiling's buffer (default 1 GiB on a GPU, 64 MiB on a CPU).
        matmul_size: the matmul ceiling's M = N = K (default 8192 on a GPU, 1024 on a CPU).
        seed: torch's seed for the operands.
        progress: called with (0, distinct shapes) before the ceilings, then (shapes done, distinct shapes)
            after each one.

    Raises:
        ValueError: a bad ``device``, ``dtype``, ``iters``, ``warmup`` or size (the message lists the allowed).
        InputError: torch is missing, CUDA asked for but absent, or a bad hardware profile.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: allowed {', '.join(DTYPES)}")
    if iters < 1 or warmup < 0:
        raise ValueError(f"iters must be >= 1 and warmup >= 0, got {iters} and {warmup}")
    for label, value in (("cold_bytes", cold_bytes), ("copy_bytes", copy_bytes), ("matmul_size", matmul_size)):
        if value is not None and value < (0 if label == "cold_bytes" else 1):
            raise ValueError(f"{label} must be positive, got {value}")
    torch = _import_torch()
    dev = _resolve_device(torch, device)
    kind = "cuda" if dev.type == "cuda" else "cpu"
    cold = _DEFAULTS[kind][0] if cold_bytes is None else cold_bytes
    copy_n = _DEFAULTS[kind][1] if copy_bytes is None else copy_bytes
    mm_size = _DEFAULTS[kind][2] if matmul_size is None else matmul_size
    device_name = torch.cuda.get_device_name(dev) if kind == "cuda" else _cpu_name()
    profile = _resolve_hardware(hardware, device_name if kind == "cuda" else None)
    datasheet = load_datasheet(profile, dtype=dtype) if profile else None
    date = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    tdtype = getattr(torch, dtype)
    torch.manual_seed(seed)

    distinct: dict[tuple[int, int, int], list[str]] = {}
    for s in shapes:
        names = distinct.setdefault((s.m, s.n, s.k), [])
        if f"{s.model}:{s.name}" not in names:
            names.append(f"{s.model}:{s.name}")
    sampler = _Sampler(torch, dev, iters=iters, warmup=warmup)
    ceilings = _Sampler(torch, dev, iters=iters, warmup=warmup,
                        budget_s=_CPU_CEILING_BUDGET_S if kind == "cpu" else None)

    if progress is not None:
        progress(0, len(distinct))
    copy_ceiling = _copy_ceiling(torch, dev, ceilings, copy_n)
    matmul_ceiling = _matmul_ceiling(torch, dev, tdtype, ceilings, mm_size, dtype)
    elem = _ELEM_BYTES[dtype]
    copies = {key: _copies(key[1] * key[2] * elem, cold) for key in distinct}
    pool = torch.empty(max((c * key[1] * key[2] for key, c in copies.items()), default=1), dtype=tdtype, device=dev)
    pool.uniform_(-1.0, 1.0)
    timings: list[GemmTiming] = []
    for done, ((m, n, k), names) in enumerate(distinct.items(), start=1):
        calls = max(copies[(m, n, k)], _MIN_CALLS)
        times = _time_gemm(torch, dev, tdtype, sampler, pool, m, n, k, copies[(m, n, k)], calls)
        median = statistics.median(times)
        moved = (m * k + n * k + m * n) * elem
        tflops, gbps = 2 * m * n * k / median / 1e12, moved / median / 1e9
        timings.append(GemmTiming(
            m=m, n=n, k=k, names=tuple(names), calls_per_sample=calls, times_s=tuple(times), median_s=median,
            bytes_moved=moved, tflops=tflops, gbps=gbps,
            frac_ceiling_tflops=tflops / matmul_ceiling.tflops, frac_ceiling_gbps=gbps / copy_ceiling.gbps,
            frac_datasheet_tflops=(tflops / datasheet.dense_tflops
                                   if datasheet and datasheet.dense_tflops else None),
            frac_datasheet_gbps=gbps / datasheet.hbm_gbps if datasheet else None))
        if progress is not None:
            progress(done, len(distinct))
    del pool
    timings, notes = _withhold_beaten_ceilings(timings, copy_ceiling, matmul_ceiling, kind)

    return GemmBenchDoc(
        schema=GEMM_SCHEMA_VERSION, kind="gemm_bench", tool_version=__version__, date=date,
        device_name=device_name, torch_version=str(torch.__version__), cuda_version=torch.version.cuda,
        python=sys.version.split()[0], platform=platform.platform(),
        options=GemmBenchOptions(device=str(dev), dtype=dtype, iters=iters, warmup=warmup, cold_bytes=cold,
                                 copy_bytes=copy_n, matmul_size=mm_size, hardware=profile, seed=seed),
        shapes=tuple(shapes), timings=tuple(timings), copy_ceiling=copy_ceiling, matmul_ceiling=matmul_ceiling,
        datasheet=datasheet, notes=notes)


def run_model_gemm_bench(model: str, *, tp: int = 1, batches: Sequence[int] = (1, 16, 64), device: str = "auto",
                         iters: int = 50, progress: Progress | None = None) -> GemmBenchDoc:
    """:func:`run_gemm_bench` of the per-rank decode GEMMs of ``model`` (a preset, a ``config.json`` or a hub id)
    at tensor parallelism ``tp``, for each decode batch of ``batches``: what ``bench gemm`` runs.

    Raises:
        InputError: an unknown model, or a device or extra that is missing.
    """
    from servescope.plan.model import gemm_shapes, load_model_arch

    arch = load_model_arch(model)
    shapes = [s for b in batches for s in gemm_shapes(arch, tp=tp, batch=b)]
    return run_gemm_bench(shapes, device=device, iters=iters, progress=progress)


def _withhold_beaten_ceilings(timings: list[GemmTiming], copy: CopyCeiling, matmul: MatmulCeiling,
                              kind: str) -> tuple[list[GemmTiming], tuple[str, ...]]:
    """A ceiling some GEMM beat is none (on a CPU the caches and the kernel picked per shape do that): its
    fractions become ``None`` and a note says why, instead of ratios over 100%."""
    notes = []
    best_tflops = max((t.tflops for t in timings), default=0.0)
    best_gbps = max((t.gbps for t in timings), default=0.0)
    if best_tflops > matmul.tflops:
        timings = [dataclasses.replace(t, frac_ceiling_tflops=None) for t in timings]
        notes.append(f"a GEMM ran at {best_tflops:.3g} TFLOP/s, above the {matmul.size}^3 matmul's "
                     f"{matmul.tflops:.3g}: that matmul is no compute ceiling on this {kind}, so no fraction of it "
                     "is given")
    if best_gbps > copy.gbps:
        timings = [dataclasses.replace(t, frac_ceiling_gbps=None) for t in timings]
        notes.append(f"a GEMM moved {best_gbps:.3g} GB/s, above the {copy.bytes_copied >> 20} MiB copy's "
                     f"{copy.gbps:.3g} (its weights sat in cache): that copy is no memory ceiling on this {kind}, "
                     "so no fraction of it is given")
    return timings, tuple(notes)


list_hardware_profiles = hardware_profile_names


def load_datasheet(name: str, *, dtype: str = "bfloat16") -> Datasheet:
    """The vendor figures of hardware profile ``name`` (a bundled name or a ``.toml`` path), at ``dtype``.

    Raises:
        InputError: no such profile (the message lists them), or a field missing or not a number.
    """
    data, where = _read_profile(name)
    try:
        dense = data.get("dense_tflops", {})
        tflops = dense.get(dtype)
        return Datasheet(name=str(data["name"]), gpu=str(data["gpu"]), dtype=dtype,
                         dense_tflops=None if tflops is None else _number(tflops, "dense_tflops", where),
                         hbm_gbps=_number(data["hbm_gbps"], "hbm_gbps", where),
                         memory_gb=_number(data["memory_gb"], "memory_gb", where),
                         quality=str(data.get("quality", "datasheet")), source=str(data["source"]))
    except KeyError as exc:
        raise InputError(where, f"missing field {exc.args[0]!r}") from None
    except AttributeError:
        raise InputError(where, "dense_tflops: expected a table of dtype = TFLOP/s") from None


def _read_profile(name: str) -> tuple[dict[str, Any], str]:
    path = Path(name)
    if path.suffix == ".toml":
        where = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise InputError(where, exc.strerror or "cannot read") from None
    else:
        where = f"hardware profile {name}"
        resource = files("servescope").joinpath(*HARDWARE_DIR, f"{name}.toml")
        if not resource.is_file():
            raise InputError(name, f"no such hardware profile; profiles: {', '.join(list_hardware_profiles())}")
        text = resource.read_text(encoding="utf-8")
    try:
        return tomllib.loads(text), where
    except tomllib.TOMLDecodeError as exc:
        raise InputError(where, f"not TOML: {exc}") from None


def _number(value: object, key: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise InputError(where, f"{key}: expected a positive number, got {value!r}")
    return float(value)


def _resolve_hardware(hardware: str | None, gpu_name: str | None) -> str | None:
    if hardware != "auto":
        return hardware
    if gpu_name is None:
        return None
    for name in list_hardware_profiles():
        match = _read_profile(name)[0].get("match", [])
        if any(isinstance(m, str) and m.lower() in gpu_name.lower() for m in match):
            return name
    return None


def _import_torch() -> Any:
    require_extra("torch", "bench", "bench gemm")
    import torch

    return torch


def _resolve_device(torch: Any, device: str) -> Any:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device != "cpu" and not (device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit())):
        raise ValueError(f"device {device!r}: allowed auto, cpu, cuda, cuda:N")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise InputError("device", f"{device} asked for, but torch {torch.__version__} sees no CUDA device")
        dev = torch.device(device)
        return torch.device("cuda", dev.index if dev.index is not None else torch.cuda.current_device())
    return torch.device("cpu")


def _cpu_name() -> str:
    """The CPU's model name: ``/proc/cpuinfo``'s ``model name`` (``lscpu``'s), else ``platform.processor()``."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _copies(weight_bytes: int, cold_bytes: int) -> int:
    return max(1, min(_MAX_COPIES, math.ceil(cold_bytes / weight_bytes)))


class _Sampler:
    """Per-call seconds of ``iters`` samples of ``run`` (which makes ``calls`` calls), after ``warmup``."""

    def __init__(self, torch: Any, dev: Any, *, iters: int, warmup: int, budget_s: float | None = None) -> None:
        self.torch, self.dev, self.iters, self.warmup, self.budget_s = torch, dev, iters, warmup, budget_s

    def sample(self, run: Callable[[], None], calls: int) -> list[float]:
        torch = self.torch
        started = time.perf_counter()
        for i in range(self.warmup):
            if i and self.budget_s is not None and time.perf_counter() - started > self.budget_s / 4:
                break
            run()
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(self.iters)]
            for start, end in events:
                start.record()
                run()
                end.record()
            torch.cuda.synchronize(self.dev)
            return [start.elapsed_time(end) / 1e3 / calls for start, end in events]
        out: list[float] = []
        started = time.perf_counter()
        for _ in range(self.iters):
            if len(out) >= 3 and self.budget_s is not None and time.perf_counter() - started > self.budget_s:
                break
            t0 = time.perf_counter()
            run()
            out.append((time.perf_counter() - t0) / calls)
        return out


def _time_gemm(torch: Any, dev: Any, tdtype: Any, sampler: _Sampler, pool: Any, m: int, n: int, k: int,
               copies: int, calls: int) -> list[float]:
    a = torch.empty((m, k), dtype=tdtype, device=dev).uniform_(-1.0, 1.0)
    c = torch.empty((m, n), dtype=tdtype, device=dev)
    weights = [pool[i * n * k:(i + 1) * n * k].view(n, k) for i in range(copies)]
    order = [weights[i % copies] for i in range(calls)]

    def eager() -> None:
        for w in order:
            torch.mm(a, w.t(), out=c)

    if dev.type != "cuda":
        return sampler.sample(eager, calls)
    with torch.cuda.device(dev):
        eager()  # cuBLAS picks its kernel and workspace before capture
        torch.cuda.synchronize(dev)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            eager()
        try:
            return sampler.sample(graph.replay, calls)
        finally:
            del graph


def _copy_ceiling(torch: Any, dev: Any, sampler: _Sampler, nbytes: int) -> CopyCeiling:
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev).fill_(1)
    dst = torch.empty_like(src)

    def run() -> None:
        dst.copy_(src)

    times = sampler.sample(run, 1)
    median = statistics.median(times)
    return CopyCeiling(bytes_copied=nbytes, times_s=tuple(times), median_s=median, gbps=2 * nbytes / median / 1e9)


def _matmul_ceiling(torch: Any, dev: Any, tdtype: Any, sampler: _Sampler, size: int, dtype: str) -> MatmulCeiling:
    a = torch.empty((size, size), dtype=tdtype, device=dev).uniform_(-1.0, 1.0)
    w = torch.empty((size, size), dtype=tdtype, device=dev).uniform_(-1.0, 1.0)
    c = torch.empty((size, size), dtype=tdtype, device=dev)

    def run() -> None:  # the GEMMs' own call and layout (A·Wᵀ): a CPU's bf16 A·W takes a path ~10x slower
        torch.mm(a, w.t(), out=c)

    times = sampler.sample(run, 1)
    median = statistics.median(times)
    return MatmulCeiling(size=size, dtype=dtype, times_s=tuple(times), median_s=median,
                         tflops=2 * size**3 / median / 1e12)
