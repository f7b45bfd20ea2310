"""The collectives a calibration capture measured, as per-call points of origin ``calibrated`` (issue 24 item 3).

``plan --calibrate`` takes, from the capture's decode phase on the rank it fits (the one that spent least time in
collectives: its calls hold the transfer and the launch, and no more wait for the last rank than the step itself
holds), each ``comm.*`` category's calls per step and mean time a call, and the message sizes they moved:

- from the kernels of that rank's trace that ran inside its decode steps (``StepRow`` windows of the analysis):
  NCCL kernels carry ``In msg nelems`` / ``Out msg nelems`` and ``dtype`` in their args (PyTorch's profiler,
  ``record_param_comms``); the size is nccl-tests' (all-reduce: the buffer; all-gather: the gathered output), and
  the time at each size is the mean duration of the kernels of that size;
- where the kernels carry no size (vLLM's custom all-reduce, a CPU ``shm_allreduce``) or the trace is not at
  hand: the model's own message at the capture's batch (:func:`servescope.plan.cost.collectives_per_step` of
  TP = the capture's ranks), at the category's mean time a call.

Each op becomes a :class:`~servescope.plan.paths.Point` over the capture's group size, for the capture's hardware
profile, on the implementation the engine ran: the kernel names say it (``cross_device_reduce_1stage`` = custom
one-shot, ``ncclDevKernel_*`` = NCCL, ``multimem`` = torch symmetric memory); where they do not, or say another
than vLLM's rules pick for that size, the rules' choice (and a note). :class:`~servescope.plan.collectives.CommCosts`
prices every collective of the same op, group size and implementation from it before any published figure, for
every layout: a user's TP=8 trace gives the TP=8 layout's all-reduce (and the TP=8 EP=8 layout's) their own
measured time. Within its sizes the point is interpolated, past its largest carried on by the curve's (else the
α-β estimate's) shape, below its smallest held (a one-size point) or extended (``paths.point_time_us``).
"""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from servescope.core.analysis import AnalysisDoc, RankAnalysis
from servescope.plan.cost import collectives_per_step
from servescope.plan.hardware import HardwareProfile
from servescope.plan.layouts import Layout
from servescope.plan.model import ModelArch
from servescope.plan.paths import Point, allreduce_path

__all__ = ["CALIBRATED", "captured_points"]

CALIBRATED = "calibrated"
# comm.* category -> op (comm.other is no op plan prices)
OPS_OF = {"comm.all_reduce": "all_reduce", "comm.all_gather": "all_gather", "comm.reduce_scatter": "reduce_scatter",
          "comm.all_to_all": "all_to_all", "comm.send_recv": "send_recv"}
# kernel name -> op, in the order of data/taxonomy.toml's communication rules (all-reduce first)
_OP_NAME = (("all_reduce", re.compile(r"allreduce|all_reduce|cross_device_reduce", re.I)),
            ("all_gather", re.compile(r"allgather|all_gather", re.I)),
            ("reduce_scatter", re.compile(r"reducescatter|reduce_scatter", re.I)),
            ("all_to_all", re.compile(r"alltoall|all_to_all", re.I)),
            ("send_recv", re.compile(r"Kernel_(SendRecv|Send|Recv)")))
# kernel name -> the implementation (paths.IMPLS) it is
_IMPL_NAME = (("custom_1stage", re.compile(r"cross_device_reduce_1stage")),
              ("custom_2stage", re.compile(r"cross_device_reduce_2stage")),
              ("symm_mem_multimem", re.compile(r"multimem", re.I)),
              ("nccl_symm_mem", re.compile(r"^(void\s+)?ncclSymk")),
              ("nccl", re.compile(r"^(void\s+)?(nccl|rccl)(Dev)?Kernel_")),
              ("quick_reduce", re.compile(r"allreduce_prototype")))
