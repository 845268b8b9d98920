"""Keeping Spark's Python workers' garbage collection off the relay's per-batch path.

PySpark's worker daemon runs a full ``gc.collect()`` after every task a reused worker ran
(``pyspark/daemon.py``). A worker that publishes holds SQLAlchemy, pydantic, the
configuration and the target clients: tens of thousands of long-lived objects that each
collection walks again (22 ms for the imports alone, measured; most of a low-rate
micro-batch's Python CPU in a profile of the latency run). :func:`freeze_heap` moves what
a worker holds after its first task into the permanent generation, which collections
skip; what later tasks allocate is collected as before.

Within a task, :func:`collection_paused` keeps the collector from running at all: a chunk
of the log is tens of thousands of events held at once, several objects each, and the
collections their allocation sets off walk them again and again (10-15% of a task's CPU on
a frozen heap, 20% without, measured on the event-store relay). Those objects hold no
reference cycles: they are freed by their counts as each chunk is done, and what a task
leaves in cycles is collected right after it, by the daemon's collection.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

_frozen = False


def freeze_heap() -> None:
    """Once per process: collect what is garbage now, then freeze what is left.

    Called at the end of a task's work, when the worker's imports, engine, compiled
    statements and targets exist; collecting first means no garbage is frozen for good.
    """
    global _frozen
    if _frozen:
        return
    _frozen = True
    gc.collect()
    gc.freeze()


@contextmanager
def collection_paused() -> Iterator[None]:
    """No automatic garbage collection in this block (see the module's docstring); as it
    was afterwards (a caller that had turned it off keeps it off)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
