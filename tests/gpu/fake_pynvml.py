"""A fake ``pynvml`` that replays a recording made by tools/record_gpu_fixtures.py on a real GPU.

Each call is looked up by function name and arguments (a device handle is {"device": index}); a
call the recording lacks fails the test, so nvml.py and the recorder stay in step.
"""

from __future__ import annotations

import copy
import json
import types
from pathlib import Path
from typing import Any


class NVMLError(Exception):
    """Like pynvml's: carries ``value`` and maps it to a named subclass."""

    _by_value: dict[int, type[NVMLError]] = {}

    def __new__(cls, value: int) -> NVMLError:
        target = NVMLError._by_value.get(value, cls) if cls is NVMLError else cls
        obj = Exception.__new__(target)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return f"{type(self).__name__} ({self.value})"


def _error_class(name: str, value: int) -> type[NVMLError]:
    if value not in NVMLError._by_value:
        NVMLError._by_value[value] = type(name, (NVMLError,), {})
    return NVMLError._by_value[value]


class Handle:
    def __init__(self, index: int) -> None:
        self.index = index


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict):
        if "__bytes__" in value:
            return value["__bytes__"].encode("latin-1")
        if "__struct__" in value:
            return types.SimpleNamespace(**{k: _decode(v) for k, v in value["fields"].items()})
        if set(value) == {"device"}:
            return Handle(value["device"])
    return value


def _key(fn: str, args: tuple[Any, ...]) -> str:
    shown = [{"device": a.index} if isinstance(a, Handle) else a for a in args]
    return fn + json.dumps(shown)


def load_recording(path: Path) -> dict[str, Any]:
    assert path.is_file(), f"missing NVML recording {path}"
    doc: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    assert doc.get("format") == "servescope-nvml-recording/1", path
    return doc


def make_fake_pynvml(doc: dict[str, Any], *, overrides: dict[str, Any] | None = None) -> types.ModuleType:
    """A module that answers like pynvml did when `doc` was recorded.

    Args:
        overrides: ``{"fnName": {"error": "NVMLError_NotSupported"}}`` or ``{"fnName": {"return": ...}}``
            to replace every recorded answer of that function (for the not-supported and failure paths).
    """
    fake = types.ModuleType("pynvml")
    fake.NVMLError = NVMLError  # type: ignore[attr-defined]
    constants = doc["constants"]
    for name, value in constants.items():
        setattr(fake, name, value)
    names = {v: k for k, v in constants.items() if k.startswith("NVML_ERROR_")}
    for value, const in names.items():
        cls_name = "NVMLError_" + "".join(part.capitalize() for part in const[len("NVML_ERROR_") :].split("_"))
        setattr(fake, cls_name, _error_class(cls_name, value))
    answers: dict[str, dict[str, Any]] = {}
    for call in doc["calls"]:
        answers.setdefault(_key(call["fn"], tuple(_decode(a) for a in call["args"])), call)
    fake.calls = []  # type: ignore[attr-defined]
    overrides = overrides or {}
    error_values = {f"NVMLError_{''.join(p.capitalize() for p in k[11:].split('_'))}": v for v, k in names.items()}

    def answer(fn: str, args: tuple[Any, ...]) -> Any:
        fake.calls.append(fn)  # type: ignore[attr-defined]
        entry = overrides.get(fn) or answers.get(_key(fn, args))
        assert entry is not None, f"NVML call {fn}{args} is not in the recording: update tools/record_gpu_fixtures.py"
        if "error" in entry:
            err = entry["error"]
            value = err["value"] if isinstance(err, dict) else error_values[err]
            raise NVMLError(value)
        return _decode(entry["return"])

    fns = {call["fn"] for call in doc["calls"]} | set(overrides)
    for fn in fns:

        def replay(*args: Any, _fn: str = fn) -> Any:
            return answer(_fn, args)

        replay.__name__ = fn
        setattr(fake, fn, replay)
    return fake


def with_two_gpus(idle: dict[str, Any]) -> dict[str, Any]:
    """The idle H200 recording with its device 0 answers copied to a device 1, plus topology answers
    in the recorder's format (no multi-GPU host recorded yet): NVSwitch-style, 18 active links each."""
    doc = copy.deepcopy(idle)
    calls = doc["calls"]
    extra = []
    for call in calls:
        if call["fn"] == "nvmlDeviceGetCount":
            call["return"] = 2
        if call["args"][:1] in ([0], [{"device": 0}]) and call["fn"] != "nvmlDeviceGetCount":
            twin = copy.deepcopy(call)
            twin["args"][0] = 1 if twin["args"][0] == 0 else {"device": 1}
            if twin["fn"] == "nvmlDeviceGetHandleByIndex":
                twin["return"] = {"device": 1}
            if twin["fn"] == "nvmlDeviceGetPciInfo":
                twin["return"]["fields"]["busId"] = "00000000:00:07.0"
            extra.append(twin)
    calls.extend(extra)
    for dev in (0, 1):
        for link in range(18):
            calls.append({"fn": "nvmlDeviceGetNvLinkState", "args": [{"device": dev}, link], "return": 1})
            calls.append(
                {
                    "fn": "nvmlDeviceGetNvLinkRemotePciInfo",
                    "args": [{"device": dev}, link],
                    "return": {"__struct__": "nvmlPciInfo_t", "fields": {"busId": "00000000:A5:00.0"}},
                }
            )
        calls.append(
            {
                "fn": "nvmlDeviceGetNvLinkState",
                "args": [{"device": dev}, 18],
                "error": {"name": "NVMLError_InvalidArgument", "value": 2},
            }
        )
    pair = [{"device": 0}, {"device": 1}]
    calls.append({"fn": "nvmlDeviceGetTopologyCommonAncestor", "args": pair, "return": 50})
    calls.append({"fn": "nvmlDeviceGetP2PStatus", "args": [*pair, 0], "return": 0})
    calls.append({"fn": "nvmlDeviceGetP2PStatus", "args": [*pair, 2], "return": 0})
    return doc
