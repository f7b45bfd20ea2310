"""Kernel names for display: demangled (LLVM's demangler, else one ``c++filt`` call), shortened to a width,
and kept apart where two shortened names would read the same."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

__all__ = ["demangle", "demangle_all", "distinct_kernel_names", "shorten_kernel_name"]


def shorten_kernel_name(name: str, *, max_chars: int = 60) -> str:
    """A kernel name for display: no leading ``void``, no argument lists, at most ``max_chars`` long.

    Only a parenthesised group that directly follows a name (``foo<…>(float*, int)``) at template depth 0
    is an argument list; ``(anonymous namespace)`` and ``Memcpy HtoD (Pinned -> Device)`` keep theirs.
    The start of the name is kept and a cut one ends in ``…``.
    """
    text = demangle(name.strip())
    if text.startswith("void "):
        text = text[len("void ") :]
    out: list[str] = []
    angle = brace = kept_paren = skipped_paren = 0
    for ch in text:
        if skipped_paren:
            skipped_paren += {"(": 1, ")": -1}.get(ch, 0)
            continue
        if ch == "(":
            starts_args = out and (out[-1].isalnum() or out[-1] in "_>]")
            if starts_args and angle == 0 and brace == 0 and kept_paren == 0:
                skipped_paren = 1
                continue
            kept_paren += 1
        elif ch == ")" and kept_paren:
            kept_paren -= 1
        elif kept_paren == 0:
            if ch == "<":
                angle += 1
            elif ch == ">" and angle:
                angle -= 1
            elif ch == "{":
                brace += 1
            elif ch == "}" and brace:
                brace -= 1
        out.append(ch)
    short = " ".join("".join(out).split()) or " ".join(name.split())
    short = _LAMBDA.sub("λ", _NOISE.sub("", short)).replace("::operator()() const", "")
    while (stripped := _SIGNATURE.sub("", short)) != short:  # function signatures inside template arguments
        short = stripped
    if len(short) <= max_chars:
        return short
    head, removed = _collapse_templates(short)
    detail = next((w for w in _IDENTIFIER.findall(removed) if _SPECIFIC.search(w) and w not in _GENERIC), "")
    if detail and detail not in head:
        head = f"{head} [{detail}]"
    if len(head) <= max_chars:
        return head
    tail = max_chars // 3  # names that differ only at the end (tile shapes, policies) stay apart
    return head[: max_chars - tail - 1].rstrip() + "…" + head[-tail:]


def distinct_kernel_names(names: Sequence[str], *, max_chars: int = 60) -> list[str]:
    """:func:`shorten_kernel_name` of each name, where two would read the same, each shows its own
    first stretch that differs from the others (CK / Tensile names differ in the middle: tile sizes)."""
    demangle_all(names)  # one c++filt call for all the names LLVM's demangler cannot read
    short = [shorten_kernel_name(n, max_chars=max_chars) for n in names]
    seen: dict[str, list[int]] = {}
    for i, text in enumerate(short):
        seen.setdefault(text, []).append(i)
    for group in (g for g in seen.values() if len({names[i] for i in g}) > 1):
        full = [shorten_kernel_name(names[i], max_chars=len(names[i]) * 2) for i in group]  # whole, demangled
        for i, mine in zip(group, full, strict=True):
            others = [f for f in full if f != mine]
            at = min((next((k for k, (a, b) in enumerate(zip(mine, o, strict=False)) if a != b), len(mine))
                      for o in others), default=0)
            lead = max_chars // 3
            window = mine[max(at - 8, lead) : max(at - 8, lead) + max_chars - lead - 2]
            short[i] = mine[:lead] + "…" + window + ("…" if len(mine) > max(at - 8, lead) + len(window) else "")
    return short


_SIGNATURE = re.compile(r"(?<=[\w>])\((?:[^()]*)\)")


# Display only: namespaces every PyTorch / CUTLASS kernel repeats, and lambdas, say nothing about the kernel.
_NOISE = re.compile(r"\b(?:at::native::|at::cuda::detail::|at::cuda::|at::|c10::|std::|cute::|cutlass::)|"
                    r"\(anonymous namespace\)::")
_LAMBDA = re.compile(r"\{lambda\([^)]*\)#\d+\}")
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
_SPECIFIC = re.compile(r"Functor|Ops?$|_kernel_cuda$|_kernel$|Kernel$|_impl$|Copy|Mul|Add|Div|Sub")
_GENERIC = frozenset({"gpu_kernel_impl", "gpu_kernel_impl_nocast", "ReduceOp", "Kernel", "Kernel2", "device_kernel"})


def _collapse_templates(text: str) -> tuple[str, str]:
    """``text`` with template arguments below the first level replaced by ``…``, and what was removed."""
    kept: list[str] = []
    removed: list[str] = []
    depth = 0
    for ch in text:
        if ch == "<":
            depth += 1
            if depth == 2:
                kept.append("<…")
                continue
        elif ch == ">" and depth:
            depth -= 1
            if depth == 1:
                kept.append(">")
                continue
        (removed if depth >= 2 else kept).append(ch)
    return "".join(kept), "".join(removed)


def demangle(name: str) -> str:
    """An Itanium-mangled kernel name (``_ZN7cutlass…``, ``_ZN5aiter…``, ``_ZN7ck_tile…``) as C++, else ``name``.

    LLVM's demangler (the ``pycxxfilt`` package, which carries its own copy): it reads what the system's
    ``__cxa_demangle`` (the ``cxxfilt`` package) could not on real ROCm traces: ``DF16b`` (``std::bfloat16_t``)
    in aiter / CK-tile names, ``Tn`` template parameters (sgl_hip), templates nested deeper than binutils'
    recursion limit (CUTLASS, CK convolutions). Where it fails too, binutils' ``c++filt --no-recurse-limit``
    is asked when it is installed; a name no demangler reads is shown as recorded.
    """
    if not name.startswith("_Z"):
        return name
    known = _DEMANGLED.get(name)
    if known is None:
        known = demangle_all([name])[name]
    return known


_DEMANGLED: dict[str, str] = {}  # every name demangled so far (a trace repeats few kernel names)
_MANGLED = re.compile(r"_Z[\w$.]+")  # one token: what c++filt reads one to a line


def demangle_all(names: Iterable[str]) -> dict[str, str]:
    """:func:`demangle` of each name; the names LLVM's demangler cannot read go to ``c++filt`` in one call."""
    out: dict[str, str] = {}
    left: list[str] = []
    for name in dict.fromkeys(names):
        if not name.startswith("_Z"):
            out[name] = name
        elif name in _DEMANGLED:
            out[name] = _DEMANGLED[name]
        else:
            text = _llvm_demangle(name)
            if text is None:
                left.append(name)
            else:
                out[name] = _DEMANGLED[name] = text
    for name, text in zip(left, _binutils_demangle(left), strict=True):
        out[name] = _DEMANGLED[name] = text
    return out


def _llvm_demangle(name: str) -> str | None:
    try:
        import pycxxfilt  # noqa: PLC0415 - only a few names are mangled

        text = pycxxfilt.itanium_demangle(name)
    except (ImportError, ValueError):
        return None
    return text if text and text != name else None


def _binutils_demangle(names: Sequence[str]) -> list[str]:
    """``names`` through one ``c++filt`` process (each unchanged where it fails or c++filt is not installed)."""
    import shutil  # noqa: PLC0415
    import subprocess  # noqa: PLC0415

    asked = [n for n in names if _MANGLED.fullmatch(n)]
    tool = shutil.which("c++filt")
    if not asked or tool is None:
        return list(names)
    try:
        done = subprocess.run([tool, "--no-recurse-limit"], input="\n".join(asked) + "\n", capture_output=True,
                              text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return list(names)
    lines = done.stdout.splitlines()
    if done.returncode != 0 or len(lines) != len(asked):
        return list(names)
    read = dict(zip(asked, lines, strict=True))
    return [read.get(n, n) for n in names]
