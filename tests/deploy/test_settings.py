"""settings: the example unit (+ drop-ins) and real processes read through /proc; drift; redaction; bad input.

The "server" here is a real process whose command line looks like ``vllm serve`` (a script named ``vllm``
that sleeps); the live vLLM server is in tests/server/test_settings_live.py.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from servescope.cli import app
from servescope.core.document import encode
from servescope.core.settings import SettingsDoc
from servescope.deploy.effective import effective_settings
from servescope.deploy.installed import read_unit_settings
from servescope.report.settings import render_settings
from servescope.server.process import find_processes, read_process_record
from servescope.server.settings import (
    SettingsRequest,
    choose_pid,
    is_server_argv,
    pick_process,
    read_settings,
    server_url,
)

from .conftest import example_text

API_KEY = "sk-settings-test-4f8a1c9e"
HF_TOKEN = "hf_settingsSecret123xyz"
DB_PASSWORD = "pw-settings-77d1"
SECRETS = (API_KEY, HF_TOKEN, DB_PASSWORD)
MODEL = "moonshotai/Kimi-K2.5"
# The example's ExecStart flags plus many more, so a cut-off line would lose some.
EXTRA_FLAGS = ["--max-num-seqs", "64", "--kv-cache-dtype", "fp8", "--enable-expert-parallel",
               "--pipeline-parallel-size", "1", "--data-parallel-size", "1", "--quantization", "compressed-tensors",
               "--served-model-name", "kimi-k25", "--port", "8011", "--host", "0.0.0.0",
               "--tokenizer", "moonshotai/Kimi-K2.5", "--max-num-batched-tokens", "8192",
               "--enable-auto-tool-choice", "--tool-call-parser", "kimi_k2", "--reasoning-parser", "kimi_k2",
               "--api-key", API_KEY]
runner = CliRunner()


def _example_exec_start_flags() -> list[str]:
    """The example's ExecStart words after the entry-point module, split by shlex (an independent route)."""
    line = next(x for x in example_text().splitlines() if x.startswith("ExecStart="))
    words = shlex.split(line[len("ExecStart="):])
    return words[words.index("vllm.entrypoints.openai.api_server") + 1:]


def _pairs(words: list[str]) -> list[tuple[str, str]]:
    """(flag, value) from words as a person reads them: a flag takes the next word unless that is a flag."""
    out = []
    for i, word in enumerate(words):
        if word.startswith("--"):
            nxt = words[i + 1] if i + 1 < len(words) else "--"
            out.append((word, "" if nxt.startswith("--") else nxt))
    return out


def _write_unit(folder: Path, *, flags: list[str], program: list[str], env_lines: str = "",
                name: str = "vllm-kimi.service") -> Path:
    text = example_text()
    start = next(x for x in text.splitlines() if x.startswith("ExecStart="))
    text = text.replace(start, "ExecStart=" + shlex.join([*program, *flags]))
    text = text.replace("Environment=NCCL_P2P_LEVEL=SYS", f"Environment=NCCL_P2P_LEVEL=SYS\n{env_lines}".rstrip())
    unit = folder / name
    unit.write_text(text)
    return unit


