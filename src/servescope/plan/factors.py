"""The efficiency factors and overheads of plan's step model, with where each value comes from.

Defaults live in ``data/plan.toml`` (every one "assumed", with its reasoning there); ``--calibrate`` replaces
some with values fitted to a capture ("calibrated"). A factor below 1 is an achieved fraction of a
datasheet rate; a scale multiplies a modelled time.
"""

from __future__ import annotations

import dataclasses
import itertools
import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib.resources import files
from typing import Any

__all__ = ["FACTOR_NAMES", "ROUTINGS", "Factors", "default_factors"]

# Factors --calibrate can fit (the rest stay as assumed).
FACTOR_NAMES = ("hbm_efficiency", "attention_efficiency", "collective_scale", "other_scale", "weights_fixed_us",
                "attention_fixed_us", "attention_request_tokens", "us_per_request", "host_step_us", "other_calls",
                "routing")
# How a step's tokens pick their experts (``routing``): "independent" (requests of distinct prompts: B tokens pick
# experts independently, uniform routing) or "alike" (the B requests are one sequence repeated, as
# `servescope profile` sent them until 2026-12-04: one prompt, temperature 0, so every token picks the same top_k
# experts).
ROUTINGS = ("independent", "alike")


@dataclass(frozen=True, kw_only=True)
class Factors:
    """Efficiencies (fractions of datasheet rates), overheads (µs) and memory rules of the step model.

    Attributes:
        hbm_efficiency: achieved fraction of HBM bandwidth when GEMMs stream weights.
        attention_efficiency: achieved fraction of HBM bandwidth when attention reads the KV cache.
        tflops_efficiency: achieved fraction of the dense tensor-core rate.
        link_efficiency: achieved fraction of the p2p link in the α-β collective estimate.
        collective_scale: multiplies every collective time (curves and estimate).
        other_scale: multiplies the fixed "other" time (``us_per_step + us_per_layer × layers``).
        us_per_layer, us_per_step: the "other" time per decoder layer and per step, µs.
        us_per_request: the "other" time per running request and step, µs.
        other_calls: small "other" kernels per step (norms, rotary, residual adds, …), each costing the
            hardware profile's floor at the step's batch (``HardwareProfile.other_floor_us``); 0 (their
            time is in ``us_per_layer``) until calibrated.
        weights_fixed_us, attention_fixed_us: per-step time of the weights and attention parts that does not
            depend on the bytes read (kernel floors × calls), µs; 0 until calibrated.
        attention_request_tokens: the attention kernel's own work per request (its query, the combine of its KV
            splits), as the KV tokens whose reading takes as long: each request is priced as if it held this many
            more tokens (``data/plan.toml`` ``[overhead]``, or calibrated). Unlike an efficiency it does not grow
            with the context.
        host_step_us: the host's time to launch one step of a launch-bound engine (eager PyTorch), µs: the
            step is never shorter; 0 (the device sets the step) until a launch-bound capture calibrates it.
        host_steps: ``(batch, µs)`` of the server's own step without the profiler at several batches, ascending:
            under async scheduling the step's floor at each (:meth:`host_floor_us`), in place of ``host_step_us``;
            empty until a capture timed at other batches calibrates it.
        step_corrections: ``(batch, µs)``, ascending: without async scheduling, what the server's own step at each
            timed batch adds to the model's (:meth:`step_correction_us`); empty until such a capture calibrates it.
        routing: how a step's tokens pick their MoE experts, one of ``ROUTINGS``: "independent" (the expected
            distinct experts of B independent tokens, :func:`servescope.plan.model.active_experts`) or "alike"
            (B copies of one sequence: ``top_k`` experts at every batch).
        memory_utilization: share of a GPU's memory the engine may use.
        reserve_gib: activations, graphs and buffers per GPU, GiB.
        kv_bytes: bytes per KV-cache element.
        wait_us: the wait for the last rank added to a collective call priced from a microbenchmark, µs
            (``data/plan.toml`` ``[comm.wait]``).
        comm_alpha: per interconnect kind, ``(base_us, hop_us)`` of the α-β estimate.
        origins: per attribute name, ``assumed`` or ``calibrated``.
    """

    hbm_efficiency: float
    attention_efficiency: float
    tflops_efficiency: float
    link_efficiency: float
    collective_scale: float = 1.0
    other_scale: float = 1.0
    us_per_layer: float
    us_per_step: float
    us_per_request: float = 0.0
    other_calls: float = 0.0
    weights_fixed_us: float = 0.0
    attention_fixed_us: float = 0.0
    attention_request_tokens: float = 0.0
    host_step_us: float = 0.0
    host_steps: tuple[tuple[int, float], ...] = ()
    step_corrections: tuple[tuple[int, float], ...] = ()
    routing: str = "independent"
    memory_utilization: float
    reserve_gib: float
    kv_bytes: float
    wait_us: float = 0.0
    comm_alpha: dict[str, tuple[float, float]] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, got {self.routing!r}")

    def replaced(self, origin: str, **values: float | str) -> Factors:
        """A copy with ``values`` set and marked as coming from ``origin``."""
        origins = dict(self.origins)
        origins.update(dict.fromkeys(values, origin))
        return dataclasses.replace(self, origins=origins, **values)  # type: ignore[arg-type]

    def host_floor_us(self, batch: int) -> float:
        """The step's floor at ``batch``, µs: with ``host_steps``, linear between the timed batches and the nearest
        one's beyond them (the cycle is not extrapolated); else ``host_step_us``."""
        return interpolate(self.host_steps, batch) if self.host_steps else self.host_step_us

    def step_correction_us(self, batch: int) -> float:
        """What the server's own steps add to the model's at ``batch``, µs (``step_corrections``: linear between the
        timed batches, the nearest one's beyond them); 0 without them."""
        return interpolate(self.step_corrections, batch) if self.step_corrections else 0.0

    def table(self) -> dict[str, dict[str, Any]]:
        """``{name: {value, origin}}`` of every scalar factor, for the result document (``host_steps`` as
        ``host_step_us_b<batch>`` and ``step_corrections`` as ``step_correction_us_b<batch>``, one per timed batch)."""
        out: dict[str, dict[str, Any]] = {}
        for f in dataclasses.fields(self):
            if f.name in ("comm_alpha", "origins", "host_steps", "step_corrections"):
                continue
            out[f.name] = {"value": getattr(self, f.name), "origin": self.origins.get(f.name, "assumed")}
        for batch, us in self.host_steps:
            out[f"host_step_us_b{batch}"] = {"value": us, "origin": self.origins.get("host_steps", "assumed")}
        for batch, us in self.step_corrections:
            out[f"step_correction_us_b{batch}"] = {"value": us,
                                                   "origin": self.origins.get("step_corrections", "assumed")}
        for kind, (base, hop) in sorted(self.comm_alpha.items()):
            out[f"comm_{kind}_base_us"] = {"value": base, "origin": "assumed"}
            out[f"comm_{kind}_hop_us"] = {"value": hop, "origin": "assumed"}
        return out


