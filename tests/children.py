"""Signal dispositions for the child processes tests start and then signal.

A shell started without job control runs a background command (``pytest … &``, CI runners, some IDEs) with
SIGINT and SIGQUIT ignored, and a child inherits an ignored disposition across exec. A Python child whose
SIGINT is ignored on entry installs no KeyboardInterrupt handler, so a test that sends it SIGINT sees it run
on. A test that signals a child passes ``preexec_fn=default_signals`` (or calls it in the child) so the child
starts with the default dispositions whatever the test runner inherited.
"""

from __future__ import annotations

import signal

__all__ = ["SIGNALS_TESTS_SEND", "default_signals"]

# Every signal a test here sends that a process can ignore (SIGKILL cannot be ignored), plus SIGHUP for nohup.
SIGNALS_TESTS_SEND = (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGHUP)


def default_signals() -> None:
    """Set SIGINT, SIGTERM, SIGQUIT and SIGHUP to their default action (for ``subprocess.Popen(preexec_fn=…)``)."""
    for sig in SIGNALS_TESTS_SEND:
        signal.signal(sig, signal.SIG_DFL)