def _fake_vllm(folder: Path, *, fork: bool = False) -> Path:
    """An executable named ``vllm``: ``vllm serve ...`` shows in /proc as ``python .../vllm serve ...``;
    with ``fork`` it forks once, as a forked worker keeps its parent's command line."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "vllm"
    script.write_text(f"#!{sys.executable}\nimport os, time\n{'os.fork()' if fork else ''}\ntime.sleep(300)\n")
    script.chmod(0o755)
    return script


class Started:
    def __init__(self, proc: subprocess.Popen[bytes], argv: list[str], env: dict[str, str]) -> None:
        self.proc, self.argv, self.env = proc, argv, env

    @property
    def pid(self) -> int:
        return self.proc.pid


StartServer = Callable[..., Started]


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[StartServer]:
    """Start real processes with a vllm-like argv and env; wait until /proc shows the argv; kill at the end."""
    started: list[subprocess.Popen[bytes]] = []

    def start(flags: list[str], env: dict[str, str], *, fork: bool = False) -> Started:
        script = _fake_vllm(tmp_path / ("fork" if fork else "bin"), fork=fork)
        argv = [str(script), "serve", MODEL, *flags]
        full_env = {"PATH": os.environ["PATH"], **env}
        proc = subprocess.Popen(argv, env=full_env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                start_new_session=True)
        started.append(proc)
        deadline = time.monotonic() + 10
        cmdline = Path(f"/proc/{proc.pid}/cmdline")
        while cmdline.read_bytes().split(b"\0")[1:-1] != [a.encode() for a in argv]:  # the script runs
            assert time.monotonic() < deadline
            time.sleep(0.01)
        return Started(proc, argv, full_env)

    yield start
    for proc in started:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the forked child too
        proc.wait()


def _group(doc: dict[str, Any], group_id: str) -> dict[str, dict[str, Any]]:
    for group in doc["groups"]:
        if group["id"] == group_id:
            return {s["key"]: s for s in group["settings"]}
    return {}


def _settings(*args: str) -> tuple[str, dict[str, Any]]:
    """(text output, JSON document) of ``servescope settings ARGS``; both must succeed."""
    text = runner.invoke(app, ["settings", *args], env={"COLUMNS": "400"})  # every row on one line at this width
    assert text.exit_code == 0, text.output
    as_json = runner.invoke(app, ["settings", *args, "--json"])
    assert as_json.exit_code == 0, as_json.output
    return text.stdout, json.loads(as_json.stdout)


def _assert_no_secret(*outputs: str) -> None:
    for out in outputs:
        for secret in SECRETS:
            assert secret not in out


@pytest.mark.needs_shared
def test_unit_file_shows_every_flag_and_the_dropin_override(tmp_path: Path, start_server: StartServer) -> None:
    flags = _example_exec_start_flags() + EXTRA_FLAGS
    unit = _write_unit(tmp_path, flags=flags, program=[str(_fake_vllm(tmp_path / "bin")), "serve", MODEL],
                       env_lines=f"Environment=HF_TOKEN={HF_TOKEN} VLLM_USE_V1=1")
    dropins = tmp_path / "vllm-kimi.service.d"
    dropins.mkdir()
    (dropins / "10-nccl.conf").write_text("[Service]\nEnvironment=NCCL_ALGO=Tree\nTimeoutStartSec=3600\n")
    (dropins / "20-more.conf").write_text("[Service]\nEnvironment=NCCL_DEBUG=INFO\n")
    # The process runs exactly the unit's command and environment: no drift expected.
    server = start_server(flags, {"NCCL_PROTO": "LL", "NCCL_ALGO": "Tree", "NCCL_P2P_LEVEL": "SYS",
                                  "NCCL_DEBUG": "INFO", "HF_TOKEN": HF_TOKEN, "VLLM_USE_V1": "1"})
    text, doc = _settings("--unit-file", str(unit), "--pid", str(server.pid))
    _assert_no_secret(text, json.dumps(doc))

    every = {**_group(doc, "engine"), **_group(doc, "parallelism"), **_group(doc, "model"), **_group(doc, "memory")}
    lines = text.splitlines()
    for flag, value in _pairs(flags):
        assert flag in every, flag
        if flag == "--api-key":
            assert every[flag]["value"] == "***"
            continue
        assert every[flag]["value"] == value, flag
        assert any(line.split()[:2] == [flag, value or "(set)"] for line in lines), flag  # one row, uncut
    command_line = _group(doc, "engine")["command line"]["value"]
    assert shlex.split(command_line)[1:] == [*server.argv[:-1], "***"]  # the whole argv, secret masked
    assert _group(doc, "model")["model"]["value"] == MODEL

    # Grouping of known flags, from the flags' meaning.
    assert {"--tensor-parallel-size", "--enable-expert-parallel", "--pipeline-parallel-size",
            "--data-parallel-size"} <= set(_group(doc, "parallelism"))
    assert {"--max-model-len", "--gpu-memory-utilization", "--kv-cache-dtype", "--max-num-seqs",
            "--max-num-batched-tokens"} <= set(_group(doc, "memory"))
    assert {"--quantization", "--trust-remote-code", "--served-model-name", "--tokenizer"} <= set(_group(doc, "model"))
    nccl = _group(doc, "nccl_cuda_env")
    assert {k: nccl[k]["value"] for k in ("NCCL_PROTO", "NCCL_ALGO", "NCCL_P2P_LEVEL", "NCCL_DEBUG")} == \
        {"NCCL_PROTO": "LL", "NCCL_ALGO": "Tree", "NCCL_P2P_LEVEL": "SYS", "NCCL_DEBUG": "INFO"}
    assert nccl["NCCL_ALGO"]["origin"] == f"{dropins / '10-nccl.conf'}:2"  # the drop-in's override
    assert _group(doc, "vllm_env")["VLLM_USE_V1"]["value"] == "1"
    assert _group(doc, "other")["HF_TOKEN"]["value"] == "***"

    service = _group(doc, "service")
    assert service["drop-in 1"]["value"] == str(dropins / "10-nccl.conf")
    assert service["drop-in 2"]["value"] == str(dropins / "20-more.conf")
    assert service["TimeoutStartSec"]["value"] == "3600"
    assert service["Type"]["value"] == "simple" and service["User"]["value"] == "root"
    assert "seq 1 30" in service["ExecStartPre"]["value"] and "$(seq" in service["ExecStartPre"]["value"]
    assert doc["drift"] == []


@pytest.mark.needs_shared
def test_drift_between_the_unit_on_disk_and_the_running_process(tmp_path: Path, start_server: StartServer) -> None:
    running = ["--tensor-parallel-size", "8", "--max-model-len", "65536", "--enforce-eager", "--api-key", API_KEY]
    server = start_server(running, {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS",
                                    "NCCL_IB_DISABLE": "1", "HF_TOKEN": HF_TOKEN})
    on_disk = ["--tensor-parallel-size", "8", "--max-model-len", "131072", "--trust-remote-code",
               "--api-key", API_KEY]
    unit = _write_unit(tmp_path, flags=on_disk, program=[str(tmp_path / "bin" / "vllm"), "serve", MODEL],
                       env_lines=f"Environment=HF_TOKEN=hf_otherSecret99 DB_PASSWORD={DB_PASSWORD}")
    (tmp_path / "vllm-kimi.service.d").mkdir()
    dropin = tmp_path / "vllm-kimi.service.d" / "override.conf"
    dropin.write_text("[Service]\nEnvironment=NCCL_PROTO=Simple\n")
    started = read_process_record(server.pid).start_time
    assert started is not None
    os.utime(dropin, (started + 120, started + 120))  # edited two minutes after the start
    os.utime(unit, (started - 120, started - 120))  # written before it

    text, doc = _settings("--unit-file", str(unit), "--pid", str(server.pid))
    _assert_no_secret(text, json.dumps(doc))
    assert "hf_otherSecret99" not in text + json.dumps(doc)
    drift = {(d["kind"], d["key"]): d for d in doc["drift"]}
    assert drift[("arg", "--max-model-len")]["values"] == {"unit": "131072", "process": "65536"}
    assert drift[("arg", "--enforce-eager")]["values"] == {"unit": None, "process": "(set)"}
    assert drift[("arg", "--trust-remote-code")]["values"] == {"unit": "(set)", "process": None}
    assert drift[("env", "NCCL_PROTO")]["values"] == {"unit": "Simple", "process": "LL"}
    assert drift[("env", "NCCL_IB_DISABLE")]["values"] == {"unit": None, "process": "1"}
    assert drift[("env", "HF_TOKEN")]["values"] == {"unit": "***", "process": "***"}
    assert drift[("env", "DB_PASSWORD")]["values"] == {"unit": "***", "process": None}
    assert ("unit_changed", str(dropin)) in drift and ("unit_changed", str(unit)) not in drift
    assert ("arg", "--tensor-parallel-size") not in drift and ("arg", "--api-key") not in drift
    assert ("env", "NCCL_ALGO") not in drift and ("env", "PATH") not in drift
    # The text names each item.
    for kind, key in drift:
        assert any(line.split()[:2] == [kind, key] for line in text.splitlines()), (kind, key)
    # What runs wins; the unit-only flag is still listed.
    assert _group(doc, "memory")["--max-model-len"]["value"] == "65536"
    assert _group(doc, "model")["--trust-remote-code"]["source"] == "unit only (not running)"


@pytest.mark.needs_shared
def test_unit_by_name_through_systemctl_cat_and_its_main_pid(tmp_path: Path, start_server: StartServer,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    flags = ["--tensor-parallel-size", "2", "--max-model-len", "4096"]
    server = start_server(flags, {"NCCL_PROTO": "LL"})
    unit = _write_unit(tmp_path, flags=flags, program=[str(tmp_path / "bin" / "vllm"), "serve", MODEL],
                       name="kimi.service")
    dropin = tmp_path / "kimi.service.d" / "override.conf"
    dropin.parent.mkdir()
    dropin.write_text("[Service]\nEnvironment=NCCL_ALGO=Ring\n")
    # A real executable answering `cat` and `show` as systemctl does (systemd is not PID 1 here).
    fake = tmp_path / "fake" / "systemctl"
    fake.parent.mkdir()
    fake.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import sys
        args = [a for a in sys.argv[1:] if a != "--no-pager"]
        if args[:2] == ["cat", "kimi.service"]:
            for path in ({str(unit)!r}, {str(dropin)!r}):
                print("# " + path)
                print(open(path).read())
        elif args[:2] == ["show", "kimi.service"]:
            print("MainPID={server.pid}\\nActiveState=active\\nSubState=running\\nNeedDaemonReload=yes")
        else:
            sys.stderr.write("Unit " + args[-1] + " could not be found.\\n")
            sys.exit(1)
        """))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    text, doc = _settings("--unit", "kimi")
    assert doc["pid"] == server.pid and doc["unit"] == "kimi.service"
    service = _group(doc, "service")
    assert service["unit"]["origin"] == "systemctl cat" and service["drop-in 1"]["value"] == str(dropin)
    assert service["systemd MainPID"]["value"] == str(server.pid)
    kinds = {(d["kind"], d["key"]) for d in doc["drift"]}
    assert ("daemon_reload", "kimi.service") in kinds
    assert ("env", "NCCL_ALGO") in kinds  # the drop-in sets it, the process does not have it
    assert ("arg", "--max-model-len") not in kinds


