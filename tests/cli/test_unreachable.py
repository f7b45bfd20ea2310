"""A server that does not answer: health is a finding (exit 1, JSON with --json), profile names the refused port
first, settings says which sources it could not read instead of 'No drift'. Real processes, a real dead port."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from httpd import serving
from servescope.core.settings import SettingsDoc, SourceNote
from servescope.report.settings import render_settings


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _servescope(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "servescope", *argv], capture_output=True, text=True, timeout=120)


def test_health_on_a_refused_port_is_not_ready_exit_1() -> None:
    url = _dead_url()
    human = _servescope("health", url)
    assert human.returncode == 1, human.stderr
    assert human.stdout.startswith(f"{url}: unreachable") and "connection refused" in human.stdout
    done = _servescope("health", url, "--json")
    assert done.returncode == 1
    doc = json.loads(done.stdout)
    assert (doc["ready"], doc["phase"], doc["url"]) == (False, "unreachable", url)
    assert "connection refused" in doc["checks"][0]["detail"]


def test_health_bad_input_is_still_exit_2() -> None:
    done = _servescope("health", "ftp://x")
    assert done.returncode == 2 and done.stdout == ""


def test_profile_names_the_refused_port_before_the_trace_directory(tmp_path: Path) -> None:
    url = _dead_url()
    for extra in ([], ["--trace-dir", str(tmp_path)]):
        done = _servescope("profile", url, *extra)
        assert done.returncode == 2
        [line] = done.stderr.strip().splitlines()
        assert f"{url}: connection refused: nothing listens on 127.0.0.1:{url.rsplit(':', 1)[1]}" in line
        assert "--trace-dir" not in line


def _doc(*read: str) -> SettingsDoc:
    notes = [SourceNote(name=n, ok=n in read, detail="read" if n in read else f"no {n} answered")
             for n in ("unit", "process", "server")]
    return SettingsDoc(servescope_version="0", taken_at="t", engine=None, unit=None, pid=None, url=None,
                       sources=notes, groups=[], drift=[])


@pytest.mark.parametrize(("read", "expected"), [
    ((), "Drift not checked: none of the unit, process and server was read (could not read the unit: no unit "
         "answered; the running process: no process answered; the server: no server answered)"),
    (("server",), "Drift not checked: only the server was read (could not read the unit: no unit answered; the "
                  "running process: no process answered)"),
    (("unit", "server"), "No drift between the unit and the server; not checked against the running process: no "
                         "process answered"),
    (("unit", "process", "server"), "No drift: the unit and the running process and the server agree."),
])
def test_settings_says_what_it_could_not_compare(read: tuple[str, ...], expected: str) -> None:
    console = Console(record=True, width=400, highlight=False)
    render_settings(_doc(*read), console)
    assert console.export_text().strip().splitlines()[-1] == expected


def test_settings_cli_with_nothing_answering_does_not_claim_agreement() -> None:
    done = _servescope("settings", "--url", _dead_url())
    assert "No drift" not in done.stdout + done.stderr
    # with a vLLM process on this machine it compares what it could read; with none it says so and stops
    assert "not checked" in done.stdout or (done.returncode == 2 and "no vLLM/SGLang server process found"
                                             in done.stderr)


def test_a_404_on_server_info_is_not_taken_for_a_non_openai_server() -> None:
    """A real HTTP server that answers /version and /v1/models but not /server_info (vLLM without dev mode)."""
    from http.server import BaseHTTPRequestHandler

    from servescope.server.reported import read_server_record

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = {"/version": b'{"version": "0.32.0"}', "/v1/models": b'{"data": [{"id": "m"}]}'}.get(
                self.path.split("?")[0])
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body or b'{"detail": "Not Found"}')

        def log_message(self, *args: object) -> None:
            pass

    with serving(Handler) as url:
        record = read_server_record(url, timeout_s=5.0)
    info = next(e for e in record.endpoints if e.path == "/server_info")
    assert not info.ok and "not served here (vLLM serves /server_info only with VLLM_SERVER_DEV_MODE=1" in info.detail
    assert "OpenAI-compatible" not in info.detail
    assert next(e for e in record.endpoints if e.path == "/v1/models").ok
