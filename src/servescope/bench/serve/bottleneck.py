"""Who is the bottleneck at one ``bench serve`` point: the client, or the server's API front end.

A late client (its 1 ms timer fires late) is ``client_bound``; a client on time that still measures more than
the engine's own histograms says names the server's API front end (``front_end_bound``). Thresholds and
messages are data: ``data/findings-serve.toml``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from functools import cache
from importlib.resources import files
from typing import Any

from servescope.core.messages import format_message
from servescope.core.serve import ServeFinding, ServePoint

__all__ = ["SEVERITIES", "is_client_bound", "judge_point", "load_serve_rules"]

SEVERITIES = ("high", "medium", "info")
"""A finding's severities, gravest first."""


@cache
def load_serve_rules() -> dict[str, Any]:
    """The bundled ``data/findings-serve.toml``: ``client_bound`` and ``front_end_bound`` thresholds and messages."""
    return tomllib.loads((files("servescope") / "data" / "findings-serve.toml").read_text(encoding="utf-8"))


def is_client_bound(lag_p99_ms: float | None, tpot_median_ms: float | None,
                    rules: Mapping[str, Any] | None = None) -> bool:
    """Whether the client's own delays rival what it measures (``[client_bound]`` of the rules)."""
    rule = (rules or load_serve_rules())["client_bound"]
    if lag_p99_ms is None:
        return False
    return bool(lag_p99_ms > rule["lag_p99_ms_above"] and
                (tpot_median_ms is None or lag_p99_ms > rule["lag_share_of_tpot_median_above"] * tpot_median_ms))


def judge_point(point: ServePoint, rules: Mapping[str, Any] | None = None) -> list[ServeFinding]:
    """The findings of one point: ``client_bound`` when its client ran late, else ``front_end_bound`` when the
    client was on time but its TTFT/TPOT/ITL means exceed the engine's histogram means by the rules' margins.

    The two exclude each other: a late client's figures say nothing about the server.
    """
    rules = rules or load_serve_rules()
    lag = point.client_lag
    processes = f"{point.workers} client process{'es' if point.workers != 1 else ''}"
    values: dict[str, Any] = {"lag_p99_ms": lag.p99_ms, "lag_max_ms": lag.max_ms, "workers": point.workers,
                              "processes": processes, "tpot_median_ms": point.tpot_ms.median}
    evidence: dict[str, float] = {k: float(v) for k, v in (("lag_p99_ms", lag.p99_ms), ("workers", point.workers),
                                                           ("tpot_median_ms", point.tpot_ms.median)) if v is not None}
    if lag.client_bound or is_client_bound(lag.p99_ms, point.tpot_ms.median, rules):
        rule = rules["client_bound"]
        return [ServeFinding(id="client_bound", message=format_message(rule["message"], values), advice=rule["advice"],
                             evidence=evidence, severity=rule["severity"])]
    rule = rules["front_end_bound"]
    if lag.p99_ms is None or lag.p99_ms > rule["lag_p99_ms_at_most"]:
        return []
    if point.requests - point.errors < rule["min_requests"]:
        return []
    exceeded: list[str] = []
    severities: list[str] = []
    for figure in rule["figure"]:
        name = figure["name"]
        client: float | None = getattr(point, f"{name}_ms").mean
        server: float | None = getattr(point.server, f"{name}_ms_mean")
        if client is None or server is None or server <= 0:
            continue
        ratio = client / server
        values.update({f"client_{name}_ms": client, f"server_{name}_ms": server, f"{name}_ratio": ratio})
        evidence.update({f"client_{name}_ms": client, f"server_{name}_ms": server, f"{name}_ratio": ratio})
        margin = max(figure["excess_ms_above"], figure["lag_factor"] * lag.p99_ms)
        if ratio > figure["ratio_above"] and client - server > margin:
            exceeded.append(f"{figure['label']} {client:.1f} ms vs the engine's {server:.1f} ms ({ratio:.2f}x)")
            severities.append(figure["severity"])
    if not exceeded:
        return []
    values["figures"] = "; ".join(exceeded)
    return [ServeFinding(id="front_end_bound", message=format_message(rule["message"], values), advice=rule["advice"],
                         evidence=evidence, severity=min(severities, key=SEVERITIES.index))]
