"""``-n 2``: the tests that run alone start after every other test has ended, on one worker, in collection order
(tests/alone_last.py), judged from the times each test wrote; the collection stops on a test that starts a server
outside them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import alone_last

HERE = Path(__file__).resolve().parent

# Each test of the made-up suite writes when it started and ended, and on which worker.
_TEST = '''
import json, os, time
from pathlib import Path
from types import SimpleNamespace

def _log(name, start):
    out = Path(os.environ["ALONE_LOG"]) / f"{name}.json"
    out.write_text(json.dumps({"start": start, "end": time.time(), "worker": os.environ.get("PYTEST_XDIST_WORKER")}))

'''


def _module(names: list[str], seconds: float) -> str:
    return _TEST + "\n".join(f"def test_{n}():\n    s = time.time()\n    time.sleep({seconds})\n    _log({n!r}, s)\n"
                             for n in names)


def _suite(root: Path) -> None:
    (root / "tests" / "server").mkdir(parents=True)
    (root / "tests" / "trace").mkdir()
    (root / "tests" / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(HERE)!r})\n"
        "import pytest\n"
        "@pytest.hookimpl(optionalhook=True)\n"
        "def pytest_xdist_make_scheduler(config, log):\n"
        "    from alone_last import AloneLast\n"
        "    return AloneLast(config, log)\n")
    (root / "tests" / "server" / "test_live.py").write_text(_module(["live_a", "live_b", "live_c"], 0.2))
    (root / "tests" / "trace" / "test_short.py").write_text(_module([f"short_{i}" for i in range(24)], 0.1))
    (root / "tests" / "test_corpus.py").write_text(_module(["clone"], 0.1))


def test_alone_tests_run_after_the_others_on_one_worker_in_order(tmp_path: Path) -> None:
    pytest.importorskip("xdist")
    _suite(tmp_path)
    log = tmp_path / "log"
    log.mkdir()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", "tests"],
                          cwd=tmp_path, env={**os.environ, "ALONE_LOG": str(log)}, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    runs = {p.stem: json.loads(p.read_text()) for p in log.glob("*.json")}
    assert len(runs) == 28
    alone = ["live_a", "live_b", "live_c", "clone"]
    shared = [name for name in runs if name not in alone]
    assert {runs[n]["worker"] for n in shared} == {"gw0", "gw1"}  # the others were shared out
    assert len({runs[n]["worker"] for n in alone}) == 1
    assert min(runs[n]["start"] for n in alone) >= max(runs[n]["end"] for n in shared)
    # collection order: the folder tests/server before tests/test_corpus.py, a module's tests top-down
    order = sorted(alone, key=lambda n: runs[n]["start"])
    assert order == ["live_a", "live_b", "live_c", "clone"]


def test_the_alone_places_exist() -> None:
    for place in alone_last.ALONE:
        assert (HERE.parent / place).exists(), place


@pytest.mark.parametrize(("nodeid", "alone"), [
    ("tests/server/test_health.py::test_x", True),
    ("tests/tune/test_cli.py::test_y[1]", True),
    ("tests/test_corpus.py::test_z", True),
    ("tests/trace/test_analyze.py::test_w", False),
    ("tests/serverless/test_v.py::test_v", False),
    ("tests/bench/test_gemm.py::test_u", False),
])
def test_runs_alone_by_node_id(nodeid: str, alone: bool) -> None:
    assert alone_last.runs_alone(nodeid) is alone


def test_a_test_that_starts_a_server_outside_alone_stops_the_collection() -> None:
    """The collection's check (tests/conftest.py): a server fixture, or a module using the toy or SSE servers, in
    a place not in ALONE is one error naming the test and where to add it; the same tests in ALONE pass."""
    import conftest

    toy_module = SimpleNamespace(toy_command=object())
    plain = SimpleNamespace(nodeid="tests/trace/test_x.py::test_a", fixturenames=["tmp_path"], module=SimpleNamespace())
    by_fixture = SimpleNamespace(nodeid="tests/trace/test_x.py::test_b", fixturenames=["capped_server"],
                                 module=SimpleNamespace())
    by_module = SimpleNamespace(nodeid="tests/plan/test_y.py::test_c", fixturenames=[], module=toy_module)
    conftest._check_alone([plain])
    for stray in (by_fixture, by_module):
        with pytest.raises(pytest.UsageError, match=re.escape(stray.nodeid) + r" .*tests/alone_last\.py"):
            conftest._check_alone([plain, stray])
    conftest._check_alone([SimpleNamespace(nodeid="tests/knee/test_k.py::test_d", fixturenames=["capped_server"],
                                           module=toy_module)])
