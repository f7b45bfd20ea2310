"""What bounds the knee: one judge over the points around it, its rules in ``data/knee.toml``.

:func:`knee_figures` turns a point (the least load that missed the targets) and its neighbours (the knee's
point, the search's first point) into named figures from the engine's ``/metrics`` and the client's lag;
:func:`judge_knee` runs the rules over them, first match wins, and says whether the setting that moves the
cause is already on the server's command line (``server_argv``, where the server runs on this machine).
"""

from __future__ import annotations

import operator
import tomllib
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from importlib.resources import files
from typing import Any

from servescope.core.messages import format_message
from servescope.core.serve import KneeCause, ServePoint

__all__ = ["engine_flags", "judge_knee", "knee_figures", "load_knee_rules"]

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt, "==": operator.eq}


@cache
def _knee_data() -> dict[str, Any]:
    data: dict[str, Any] = tomllib.loads((files("servescope") / "data" / "knee.toml").read_text(encoding="utf-8"))
    return data


@cache
def load_knee_rules() -> list[dict[str, Any]]:
    """The bundled ``data/knee.toml`` rules, in file order."""
    rules: list[dict[str, Any]] = _knee_data()["rule"]
    for rule in rules:
        for cond in rule.get("when", []):
            if cond["op"] not in _OPS:
                raise ValueError(f"data/knee.toml: rule {rule['id']!r} has an unknown op {cond['op']!r}")
    return rules


def engine_flags(argv: Sequence[str]) -> dict[str, str]:
    """``--flag value`` / ``--flag=value`` pairs of a server command line (flags without a value map to ``""``),
    spelled with dashes (``--max_num_seqs`` → ``--max-num-seqs``)."""
    out: dict[str, str] = {}
    words = list(argv)
    for i, word in enumerate(words):
        if not word.startswith("--"):
            continue
        name, eq, value = word.partition("=")
        name = "--" + name[2:].replace("_", "-")
        if not eq:
            following = words[i + 1] if i + 1 < len(words) else ""
            value = following if following and not following.startswith("--") else ""
        out[name] = value
    return out


def knee_figures(point: ServePoint, *, knee: ServePoint | None, first: ServePoint | None,
                 prompt_tokens: int, flags: Mapping[str, str], client_explains: bool = False) -> dict[str, float]:
    """The figures the rules test (``data/knee.toml`` lists them), for ``point``; missing ones left out."""
    s = point.server
    fig: dict[str, float | None] = {
        "load": point.load, "kv_usage_max": s.kv_cache_usage_max, "preemptions": s.preemptions,
        "running_max": s.max_running, "running_mean": s.mean_running, "waiting_max": s.max_waiting,
        "waiting_mean": s.mean_waiting, "queue_ms": s.queue_ms_mean, "prefill_ms": s.prefill_ms_mean,
        "decode_ms": s.decode_ms_mean, "step_tokens": s.step_tokens_mean, "prompt_tokens": float(prompt_tokens),
        "itl_server_ms": s.itl_ms_mean, "lag_p99_ms": point.client_lag.p99_ms,
        "client_bound": float(point.client_lag.client_bound or any(f.id == "client_bound" for f in point.findings)),
        "client_explains": float(client_explains),
        "front_end_bound": float(any(f.id == "front_end_bound" for f in point.findings)),
    }
    missed = point.slo.missed_by if point.slo else []
    for metric in ("ttft", "itl", "tpot", "e2e"):
        fig[f"missed_{metric}"] = float(any(m.startswith(metric + "_") for m in missed))
    fig["missed_errors"] = float("errors" in missed)
    load = fig["load"] or 0.0
    if s.max_running is not None and load > 0 and point.concurrency is not None:
        fig["running_share"] = s.max_running / load
    if s.queue_ms_mean is not None and s.prefill_ms_mean is not None and s.queue_ms_mean + s.prefill_ms_mean > 0:
        fig["queue_share"] = s.queue_ms_mean / (s.queue_ms_mean + s.prefill_ms_mean)
    if knee is not None:
        fig["itl_server_knee_ms"] = knee.server.itl_ms_mean
    if first is not None and first.server.itl_ms_mean and s.itl_ms_mean is not None:
        fig["itl_first_ms"] = first.server.itl_ms_mean
        fig["itl_growth"] = s.itl_ms_mean / first.server.itl_ms_mean
    if point.itl_ms.p99 is not None and point.itl_ms.median:
        fig["itl_tail"] = point.itl_ms.p99 / point.itl_ms.median
    for name in ("max-num-seqs", "max-num-batched-tokens"):
        try:
            fig[name.replace("-", "_")] = float(flags[f"--{name}"])
        except (KeyError, ValueError):
            pass
    cap = fig.get("max_num_seqs") or float(_knee_data()["defaults"]["max_num_seqs"])
    fig["scheduler_cap"] = cap
    if s.max_running is not None and cap:
        fig["running_cap_share"] = s.max_running / cap
    if fig.get("max_num_batched_tokens"):
        fig["prompt_chunks"] = prompt_tokens / float(fig["max_num_batched_tokens"] or 1)
    return {k: float(v) for k, v in fig.items() if v is not None}


def _holds(rule: Mapping[str, Any], fig: Mapping[str, float]) -> bool:
    for cond in rule.get("when", []):
        value = fig.get(cond["figure"])
        if value is None or not _OPS[cond["op"]](value, float(cond["value"])):
            return False
    return True


def judge_knee(point: ServePoint, *, knee: ServePoint | None, first: ServePoint | None, prompt_tokens: int,
               server_argv: Sequence[str] | None = None, client_explains: bool = False) -> KneeCause | None:
    """The cause that bounds the knee at ``point`` (the least load that missed the targets), or ``None``: the
    point met the targets (nothing bounds it there), or no rule holds on its figures."""
    if point.slo is not None and point.slo.met and not client_explains:
        return None
    flags = engine_flags(server_argv) if server_argv is not None else {}
    fig = knee_figures(point, knee=knee, first=first, prompt_tokens=prompt_tokens, flags=flags,
                       client_explains=client_explains)
    held = [rule for rule in load_knee_rules() if _holds(rule, fig)]
    if not held:
        return None
    rule = held[0]
    flag = rule.get("flag")
    in_place: bool | None = None
    value: str | None = None
    if flag and server_argv is not None:
        in_place = flag in flags
        value = flags.get(flag) or None
    also = sorted({r["title"] for r in held[1:] if r["id"] != rule["id"]})
    advice = rule["advice"] + (f" (also seen: {'; '.join(also)})" if also else "")
    return KneeCause(id=rule["id"], title=rule["title"], message=format_message(rule["message"], fig),
                     evidence=dict(fig), setting=rule["setting"], advice=advice, in_place=in_place,
                     setting_value=value, at_load=fig.get("load"))
