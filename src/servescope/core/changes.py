"""The catalogue of changes (``data/changes.toml``): which server settings the evidence calls for, and which are in
place already, not allowed or waiting on an input.

:func:`match_changes` takes what is known of a server (:class:`ChangeEvidence`: the knee's cause and its
figures, findings of ``analyze``/``profile``/``bench serve``, server log lines, the command line and environment,
the deployment settings as evidence) and returns the candidates ranked by predicted gain, and the changes the
evidence called for that are ruled out, each with its reason. ``tune`` tries the candidates; ``analyze``,
``profile`` and ``bench serve`` name them (:mod:`servescope.core.next_steps`). Lives in core so that every
feature can import it.

Example:
    >>> matched = match_changes(ChangeEvidence(knee_cause="scheduler_cap", argv=["vllm", "serve", "m",
    ...                                        "--max-num-seqs", "4"], load=4))
    >>> matched.candidates[0].id, matched.candidates[0].value
    ('max-num-seqs', '8')
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import msgspec

from servescope.core.analysis import SettingEvidence
from servescope.core.bundled import bundled_toml
from servescope.core.engine_log import log_value, moe_log_facts
from servescope.core.engines import check_engine
from servescope.core.errors import InputError
from servescope.core.messages import format_message

__all__ = ["catalogue_engine", "Candidate", "ChangeEdit", "ChangeEvidence", "Matched", "NotCandidate", "SeenFinding",
           "flag_values", "load_catalogue", "match_changes", "moe_log_facts"]

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt, "==": operator.eq}
_ADVISED = ("medium", "high")  # a finding's severities that call for a change (info reports, never advises)
_SAME_LOAD_SCALES = ("finding", "fact")  # ranges of a shorter step: the same load's tokens/s, not the knee's move

class SeenFinding(msgspec.Struct, kw_only=True, frozen=True):
    """A finding as evidence: its id and severity, the settings its advice names, the per-step saving each piece
    of advice predicts as fractions of the step (``gains``: setting → [low, high]; ``""`` for advice without a
    setting), its numeric figures (``facts``) and the phase of steps it is about (``decode``, ``mixed``; None: all)."""

    id: str
    severity: str | None = None
    phase: str | None = None
    advice_settings: list[str] = []
    gains: dict[str, list[float]] = {}
    facts: dict[str, float] = {}


class ChangeEvidence(msgspec.Struct, kw_only=True, frozen=True):
    """What is known of one server. Everything is optional; each missing piece only silences what needs it.

    ``load``: the load the evidence was seen at (the knee's streams, or the profiled batch); ``argv`` / ``env``:
    the server's command line and environment; ``settings``: the deployment settings as analyze/profile tell
    them; ``platform``: ``cuda``, ``rocm`` or ``cpu``; ``facts``: of the model or server (``model_mtp_layers``);
    ``inputs``: what the user gave (``moe_config_dir``, ``comm_env`` as ``K=V K=V``, ``model``, ``tp``).
    """

    knee_cause: str | None = None
    cause_figures: dict[str, float] = {}
    findings: list[SeenFinding] = []
    log_lines: list[str] = []
    load: float | None = None
    argv: list[str] = []
    env: dict[str, str] = {}
    settings: dict[str, SettingEvidence] = {}
    platform: str | None = None
    facts: dict[str, float] = {}
    inputs: dict[str, str] = {}


class ChangeEdit(msgspec.Struct, kw_only=True, frozen=True):
    """What applying a change does to a command line and environment: flags set to a value (every earlier
    spelling replaced), switches added, flags removed (switches), environment variables set."""

    set_flags: dict[str, str] = {}
    add: list[str] = []
    remove: list[str] = []
    env: dict[str, str] = {}

    def describe(self) -> str:
        """``--max-num-seqs 8``, ``-- enforce-eager removed``, ``VLLM_X=1``, joined by ``; ``."""
        parts = [f"{f} {v}" for f, v in self.set_flags.items()] + list(self.add)
        parts += [] if self.add else [f"{f} removed" for f in self.remove]
        parts += [f"{k}={v}" for k, v in self.env.items()]
        return "; ".join(parts)


class Candidate(msgspec.Struct, kw_only=True, frozen=True):
    """A change the evidence calls for and the deployment lacks, with what it should gain.

    ``gain_low`` .. ``gain_high``: the predicted change of the knee's goodput tokens/s, as fractions (0.2 = +20%),
    ``gain_basis`` where that range comes from; ``because``: the evidence, one sentence each. ``gain_at``: ``load``
    where the range prices the tokens/s at the knee's load as it was (a shorter step: ``scale`` ``finding`` or
    ``fact``), ``knee`` where it prices the knee wherever it moves (more requests at once, more KV cache).
    """

    id: str
    label: str
    edit: ChangeEdit
    current: str | None
    value: str | None
    because: list[str]
    gain_low: float
    gain_high: float
    gain_basis: str
    risk: dict[str, str]
    undo: str
    allow: str | None = None
    gain_at: str = "knee"


class NotCandidate(msgspec.Struct, kw_only=True, frozen=True):
    """A change the evidence called for that is not tried: ``reason`` is ``in_place``, ``not_allowed``,
    ``needs_input``, ``platform`` or ``no_value`` (the catalogue's), ``budget`` or ``below_noise`` (tune's: no time
    left, or a predicted gain no larger than the baseline's noise); ``detail`` says it in a sentence (and how to
    give an input)."""

    id: str
    label: str
    reason: str
    detail: str
    because: list[str] = []


class Matched(msgspec.Struct, kw_only=True, frozen=True):
    """Candidates, most predicted gain first, and the called-for changes ruled out."""

    candidates: list[Candidate]
    ruled_out: list[NotCandidate]


# ------------------------------------------------------------------------------------------------ the catalogue

@cache
def _bundled_data() -> dict[str, Any]:
    data: dict[str, Any] = bundled_toml("changes.toml")
    check_engine(data.get("engine"), "data/changes.toml", "engine")  # an engine of data/engines.toml
    return data


def _bundled() -> dict[str, dict[str, Any]]:
    return dict(_bundled_data()["changes"])


def catalogue_engine() -> str:
    """The engine whose flags the bundled catalogue sets (``engine`` in ``data/changes.toml``)."""
    return str(_bundled_data()["engine"])


def load_catalogue(extra: Path | None = None) -> dict[str, dict[str, Any]]:
    """The bundled catalogue, with the entries of ``extra`` (a TOML file of ``[changes.ID]`` tables) added or
    replacing bundled ones of the same id.

    Raises:
        InputError: ``extra`` cannot be read, is not TOML, or an entry has no ``label`` or ``when``.
    """
    catalogue = dict(_bundled())
    if extra is None:
        return catalogue
    import tomllib  # here: the bundled catalogue is read from the parsed-data cache (servescope.core.bundled)

    try:
        data = tomllib.loads(extra.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(str(extra), f"cannot read ({exc.strerror or exc})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InputError(str(extra), f"not TOML ({exc})") from None
    entries = data.get("changes")
    if not isinstance(entries, dict) or not entries:
        raise InputError(str(extra), "no [changes.ID] table")
    for cid, entry in entries.items():
        if not isinstance(entry, dict) or "label" not in entry or not entry.get("when"):
            raise InputError(str(extra), f"[changes.{cid}] needs a label and at least one [[changes.{cid}.when]]")
        catalogue[cid] = entry
    return catalogue


# ------------------------------------------------------------------------------------------------ reading argv

def _flag_name(word: str) -> str:
    name = word.partition("=")[0]
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


def flag_values(argv: Sequence[str]) -> dict[str, list[str]]:
    """Each flag of a command line (``--x_y`` spelled ``--x-y``) → its values in order; a switch's value is ``""``.

    ``--flag value`` and ``--flag=value`` both count; a word after a flag is its value unless it is a flag itself.
    """
    out: dict[str, list[str]] = {}
    words = list(argv)
    for i, word in enumerate(words):
        if not word.startswith("-") or word == "-" or re.fullmatch(r"-\d.*", word):
            continue
        name, eq, inline = word.partition("=")
        if eq:
            value = inline
        else:
            nxt = words[i + 1] if i + 1 < len(words) else None
            value = nxt if nxt is not None and (not nxt.startswith("-") or re.fullmatch(r"-\d.*", nxt)) else ""
        out.setdefault(_flag_name(name), []).append(value)
    return out


# ------------------------------------------------------------------------------------------------ evidence

def _holds(figure: float | None, op: str, value: float) -> bool:
    return figure is not None and _OPS[op](figure, value)


def _block_reasons(block: Mapping[str, Any], ev: ChangeEvidence) -> list[str] | None:
    """The sentences of one ``when`` block's evidence, or None when some key of it does not hold."""
    reasons: list[str] = []
    if "knee_cause" in block:
        if ev.knee_cause != block["knee_cause"]:
            return None
        reasons.append(f"the knee's cause is {ev.knee_cause}")
    for figure, op, value in block.get("figures", ()):
        if not _holds(ev.cause_figures.get(figure), op, value):
            return None
        reasons.append(f"{figure} {op} {value:g} ({ev.cause_figures[figure]:g})")
    if "finding" in block:
        found = [f for f in ev.findings if f.id == block["finding"] and (f.severity is None or f.severity in _ADVISED)]
        if "advice_setting" in block:
            found = [f for f in found if block["advice_setting"] in f.advice_settings]
        if not found:
            return None
        extra = f" (advice on {block['advice_setting']})" if "advice_setting" in block else ""
        reasons.append(f"finding {found[0].id}{extra}")
    if "log" in block:
        pattern = re.compile(block["log"])
        hit = next(((x, m) for x in ev.log_lines if (m := pattern.search(x)) is not None), None)
        if hit is None:
            return None
        reasons.append(f"the server log: {hit[0][hit[1].start():].strip()[:400]}")
    if "load_at_most" in block and not _holds(ev.load, "<=", block["load_at_most"]):
        return None
    if "load_at_least" in block and not _holds(ev.load, ">=", block["load_at_least"]):
        return None
    if ev.load is not None and ("load_at_most" in block or "load_at_least" in block):
        reasons.append(f"at load {ev.load:g}")
    for fact, least in block.get("fact_at_least", {}).items():
        if not _holds(ev.facts.get(fact), ">=", least):
            return None
        reasons.append(f"{fact} = {ev.facts[fact]:g}")
    return reasons


