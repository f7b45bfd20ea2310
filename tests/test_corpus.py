"""The ../shared rule: tests that read the corpus run when it is there, are skipped (and counted in one header
line) on a clone without it, and fail the run in CI; the README's test command passes on a fresh clone."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tracefiles import CORPUS, REQUIRE_ENV, ROOT, SHARED, SPLIT_ENV, TRACES

_LINE = re.compile(r"^\.\./shared: not found at (?P<at>\S+): (?P<count>\d+) tests that read it are skipped \(",
                   re.M)
_SUMMARY = re.compile(r"^(?:=+ )?(?P<body>(?:\d+ \w+(?:, )?)+) in [\d.]+s", re.M)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("SERVESCOPE_SHARED", REQUIRE_ENV, "SERVESCOPE_SLOW", SPLIT_ENV)}
    return {**env, **extra}


def _pytest(args: list[str], env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600, check=False)


def _counts(stdout: str) -> dict[str, int]:
    match = list(_SUMMARY.finditer(stdout))
    assert match, stdout[-2000:]
    return {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", match[-1]["body"])}


@pytest.mark.needs_shared
def test_the_corpus_list_names_every_shared_trace() -> None:
    """CORPUS (what a clone without ../shared collects) is the folder's content, so no trace is left untested."""
    assert sorted(str(p.relative_to(TRACES)) for p in TRACES.glob("*/*.json.gz")) == sorted(CORPUS)


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_without_the_corpus_its_tests_are_skipped_and_counted_in_one_line(tmp_path: Path, workers: list[str]) -> None:
    """Real pytest runs over a module that mixes corpus tests and its own: the corpus's are skipped, counted (in
    one line, also when xdist's workers collect and the controller says it)."""
    target = "tests/trace/test_ranks.py"
    proc = _pytest([*workers, target], _env(SERVESCOPE_SHARED=str(tmp_path / "nothing")))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [line] = _LINE.finditer(proc.stdout)
    assert line["at"] == str(tmp_path / "nothing")
    counts = _counts(proc.stdout)
    marked = len(re.findall(r"^@pytest\.mark\.needs_shared$", (ROOT / target).read_text(), re.M))
    assert int(line["count"]) == counts["skipped"] == marked > 0
    assert counts["passed"] > 0  # the module's own tests still ran


def test_ci_fails_the_run_when_the_corpus_is_missing(tmp_path: Path) -> None:
    proc = _pytest(["tests/trace/test_ranks.py"], _env(SERVESCOPE_SHARED=str(tmp_path / "nothing"),
                                                       **{REQUIRE_ENV: "1"}))
    assert proc.returncode not in (0, 5), proc.stdout[-2000:]
    assert f"{REQUIRE_ENV}=1 but the corpus is missing: no folder {tmp_path / 'nothing'}" in proc.stderr
    assert "passed" not in proc.stdout


def test_ci_sets_the_requirement() -> None:
    text = (ROOT / ".ci" / "run").read_text()
    assert f"export {REQUIRE_ENV}=1" in text and "export SERVESCOPE_SLOW=1" in text
    assert f"export {SPLIT_ENV}=1" in text  # each test once: here the corpus's and the slow, the rest in the clone


def test_ci_split_leaves_to_the_clone_only_what_reads_neither_the_corpus_nor_is_slow(tmp_path: Path) -> None:
    """Under CI's split a module mixing corpus tests and its own runs only the corpus's; the clone's run (the
    README's command, the split not passed on) runs the others."""
    target = "tests/trace/test_ranks.py"
    split = _pytest([target], _env(**{SPLIT_ENV: "1"}))
    alone = _pytest([target], _env(SERVESCOPE_SHARED=str(tmp_path / "nothing")))
    assert split.returncode == alone.returncode == 0, split.stdout[-2000:] + alone.stdout[-2000:]
    marked = len(re.findall(r"^@pytest\.mark\.needs_shared$", (ROOT / target).read_text(), re.M))
    ran, rest = _counts(split.stdout), _counts(alone.stdout)
    if SHARED.is_dir():
        assert ran["passed"] == marked and ran["skipped"] == rest["passed"] > 0


def _readme_test_command() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)\n```", readme.split("## Two commands", 1)[1], re.S)
    [command] = [b for b in blocks if "pytest" in b]
    return command


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    assert _readme_test_command() in (ROOT / ".ci" / "run").read_text()


@pytest.mark.slow
def test_the_readme_test_command_passes_on_a_fresh_clone_without_shared(tmp_path: Path) -> None:
    """`git clone` of this checkout's HEAD into a temp dir (nothing beside it), then the README's test command."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=300)
    assert not (clone.parent / "shared").exists()
    proc = subprocess.run(["bash", "-c", _readme_test_command()], cwd=clone, env=_env(), capture_output=True,
                          text=True, timeout=3600, check=False)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    [line] = _LINE.finditer(proc.stdout)
    assert Path(line["at"]) == (tmp_path / "shared").resolve()
    counts = _counts(proc.stdout)
    assert counts.get("failed", 0) == 0 and counts.get("errors", 0) == 0
    assert counts["passed"] > 0 and counts["skipped"] >= int(line["count"]) > 0
