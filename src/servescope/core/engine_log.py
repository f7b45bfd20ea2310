"""What a vLLM server's own log says it runs with: the lines tune and the catalogue read as evidence.

The log is the engine's word on values the command line leaves to defaults (``Chunked prefill is enabled with
max_num_batched_tokens=8192``) and on what it could not find (``Using default MoE config ... not found at
.../E=128,N=768,device_name=NVIDIA_H100_80GB_HBM3.json``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["log_value", "moe_log_facts"]

_MOE_RE = re.compile(r"(?P<path>/\S*?fused_moe/configs/)?(?P<file>E=(?P<E>\d+),N=(?P<N>\d+),device_name="
                     r"(?P<device>[^,\s]+?)(?:,dtype=(?P<dtype>[^,\s.]+))?(?:,block_shape=\[[^\]]*\])?\.json)")


def log_value(lines: Sequence[str], pattern: str) -> str | None:
    """Group 1 of ``pattern`` in the last log line it matches (the latest start's word), else None."""
    compiled = re.compile(pattern)
    for line in reversed(lines):
        if (found := compiled.search(line)) is not None:
            return found.group(1)
    return None


def moe_log_facts(lines: Sequence[str]) -> dict[str, str]:
    """From vLLM's ``Using default MoE config ... Config file not found at .../E=128,N=768,device_name=…json``
    line: ``moe_file``, ``moe_shape`` (``E=128,N=768``), ``moe_device``, ``moe_dtype`` (``auto`` when the file
    name has none); empty when no line says so."""
    for line in lines:
        if "Using default MoE config" not in line:
            continue
        found = _MOE_RE.search(line)
        if found is None:
            return {"moe_file": "(the file the log names)", "moe_shape": "N/A", "moe_device": "this GPU",
                    "moe_dtype": "auto"}
        return {"moe_file": found["file"], "moe_shape": f"E={found['E']},N={found['N']}",
                "moe_device": found["device"], "moe_dtype": found["dtype"] or "auto"}
    return {}
