"""Trace files found and decoded: the JSON cut into blocks of whole events, decoded (in child processes ahead of
the caller where it pays) into the columnar tables of :class:`~servescope.trace.read.table.TraceData`.

Nothing here imports numpy at module level or any other room of ``trace``: a read-ahead child imports only this.
"""

__all__: list[str] = []
