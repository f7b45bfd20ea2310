"""Collective cost curves: the document ``bench comm`` writes and ``plan`` reads (``servescope.comm-curves/1``).

Per curve (one op, one NCCL env variant, eager or inside a CUDA graph) a list of points sorted by
``bytes``, each with the median per-op time and nccl-tests' algorithm and bus bandwidth. ``bytes`` is
nccl-tests' *size* column: all_reduce the buffer, all_gather the gathered output, reduce_scatter the full
input, all_to_all the per-rank send buffer. GB/s are 1e9 bytes/s.

Stdlib only (dataclasses + json): the worker that runs on a GPU machine with torch and nothing else imports
this module too.

Example:
    >>> doc = load_curves("src/servescope/data/comm/h200_x8.json")           # doctest: +SKIP
    >>> curve = doc.curve("all_reduce", variant="default", graph=True)      # doctest: +SKIP
    >>> time_us_at(curve, 7168 * 2 * 32)                                      # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servescope.core.errors import InputError
from servescope.core.files import read_json

__all__ = [
    "CURVES_SCHEMA",
    "INTERCONNECTS",
    "OPS",
    "CurveDoc",
    "CurvePoint",
    "OpCurve",
    "bus_factor",
    "curve_doc_from_dict",
    "curve_doc_to_json",
    "load_curves",
    "size_text",
    "time_us_at",
]

CURVES_SCHEMA = "servescope.comm-curves/1"
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
INTERCONNECTS = ("nvlink", "pcie", "shm", "unknown")
SOURCES = ("measured", "published")


def size_text(nbytes: int) -> str:
    """Bytes as nccl-tests writes message sizes: 1K, 64M (powers of 1024), else the number."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' busbw / algbw factor: all_reduce 2(n-1)/n, the other three ops (n-1)/n."""
    if op not in OPS:
        raise ValueError(f"op {op!r}: expected one of {', '.join(OPS)}")
    n = world_size
    return 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


@dataclass(frozen=True, kw_only=True)
class CurvePoint:
    """One message size: ``time_us`` is the median over iterations of the slowest rank's per-op time."""

    bytes: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    iters: int


@dataclass(frozen=True, kw_only=True)
class OpCurve:
    """Latency vs bytes of one op under one env variant, eager or replayed from a CUDA graph."""

    op: str
    variant: str
    env: dict[str, str]
    graph: bool
    points: tuple[CurvePoint, ...]

    @property
    def label(self) -> str:
        """``variant`` plus ``[graph]`` when timed inside a CUDA graph."""
        return f"{self.variant}{' [graph]' if self.graph else ''}"


@dataclass(frozen=True, kw_only=True)
class CurveDoc:
    """A curve file: where and how the curves were measured (or published), and the curves."""

    schema: str = CURVES_SCHEMA
    source: str
    provenance: str
    device: str
    interconnect: str
    backend: str
    versions: dict[str, str | None]
    date: str
    host: str | None
    world_size: int
    dtype: str
    curves: tuple[OpCurve, ...] = field(default_factory=tuple)

    def curve(self, op: str, *, variant: str = "default", graph: bool = False) -> OpCurve | None:
        """The curve of ``op`` under ``variant`` (eager or graph), ``None`` if the file has none."""
        for c in self.curves:
            if c.op == op and c.variant == variant and c.graph == graph:
                return c
        return None


def time_us_at(curve: OpCurve, nbytes: float) -> float:
    """Time of one op at ``nbytes`` by the contract's rule, µs.

    Piecewise-linear in log(bytes)–log(time) between measured points; below the smallest point the latency is
    constant; above the largest, time grows with bytes at the last segment's bandwidth (time ∝ bytes).
    """
    pts = curve.points
    if not pts:
        raise ValueError(f"{curve.op} {curve.label}: no points")
    if nbytes <= pts[0].bytes:
        return pts[0].time_us
    if nbytes >= pts[-1].bytes:
        return pts[-1].time_us * nbytes / pts[-1].bytes
    for lo, hi in zip(pts, pts[1:], strict=False):
        if lo.bytes <= nbytes <= hi.bytes:
            if hi.bytes == lo.bytes:
                return lo.time_us
            f = (math.log(nbytes) - math.log(lo.bytes)) / (math.log(hi.bytes) - math.log(lo.bytes))
            return math.exp(math.log(lo.time_us) + f * (math.log(hi.time_us) - math.log(lo.time_us)))
    raise AssertionError("unreachable: points are sorted")


