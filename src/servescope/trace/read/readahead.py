"""Trace files decoded in forked child processes while the caller goes on with other work.

Decoding a trace is CPU work in one thread (msgspec holds the GIL), and so is importing numpy and the
analysis modules; with two or more cores they can run at once. :class:`ReadAhead` forks its children
*before* its caller imports anything heavy (this module imports only the standard library and
:mod:`servescope.core.cpus`, which is ``os`` alone); each imports just the decoder
(:mod:`servescope.trace.read.trace_json`) and sends what it decodes back through a pipe, one pickle at a time, read
by a thread per pipe so that no child waits on a full pipe.

Up to one child per core is started, each decoding its share of the files, biggest first. One file of over
``SPLIT_BYTES`` of JSON, read alone, is cut into byte ranges instead, each moved to the next event boundary
(:func:`~servescope.trace.read.trace_json.decode_parts`): one child maps or inflates the file once and forks a helper
per range but its own, which decode from that one copy; each sends its part straight to the caller through a pipe
of its own (the caller made them all before the first fork), and the caller joins them in order. The child and its
helpers form a process group, stopped together. (Sharing one gzip file's blocks between a child and the caller was
tried: the caller must inflate the file again to help, which costs what its help saves.)

It never changes a result, only when it is computed: if ``fork`` is missing, the caller already runs other
threads (forking those is unsafe), the machine has one core, a child cannot be started or dies, or a file
fails in any way other than an ``InputError`` (which the child sends back), what was not delivered is decoded
in the caller's process by :meth:`ReadAhead.take`, exactly as without read-ahead.
"""

from __future__ import annotations

import os
import pickle
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from servescope.core.cpus import usable_cpus

if TYPE_CHECKING:
    from servescope.trace.read.parts import Part
    from servescope.trace.read.table import TraceData

__all__ = ["SPLIT_BYTES", "ReadAhead"]

SPLIT_BYTES = 16 << 20
"""A trace of more JSON than this, read alone, is decoded in parts by several children."""
_PART_BYTES = 16 << 20  # at least this much JSON per part
# A gzip trace of more JSON than this is inflated as a stream by one process (the decoder's _WHOLE_LIMIT), not
# inflated whole by each part.
_WHOLE_GZ_BYTES = 128 << 20


@dataclass(slots=True)
class _Child:
    pid: int  # the leader of its process group (its helpers, if any, are in it too)
    fds: list[int]  # the read ends of its pipes: its own, then one per helper
    paths: list[Path]
    readers: list[threading.Thread] = field(default_factory=list)
    open_pipes: int = field(init=False)  # how many of its pipes have not reached their end

    def __post_init__(self) -> None:
        self.open_pipes = len(self.fds)

    @property
    def ended(self) -> bool:
        """Every pipe reached its end: whatever it did not send, it never will."""
        return self.open_pipes == 0


@dataclass(slots=True)
class _Outcome:
    trace: TraceData | None = None
    error: tuple[str, str] | None = None  # an InputError's (source, problem)


