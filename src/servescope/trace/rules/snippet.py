"""The ``--taxonomy`` rule that would file the kernels servescope cannot: the ``unclassified_time`` finding's
snippet, one rule per name stem with the category its name suggests."""

from __future__ import annotations

import re
from collections.abc import Sequence

from servescope.core.analysis import KernelRow
from servescope.core.kernel_names import shorten_kernel_name

__all__ = ["taxonomy_snippet", "unclassified"]

_HINTS = (
    (re.compile(r"(?i)all_?reduce|allreduce"), "comm.all_reduce"),
    (re.compile(r"(?i)all_?gather"), "comm.all_gather"),
    (re.compile(r"(?i)all_?to_?all|dispatch|combine"), "comm.all_to_all"),
    (re.compile(r"(?i)attn|attention"), "attention"),
    (re.compile(r"(?i)moe|expert"), "moe"),
    (re.compile(r"(?i)gemm|matmul|_mm\b"), "gemm"),
    (re.compile(r"(?i)norm"), "norm"),
    (re.compile(r"(?i)rope|rotary"), "rotary"),
)


def _name_stem(name: str) -> str:
    stem = name.removeprefix("void ").strip()
    return re.split(r"[<(\s]", stem, maxsplit=1)[0] or stem


def _toml_string(text: str) -> str:
    return f"'{text}'" if "'" not in text and "\n" not in text else '"' + text.replace("\\", "\\\\").replace(
        '"', '\\"') + '"'


def taxonomy_snippet(names: Sequence[str]) -> str:
    """A ``--taxonomy`` file that files ``names``: one rule per name stem, with the category its name suggests
    (a new ``user.*`` category where it suggests none)."""
    new: dict[str, str] = {}
    rules: list[str] = []
    for stem in dict.fromkeys(_name_stem(n) for n in names):
        category = next((c for p, c in _HINTS if p.search(stem)), None)
        if category is None:
            category = "user." + (re.sub(r"[^A-Za-z0-9_]+", "_", stem).strip("_").lower()[:40] or "kernel")
            new[category] = "compute"
        rules.append(f"[[rule]]\ncategory = {_toml_string(category)}\nregex = [{_toml_string('^' + re.escape(stem))}]\n"
                     f"note = {_toml_string('filed by hand after servescope analyze: ' + stem[:60])}")
    head = "[categories]\n" + "".join(f"{_toml_string(c)} = \"{g}\"\n" for c, g in new.items()) if new else ""
    return head + ("\n" if head else "") + "\n\n".join(rules) + "\n"


def unclassified(rows: Sequence[KernelRow]) -> tuple[str | None, str | None]:
    """The top kernels filed as ``other`` (name and share) and the taxonomy snippet that would file them."""
    other: dict[str, float] = {}
    for k in rows:
        if k.category == "other":
            other[k.name] = other.get(k.name, 0.0) + k.total_us
    if not other:
        return None, None
    total = sum(k.total_us for k in rows)
    top = sorted(other, key=lambda n: -other[n])[:3]
    text = ", ".join(f"{shorten_kernel_name(n, max_chars=80)} ({100 * other[n] / total:.1f}%)" for n in top)
    return text, taxonomy_snippet(top)
