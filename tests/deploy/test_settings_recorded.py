"""`settings` on the real server's recording: the lent H200 running vLLM 0.26 in a container (88 unrelated
variables, one of them ~1,000 characters), as `settings --pid --url --json` wrote it there on 2026-12-03
(tests/data/h200-vllm/recorded/settings-dense.json; the lent machine's two home paths replaced by /srv/…).
"""

from __future__ import annotations

import io
import json

import msgspec
import pytest
from rich.console import Console

from servescope.core.settings import SettingsDoc, is_serving_env
from servescope.report.settings import render_settings
from tracefiles import ROOT

RECORDING = ROOT / "tests" / "data" / "h200-vllm" / "recorded" / "settings-dense.json"


def _render(width: int, *, all_env: bool) -> list[str]:
    doc = msgspec.json.decode(RECORDING.read_bytes(), type=SettingsDoc)
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, color_system=None, highlight=False)
    render_settings(doc, console, all_env=all_env, serving=is_serving_env)
    return buffer.getvalue().splitlines()


@pytest.mark.parametrize("width", [80, 120, 200])
def test_the_real_servers_settings_fit_and_keep_to_serving(width: int) -> None:
    raw = json.loads(RECORDING.read_text(encoding="utf-8"))
    other = next(g for g in raw["groups"] if g["title"] == "Other environment")["settings"]
    unrelated = [s["key"] for s in other if not is_serving_env(s["key"])]
    env = [s for g in raw["groups"] if "environment" in g["title"] for s in g["settings"]]
    longest = max(env, key=lambda s: len(s["value"]))
    assert len(unrelated) > 50 and len(longest["value"]) > 500  # what the issue saw, in the plain recording
    lines = _render(width, all_env=False)
    assert max(len(line) for line in lines) <= width
    text = "\n".join(lines)
    assert f"+{len(unrelated)} other" in text  # counted, not listed
    assert longest["value"][:200] not in text.replace("\n", "")  # shortened, saying so
    assert "--model" in text and "VLLM" in text  # what matters to serving stays


def test_all_env_shows_every_variable_of_the_recording() -> None:
    raw = json.loads(RECORDING.read_text(encoding="utf-8"))
    keys = [s["key"] for g in raw["groups"] if "environment" in g["title"] for s in g["settings"]]
    text = "\n".join(_render(200, all_env=True))
    assert all(key in text for key in keys)