@dataclass
class ReadAhead:
    """Decode ``paths`` in child processes (up to ``jobs``, default one per usable core), starting now.

    Use it as a context manager, and :meth:`take` each file when needed; leaving the block stops and reaps
    every child still running. ``min_files``: fewer files than this are not worth a process and are read in
    :meth:`take` (the CLI passes 1, to overlap even one file with its imports).
    """

    paths: Sequence[Path]
    jobs: int | None = None
    min_files: int = 2
    _children: list[_Child] = field(default_factory=list, init=False)
    _child_of: dict[Path, _Child] = field(default_factory=dict, init=False)
    _done: dict[Path, _Outcome] = field(default_factory=dict, init=False)
    _parts: dict[int, Part] = field(default_factory=dict, init=False)
    _split: Path | None = field(default=None, init=False)  # the one file decoded in parts
    _part_count: int = field(default=0, init=False)
    _ready: threading.Condition = field(default_factory=threading.Condition, init=False)

    def __post_init__(self) -> None:
        jobs = min(len(self.paths), self.jobs or usable_cpus())
        if len(self.paths) < self.min_files or jobs < 1 or not _safe_to_fork():
            return
        if self.jobs is None and usable_cpus() < 2:
            return
        parts = _parts_for(self.paths, self.jobs or usable_cpus())
        shares = _shares(self.paths, jobs) if parts == 1 else []
        # the decoder (msgspec and what it imports: ~40 ms) imported once here, before the children are forked:
        # they inherit it, and this process needs it anyway to take their results
        import servescope.trace.read.parts  # noqa: F401
        import servescope.trace.read.trace_json  # noqa: F401
        if parts > 1:
            self._split, self._part_count = self.paths[0], parts
            child = _fork([self._split], partial(_decode_parts, self._split), pipes=parts)
            if child is not None:  # else take() decodes the file itself
                self._children.append(child)
        else:
            for share in shares:
                child = _fork(share, partial(_decode_files, share))
                if child is None:
                    break  # its files and the rest are read in take()
                self._children.append(child)
                self._child_of.update(dict.fromkeys(share, child))
        for child in self._children:  # threads only after the last fork
            child.readers = [threading.Thread(target=self._drain, args=(child, fd), daemon=True) for fd in child.fds]
            for reader in child.readers:
                reader.start()

    @property
    def forked(self) -> int:
        """How many child processes were started."""
        return len(self._children)

    def take(self, path: Path) -> TraceData:
        """The decoded trace at ``path``: from its child when it delivered it, else decoded here.

        Raises:
            InputError: the file is not a readable trace (as :func:`~servescope.trace.read.trace_json.decode_trace`).
        """
        from servescope.core.errors import InputError

        if path == self._split:
            return self._take_parts(path)
        child = self._child_of.get(path)
        if child is not None:
            with self._ready:
                self._ready.wait_for(lambda: path in self._done or child.ended)
                outcome = self._done.pop(path, None)
            if outcome is not None and outcome.error is not None:
                raise InputError(*outcome.error)
            if outcome is not None and outcome.trace is not None:
                return outcome.trace
        from servescope.trace.read.trace_json import decode_trace

        return decode_trace(path)

    def _take_parts(self, path: Path) -> TraceData:
        """The file joined from every child's part, or decoded here when a part is missing or they do not join."""
        from servescope.trace.read.parts import join_parts
        from servescope.trace.read.trace_json import decode_trace

        count = self._part_count if self._children else 0
        with self._ready:
            self._ready.wait_for(lambda: all(c.ended for c in self._children) or len(self._parts) == count)
            parts = [self._parts.get(i) for i in range(count)]
        if count and all(part is not None for part in parts):
            try:
                return join_parts(path, [part for part in parts if part is not None])
            except ValueError:
                pass
        return decode_trace(path)

    def _drain(self, child: _Child, fd: int) -> None:
        """Read the results that come through one of the child's pipes (a thread per pipe)."""
        from servescope.trace.read.parts import Part

        try:
            with os.fdopen(fd, "rb") as pipe:
                while True:
                    index, outcome = pickle.load(pipe)
                    with self._ready:
                        if isinstance(outcome, Part):
                            self._parts[index] = outcome
                        else:
                            self._done[child.paths[index]] = outcome
                        self._ready.notify_all()
        except Exception:  # noqa: BLE001, S110 - the end of the pipe, or a child that died mid-result: take() reads the rest
            pass
        finally:
            with self._ready:
                child.open_pipes -= 1
                self._ready.notify_all()

    def close(self) -> None:
        """Stop the children still running and reap them all."""
        import signal

        for child in self._children:
            if not child.ended:  # the child and its helpers: a helper's pipe ends only when the helper does
                try:
                    os.killpg(child.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            try:
                os.waitpid(child.pid, 0)
            except ChildProcessError:
                pass
            for reader in child.readers:
                reader.join()
        self._children.clear()

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _safe_to_fork() -> bool:
    return hasattr(os, "fork") and threading.active_count() == 1


def _shares(paths: Sequence[Path], jobs: int) -> list[list[Path]]:
    """``paths`` dealt to ``jobs`` children, biggest file first to the least loaded, each share biggest first."""
    def size(path: Path) -> int:
        try:
            return path.stat().st_size
        except OSError:
            return 0

    shares: list[list[Path]] = [[] for _ in range(jobs)]
    load = [0] * jobs
    for path in sorted(paths, key=size, reverse=True):
        least = load.index(min(load))
        shares[least].append(path)
        load[least] += size(path)
    return [share for share in shares if share]


def _parts_for(paths: Sequence[Path], cores: int) -> int:
    """Into how many parts one file is cut: 1 unless it is a single file of over SPLIT_BYTES of JSON (plain, or a
    gzip one the decoder would inflate whole: each part inflates it again), ``_PART_BYTES`` or more per part."""
    if len(paths) != 1 or cores < 2:
        return 1
    try:
        size = paths[0].stat().st_size
        with paths[0].open("rb") as handle:
            gzipped = handle.read(2) == b"\x1f\x8b"
            if gzipped:  # the JSON's size, as the gzip trailer gives it (modulo 4 GiB)
                handle.seek(max(size - 4, 0))
                size = int.from_bytes(handle.read(4), "little")
    except OSError:
        return 1
    if size <= SPLIT_BYTES or (gzipped and size > _WHOLE_GZ_BYTES):
        return 1
    return max(2, min(cores, size // _PART_BYTES))


def _fork(paths: list[Path], work: Callable[[list[int]], None], pipes: int = 1) -> _Child | None:
    """A child running ``work`` on the write ends of ``pipes`` pipes (its results for ``paths``), the leader of a
    process group of its own; None when it cannot be started."""
    ends: list[tuple[int, int]] = []
    try:
        for _ in range(pipes):
            ends.append(os.pipe())
        pid = os.fork()
    except OSError:
        for read_end, write_end in ends:
            os.close(read_end)
            os.close(write_end)
        return None
    if pid == 0:  # the child: never returns, and exits without cleanup (the buffers, atexit handlers and
        status = 1  # threads it inherited are the caller's)
        try:
            import gc

            gc.disable()  # it makes millions of acyclic objects and lives for a moment
            os.setpgid(0, 0)  # its helpers join its group: close() stops them all at once
            for read_end, _ in ends:
                os.close(read_end)
            work([write_end for _, write_end in ends])
            status = 0
        except BaseException:  # noqa: BLE001, S110 - anything else: the caller decodes what is missing itself
            pass
        finally:
            os._exit(status)
    try:  # on both sides, as shells do: whichever runs first makes the group, so that a close() right after the
        os.setpgid(pid, pid)  # fork finds it (else its kill finds no group, and the child runs on to the end)
    except OSError:
        pass  # the child made it already, or has ended
    for _, write_end in ends:
        os.close(write_end)
    return _Child(pid=pid, fds=[read_end for read_end, _ in ends], paths=paths)


def _send(pipe: BinaryIO, index: int, outcome: object) -> None:
    pickle.dump((index, outcome), pipe, protocol=pickle.HIGHEST_PROTOCOL)
    pipe.flush()


def _send_part(fd: int, index: int, part: Part) -> None:
    """Part ``index`` pickled into the pipe ``fd``, which is closed after (the caller's reader sees its end)."""
    with os.fdopen(fd, "wb") as pipe:
        _send(pipe, index, part)


def _decode_parts(path: Path, pipes: list[int]) -> None:
    """A child's work on a file decoded in as many parts as ``pipes``: the JSON mapped or inflated once, then a
    helper forked for each part but the first, which all decode at once from that one copy (a gzip file is not
    inflated again per part), each part sent through its own pipe. Any problem ends a part quietly: the caller
    decodes the whole file itself, and names the problem."""
    from servescope.trace.read.parts import decode_parts

    def each(part_of: Callable[[int], Part]) -> None:
        helpers: list[int] = []
        try:
            for index in range(1, len(pipes)):
                pid = os.fork()
                if pid == 0:  # a helper: its part into its own pipe, then gone
                    status = 1
                    try:
                        for fd in (pipes[0], *pipes[index + 1:]):  # the earlier helpers' are closed already
                            os.close(fd)
                        _send_part(pipes[index], index, part_of(index))
                        status = 0
                    except BaseException:  # noqa: BLE001, S110 - its part goes missing: the caller decodes the file
                        pass
                    finally:
                        os._exit(status)
                os.close(pipes[index])
                helpers.append(pid)
            _send_part(pipes[0], 0, part_of(0))
        finally:  # the helpers reaped (a part that failed is missing at the caller, which decodes the file)
            for pid in helpers:
                os.waitpid(pid, 0)

    decode_parts(path, len(pipes), each)


def _decode_files(paths: list[Path], pipes: list[int]) -> None:
    """The child's work: each file's trace, or the InputError that names its problem, pickled into its pipe."""
    from servescope.core.errors import InputError
    from servescope.trace.read.trace_json import decode_trace

    with os.fdopen(pipes[0], "wb") as pipe:
        for index, path in enumerate(paths):
            try:
                outcome = _Outcome(trace=decode_trace(path))
            except InputError as exc:
                outcome = _Outcome(error=(exc.source, exc.problem))
            _send(pipe, index, outcome)
