"""What calls for a change on a server tune runs: the knee's cause, the server's log, its command line as the
deployment settings (with the version's defaults), the model's own facts, a profile at the knee's load.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from servescope.bench.moe_config import kernel_gain, read_timings
from servescope.core.aio import run_loop
from servescope.core.analysis import SettingEvidence
from servescope.core.changes import ChangeEvidence, SeenFinding, catalogue_engine, flag_values
from servescope.core.engine_log import moe_log_facts
from servescope.core.errors import ServescopeError
from servescope.core.next_steps import evidence_of_analysis
from servescope.trace.read.files import log_lines_beside
from servescope.tune.edit import ServerConfig
from servescope.tune.measure import Measured

__all__ = ["deployment_of", "gather_evidence", "log_lines_beside", "model_facts", "moe_search_facts", "platform_here",
           "profile_findings", "server_version"]

_MTP_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_modules")


def platform_here() -> str:
    """``cuda`` where ``nvidia-smi`` is on PATH, ``rocm`` where ``/dev/kfd`` exists, else ``cpu``."""
    if shutil.which("nvidia-smi"):
        return "cuda"
    return "rocm" if Path("/dev/kfd").exists() else "cpu"


def server_version(url: str, api_key: str | None) -> str | None:
    """The server's ``/version`` (vLLM), or None when it has none."""
    from servescope.server.client import ApiKey, ServerClient

    async def ask() -> str | None:
        async with ServerClient(url, api_key=ApiKey(api_key, "--api-key") if api_key else None) as client:
            answer = await client.get_json("/version")
        value = answer.get("version") if isinstance(answer, dict) else None
        return str(value) if value else None

    try:
        return run_loop(ask())
    except (ServescopeError, OSError):
        return None


def deployment_of(config: ServerConfig, version: str | None) -> dict[str, SettingEvidence]:
    """The deployment settings the command line and environment tell, with the version's defaults."""
    from servescope.trace.rules.deployment import DeploymentInput, deployment_settings

    where = "the configuration tune runs"
    told = deployment_settings([], [], [], [DeploymentInput(source="settings", where=where, argv=list(config.argv),
                                                            env=dict(config.env), version=version,
                                                            engine=catalogue_engine())],
                               graph_engine=True)
    told.pop("platform", None)  # no trace here: the platform is this machine's (platform_here)
    return told


def model_facts(argv: Sequence[str]) -> dict[str, float]:
    """``model_mtp_layers`` from the served model's ``config.json`` where it is a local folder."""
    values = flag_values(argv)
    model = values.get("--model", [None])[-1]
    if model is None:
        words = list(argv)
        model = words[words.index("serve") + 1] if "serve" in words[:-1] else None
    config = Path(model) / "config.json" if model else None
    if config is None or not config.is_file():
        return {}
    try:
        data: dict[str, Any] = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    layers = next((data[k] for k in _MTP_KEYS if isinstance(data.get(k), int)), 0)
    return {"model_mtp_layers": float(layers)}


def profile_findings(url: str, load: float, *, api_key: str | None,
                     output_tokens: int) -> tuple[list[SeenFinding], str]:
    """The findings of ``servescope profile`` at ``load`` requests, and a sentence on how it went."""
    from servescope.server.client import ApiKey
    from servescope.server.profile import ProfileRequest, profile_server

    batch = max(1, round(load))
    try:
        result = profile_server(ProfileRequest(url=url, batch=batch, output_tokens=max(16, output_tokens),
                                               api_key=ApiKey(api_key, "--api-key") if api_key else None,
                                               unprofiled_runs=1, after_runs=0))
    except ServescopeError as exc:
        return [], f"not profiled: {exc}"
    findings = evidence_of_analysis(result.analysis).findings
    return findings, profile_sentence(batch, findings)


def profile_sentence(batch: int, findings: Sequence[SeenFinding]) -> str:
    """``profiled at 64 requests: launch_bound (high, decode), ...``: each finding with its severity and the
    phase of steps it is about where the trace told it (two findings of one rule differ by it)."""
    def told(f: SeenFinding) -> str:
        return ", ".join(x for x in (f.severity, f.phase) if x and x != "unknown")
    names = ", ".join(f"{f.id} ({told(f)})" for f in findings)
    return f"profiled at {batch} requests: {names or 'no findings'}"


def gather_evidence(measured: Measured, config: ServerConfig, *, log_lines: Sequence[str], version: str | None,
                    platform: str, inputs: dict[str, str], findings: Sequence[SeenFinding] = ()) -> ChangeEvidence:
    """Everything known of the server running ``config``, for :func:`servescope.core.changes.match_changes`."""
    values = flag_values(config.argv)
    tp = values.get("--tensor-parallel-size", values.get("-tp", ["1"]))[-1] or "1"
    model = values.get("--model", [None])[-1] or next(
        (config.argv[i + 1] for i in range(len(config.argv) - 1) if config.argv[i] == "serve"), None)
    more = {"tp": tp, **({"model": model} if model else {}), **inputs}
    facts = {**model_facts(config.argv), **moe_search_facts(inputs, log_lines, measured.figure.load)}
    return ChangeEvidence(knee_cause=measured.figure.cause, cause_figures=dict(measured.cause_figures),
                          findings=list(findings), log_lines=list(log_lines), load=measured.figure.load,
                          argv=list(config.argv), env=dict(config.env), settings=deployment_of(config, version),
                          platform=platform, facts=facts, inputs=more)


def moe_search_facts(inputs: Mapping[str, str], log_lines: Sequence[str], load: float | None) -> dict[str, float]:
    """``moe_kernel_gain``: what the searched fused-MoE config (``--moe-config-dir``, the file the server's log
    says it lacks) gained on the kernel at the knee's load, from the search's timings beside it; none unknown."""
    folder, wanted = inputs.get("moe_config_dir"), moe_log_facts(log_lines).get("moe_file", "")
    if not folder or not wanted.startswith("E=") or load is None:
        return {}
    timings = read_timings(Path(folder) / wanted)
    return {"moe_kernel_gain": kernel_gain(timings, load)} if timings else {}