def _called(entry: Mapping[str, Any], ev: ChangeEvidence, flags: Mapping[str, list[str]]) -> list[str] | None:
    for block in entry.get("when", ()):
        reasons = _block_reasons(block, ev)
        if reasons is not None and block.get("load_above_current"):
            current = _number(_current(entry, ev, flags))
            if current is None or ev.load is None or ev.load <= current:
                continue
            reasons.append(f"the load {ev.load:g} is above the current {current:g}")
        if reasons is not None:
            return reasons
    return None


# ------------------------------------------------------------------------------------------------ values

def _current(entry: Mapping[str, Any], ev: ChangeEvidence, flags: Mapping[str, list[str]]) -> str | None:
    """The server's value of the change's setting: the command line, environment, a pattern, the server's own
    log (what the engine says it runs with), the cause's figures, then the entry's default."""
    spec = entry.get("current", {})
    if entry.get("add"):  # a switch: the last of its on/off flags wins
        state = None
        for word in ev.argv:
            name = _flag_name(word)
            if name in entry["add"]:
                state = "on"
            elif name in entry.get("remove", ()):
                state = "off"
        return state or spec.get("default")
    for flag in spec.get("flags", ()):
        if flag in flags:
            return flags[flag][-1]
    if "env" in spec and spec["env"] in ev.env:
        return ev.env[spec["env"]]
    if "pattern" in spec:
        found = re.search(spec["pattern"], " ".join(ev.argv))
        if found:
            return found.group(1)
    if "log" in spec and (logged := log_value(ev.log_lines, spec["log"])) is not None:
        return logged
    keys = spec.get("evidence", ())
    for key in [keys] if isinstance(keys, str) else keys:
        if (figure := _figure(ev, key)) is not None:
            return f"{figure:g}"
    default = spec.get("default")  # the engine's, where the command line is known to say nothing
    return str(default) if default is not None and ev.argv else None