def curve_doc_to_json(doc: CurveDoc) -> str:
    """The document as indented JSON text."""
    return json.dumps(dataclasses.asdict(doc), indent=1) + "\n"


def load_curves(path: str | Path) -> CurveDoc:
    """A curve file, validated against ``servescope.comm-curves/1``.

    Raises:
        InputError: unreadable, not JSON, another schema id, or a field missing or of the wrong type/value.
    """
    return curve_doc_from_dict(read_json(path), source=str(path))


def curve_doc_from_dict(data: Any, *, source: str) -> CurveDoc:
    """Validate a decoded curve file; ``source`` names it in errors."""
    if not isinstance(data, dict):
        raise InputError(source, "not a curve file: the top level is not an object")
    schema = data.get("schema")
    if schema != CURVES_SCHEMA:
        raise InputError(source, f"schema {schema!r}, expected {CURVES_SCHEMA!r}")
    get = _Fields(data, source, "")
    world = get.int_("world_size", minimum=1)
    doc = CurveDoc(
        source=get.choice("source", SOURCES),
        provenance=get.str_("provenance"),
        device=get.str_("device"),
        interconnect=get.choice("interconnect", INTERCONNECTS),
        backend=get.choice("backend", ("nccl", "gloo")),
        versions=get.versions("versions"),
        date=get.str_("date"),
        host=get.str_("host", optional=True),
        world_size=world,
        dtype=get.str_("dtype"),
        curves=tuple(_curve(c, source, f"curves[{i}]") for i, c in enumerate(get.list_("curves"))),
    )
    return doc


def _curve(raw: Any, source: str, where: str) -> OpCurve:
    if not isinstance(raw, dict):
        raise InputError(source, f"{where}: not an object")
    get = _Fields(raw, source, where + ".")
    env = raw.get("env")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise InputError(source, f"{where}.env: expected an object of strings")
    points = []
    for j, p in enumerate(get.list_("points")):
        pw = f"{where}.points[{j}]"
        if not isinstance(p, dict):
            raise InputError(source, f"{pw}: not an object")
        pg = _Fields(p, source, pw + ".")
        points.append(CurvePoint(bytes=pg.int_("bytes", minimum=1), time_us=pg.float_("time_us"),
                                 algbw_gbps=pg.float_("algbw_gbps"), busbw_gbps=pg.float_("busbw_gbps"),
                                 iters=pg.int_("iters", minimum=1)))
    sizes = [p.bytes for p in points]
    if sizes != sorted(sizes):
        raise InputError(source, f"{where}.points: not sorted by bytes")
    graph = raw.get("graph")
    if not isinstance(graph, bool):
        raise InputError(source, f"{where}.graph: expected true or false")
    return OpCurve(op=get.choice("op", OPS), variant=get.str_("variant"), env=dict(env), graph=graph,
                   points=tuple(points))


class _Fields:
    """Typed reads of one JSON object's fields, each failure one line naming the field path."""

    def __init__(self, obj: Mapping[str, Any], source: str, prefix: str) -> None:
        self.obj, self.source, self.prefix = obj, source, prefix

    def _bad(self, key: str, expected: str) -> InputError:
        got = self.obj.get(key, "missing")
        return InputError(self.source, f"{self.prefix}{key}: expected {expected}, got {got!r}"[:300])

    def str_(self, key: str, *, optional: bool = False) -> Any:
        value = self.obj.get(key)
        if value is None and optional and key in self.obj:
            return None
        if not isinstance(value, str):
            raise self._bad(key, "a string" + (" or null" if optional else ""))
        return value

    def choice(self, key: str, allowed: tuple[str, ...]) -> str:
        value = self.obj.get(key)
        if value not in allowed:
            raise self._bad(key, "one of " + ", ".join(allowed))
        return str(value)

    def int_(self, key: str, *, minimum: int) -> int:
        value = self.obj.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self._bad(key, f"an integer ≥ {minimum}")
        return value

    def float_(self, key: str) -> float:
        value = self.obj.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise self._bad(key, "a finite number ≥ 0")
        return float(value)

    def list_(self, key: str) -> list[Any]:
        value = self.obj.get(key)
        if not isinstance(value, list):
            raise self._bad(key, "a list")
        return value

    def versions(self, key: str) -> dict[str, str | None]:
        value = self.obj.get(key)
        if (not isinstance(value, dict) or not isinstance(value.get("torch"), str)
                or not all(isinstance(v, str) or v is None for v in value.values())):
            raise self._bad(key, 'an object {"torch": str, "nccl": str | null}')
        return {str(k): v for k, v in value.items()}