def interpolate(points: tuple[tuple[int, float], ...], batch: int) -> float:
    """The value at ``batch`` of ``(batch, value)`` points in ascending batch: linear between two, the nearest one's
    beyond them."""
    if batch <= points[0][0]:
        return points[0][1]
    for (b0, v0), (b1, v1) in itertools.pairwise(points):
        if batch <= b1:
            return v0 + (v1 - v0) * (batch - b0) / (b1 - b0)
    return points[-1][1]


@cache
def plan_data() -> dict[str, Any]:
    """``data/plan.toml``, read once (callers only read it)."""
    data: dict[str, Any] = tomllib.loads(files("servescope").joinpath("data", "plan.toml").read_text(encoding="utf-8"))
    return data


def wait_caveat(interconnect: str) -> str | None:
    """What plan says about the assumed wait for the last rank on ``interconnect`` (``data/plan.toml``
    ``[comm.wait]``, keyed by the interconnect kind), or ``None`` where the measured wait stands."""
    caveat = plan_data()["comm"].get("wait", {}).get(interconnect)
    return str(caveat) if caveat else None


def default_factors() -> Factors:
    """The assumed factors of ``data/plan.toml``."""
    data = plan_data()
    eff, over, mem = data["efficiency"], data["overhead"], data["memory"]
    routing = str(data.get("workload", {}).get("routing", "independent"))
    alpha = {kind: (float(v["base_us"]), float(v["hop_us"])) for kind, v in data["comm"].items() if kind != "wait"}
    wait = data["comm"].get("wait", {})
    values: dict[str, Any] = dict(
        hbm_efficiency=float(eff["hbm"]), attention_efficiency=float(eff["attention"]),
        tflops_efficiency=float(eff["tflops"]), link_efficiency=float(eff["link"]),
        us_per_layer=float(over["us_per_layer"]), us_per_step=float(over["us_per_step"]),
        us_per_request=float(over.get("us_per_request", 0.0)),
        attention_request_tokens=float(over.get("attention_request_tokens", 0.0)),
        memory_utilization=float(mem["utilization"]), reserve_gib=float(mem["reserve_gib"]),
        kv_bytes=float(mem["kv_bytes"]), wait_us=float(wait.get("us", 0.0)))
    return Factors(**values, routing=routing, comm_alpha=alpha,
                   origins=dict.fromkeys([*values, "routing", "collective_scale", "other_scale", "weights_fixed_us",
                                           "attention_fixed_us", "host_step_us", "other_calls"], "assumed"))
