"""service import → render keeps every directive of a rich hand-written unit, or refuses naming the line.

The units are compared by a parser of their own here (sections, ``Key=value`` lines, shlex for commands and
Environment=), not by servescope's; the rendered unit is also checked by the real ``systemd-analyze verify``.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servescope.cli import app

from .conftest import fake_bin, spec_text, verify

SECRET_KEY, SECRET_TOKEN = "sk-roundtrip-9f2c", "hf_roundtrip_77aa"

RICH = """\
[Unit]
Description=vLLM Qwen3 on 4 GPUs (100%% of them)
Documentation=https://docs.vllm.ai
After=network-online.target nvidia-persistenced.service local-fs.target
Wants=network-online.target
Requires=local-fs.target
StartLimitIntervalSec=7200
StartLimitBurst=4

[Service]
Type=simple
User=root
Group=root
WorkingDirectory=/srv/vllm
Environment=NCCL_PROTO=LL "NCCL_ALGO=Ring" CUDA_VISIBLE_DEVICES=0,1,2,3
Environment=VLLM_LOGGING_LEVEL=DEBUG HF_HOME=/srv/hf
Environment=HF_TOKEN={token}
EnvironmentFile=-/etc/vllm/extra.env
ExecStartPre=/bin/mkdir -p /srv/vllm/cache
ExecStartPre=/bin/bash -c 'for i in $$(seq 1 30); do used=$$(nvidia-smi --query-gpu=memory.used \\
--format=csv,noheader,nounits | sort -rn | head -1); [ "$$used" -lt 1000 ] && exit 0; sleep 1; done; exit 0'
ExecStart={bin}/python3 -m vllm.entrypoints.openai.api_server --model Qwen/Qwen3-30B-A3B \\
--tensor-parallel-size 4 --max-model-len 32768 --port 8011 --api-key {key} \\
--chat-template "{{%% if x %%}}$${{HOME}} y{{%% endif %%}}" --enable-expert-parallel
ExecStartPost=/bin/sh -c 'echo started'
ExecStop=/bin/kill -INT $MAINPID
Restart=on-failure
RestartSec=10
TimeoutStartSec=2700
TimeoutStopSec=180
KillSignal=SIGTERM
LimitNOFILE=65536
LimitMEMLOCK=infinity
Nice=-5
CPUAffinity=0-31
StandardOutput=journal
SyslogIdentifier=vllm-qwen