@pytest.mark.needs_shared
def test_unit_by_name_without_systemd_reads_the_unit_path(tmp_path: Path, start_server: StartServer,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    flags = ["--tensor-parallel-size", "4"]
    server = start_server(flags, {})
    units = tmp_path / "units"
    units.mkdir()
    _write_unit(units, flags=flags, program=[str(tmp_path / "bin" / "vllm"), "serve", MODEL], name="kimi.service")
    (units / "kimi.service.d").mkdir()
    (units / "kimi.service.d" / "x.conf").write_text("[Service]\nRestart=always\n")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no systemctl
    monkeypatch.setenv("SYSTEMD_UNIT_PATH", str(units))
    _, doc = _settings("--unit", "kimi.service", "--pid", str(server.pid))
    service = _group(doc, "service")
    assert service["unit"]["value"] == str(units / "kimi.service") and service["unit"]["origin"] == "file"
    assert service["Restart"]["value"] == "always"
    assert service["Restart"]["origin"] == f"{units / 'kimi.service.d' / 'x.conf'}:2"
    missing = runner.invoke(app, ["settings", "--unit", "nope", "--pid", str(server.pid)])
    assert missing.exit_code == 2 and "nope" in missing.output and len(missing.output.strip().splitlines()) == 1


@pytest.mark.needs_shared
def test_finding_the_server_process_by_scanning_proc(tmp_path: Path, start_server: StartServer) -> None:
    flags = ["--tensor-parallel-size", "2", "--port", "18123", "--served-model-name", f"scan-{os.getpid()}"]
    server = start_server(flags, {})
    seen = find_processes(is_server_argv)
    assert server.pid in {p.pid for p in seen}
    assert os.getpid() not in {p.pid for p in seen}  # pytest is no server
    unit = read_unit_settings(path=_write_unit(tmp_path, flags=flags, program=[str(tmp_path / "bin" / "vllm"),
                                                                               "serve", MODEL]))
    # Other vLLM servers may run on this machine: the unit's command line picks ours.
    assert choose_pid(pid=None, unit=unit, scan=lambda: find_processes(is_server_argv)) == \
        (server.pid, "found in /proc: it runs the unit's command line")
    assert server_url(server.argv) == "http://127.0.0.1:18123"


def test_forked_children_with_the_same_command_line_count_once(start_server: StartServer) -> None:
    parent = start_server(["--tensor-parallel-size", "2", "--port", "18124"], {}, fork=True)
    deadline = time.monotonic() + 10
    while len(ours := [p for p in find_processes(is_server_argv) if parent.pid in (p.pid, p.ppid)]) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert {p.argv[1:] == parent.argv for p in ours} == {True}  # the child has the same command line
    assert pick_process(ours, None) == parent.pid


@pytest.mark.needs_shared
def test_secrets_in_free_text_are_masked(tmp_path: Path, start_server: StartServer) -> None:
    flags = ["--tensor-parallel-size", "2", f"--hf-token={HF_TOKEN}", "--api-key", API_KEY]
    server = start_server(flags, {"HF_TOKEN": HF_TOKEN, "MY_SERVICE_SECRET": DB_PASSWORD})
    unit = _write_unit(tmp_path, flags=flags, program=[str(tmp_path / "bin" / "vllm"), "serve", MODEL])
    text = unit.read_text().replace(
        "ExecStartPre=", f"ExecStartPre=/bin/sh -c 'curl -H \"Authorization: Bearer {API_KEY}\" "
                         f"https://admin:{DB_PASSWORD}@example.com/ready'\nExecStartPre=", 1)
    unit.write_text(text)
    out, doc = _settings("--unit-file", str(unit), "--pid", str(server.pid))
    _assert_no_secret(out, json.dumps(doc))
    assert "Bearer ***" in out and "://***@example.com" in out
    assert _group(doc, "engine")["--hf-token"]["value"] == "***"
    assert _group(doc, "other")["MY_SERVICE_SECRET"]["value"] == "***"


@pytest.mark.needs_shared
def test_narrow_terminal_wraps_but_never_cuts(tmp_path: Path) -> None:
    flags = _example_exec_start_flags() + EXTRA_FLAGS
    record = read_unit_settings(path=_write_unit(tmp_path, flags=flags, program=["/usr/bin/vllm", "serve", MODEL]))
    doc = effective_settings(unit=record, process=None, server=None, gpus=None)
    assert isinstance(doc, SettingsDoc) and doc.engine == "vllm"
    buffer = io.StringIO()
    render_settings(doc, Console(file=buffer, width=60, color_system=None))
    lines = buffer.getvalue().splitlines()
    whole = shlex.join(["/usr/bin/vllm", "serve", MODEL, *flags[:-1]]) + " ***"
    # At 60 columns the value wraps at spaces, beside the setting or on the lines below it (stacked): read the
    # row's lines back without the setting, its source and where. Wrapping moves words, breaks and drops none.
    row = next(i for i, line in enumerate(lines) if line.startswith("command line"))
    end = next(i for i in range(row + 1, len(lines)) if lines[i][:1].strip())  # the next setting
    where = next(s.origin for g in doc.groups for s in g.settings if s.key == "command line") or ""
    words = " ".join(lines[row:end]).split()[2:]
    words.remove("unit")
    at = next((i, j) for i in range(len(words)) for j in range(i + 1, len(words) + 1)
              if "".join(words[i:j]) == where)  # where: one word, folded where longer than its room
    del words[at[0]:at[1]]
    assert end - row > 1 and max(len(line.rstrip()) for line in lines) <= 60  # it did wrap, and fits
    assert words == whole.split()
    assert "…" not in buffer.getvalue() and "..." not in buffer.getvalue()
    assert API_KEY not in buffer.getvalue()


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, start_server: StartServer) -> None:
    server = start_server(["--port", "18125"], {})
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())  # pids are below it: no such process
    cases = [
        (["--unit-file", str(tmp_path / "missing.service"), "--pid", str(server.pid)], "missing.service"),
        (["--pid", str(pid_max)], f"--pid {pid_max}: no such process"),
        (["--pid", str(server.pid), "--url", "ftp://127.0.0.1:1"], "ftp://127.0.0.1:1"),
        (["--pid", str(server.pid), "--url", "http://127.0.0.1:99999"], "127.0.0.1:99999"),
    ]
    cases.append((["--unit", "x", "--unit-file", str(tmp_path / "x.service")], "--unit or --unit-file"))
    broken = tmp_path / "broken.service"
    broken.write_text("[Service]\nExecStart /usr/bin/vllm serve x\n")
    cases.append((["--unit-file", str(broken), "--pid", str(server.pid)], f"{broken}:2: missing '='"))
    for args, named in cases:
        result = runner.invoke(app, ["settings", *args])
        assert result.exit_code == 2, (args, result.output)
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("servescope: error: ") and named in lines[0], lines


