"""A floor for the loop (issue 39, item 6): the knee search (``bench/serve/``) and ``tune/`` call the features
through their public functions, never through the CLI: every name they import from another package of servescope
is in that module's ``__all__``, and none comes from ``servescope.cli``. ``lint-imports`` holds the second as a
contract too (``pyproject.toml``); this test holds both, and shows it fails on a planted import."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import servescope

PACKAGE = Path(servescope.__file__).parent
LOOP = ("tune", "bench/serve")


def loop_violations(source: str, own: str) -> list[str]:
    """What the module ``source`` (of the package ``own``, e.g. ``servescope.tune``) imports from another package
    that is not a public name of it: ``MODULE.NAME`` (private, or not in its ``__all__``) or ``servescope.cli...``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [(node.module, alias.name) for alias in node.names]
        else:
            continue
        for module, name in names:
            if not module.startswith("servescope.") or module.startswith(own + ".") or module == own:
                continue
            if module.startswith("servescope.cli") or name is None:
                found.append(module if name is None else f"{module}.{name}")
                continue
            public = getattr(importlib.import_module(module), "__all__", ())
            if name not in public:
                found.append(f"{module}.{name}")
    return found


def _loop_modules() -> list[tuple[Path, str]]:
    return [(path, "servescope." + folder.replace("/", ".")) for folder in LOOP
            for path in sorted((PACKAGE / folder).glob("*.py"))]


@pytest.mark.parametrize(("path", "own"), _loop_modules(), ids=lambda v: getattr(v, "name", ""))
def test_the_loop_calls_features_through_their_public_functions(path: Path, own: str) -> None:
    assert loop_violations(path.read_text(encoding="utf-8"), own) == []


def test_a_planted_import_of_the_cli_or_a_private_name_fails() -> None:
    planted = ("from servescope.cli.common import emit\n"
               "from servescope.server.profile import _complete, profile_server\n"
               "import servescope.trace.analyze\n"
               "from servescope.tune.loop import run_tune\n")
    assert loop_violations(planted, "servescope.tune") == [
        "servescope.cli.common.emit", "servescope.server.profile._complete", "servescope.trace.analyze"]
