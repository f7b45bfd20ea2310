"""Terminal view of a health result: exact text at a fixed width, N/A for a missing max_model_len."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from servescope.core.document import decode_as, encode
from servescope.core.errors import InputError
from servescope.core.health import Check, HealthResult, ProcessInfo
from servescope.report.health import render_health


def _render(result: HealthResult) -> str:
    buf = io.StringIO()
    render_health(result, Console(file=buf, width=100, color_system=None, highlight=False))
    return buf.getvalue()


def _result(**changes: object) -> HealthResult:
    base = dict(
        servescope_version="0.1.0", checked_at="2026-01-01T00:00:00+00:00", url="http://127.0.0.1:8000",
        ready=True, phase="ready", model="tiny-llama", max_model_len=256, elapsed_s=42.25, waited=True,
        timed_out=False,
        checks=[Check(name="health", ok=True, detail="HTTP 200"),
                Check(name="models", ok=True, detail="tiny-llama, max_model_len 256"),
                Check(name="completion", ok=True, detail="1 token in 0.02 s")],
    )
    base.update(changes)
    return HealthResult(**base)  # type: ignore[arg-type]


def test_ready() -> None:
    assert _render(_result()) == (
        "http://127.0.0.1:8000: ready  model tiny-llama  max_model_len 256  (waited 42.2 s)\n"
        "ok  health      HTTP 200\n"
        "ok  models      tiny-llama, max_model_len 256\n"
        "ok  completion  1 token in 0.02 s\n"
    )


def test_crashed_shows_process_and_log_tail() -> None:
    result = _result(ready=False, phase="crashed", model=None, max_model_len=None, elapsed_s=3.0,
                     checks=[Check(name="health", ok=False, detail="connection refused; process 7 exited "
                                                                   "(killed by signal 9; a zombie)")],
                     process=ProcessInfo(pid=7, alive=False, state="Z", exit_status=9,
                                         detail="process 7 exited (killed by signal 9; a zombie)"),
                     log_path="/var/log/vllm.log", log_tail=["loading weights", "Killed"])
    assert _render(result) == (
        "http://127.0.0.1:8000: crashed  (waited 3.0 s)\n"
        "FAIL  health  connection refused; process 7 exited (killed by signal 9; a zombie)\n"
        "process: process 7 exited (killed by signal 9; a zombie)\n"
        "last 2 log lines of /var/log/vllm.log:\n"
        "  loading weights\n"
        "  Killed\n"
    )


def test_missing_max_model_len_is_na_and_timeout_is_said() -> None:
    result = _result(ready=False, phase="not ready", max_model_len=None, timed_out=True, waited=False)
    assert _render(result).splitlines()[0] == (
        "http://127.0.0.1:8000: not ready  model tiny-llama  max_model_len N/A  (took 42.2 s, timed out)")


def test_json_round_trip_keeps_null() -> None:
    result = _result(max_model_len=None)
    data = encode(result)
    assert b'"max_model_len": null' in data
    assert decode_as(data, "x.json", HealthResult) == result


def test_decode_rejects_other_documents() -> None:
    with pytest.raises(InputError, match=r"^x.json: not a servescope health result"):
        decode_as(b'{"schema": "servescope.analysis"}', "x.json", HealthResult)