[Install]
WantedBy=multi-user.target graphical.target
Alias=vllm-qwen-alias.service
"""


def _directives(text: str) -> dict[tuple[str, str], list[str]]:
    """(section, key) → values in order; continuation lines joined; comments skipped."""
    found: dict[tuple[str, str], list[str]] = {}
    section = ""
    for line in text.replace("\\\n", "").splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        found.setdefault((section, key.strip()), []).append(value.strip())
    return found


def _env(values: list[str]) -> dict[str, str]:
    return dict(word.split("=", 1) for value in values for word in shlex.split(value))


def _argv(value: str) -> list[str]:
    return [w.replace("$$", "$").replace("%%", "%") for w in shlex.split(value.lstrip("-"))]


def _import_render(tmp_path: Path, text: str) -> tuple[str, str, Path]:
    unit = tmp_path / "vllm-qwen.service"
    unit.write_text(text)
    spec = tmp_path / "spec" / "vllm-qwen.toml"
    imported = CliRunner().invoke(app, ["service", "import", str(unit), "-o", str(spec), "--mkdir"])
    assert imported.exit_code == 0, imported.output
    out = tmp_path / "units" / "vllm-qwen.service"
    rendered = CliRunner().invoke(app, ["service", "render", str(spec), "-o", str(out), "--mkdir"])
    assert rendered.exit_code == 0, rendered.output
    return imported.output + rendered.output, out.read_text(), spec


def test_every_directive_of_a_rich_unit_survives_import_and_render(tmp_path: Path) -> None:
    bin_dir = fake_bin(tmp_path / "bin", "python3")
    original_text = RICH.format(bin=bin_dir, key=SECRET_KEY, token=SECRET_TOKEN)
    printed, rendered_text, spec = _import_render(tmp_path, original_text)
    original, rendered = _directives(original_text), _directives(rendered_text)

    # what the rendered unit replaces on purpose, each checked for what stands instead
    assert rendered[("Service", "Type")] == ["exec"]
    pre = [_argv(v) for v in rendered[("Service", "ExecStartPre")]]
    assert ["/bin/mkdir", "-p", "/srv/vllm/cache"] in pre and not any("nvidia-smi" in " ".join(p) for p in pre)
    assert any(p[1:3] == ["gpu", "wait-free"] for p in pre)
    post = rendered[("Service", "ExecStartPost")]
    assert post[-1] == "/bin/sh -c 'echo started'" and "health" in _argv(post[0])
    secret_env = {"HF_TOKEN": SECRET_TOKEN}
    assert _env(rendered[("Service", "Environment")]) == {
        k: v for k, v in _env(original[("Service", "Environment")]).items() if k not in secret_env}
    start = _argv(original[("Service", "ExecStart")][0])
    key_at = start.index("--api-key")
    assert _argv(rendered[("Service", "ExecStart")][0]) == start[:key_at] + start[key_at + 2:]
    for key in (("Unit", "After"), ("Unit", "Wants"), ("Install", "WantedBy")):
        assert set(original[key][0].split()) <= {w for v in rendered[key] for w in v.split()}, key
    checked = {("Service", k) for k in ("Type", "ExecStartPre", "ExecStartPost", "Environment", "ExecStart")}
    checked |= {("Unit", "After"), ("Unit", "Wants"), ("Install", "WantedBy")}

    # every other directive comes back with the same values (RestartSec=10 among them, not render's 30)
    for key, values in original.items():
        if key not in checked:
            assert rendered.get(key) == values, key
    assert rendered[("Service", "RestartSec")] == ["10"]

    # the secrets live only in the 0600 file beside the spec, never in the spec, the unit or the output
    env_file = spec.with_name("vllm-qwen.env")
    assert sorted(env_file.read_text().splitlines()) == [f"HF_TOKEN={SECRET_TOKEN}", f"VLLM_API_KEY={SECRET_KEY}"]
    for text in (printed, rendered_text, spec.read_text()):
        assert SECRET_KEY not in text and SECRET_TOKEN not in text
    assert tomllib.loads(spec.read_text())["secrets"] == ["HF_TOKEN", "VLLM_API_KEY"]
    result = verify(tmp_path / "units", "vllm-qwen.service")
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_rendered_unit_imports_back_to_itself(tmp_path: Path) -> None:
    """render → import → render gives the same unit, byte for byte: the import lost nothing render wrote."""
    bin_dir = fake_bin(tmp_path / "bin", "python3", "servescope")
    spec = tmp_path / "first.toml"
    spec.write_text(spec_text(bin_dir, name="vllm-qwen", extra='secrets = ["VLLM_API_KEY"]\nstart_margin_s = 120'))
    first = CliRunner().invoke(app, ["service", "render", str(spec)])
    assert first.exit_code == 0, first.output
    _, again, _ = _import_render(tmp_path, first.stdout)
    assert again + "\n" == first.stdout  # stdout: the unit and echo's newline


def test_a_secret_given_twice_is_refused_naming_both_places(tmp_path: Path) -> None:
    unit = tmp_path / "twice.service"
    unit.write_text("[Service]\nEnvironment=VLLM_API_KEY=env-secret-a1\n"
                    "ExecStart=/usr/bin/vllm serve m/M --max-model-len 4096 --api-key flag-secret-b2\n")
    out = tmp_path / "twice.toml"
    result = subprocess.run([sys.executable, "-m", "servescope", "service", "import", str(unit), "-o", str(out)],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"servescope: error: {unit}:3: VLLM_API_KEY is given twice: {unit}:2 (Environment=VLLM_API_KEY) and "
        f"{unit}:3 (ExecStart --api-key) (values not shown); keep one"]
    assert "env-secret-a1" not in result.stderr and "flag-secret-b2" not in result.stderr
    assert not out.exists() and not (tmp_path / "twice.env").exists()


@pytest.mark.parametrize(("line", "refused"), [
    ("ExecStart=/usr/bin/vllm serve m/M --port ${PORT}", "ExecStart= uses ${P"),
    ("ExecStart=/usr/bin/vllm serve m/M --served-model-name %i", "ExecStart= uses %i"),
    ("ExecStart=-/usr/bin/vllm serve m/M", "ExecStart= prefix '-'"),
    ("ExecStart=/usr/bin/vllm serve m/M\nType=notify", "Type=notify"),
    ("ExecStart=/usr/bin/vllm serve m/M\nKillMode=process", "KillMode=process"),
    ("ExecStart=/usr/bin/vllm serve m/M\nRestartSec=500ms", "RestartSec=500ms: the spec holds whole seconds"),
    ("ExecStart=/usr/bin/vllm serve m/M\nExecStartPost=/usr/bin/curl -H 'Authorization: Bearer sk-verbatim-31'",
     "ExecStartPost= holds a secret (value not shown)"),
])
def test_what_a_spec_cannot_carry_is_refused_naming_its_line(tmp_path: Path, line: str, refused: str) -> None:
    unit = tmp_path / "u.service"
    unit.write_text(f"[Service]\n{line}\n")
    number = 3 if "\n" in line else 2
    result = CliRunner().invoke(app, ["service", "import", str(unit)])
    assert result.exit_code == 2 and result.stdout == ""
    (message,) = result.stderr.splitlines()
    assert message.startswith(f"servescope: error: {unit}:{number}: ") and refused in message, message
    assert "sk-verbatim-31" not in result.output


def test_a_reference_to_a_secret_is_carried(tmp_path: Path) -> None:
    unit = tmp_path / "u.service"
    unit.write_text("[Service]\nExecStart=/usr/bin/vllm serve m/M\n"
                    "ExecStartPost=/usr/bin/curl -H 'Authorization: Bearer ${VLLM_API_KEY}' localhost:8000/health\n")
    result = CliRunner().invoke(app, ["service", "import", str(unit)])
    assert result.exit_code == 0, result.output
    assert tomllib.loads(result.stdout)["extra"]["Service"]["ExecStartPost"] == [
        "/usr/bin/curl -H 'Authorization: Bearer ${VLLM_API_KEY}' localhost:8000/health"]


UNCLOSED = '[Service]\nExecStart=vllm serve "unterminated\n'


@pytest.mark.parametrize("command", [["service", "lint", "--no-host"], ["service", "import"]])
def test_a_parse_error_is_one_line_naming_file_and_line(tmp_path: Path, command: list[str]) -> None:
    """The issue's repro, in a real process: no traceback, exit 2 (not lint's 1), the file and line named."""
    unit = tmp_path / "q.service"
    unit.write_text(UNCLOSED)
    result = subprocess.run([sys.executable, "-m", "servescope", *command, str(unit)], capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"servescope: error: {unit}:2: unbalanced quoting in 'vllm serve \"unterminated'"]
    checked = verify(tmp_path, "q.service")  # systemd, independently, refuses the same line
    assert "q.service:2" in checked.stdout + checked.stderr


def test_time_spans_come_back_in_seconds(tmp_path: Path) -> None:
    """TimeoutSec= sets both timeouts (systemd.service(5)); spans with units are read as systemd does."""
    unit = tmp_path / "u.service"
    unit.write_text("[Unit]\nStartLimitIntervalSec=2h\n[Service]\nExecStart=/usr/bin/vllm serve m/M\n"
                    "TimeoutSec=45min\nRestartSec=1min 30s\n")
    spec = tmp_path / "u.toml"
    assert CliRunner().invoke(app, ["service", "import", str(unit), "-o", str(spec)]).exit_code == 0
    rendered = _directives(CliRunner().invoke(app, ["service", "render", str(spec)]).stdout)
    assert rendered[("Service", "TimeoutStartSec")] == [str(45 * 60)]
    assert rendered[("Service", "TimeoutStopSec")] == [str(45 * 60)]
    assert rendered[("Service", "RestartSec")] == [str(60 + 30)]
    assert rendered[("Unit", "StartLimitIntervalSec")] == [str(2 * 3600)]


def test_drop_ins_beside_the_unit_are_carried_naming_their_file(tmp_path: Path) -> None:
    """systemd applies UNIT.d/*.conf after the unit: import does too, and a note names the drop-in's line."""
    unit = tmp_path / "u.service"
    unit.write_text("[Service]\nType=simple\nExecStart=/usr/bin/vllm serve m/M\nRestartSec=5\n")
    dropins = tmp_path / "u.service.d"
    dropins.mkdir()
    (dropins / "10-tune.conf").write_text("[Service]\nRestartSec=10\nEnvironment=NCCL_ALGO=Tree\nType=exec\n")
    result = CliRunner().invoke(app, ["service", "import", str(unit)])
    assert result.exit_code == 0, result.output
    spec = tomllib.loads(result.stdout)
    assert (spec["restart"]["delay_s"], spec["env"]) == (10, {"NCCL_ALGO": "Tree"})
    assert f"# {dropins / '10-tune.conf'}:4 Type=exec: " in result.stdout