def _figure(ev: ChangeEvidence, name: str) -> float | None:
    """A figure of the knee's cause, else of a finding."""
    if ev.cause_figures.get(name) is not None:
        return ev.cause_figures[name]
    return next((f.facts[name] for f in ev.findings if name in f.facts), None)


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def _new_value(rule: Mapping[str, Any], current: str | None, ev: ChangeEvidence) -> str | None:
    """The value ``rule`` sets, or None when it cannot be told (the current value unknown)."""
    kind = rule["rule"]
    if kind == "set":
        return str(rule["to"])
    if kind == "input":
        return ev.inputs.get(rule["name"])
    now = _number(current)
    if kind == "pow2_load":
        names = rule.get("evidence", [])
        need = max([ev.load or 0.0] + [_figure(ev, n) or 0.0 for n in ([names] if isinstance(names, str) else names)])
        if need <= 0:
            return None
        new = int(min(rule.get("cap", math.inf), 2 ** math.ceil(math.log2(max(need, 1.0)))))
        return current if now is not None and now >= new else str(new)  # never lowered: already enough
    if now is None:
        return None
    if kind == "scale":
        new = now * rule["factor"]
        if rule.get("load_factor") and ev.load:
            new = max(new, ev.load * rule["load_factor"])
    elif kind == "add":
        new = now + rule["step"]
    else:
        raise ValueError(f"data/changes.toml: unknown value rule {kind!r}")
    new = min(max(new, rule.get("floor", -math.inf)), rule.get("cap", math.inf))
    if (room := _room(rule.get("room"), ev)) is not None:
        new = max(now, min(new, room))
    return str(int(round(new))) if rule.get("integer") else f"{new:.4g}"


