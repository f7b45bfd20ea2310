"""The path an engine's collective takes, and per-call points measured on it (issue 24 items 1 and 2).

:func:`allreduce_path` applies vLLM 0.26's dispatch (``data/comm/vllm-0.26.toml``, each rule with the source file
it was read from) to a message size, group size, hardware profile and environment, in cuda_communicator.py's
order: NCCL symmetric memory (``VLLM_USE_NCCL_SYMM_MEM=1`` only), quick reduce (ROCm), custom all-reduce
(world sizes 2/4/6/8, P2P, NVLink for more than 2 GPUs, below its size limit; one-shot or two-shot by
csrc/custom_all_reduce.cuh), torch symmetric memory (multicast, bf16, below its limit; multimem or two-shot), else
NCCL. :func:`nccl_env_effects` says what the unit's NCCL variables change on the NCCL path.

:func:`load_points` reads ``data/comm/points.toml``: per-call times at message sizes with their provenance
(``in-situ`` kernels in real traces, ``published`` microbenchmarks); :func:`point_time_us` interpolates them.
:func:`load_bandwidths` reads its bus bandwidths published for a box at a large message, which price an
all-reduce beyond a point's largest size (:class:`Bandwidth`).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from typing import Any

from servescope.plan.hardware import HardwareProfile

__all__ = ["IMPLS", "Bandwidth", "Figure", "NcclEnv", "PathChoice", "Point", "allreduce_path", "engine_rules",
           "load_bandwidths", "load_points", "nccl_env_effects", "point_time_us"]

IMPLS = ("nccl", "nccl_symm_mem", "quick_reduce", "custom_1stage", "custom_2stage", "symm_mem_multimem",
         "symm_mem_two_shot")
NCCL_KEYS = ("NCCL_PROTO", "NCCL_ALGO", "NCCL_P2P_LEVEL", "NCCL_P2P_DISABLE", "NCCL_NVLS_ENABLE")


@dataclass(frozen=True, kw_only=True)
class PathChoice:
    """The implementation one all-reduce runs as, why (rule and source), and a short label for the screen
    (``custom all-reduce one-shot: NVLink, below 512 KiB``; ``NCCL (custom: not on > 2 PCIe-only GPUs)``)."""

    impl: str
    why: str
    label: str = ""


@dataclass(frozen=True, kw_only=True)
class Figure:
    """What a figure of ``data/comm/points.toml`` was taken on: ``op`` run as ``impl`` over ``group`` GPUs of one
    of the hardware ``profiles`` (the fields a :class:`Point` and a :class:`Bandwidth` begin with)."""

    op: str
    impl: str
    profiles: tuple[str, ...]
    group: int

    def is_for(self, op: str, impl: str, group: int, profile: str) -> bool:
        """Whether this figure was taken on ``op`` as ``impl`` over ``group`` GPUs of ``profile``."""
        return self.op == op and self.impl == impl and self.group == group and profile in self.profiles


@dataclass(frozen=True, kw_only=True)
class Point(Figure):
    """Per-call times of one implementation over ``group`` GPUs at message sizes, with provenance."""

    bytes: tuple[int, ...]
    us: tuple[float, ...]
    origin: str
    source: str
    stands_for: str = ""
    band: str = ""  # the class of its band where not read from origin and stands_for (plan/bands.py)


@dataclass(frozen=True, kw_only=True)
class Bandwidth(Figure):
    """A bus bandwidth published for ``op`` on ``impl`` over ``group`` GPUs of ``profiles``, measured at ``bytes``."""

    bus_gbps: float
    bytes: int
    origin: str
    source: str


@dataclass(frozen=True, kw_only=True)
class NcclEnv:
    """What the unit's NCCL variables change on the NCCL path: curve variant keys to prefer, the LL protocol's
    bandwidth, and one line per variable saying so."""

    prefer: dict[str, str]
    ll_only: bool
    notes: list[str]


@cache
def engine_rules() -> dict[str, Any]:
    """``data/comm/vllm-0.26.toml`` parsed, once a process (every collective of every point asks: a 64-GPU plan
    parsed it 1214 times, 2.5 s of its 2.6); shared, so read, never changed."""
    text = files("servescope").joinpath("data", "comm", "vllm-0.26.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def _on(env: dict[str, str], key: str, default: bool) -> bool:
    value = env.get(key)
    return default if value is None else value.strip().lower() not in ("0", "false", "no", "off", "")


def allreduce_path(nbytes: int, group: int, hw: HardwareProfile, env: dict[str, str], *,
                   dtype: str = "bfloat16") -> PathChoice:
    """The implementation vLLM 0.26 runs an all-reduce of ``nbytes`` over ``group`` GPUs of ``hw`` with (module doc)."""
    rules = engine_rules()
    where = f"vLLM {rules['version']}"
    if group <= 1:
        return PathChoice(impl="none", why="one GPU: no all-reduce", label="none (one GPU)")
    cap = hw.compute_capability
    if _on(env, rules["nccl_symm_mem"]["env"], bool(rules["nccl_symm_mem"]["default"])):
        return PathChoice(impl="nccl_symm_mem", why=f"{rules['nccl_symm_mem']['env']}=1: NCCL symmetric memory "
                          f"({where} all_reduce_utils.py should_nccl_symm_mem_allreduce)",
                          label=f"NCCL symmetric memory ({rules['nccl_symm_mem']['env']}=1)")
    if hw.platform == rules["quick_reduce"]["platform"]:
        return PathChoice(impl="quick_reduce", why=f"ROCm: quick reduce is tried first ({where} cuda_communicator.py)",
                          label="quick reduce (ROCm)")
    custom = rules["custom"]
    symm = rules["symm_mem"]
    symm_on = (_on(env, symm["env"], bool(symm["default"])) and hw.platform == "cuda" and hw.nvlink_multicast
               and cap in symm["max_bytes"] and str(group) in symm["max_bytes"][cap] and dtype == "bfloat16")
    why_not: list[str] = []
    short = ""
    if group not in custom["world_sizes"]:
        why_not.append(f"custom all-reduce supports {', '.join(map(str, custom['world_sizes']))} GPUs, not {group}")
        short = f"custom: not on {group} GPUs"
    elif not hw.p2p:
        why_not.append("custom all-reduce needs GPU P2P, which this profile lacks")
        short = "custom: no GPU P2P"
    elif hw.interconnect != "nvlink" and group > custom["pcie_max_world"]:
        why_not.append(f"custom all-reduce is off on more than {custom['pcie_max_world']} PCIe-only GPUs "
                       f"({where} custom_all_reduce.py)")
        short = f"custom: not on > {custom['pcie_max_world']} PCIe-only GPUs"
    else:
        limit = int(custom["max_bytes"])
        caps = custom["max_bytes_with_symm_mem"]
        if symm_on and cap in caps and str(group) in caps[cap]:
            limit = min(limit, int(caps[cap][str(group)]))
        if nbytes < limit and nbytes % 16 == 0:
            shot = custom["one_shot"]
            one = group == shot["always_at_world"] or any(group <= w and nbytes < b for w, b in shot["below_bytes"])
            kind = "one-shot (cross_device_reduce_1stage)" if one else "two-shot (cross_device_reduce_2stage)"
            shot_limit = (min(limit, next((b for w, b in shot["below_bytes"] if group <= w), limit))
                          if one and group != shot["always_at_world"] else limit)
            links = "NVLink" if hw.interconnect == "nvlink" else "P2P"
            return PathChoice(impl="custom_1stage" if one else "custom_2stage",
                              label=f"custom all-reduce {'one' if one else 'two'}-shot: {links}, below "
                                    f"{_size(shot_limit)}",
                              why=f"custom all-reduce {kind}: {nbytes:,} B below its {limit:,} B limit on {group} "
                                  f"{links} GPUs ({where} custom_all_reduce.py, csrc/custom_all_reduce.cuh)")
        why_not.append(f"{nbytes:,} B is not below the custom all-reduce limit {limit:,} B")
        short = f"custom: {_size(limit)} and above"
    if symm_on and nbytes <= int(symm["max_bytes"][cap][str(group)]) and nbytes % 4 == 0:
        multi = group in symm["multimem_world_sizes"].get(cap, [])
        path = f"torch symmetric memory {'multimem' if multi else 'two-shot'}"
        return PathChoice(impl="symm_mem_multimem" if multi else "symm_mem_two_shot",
                          label=f"{path}: NVLink multicast, up to {_size(int(symm['max_bytes'][cap][str(group)]))}",
                          why=f"{path}: {'; '.join(why_not)}; NVLink multicast on sm_{cap.replace('.', '')} "
                              f"({where} symm_mem.py)")
    if not symm_on:
        sm = cap.replace(".", "") or "?"
        why_not.append("no torch symmetric memory (it needs NVLink multicast, bf16 and a listed capability: "
                       f"this is sm_{sm}, multicast {'on' if hw.nvlink_multicast else 'off'})")
    return PathChoice(impl="nccl", why=f"NCCL (pynccl): {'; '.join(why_not)} ({where} cuda_communicator.py)",
                      label=f"NCCL ({short})" if short else "NCCL")


def _size(nbytes: int) -> str:
    """``512 KiB``, ``8 MiB``: a power-of-two size as the source writes it."""
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= div and nbytes % div == 0:
            return f"{nbytes // div} {unit}"
    return f"{nbytes:,} B"


def nccl_env_effects(env: dict[str, str]) -> NcclEnv:
    """What ``NCCL_PROTO``, ``NCCL_ALGO``, ``NCCL_P2P_LEVEL``, … of the unit change on the NCCL path.

    - ``NCCL_ALGO`` / ``NCCL_NVLS_ENABLE``: a curve variant timed with the same setting is preferred (the 8-GPU
      H100 file has ``NCCL_ALGO=RING, NCCL_NVLS_ENABLE=0``); without one the default curve is used, and said.
    - ``NCCL_PROTO=LL``: LL moves 8-byte words holding 4 bytes of data and a 4-byte flag (NCCL's protocol
      documentation and src/device/prims_ll.h), half the link rate: the bandwidth term is counted twice.
      At a few tokens' message (kilobytes) that adds well under a microsecond; a large batch's (megabytes) pays it.
    - ``NCCL_P2P_LEVEL``: lets P2P cross the path level named (SYS: the CPU interconnect between sockets); the
      published points and curves do not say their transport, so it is named, not priced.
    """
    prefer = {k: v for k, v in env.items() if k in ("NCCL_ALGO", "NCCL_NVLS_ENABLE", "NCCL_PROTO")}
    notes: list[str] = []
    ll = env.get("NCCL_PROTO", "").strip().upper() == "LL"
    if "NCCL_PROTO" in env:
        notes.append(f"NCCL_PROTO={env['NCCL_PROTO']}: " + ("LL carries 4 data bytes in each 8-byte word, half the "
                     "link rate: the bandwidth term is counted twice (under 1 µs at a few tokens' message; a large "
                     "batch's message pays it in full)" if ll else
                     "a curve timed with it is used where one exists"))
    if "NCCL_ALGO" in env:
        notes.append(f"NCCL_ALGO={env['NCCL_ALGO']}: a curve variant timed with it is used where one exists")
    if "NCCL_P2P_LEVEL" in env:
        notes.append(f"NCCL_P2P_LEVEL={env['NCCL_P2P_LEVEL']}: P2P allowed up to that path level; the points and "
                     "curves do not state their transport, so this is named, not priced")
    for key in sorted(set(env) - set(NCCL_KEYS)):
        if key.startswith("NCCL_"):
            notes.append(f"{key}={env[key]}: not modelled")
    return NcclEnv(prefer=prefer, ll_only=ll, notes=notes)


def _figure(entry: dict[str, Any]) -> dict[str, Any]:
    """The :class:`Figure` fields of a ``[[point]]`` or ``[[bandwidth]]`` entry."""
    return {"op": entry["op"], "impl": entry["impl"], "profiles": tuple(entry["profiles"]),
            "group": int(entry["group"])}


def load_points(*, exclude_sources: tuple[str, ...] = ()) -> list[Point]:
    """The points of ``data/comm/points.toml``, leaving out those whose source contains any of
    ``exclude_sources`` (a test's independent route)."""
    text = files("servescope").joinpath("data", "comm", "points.toml").read_text(encoding="utf-8")
    out: list[Point] = []
    for p in tomllib.loads(text).get("point", []):
        if any(x in p["source"] for x in exclude_sources):
            continue
        out.append(Point(**_figure(p), bytes=tuple(int(b) for b in p["bytes"]), us=tuple(float(u) for u in p["us"]),
                         origin=p["origin"], source=p["source"], stands_for=p.get("stands_for", ""),
                         band=p.get("band", "")))
    return out


def load_bandwidths() -> list[Bandwidth]:
    """The ``[[bandwidth]]`` entries of ``data/comm/points.toml``."""
    text = files("servescope").joinpath("data", "comm", "points.toml").read_text(encoding="utf-8")
    return [Bandwidth(**_figure(b), bus_gbps=float(b["bus_gbps"]), bytes=int(b["bytes"]), origin=b["origin"],
                      source=b["source"])
            for b in tomllib.loads(text).get("bandwidth", [])]


def point_time_us(point: Point, nbytes: float) -> float:
    """Time of one call at ``nbytes`` from ``point``: linear in bytes between its sizes, the nearest segment
    extended outside them (never below half the smallest time), the one time when it has one size."""
    xs, ys = point.bytes, point.us
    if len(xs) == 1:
        return ys[0]
    i = 0
    while i < len(xs) - 2 and nbytes > xs[i + 1]:
        i += 1
    x0, x1, y0, y1 = xs[i], xs[i + 1], ys[i], ys[i + 1]
    t = y0 + (y1 - y0) * (nbytes - x0) / (x1 - x0)
    return max(t, 0.5 * min(ys))
