"""``servescope analyze`` runs without typer when its flags are plain; both routes must behave the same.

Each case runs the real entry point twice in fresh interpreters: ``python -m servescope`` (main(), which
takes the typer-free route for plain flags) and the typer app called directly (always typer). stdout,
stderr, exit code and every written file must be byte-identical (``created_at`` aside: a clock).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from servescope.cli.analyze import ANALYZE_FLAGS
from servescope.cli.common import parse_plain
from servescope.trace.analyze import example_trace_dir

# the project's own capture (a real vLLM TP=2 run on the CPU, 90 KB): these run on any clone
SMALL = example_trace_dir("vllm-cpu-tp2") / "rank0.pt.trace.json.gz"
CPU = example_trace_dir("vllm-cpu-tp2") / "rank1.pt.trace.json.gz"
_TYPER_ONLY = "from servescope.cli import app; app(prog_name='python -m servescope')"
_CLOCK = re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[0-9:+.-]*")  # created_at, wherever it is shown


def _run(argv: list[str], cwd: Path, *, typer_only: bool) -> tuple[int, bytes, bytes, dict[str, bytes]]:
    head = [sys.executable, "-c", _TYPER_ONLY] if typer_only else [sys.executable, "-m", "servescope"]
    for f in cwd.glob("out*"):
        f.unlink()
    proc = subprocess.run([*head, *argv], cwd=cwd, capture_output=True, timeout=120)
    files = {f.name: _CLOCK.sub(b"", f.read_bytes()) for f in sorted(cwd.glob("out*"))}
    return proc.returncode, _CLOCK.sub(b"", proc.stdout), proc.stderr, files


CASES = [
    ["analyze", str(SMALL), "--json"],
    ["analyze", "--json", str(CPU), "-o", "out.json", "--top", "3"],
    ["analyze", str(SMALL), "--output=out.json", "--step-gap-us", "250.5", "--taxonomy", "tax.toml"],
    ["analyze", str(SMALL), "--html", "out.html", "--top", "0"],
    ["analyze", "missing_rank0.pt.trace.json.gz", "--json"],
    ["analyze", "broken.json.gz"],
    ["analyze", "--json"],
    ["analyze", str(SMALL), "--taxonomy", "missing.toml"],
    ["analyze", str(SMALL), "--top", "-1"],
    ["analyze", str(SMALL), "--step-gap-us", "abc"],
    ["analyze", str(SMALL), "--jsn"],
    ["analyze", str(SMALL), "--json", "--json"],
]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("routes")
    (d / "broken.json.gz").write_bytes(SMALL.read_bytes()[:2000])
    (d / "tax.toml").write_text('version = 1\n[[rule]]\ncategory = "gemm"\nregex = "elementwise"\n')
    shutil.copy(SMALL, d / SMALL.name)
    return d


@pytest.mark.parametrize("argv", CASES, ids=lambda a: " ".join(a[1:])[-60:])
def test_both_routes_behave_the_same(argv: list[str], workdir: Path) -> None:
    fast = _run(argv, workdir, typer_only=False)
    slow = _run(argv, workdir, typer_only=True)
    assert fast[0] == slow[0], (fast, slow)
    assert fast[1] == slow[1]
    assert fast[2] == slow[2]
    assert fast[3] == slow[3]
    if fast[0] == 0:
        assert fast[1] or fast[3]  # it produced something
    else:
        assert fast[2]  # and a failure said why


def test_plain_flags_are_parsed_as_typer_parses_them() -> None:
    """The typer-free parse gives exactly the values typer passes (recorded from typer itself)."""
    import typer
    from typer.testing import CliRunner

    from servescope.cli.common import register

    seen: list[dict[str, object]] = []

    def record(**values: object) -> None:
        seen.append(values)

    record.__doc__ = "record"
    argvs = [
        [str(SMALL)],
        ["a", "b", "--json", "-o", "x.json", "--top", "7", "--step-gap-us", "0.25", "--example"],
        ["--taxonomy=t.toml", "c", "--html", "r.html", "--step-gap-us", "100"],
        [],
    ]
    for argv in argvs:
        app = typer.Typer()
        register(app, record, ANALYZE_FLAGS, name="analyze")
        app.command("other")(lambda: None)  # a group, so "analyze" is a subcommand as in servescope
        result = CliRunner().invoke(app, ["analyze", *argv])
        assert result.exit_code == 0, result.output
        typer_values = seen.pop()
        plain = parse_plain(argv, ANALYZE_FLAGS)
        assert plain is not None
        assert {k: (list(v) if isinstance(v, tuple) else v) for k, v in typer_values.items()} == {
            k: (v if v is not None or k != "paths" else typer_values["paths"]) for k, v in plain.items()
        }


@pytest.mark.parametrize("argv", [["--help"], ["--"], ["-o"], ["--top", "1e3"], ["--top", "01"], ["-x"],
                                  ["--json=1"], ["-o=f"], [""], ["--step-gap-us", ".5"], ["--output", "-"]])
def test_anything_unusual_is_left_to_typer(argv: list[str]) -> None:
    assert parse_plain(argv, ANALYZE_FLAGS) is None


def test_plain_analyze_imports_no_typer_rich_or_pydantic(tmp_path: Path) -> None:
    """`-X importtime` names every module as it is imported (the fast route ends in os._exit, so nothing can
    be asked of the process after main())."""
    target = tmp_path / "out.json"
    code = ("import sys; sys.argv = ['servescope', 'analyze', sys.argv[1], '--json', '-o', sys.argv[2]]\n"
            "from servescope.cli import main\nmain()\n")
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code, str(SMALL), str(target)],
                          capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.decode().splitlines()
                if line.startswith("import time:")}
    assert "servescope.trace.analyze" in imported and "numpy" in imported  # the route did run
    assert not {"typer", "rich", "pydantic", "plotly"} & imported
    assert target.read_bytes().startswith(b"{")
