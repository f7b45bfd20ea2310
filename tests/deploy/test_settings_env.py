"""settings --pid on a container's environment: only what matters to serving, the rest counted, long values
shortened, secrets masked (issue 14: the real H200 server's process had 84 unrelated container variables and
one 1,900-character value that widened every row)."""

from __future__ import annotations

import io
import re

from rich.console import Console
from typer.testing import CliRunner

from servescope.cli import app
from servescope.core.settings import ProcessRecord, is_serving_env
from servescope.deploy.effective import effective_settings
from servescope.report.settings import ENV_VALUE_MAX, render_settings

HF_TOKEN = "hf_envTestSecret9k2"
SERVING = {
    "VLLM_USE_V1": "1", "VLLM_WORKER_MULTIPROC_METHOD": "spawn", "NCCL_DEBUG": "WARN", "CUDA_VISIBLE_DEVICES": "0",
    "TORCH_CUDA_ARCH_LIST": "9.0", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "HF_HOME": "/data/hf",
    "HF_TOKEN": HF_TOKEN, "OMP_NUM_THREADS": "8", "TRITON_CACHE_DIR": "/tmp/triton",
    "LD_LIBRARY_PATH": ":".join(f"/opt/lib{i:03d}/cuda/targets/x86_64-linux/lib" for i in range(45)),
}
# a container's own variables: orchestration, service discovery, a long colour table
UNRELATED = {f"SVC_{i:02d}_SERVICE_HOST": f"10.0.{i}.1" for i in range(40)}
UNRELATED |= {f"SVC_{i:02d}_SERVICE_PORT": str(8000 + i) for i in range(40)}
UNRELATED |= {"HOSTNAME": "gpu-worker-7", "container": "oci", "TERM": "xterm",
              "LS_COLORS": "".join(f"*.ext{i:03d}=01;3{i % 8}:" for i in range(160))}


def _doc() -> object:
    proc = ProcessRecord(pid=4242, ppid=1, argv=["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server",
                                                  "--model", "/models/llama8b-16l", "--port", "8001"],
                         env=SERVING | UNRELATED, start_time=None, uid=0)
    return effective_settings(unit=None, process=proc, server=None, gpus=None)


def _render(width: int, **kw: object) -> str:
    buffer = io.StringIO()
    render_settings(_doc(), Console(file=buffer, width=width, color_system=None), **kw)  # type: ignore[arg-type]
    return buffer.getvalue()


def test_the_recorded_case_has_what_the_issue_saw() -> None:
    assert len(UNRELATED) == 84 and len(UNRELATED["LS_COLORS"]) > 1900 > len(SERVING["LD_LIBRARY_PATH"]) > 1900 // 2
    assert all(is_serving_env(k) for k in SERVING) and not any(is_serving_env(k) for k in UNRELATED)


def test_only_serving_variables_are_shown_the_rest_counted() -> None:
    text = _render(100, all_env=False, serving=is_serving_env)
    for name in SERVING:
        assert re.search(rf"^\s*{name}\s", text, re.M), name
    for name in UNRELATED:
        assert not re.search(rf"^\s*{re.escape(name)}\s", text, re.M), name
    assert "+84 other variables of the process, not about serving: --all-env to show" in text
    assert HF_TOKEN not in text and "***" in text


def test_no_row_is_wider_than_the_terminal_and_long_values_are_shortened() -> None:
    for width in (80, 100, 160):
        text = _render(width, all_env=False, serving=is_serving_env)
        assert max(len(line) for line in text.splitlines()) <= width
    piped = _render(100_000, all_env=False, serving=is_serving_env)  # as settings_console() does for a pipe
    lines = piped.splitlines()
    assert max(len(line.rstrip()) for line in lines) < 300  # the 1,900-character value no longer widens rows
    [row] = [line for line in lines if line.lstrip().startswith("LD_LIBRARY_PATH")]
    shown = SERVING["LD_LIBRARY_PATH"][:ENV_VALUE_MAX - 30]
    assert shown in row and f"+{len(SERVING['LD_LIBRARY_PATH']) - len(shown):,} chars" in row


def test_all_env_shows_every_variable_whole_and_still_masks() -> None:
    text = _render(100_000, all_env=True, serving=is_serving_env)
    for name, value in UNRELATED.items():
        assert re.search(rf"^\s*{re.escape(name)}\s+{re.escape(value)}\s", text, re.M), name
    assert SERVING["LD_LIBRARY_PATH"] in text
    assert "other variables" not in text and HF_TOKEN not in text


def test_the_cli_has_all_env() -> None:
    result = CliRunner().invoke(app, ["settings", "--help"])
    assert result.exit_code == 0 and "--all-env" in result.output