_DTYPE_BYTES = {"bfloat16": 2, "half": 2, "float16": 2, "float": 4, "float32": 4, "double": 8, "int": 4, "long": 8,
                "byte": 1, "char": 1, "int8": 1, "uint8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}


def _op_of(name: str) -> str | None:
    return next((op for op, rx in _OP_NAME if rx.search(name)), None)


def _impl_of(name: str) -> str | None:
    return next((impl for impl, rx in _IMPL_NAME if rx.search(name)), None)


def _size(op: str, args: dict[str, Any]) -> int | None:
    """nccl-tests' size of one call from a kernel's args, ``None`` when they do not give it."""
    width = _DTYPE_BYTES.get(str(args.get("dtype", "")).lower())
    key = "Out msg nelems" if op == "all_gather" else "In msg nelems"
    nelems = args.get(key)
    if width is None or not isinstance(nelems, int) or nelems <= 0:
        return None
    return nelems * width


def _decode_kernels(path: str, windows: list[tuple[float, float]]) -> dict[str, list[tuple[str, int | None, float]]]:
    """Per op, ``(name, bytes or None, µs)`` of the collective kernels of the trace at ``path`` that ran inside
    ``windows``; empty when the trace is not at hand or is not JSON."""
    try:
        with (gzip.open(path, "rt", encoding="utf-8") if path.endswith(".gz")
              else Path(path).open(encoding="utf-8")) as fh:
            data = json.load(fh)
    except (OSError, EOFError, ValueError):
        return {}
    events = data.get("traceEvents") if isinstance(data, dict) else data
    out: dict[str, list[tuple[str, int | None, float]]] = {}
    starts = sorted(windows)
    for e in events if isinstance(events, list) else []:
        if not isinstance(e, dict) or e.get("cat") != "kernel" or not isinstance(e.get("name"), str):
            continue
        ts, dur = e.get("ts"), e.get("dur")
        if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
            continue
        if not any(a <= ts <= b for a, b in starts):
            continue
        op = _op_of(e["name"])
        if op is None:
            continue
        args = e.get("args")
        args = args if isinstance(args, dict) else {}
        out.setdefault(op, []).append((e["name"], _size(op, args), float(dur)))
    return out


def captured_points(doc: AnalysisDoc, rank: RankAnalysis, arch: ModelArch, hw: HardwareProfile,
                    env: dict[str, str], *, tp: int, batch: int, source: str) -> tuple[list[Point], list[str]]:
    """The capture's collectives as calibrated points, and a note per op saying what was taken (module doc)."""
    phase = rank.phases["decode"]
    if tp <= 1:
        return [], []
    windows = [(s.start_us, s.start_us + s.span_us) for s in rank.steps if s.phase == "decode"]
    trace = next((t.path for t in doc.traces if t.rank == rank.rank and t.role == "worker"), None)
    kernels = _decode_kernels(trace, windows) if trace and windows else {}
    modelled = {c.op: c for c in collectives_per_step(arch, Layout(kind="tp", tp=tp), batch)}
    points: list[Point] = []
    notes: list[str] = []
    where = f"{source} (rank {rank.rank}, {phase.steps} decode steps at batch {batch})"
    for category, stats in sorted(phase.categories.items()):
        op = OPS_OF.get(category)
        if op is None or stats.calls_per_step <= 0 or stats.mean_call_us <= 0:
            continue
        seen = kernels.get(op, [])
        sized: dict[int, list[float]] = {}
        for _, nbytes, us in seen:
            if nbytes is not None:
                sized.setdefault(nbytes, []).append(us)
        if sized and sum(len(v) for v in sized.values()) >= 0.5 * len(seen):
            sizes = sorted(sized)
            times = [sum(sized[b]) / len(sized[b]) for b in sizes]
            how = (f"{sum(len(v) for v in sized.values())} kernels in its decode steps, mean time at each message "
                   f"size of their args")
        elif op in modelled:
            sizes, times = [modelled[op].bytes_each], [stats.mean_call_us]
            how = (f"{stats.calls_per_step:.0f} a decode step at {stats.mean_call_us:.1f} µs a call; message size "
                   f"the model's at batch {batch} ({modelled[op].what}), the kernels carry none")
        else:
            notes.append(f"{category}: {stats.calls_per_step:.0f} calls a decode step measured, but TP={tp} runs no "
                         f"{op} in the model and the kernels carry no size: not used")
            continue
        named = Counter(i for i in (_impl_of(n) for n, _, _ in seen) if i)
        impl = named.most_common(1)[0][0] if named else None
        if op == "all_reduce":
            rule = allreduce_path(sizes[len(sizes) // 2], tp, hw, env).impl
            if impl is not None and impl != rule:
                notes.append(f"calibrated all_reduce: the capture ran {impl} where vLLM 0.26's rules pick {rule} "
                             f"for {sizes[len(sizes) // 2]:,} B on {tp} GPUs of {hw.name}: its times priced as {rule}")
            impl = rule
        else:
            impl = "nccl"
        points.append(Point(op=op, impl=impl, profiles=(hw.name,), group=tp, bytes=tuple(sizes), us=tuple(times),
                            origin=CALIBRATED, source=f"{where}: {how}"))
        shown = ", ".join(f"{t:.1f} µs at {b:,} B" for b, t in zip(sizes, times, strict=True))
        notes.append(f"calibrated {op} over {tp} GPUs ({impl}): {shown}, from the capture ({how}); every layout's "
                     f"{op} over {tp} GPUs on that path is priced from it")
    return points, notes