def test_unreachable_server_is_a_note_not_an_error(start_server: StartServer) -> None:
    server = start_server(["--port", "1", "--host", "127.0.0.1"], {})  # nothing listens on port 1
    _, doc = _settings("--pid", str(server.pid))
    assert doc["url"] == "http://127.0.0.1:1"
    note = {s["name"]: s for s in doc["sources"]}["server"]
    assert not note["ok"] and "refused" in note["detail"]
    assert doc["drift"] == []


def test_read_settings_is_the_command_without_the_cli(start_server: StartServer) -> None:
    """``settings --pid P --all-env --json`` prints read_settings(SettingsRequest(pid=P, all_env=True)): the whole
    command is one feature call with a typed request."""
    server = start_server(["--tensor-parallel-size", "2", "--api-key", API_KEY, "--port", "1"], {"HF_TOKEN": HF_TOKEN})
    _, printed = _settings("--pid", str(server.pid), "--all-env")
    doc = read_settings(SettingsRequest(pid=server.pid, all_env=True))
    assert doc.all_env and doc.pid == server.pid and doc.url == "http://127.0.0.1:1"
    assert {**json.loads(encode(doc)), "taken_at": None} == {**printed, "taken_at": None}
    _assert_no_secret(encode(doc).decode())


def test_subprocess_smoke(start_server: StartServer) -> None:
    server = start_server(["--tensor-parallel-size", "2", "--api-key", API_KEY, "--port", "1"], {"HF_TOKEN": HF_TOKEN})
    done = subprocess.run([sys.executable, "-m", "servescope", "settings", "--pid", str(server.pid)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "--tensor-parallel-size" in done.stdout and "Parallelism (TP/PP/DP/EP)" in done.stdout
    _assert_no_secret(done.stdout, done.stderr)


@pytest.mark.needs_shared
def test_gpus_from_a_real_nvidia_smi_recording() -> None:
    from gpu.gpu_inputs import holding_snapshot, plain_numbers

    snapshot = holding_snapshot()  # the H200 recording, parsed by gpu/smi
    used_mib, _, _, _ = plain_numbers()  # the same figure read from nvidia-smi's plain table by regex
    doc = effective_settings(unit=None, process=None, server=None, gpus=snapshot.gpus)
    gpus = {s.key: s.value for g in doc.groups if g.id == "gpus" for s in g.settings}
    assert list(gpus) == [f"GPU{g.index}" for g in snapshot.gpus]
    assert f"memory {used_mib} MiB used" in (gpus["GPU0"] or "")
    assert {n.name: n.ok for n in doc.sources} == {"unit": False, "process": False, "server": False, "gpus": True}


def test_environ_of_another_users_process_is_one_line_exit_2(start_server: StartServer) -> None:
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    if os.geteuid() == 0:
        probe = subprocess.run([*nobody, sys.executable, "-c", "import servescope"], capture_output=True, text=True,
                               timeout=60, check=False)
        if probe.returncode != 0:  # e.g. a checkout inside a 0700 folder (mktemp -d)
            pytest.skip(f"`nobody` cannot import servescope from this checkout: {probe.stderr.strip()[-200:]}")
    if os.geteuid() == 0:  # root reads every environ: look as `nobody` at our own process
        server = start_server(["--port", "18126"], {"HF_TOKEN": HF_TOKEN})
        target, prefix = server.pid, nobody
    else:  # an ordinary user cannot read PID 1's
        target, prefix = 1, []
    done = subprocess.run([*prefix, sys.executable, "-m", "servescope", "settings", "--pid", str(target)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    me = 65534 if os.geteuid() == 0 else os.geteuid()
    owner = int(Path(f"/proc/{target}/status").read_text().split("Uid:")[1].split()[0])
    assert done.stderr.strip() == (f"servescope: error: /proc/{target}/environ: permission denied: process {target} "
                                   f"belongs to uid {owner}, not to you (uid {me}); run as root or as the service's "
                                   "user")
    assert done.stdout == "" and HF_TOKEN not in done.stderr
