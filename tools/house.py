"""The shape of the package, read from its own source: what docs/architecture.md quotes, made again by anyone.

Per package of ``src/servescope``: its modules and lines; the arrows between packages (one per importing
package and imported package, from the ``import`` statements, function-level imports included); the modules over
the size limit; the module names that stand in more than one package; the ``type: ignore`` comments of the CLI.
Inside a package that has rooms (sub-packages, as ``trace/read/``): each room's modules and lines, and the arrows
between its rooms and its top modules (``trace/analyze.py``), read the same way.

Usage: python tools/house.py [--json]
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "servescope"
LIMIT = 500


def modules() -> dict[str, Path]:
    """Dotted module name → file, for every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        out[".".join(p for p in rel.parts if p != "__init__")] = path
    return out


def package_of(module: str) -> str:
    """``servescope.trace.steps.find`` → ``trace``; a top-level module is its own package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def room_of(module: str, path: Path) -> str | None:
    """``servescope.trace.read.files`` (and ``servescope.trace.read`` itself) → ``trace/read/``;
    ``servescope.trace.analyze`` → ``trace/analyze.py``; None for a package's own ``__init__``."""
    parts = module.split(".")
    if len(parts) >= 4 or (len(parts) == 3 and path.name == "__init__.py"):
        return f"{parts[1]}/{parts[2]}/"
    if len(parts) == 3:
        return f"{parts[1]}/{parts[2]}.py"
    return None


def imported(path: Path, module: str) -> set[str]:
    """Every ``servescope.*`` module ``path`` imports (relative imports resolved against ``module``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("servescope")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: -node.level if path.name != "__init__.py" else len(module)]
                base = ".".join([*anchor, base] if base else anchor)
            if base.startswith("servescope"):
                found |= {base} | {f"{base}.{a.name}" for a in node.names}
    return found


@dataclass(frozen=True)
class Survey:
    """The figures of the package."""

    packages: dict[str, dict[str, int]]
    arrows: list[str]
    over_limit: dict[str, int]
    repeated_names: dict[str, list[str]]
    cli_type_ignores: int
    modules: int
    lines: int
    rooms: dict[str, dict[str, int]]
    room_arrows: list[str]


def survey() -> Survey:
    """The figures of the package as its source stands."""
    mods = modules()
    lines = {m: len(p.read_text(encoding="utf-8").splitlines()) for m, p in mods.items()}
    arrows: set[tuple[str, str]] = set()
    for m, p in mods.items():
        for target in imported(p, m):
            if target in mods or any(t.startswith(target + ".") for t in mods):
                a, b = package_of(m), package_of(target)
                if a != b and b != "servescope":
                    arrows.add((a, b))
    packages: dict[str, dict[str, int]] = defaultdict(lambda: {"modules": 0, "lines": 0})
    names: dict[str, list[str]] = defaultdict(list)
    for m, p in mods.items():
        packages[package_of(m)]["modules"] += 1
        packages[package_of(m)]["lines"] += lines[m]
        if p.name != "__init__.py":
            names[p.name].append(package_of(m))
    roomed = {package_of(m) for m in mods if len(m.split(".")) >= 4}
    rooms: dict[str, dict[str, int]] = defaultdict(lambda: {"modules": 0, "lines": 0})
    room_arrows: set[tuple[str, str]] = set()
    for m, p in mods.items():
        if package_of(m) not in roomed or m.count(".") < 2:
            continue
        room = room_of(m, p)
        if room is not None and room.endswith("/"):
            rooms[room]["modules"] += 1
            rooms[room]["lines"] += lines[m]
        for target in imported(p, m):
            if target in mods and package_of(target) == package_of(m) and target.count(".") >= 2:
                a, b = room_of(m, p), room_of(target, mods[target])
                if a is not None and b is not None and a != b:
                    room_arrows.add((a, b))
    cli_ignores = sum(p.read_text(encoding="utf-8").count("type: ignore") for m, p in mods.items()
                      if package_of(m) == "cli")
    return Survey(packages=dict(sorted(packages.items())), arrows=sorted(f"{a} -> {b}" for a, b in arrows),
                  over_limit={m: n for m, n in sorted(lines.items()) if n > LIMIT},
                  repeated_names={n: sorted(pk) for n, pk in sorted(names.items()) if len(pk) > 1},
                  cli_type_ignores=cli_ignores, modules=len(mods), lines=sum(lines.values()),
                  rooms=dict(sorted(rooms.items())), room_arrows=sorted(f"{a} -> {b}" for a, b in room_arrows))


def _sizes(rows: dict[str, dict[str, int]], width: int) -> list[str]:
    return [f"  {name:{width}s} {p['modules']:3d} modules {p['lines']:6d} lines" for name, p in rows.items()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    s = survey()
    if args.json:
        print(json.dumps(asdict(s), indent=1))
        return 0
    lines = [f"{s.modules} modules, {s.lines} lines", *_sizes(s.packages, 10),
             f"arrows between packages: {len(s.arrows)}", *(f"  {a}" for a in s.arrows),
             f"modules over {LIMIT} lines: {s.over_limit or 'none'}",
             f"module names in more than one package: {len(s.repeated_names)}",
             *(f"  {n}: {', '.join(pk)}" for n, pk in s.repeated_names.items()),
             f"type: ignore in cli/: {s.cli_type_ignores}",
             f"rooms (sub-packages, each with its own modules): {len(s.rooms)}", *_sizes(s.rooms, 16),
             f"arrows between the rooms and top modules of a package: {len(s.room_arrows)}",
             *(f"  {a}" for a in s.room_arrows)]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
