"""What a kernel's name is evidence of, for its precision role: its operation words and the types it states.

A demangled kernel name reads ``void ns::kernel_name<arg, arg, …>(param, …)``. Its **operation words** are the
name outside template arguments and argument lists (``void ns::kernel_name``): what the kernel does. Its
**template arguments** say how it is instantiated: for a GEMM, attention or MoE kernel, the operand types and
policies it consumes (``BlockAttentionQuantScaleEnum``, ``Float8_e4m3fn``), which are no conversion of its own;
for a typed quantization kernel, its input and output types (aiter's ``add_rmsnorm_quant_kernel<bf16, bf16, …>``
writes bf16: it quantizes nothing). ``[precision_evidence]`` in ``taxonomy.toml`` says which categories are read
by operation words only and which types are high or low precision.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import msgspec

from servescope.core.categories import bundled_taxonomy
from servescope.core.kernel_names import demangle
from servescope.trace.classify.taxonomy import Taxonomy

__all__ = ["NameParts", "name_parts", "name_role", "precision_evidence"]


class NameParts(msgspec.Struct, frozen=True):
    text: str  # the name, demangled
    operation: str  # its operation words: outside template arguments and argument lists
    arguments: tuple[str, ...]  # the first-level template arguments of its own (outermost, last) template


def name_parts(name: str) -> NameParts:
    """The demangled name, its operation words and its own template's arguments (see the module)."""
    text = demangle(name)
    operation: list[str] = []
    arguments: list[str] = []
    current: list[str] = []
    angle = paren = 0
    previous = ""
    for ch in text:
        if paren:  # inside an argument list at depth 0: skipped
            paren += {"(": 1, ")": -1}.get(ch, 0)
            continue
        if angle == 0:
            if ch == "(" and (previous.isalnum() or previous in "_>]"):
                paren = 1
                continue
            if ch == "<":
                angle, arguments, current = 1, [], []
                continue
            operation.append(ch)
            previous = ch if not ch.isspace() else previous
            continue
        if ch == "<":
            angle += 1
        elif ch == ">":
            angle -= 1
            if angle == 0:
                arguments.append("".join(current).strip())
                previous = ">"
                continue
        elif ch == "," and angle == 1:
            arguments.append("".join(current).strip())
            current = []
            continue
        current.append(ch)
    return NameParts(text=text, operation=" ".join("".join(operation).split()), arguments=tuple(arguments))


@cache
def precision_evidence() -> tuple[frozenset[str], tuple[re.Pattern[str], ...], tuple[re.Pattern[str], ...]]:
    """``taxonomy.toml``'s ``[precision_evidence]``: the categories read by operation words only, and the patterns
    of high and of low precision types in template arguments (read once)."""
    raw: dict[str, Any] = bundled_taxonomy().get("precision_evidence", {})
    return (frozenset(raw.get("operation_only", ())), tuple(re.compile(p) for p in raw.get("high", ())),
            tuple(re.compile(p) for p in raw.get("low", ())))


def name_role(taxonomy: Taxonomy, name: str, category: str) -> str | None:
    """The precision role the name rules give a kernel of ``category`` (its category by name), read from what
    its name is evidence of: operation words only for ``operation_only`` categories; a ``quantize`` whose
    template arguments state types, none of them (nor its operation words) low precision, is none."""
    operation_only, high, low = precision_evidence()
    parts = name_parts(name) if category in operation_only else None  # the rest only where a quantize needs it
    role = taxonomy.precision(parts.operation if parts is not None else demangle(name), "name")
    if role != "quantize":
        return role
    parts = parts or name_parts(name)
    stated_low = any(p.search(a) for a in parts.arguments for p in low) or any(p.search(parts.operation) for p in low)
    stated_high = any(p.search(a) for a in parts.arguments for p in high)
    return None if stated_high and not stated_low else role
