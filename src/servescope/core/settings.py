"""The ``settings`` records: what each source saw, and the document ``servescope settings [--json]`` shows.

Sources are collected by the feature that owns each foreign API (``/proc`` and HTTP in ``server/``, the
unit in ``deploy/``, the GPUs in ``gpu/``); ``server.settings.read_settings`` reads them and
``deploy.effective.effective_settings`` combines them into a :class:`SettingsDoc`. Secret values never enter
the document: they are ``***`` (``MASK``).

Not available is ``None`` (``null`` in JSON, ``N/A`` in tables), never 0 or "".
"""

from __future__ import annotations

from typing import Any

import msgspec

from servescope.core.document import Document
from servescope.core.redact import MASK

__all__ = [
    "GROUPS",
    "MASK",
    "SERVING_ENV_PREFIXES",
    "Drift",
    "Endpoint",
    "Group",
    "ProcessRecord",
    "ProcessSeen",
    "ServedModel",
    "ServerRecord",
    "Setting",
    "SettingsDoc",
    "SourceNote",
    "is_serving_env",
]

#: Group ids in the order they are shown, with their titles.
GROUPS: dict[str, str] = {
    "service": "Service",
    "engine": "Engine and arguments",
    "parallelism": "Parallelism (TP/PP/DP/EP)",
    "model": "Model and quantization",
    "memory": "Memory",
    "nccl_cuda_env": "NCCL/CUDA environment",
    "vllm_env": "vLLM/SGLang environment",
    "other": "Other environment",
    "server": "Server (as it reports itself)",
    "gpus": "GPUs",
}


class ProcessSeen(msgspec.Struct, kw_only=True, frozen=True):
    """A process found by scanning ``/proc`` (``ps -eo pid,ppid,args``)."""

    pid: int
    ppid: int | None
    argv: list[str]


class ProcessRecord(msgspec.Struct, kw_only=True, frozen=True):
    """One running process as ``/proc/PID`` shows it.

    Attributes:
        argv: ``/proc/PID/cmdline`` split at NUL bytes (raw: secrets are masked only when shown).
        env: ``/proc/PID/environ``, the environment the process started with.
        start_time: start, seconds since the epoch (``ps -o lstart= -p PID``).
        uid: the real user id (``/proc/PID/status`` ``Uid:``).
    """

    pid: int
    ppid: int | None
    argv: list[str]
    env: dict[str, str]
    start_time: float | None
    uid: int | None = None
    cwd: str | None = None


class ServedModel(msgspec.Struct, kw_only=True, frozen=True):
    """One entry of ``GET /v1/models``."""

    id: str
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None


class Endpoint(msgspec.Struct, kw_only=True, frozen=True):
    """How one endpoint answered: ``ok`` or why not (``detail``)."""

    path: str
    ok: bool
    detail: str


class ServerRecord(msgspec.Struct, kw_only=True, frozen=True):
    """What a live server says about itself.

    Attributes:
        version: ``GET /version`` ``version``.
        models: ``GET /v1/models`` ``data``.
        info_gauges: each ``*_info`` gauge of ``/metrics`` → the label sets of its samples.
        server_info: the JSON of ``/server_info`` (vLLM with ``VLLM_SERVER_DEV_MODE=1``, SGLang).
    """

    url: str
    version: str | None = None
    models: list[ServedModel] = msgspec.field(default_factory=list)
    info_gauges: dict[str, list[dict[str, str]]] = msgspec.field(default_factory=dict)
    server_info: dict[str, Any] | None = None
    endpoints: list[Endpoint] = msgspec.field(default_factory=list)


class Setting(msgspec.Struct, kw_only=True, frozen=True):
    """One setting.

    Attributes:
        key: a flag (``--tensor-parallel-size``), a variable (``NCCL_PROTO``), a unit key (``TimeoutStartSec``)
            or a server field (``/v1/models[m].max_model_len``).
        value: as written; ``""`` for a flag given without a value; ``None`` when not available.
        source: ``process``, ``unit``, ``unit+process`` (both agree), ``systemd``, ``server``, ``gpu``.
        origin: where exactly: ``FILE:LINE`` of a unit or drop-in, ``/proc/PID/cmdline``, an endpoint.
    """

    key: str
    value: str | None
    source: str
    origin: str | None = None


class Group(msgspec.Struct, kw_only=True, frozen=True):
    """Settings of one kind; ``id`` is a key of :data:`GROUPS`."""

    id: str
    title: str
    settings: list[Setting]


class Drift(msgspec.Struct, kw_only=True, frozen=True):
    """One difference between what is on disk, what runs, and what the server reports.

    Attributes:
        kind: ``arg`` (unit ExecStart vs process), ``env`` (unit vs process), ``unit_changed`` (a unit file
            modified after the process started), ``daemon_reload`` (systemd has not re-read the unit),
            ``server`` (a process flag vs the server's own report).
        key: the flag, variable or file.
        values: each side's value by source name (``unit``, ``process``, ``server``), ``None`` where absent.
        detail: one sentence saying what differs and what to do.
    """

    kind: str
    key: str
    values: dict[str, str | None]
    detail: str


class SourceNote(msgspec.Struct, kw_only=True, frozen=True):
    """One source: ``unit``, ``process``, ``server``, ``gpus``; whether it was read, and how or why not."""

    name: str
    ok: bool
    detail: str


class SettingsDoc(Document, kw_only=True, frozen=True):
    """The effective configuration of one deployed server; ``groups`` in :data:`GROUPS` order."""

    schema: str = "servescope.settings"
    schema_version: int = 1
    servescope_version: str
    taken_at: str
    engine: str | None
    unit: str | None
    pid: int | None
    url: str | None
    sources: list[SourceNote]
    groups: list[Group]
    drift: list[Drift]
    all_env: bool = False  # the text shows every environment variable (--all-env); else those that matter to serving


#: Environment variables that matter to serving, by prefix: the engines', the collectives', CUDA's and ROCm's,
#: torch's, Hugging Face's, the threading libraries' and the loader's.
SERVING_ENV_PREFIXES = (
    "VLLM_", "SGLANG_", "SGL_", "NCCL_", "RCCL_", "CUDA_", "CUBLAS", "CUDNN_", "NVIDIA_", "NVSHMEM_", "NVTE_",
    "HIP_", "ROCM_", "HSA_", "TORCH", "PYTORCH_", "TRITON_", "GLOO_", "UCX_", "MASTER_ADDR", "MASTER_PORT",
    "HF_", "HUGGING_FACE_", "TRANSFORMERS_", "TOKENIZERS_", "OMP_", "MKL_", "KMP_", "MALLOC_", "LD_LIBRARY_PATH",
    "LD_PRELOAD", "PYTHONPATH", "PYTHONHASHSEED", "VIRTUAL_ENV", "XDG_CACHE_HOME",
)


def is_serving_env(name: str) -> bool:
    """Whether an environment variable is one that matters to serving (:data:`SERVING_ENV_PREFIXES`)."""
    return name.startswith(SERVING_ENV_PREFIXES)