def _room(spec: Mapping[str, Any] | None, ev: ChangeEvidence) -> float | None:
    """``room = {figure, per, share}``: the most the measured use leaves room for, ``figure / per * share`` (e.g.
    the requests that ran at once over the share of the KV cache they filled); None where a figure is missing."""
    if spec is None:
        return None
    figure, per = _figure(ev, spec["figure"]), _figure(ev, spec["per"])
    if figure is None or per is None or per <= 0:
        return None
    return float(figure / per * spec.get("share", 1.0))


# ------------------------------------------------------------------------------------------------ matching

def _not(entry: Mapping[str, Any], cid: str, reason: str, detail: str, because: list[str]) -> NotCandidate:
    return NotCandidate(id=cid, label=entry["label"], reason=reason, detail=detail, because=because)


def _ruled_out(cid: str, entry: Mapping[str, Any], ev: ChangeEvidence, flags: Mapping[str, list[str]],
               allow: Sequence[str], because: list[str]) -> NotCandidate | None:
    """Why a called-for change is not tried, before its value is worked out; None when nothing rules it out."""
    platforms = entry.get("platforms")
    if platforms and ev.platform is not None and ev.platform not in platforms:
        return _not(entry, cid, "platform", f"not on {ev.platform} (only {', '.join(platforms)})", because)
    if entry.get("allow") and entry["allow"] not in allow:
        return _not(entry, cid, "not_allowed", f"changes the model's outputs ({entry['risk']['quality']}); "
                    f"tried only with --allow {entry['allow']}", because)
    argv_known = bool(ev.argv)
    required = entry.get("requires_flag")
    if required and argv_known and required not in flags:
        return _not(entry, cid, "in_place", f"the command line has no {required}", because)
    present = [f for f in entry.get("unless_flags", ()) if f in flags]
    if present:
        return _not(entry, cid, "in_place", f"not with {present[0]} on the command line", because)
    if entry.get("requires_absent") and entry.get("flag") in flags:
        return _not(entry, cid, "in_place", f"{entry['flag']} is already set ({flags[entry['flag']][-1]})", because)
    setting = entry.get("setting")
    told = ev.settings.get(setting) if setting else None
    if told is not None and told.value in entry.get("in_place", ()):
        return _not(entry, cid, "in_place", f"{setting}: {told.value}, from {told.detail}", because)
    need = entry.get("needs")
    if need and not ev.inputs.get(need):
        values = {"model": ev.inputs.get("model", "MODEL"), "tp": ev.inputs.get("tp", "TP"),
                  **moe_log_facts(ev.log_lines)}
        values.setdefault("moe_dtype", "auto")
        return _not(entry, cid, "needs_input", format_message(entry.get("needs_command", need), values), because)
    return None


def _cycle_gain(share: float) -> float:
    """The throughput gain of a cycle shortened by ``share`` of itself: ``s / (1 - s)``, ``s`` within 0..0.9."""
    s = min(max(share, 0.0), 0.9)
    return s / (1.0 - s)


def _gain(entry: Mapping[str, Any], ev: ChangeEvidence, current: str | None, value: str | None,
          values: Mapping[str, Any]) -> tuple[float, float, str]:
    spec = entry["gain"]
    low, high = float(spec["low"]), float(spec["high"])
    scale = spec.get("scale")
    if scale == "value_ratio":
        now, new = _number(current), _number(value)
        if now and new and new > now:
            extra = new / now - 1.0
            low, high = low * extra, min(high * extra, extra)
    elif scale == "finding":
        for block in entry.get("when", ()):
            found = next((f for f in ev.findings if f.id == block.get("finding")), None)
            gain = found.gains.get(block.get("advice_setting", ""), None) if found else None
            if gain is None and found is not None and found.gains and "advice_setting" not in block:
                gain = next(iter(found.gains.values()))
            if gain is not None:
                # the finding saves a share of the step cycle; the same tokens in a shorter cycle: goodput rises by
                # s / (1 - s) at the same load (a share of at most 0.9 counted: some of every cycle stays)
                low, high = (_cycle_gain(share) for share in gain)
                break
    elif scale == "fact" and (measured := ev.facts.get(spec["fact"])) is not None:
        # a gain measured for this server (a kernel's speedup): the step gains at most that, as a part of it
        low, high = min(low, measured), measured
        return low, high, format_message(spec.get("basis_fact", spec["basis"]), {**values, spec["fact"]: measured})
    return low, high, format_message(spec["basis"], values)


