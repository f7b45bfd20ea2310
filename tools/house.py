"""The shape of the package, read from its own source: what docs/architecture.md quotes, made again by anyone.

Per package of ``src/servescope``: its modules and lines; the arrows between packages (one per importing
package and imported package, from the ``import`` statements, function-level imports included); the modules over
the size limit; the module names that stand in more than one package; the ``type: ignore`` comments of the CLI.

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
    """``servescope.trace.steps`` → ``trace``; a top-level module is its own package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


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
    cli_ignores = sum(p.read_text(encoding="utf-8").count("type: ignore") for m, p in mods.items()
                      if package_of(m) == "cli")
    return Survey(packages=dict(sorted(packages.items())), arrows=sorted(f"{a} -> {b}" for a, b in arrows),
                  over_limit={m: n for m, n in sorted(lines.items()) if n > LIMIT},
                  repeated_names={n: sorted(pk) for n, pk in sorted(names.items()) if len(pk) > 1},
                  cli_type_ignores=cli_ignores, modules=len(mods), lines=sum(lines.values()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    s = survey()
    if args.json:
        print(json.dumps(asdict(s), indent=1))
        return 0
    print(f"{s.modules} modules, {s.lines} lines")
    for name, p in s.packages.items():
        print(f"  {name:10s} {p['modules']:3d} modules {p['lines']:6d} lines")
    print(f"arrows between packages: {len(s.arrows)}")
    for a in s.arrows:
        print(f"  {a}")
    print(f"modules over {LIMIT} lines: {s.over_limit or 'none'}")
    print(f"module names in more than one package: {len(s.repeated_names)}")
    for n, pk in s.repeated_names.items():
        print(f"  {n}: {', '.join(pk)}")
    print(f"type: ignore in cli/: {s.cli_type_ignores}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
