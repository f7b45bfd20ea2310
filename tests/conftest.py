"""Shared fixtures and the ../shared rule; the helpers they use live in tracefiles.py (importable as `tracefiles`).

Tests that read ``../shared`` (``needs_shared`` marker, or a parameter that is a path in it) are skipped when
the corpus is not beside the checkout, and counted in one line under pytest's header; with
``SERVESCOPE_REQUIRE_SHARED=1`` (set by ``.ci/run``) a missing corpus stops the run with an error instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from alone_last import AloneLast, runs_alone
from tracefiles import REQUIRE_ENV, SHARED, SPLIT_ENV, in_shared, shared_present, shared_required

_NEEDING = pytest.StashKey[int]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "needs_shared: reads the ../shared corpus; skipped when it is absent")
    config.addinivalue_line("markers", "slow: minutes; runs only with SERVESCOPE_SLOW=1 (CI sets it)")
    if shared_required() and not shared_present():
        raise pytest.UsageError(f"{REQUIRE_ENV}=1 but the corpus is missing: no folder {SHARED} "
                                "(CI lays ../shared beside the checkout)")


def needs_shared(item: pytest.Item) -> bool:
    """A test reads ../shared: it is marked so, or one of its parameters is a path inside it."""
    if item.get_closest_marker("needs_shared") is not None:
        return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and any(in_shared(v) for v in callspec.params.values())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("SERVESCOPE_SLOW", "").strip() in ("", "0"):
        slow = pytest.mark.skip(reason="slow (minutes): SERVESCOPE_SLOW=1 runs it, as CI does")
        for item in items:
            if item.get_closest_marker("slow") is not None:
                item.add_marker(slow)
    _check_alone(items)
    needing = [item for item in items if needs_shared(item)]
    config.stash[_NEEDING] = len(needing)
    if os.environ.get(SPLIT_ENV, "").strip() not in ("", "0"):
        # CI: a test that reads neither ../shared nor is slow runs in the README's clone (tests/test_corpus.py,
        # the README's test command on a fresh clone without ../shared), so each test runs once
        there = pytest.mark.skip(reason="runs in the README's clone (CI's split)")
        for item in items:
            if not needs_shared(item) and item.get_closest_marker("slow") is None:
                item.add_marker(there)
    if not shared_present():
        skip = pytest.mark.skip(reason=f"needs the ../shared corpus, not found at {SHARED}")
        for item in needing:
            item.add_marker(skip)


# The fixtures and helpers that start a real server for a test: such tests must run alone under -n (alone_last.py)
_SERVER_FIXTURES = frozenset({"vllm_server", "ready_server", "capped_server", "profiling_server", "toy_unit"})


_SERVER_HELPERS = frozenset({"running_sse_server", "toy_command", "run_toy_tune"})


def _starts_a_server(item: pytest.Item) -> bool:
    module = getattr(item, "module", None)
    return bool(_SERVER_FIXTURES & set(getattr(item, "fixturenames", ()))
                or (module is not None and _SERVER_HELPERS & set(vars(module))))


def _check_alone(items: list[pytest.Item]) -> None:
    strays = [item.nodeid for item in items if _starts_a_server(item) and not runs_alone(item.nodeid)]
    if strays:
        raise pytest.UsageError(f"{strays[0]} (and {len(strays) - 1} more) start a server but are not among "
                                "the tests that run alone: add its place to ALONE in tests/alone_last.py")


def _shared_line(count: int) -> str:
    if shared_present():
        return f"../shared: {SHARED}: {count} tests read it"
    return (f"../shared: not found at {SHARED}: {count} tests that read it are skipped (the traces and GPU "
            f"recordings the project may not ship; CI sets {REQUIRE_ENV}=1 and fails without it)")


def pytest_report_collectionfinish(config: pytest.Config, start_path: Path, items: list[pytest.Item]) -> str:
    """One line under the header (shown at any verbosity, unlike pytest_report_header under -q)."""
    return _shared_line(config.stash.get(_NEEDING, 0))


# Under pytest-xdist (-n) the workers collect, not the controller: each worker hands its count on, and the
# controller says the same line once, at the end.

def pytest_sessionfinish(session: pytest.Session) -> None:
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["needing_shared"] = session.config.stash.get(_NEEDING, 0)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    count = getattr(node, "workeroutput", {}).get("needing_shared")
    if count is not None:
        node.config.stash[_NEEDING] = count


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("dsession") and _NEEDING in config.stash:
        terminalreporter.write_line(_shared_line(config.stash[_NEEDING]))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``-n``: the tests that start servers or time things run alone, after the rest (tests/alone_last.py)."""
    return AloneLast(config, log) if config.getvalue("dist") == "load" else None


@pytest.fixture
def written(tmp_path: Path) -> Callable[..., Path]:
    """``written(text, name="bad.toml")``: a file of this test's folder holding ``text``, for tests of what a
    loader says about a bad input file."""

    def write(text: str, name: str = "bad.toml") -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return write