def _candidate(cid: str, entry: Mapping[str, Any], ev: ChangeEvidence, flags: Mapping[str, list[str]],
               because: list[str]) -> Candidate | NotCandidate:
    current = _current(entry, ev, flags)
    edit: ChangeEdit
    value: str | None = None
    if entry.get("add") or (entry.get("remove") and not entry.get("flag")):
        if entry.get("add") and current == "on":
            return _not(entry, cid, "in_place", f"already on ({' '.join(entry['add'])} or the default)", because)
        edit = ChangeEdit(add=list(entry.get("add", ())), remove=list(entry.get("remove", ())))
    elif "env_from_input" in entry:
        pairs = dict(p.split("=", 1) for p in ev.inputs.get(entry["env_from_input"], "").split() if "=" in p)
        if all(ev.env.get(k) == v for k, v in pairs.items()):
            return _not(entry, cid, "in_place", "the environment already has " + " ".join(
                f"{k}={v}" for k, v in pairs.items()), because)
        edit, value = ChangeEdit(env=pairs), " ".join(f"{k}={v}" for k, v in pairs.items())
    else:
        value = _new_value(entry["value"], current, ev)
        target = entry.get("flag") or entry.get("env")
        if value is None:
            return _not(entry, cid, "no_value", f"the current {target} is not known (give it on the command line)",
                        because)
        if value == current or (_number(value) is not None and _number(value) == _number(current)):
            room = _room(entry["value"].get("room"), ev)
            if room is not None and _number(current) is not None and room <= (_number(current) or 0.0):
                spec = entry["value"]["room"]
                return _not(entry, cid, "in_place", f"{target} is {current}, and the measured use leaves no room "
                            f"above it ({spec['figure']} / {spec['per']} x {spec.get('share', 1.0):g} = {room:.0f})",
                            because)
            return _not(entry, cid, "in_place", f"{target} is already {current}", because)
        edit = ChangeEdit(set_flags={entry["flag"]: value}) if entry.get("flag") else \
            ChangeEdit(env={entry["env"]: value})
    now, new = _number(current), _number(value)
    values: dict[str, Any] = {**ev.facts, **ev.cause_figures, **moe_log_facts(ev.log_lines), "current": current,
                              "value": value, "ratio": (new / now) if now and new else None}
    low, high, basis = _gain(entry, ev, current, value, values)
    return Candidate(id=cid, label=entry["label"], edit=edit, current=current, value=value, because=because,
                     gain_low=low, gain_high=high, gain_basis=basis, risk=dict(entry["risk"]),
                     undo=format_message(entry["undo"], values), allow=entry.get("allow"),
                     gain_at="load" if entry["gain"].get("scale") in _SAME_LOAD_SCALES else "knee")


def match_changes(ev: ChangeEvidence, *, allow: Sequence[str] = (),
                  catalogue: Mapping[str, Mapping[str, Any]] | None = None) -> Matched:
    """The changes ``ev`` calls for: candidates (most predicted gain first, catalogue order on ties) and the
    ones ruled out (in place, not allowed, waiting on an input, another platform, no value to set).

    Changes the evidence does not call for are in neither list.
    """
    entries = catalogue if catalogue is not None else load_catalogue()
    flags = flag_values(ev.argv)
    candidates: list[Candidate] = []
    ruled: list[NotCandidate] = []
    for cid, entry in entries.items():
        because = _called(entry, ev, flags)
        if because is None:
            continue
        out = _ruled_out(cid, entry, ev, flags, allow, because) or _candidate(cid, entry, ev, flags, because)
        if isinstance(out, Candidate):
            candidates.append(out)
        else:
            ruled.append(out)
    order = {cid: i for i, cid in enumerate(entries)}
    candidates.sort(key=lambda c: (-(c.gain_low + c.gain_high) / 2, order[c.id]))
    return Matched(candidates=candidates, ruled_out=ruled)
