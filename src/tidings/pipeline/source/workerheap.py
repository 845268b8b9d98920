"""Keeping Spark's Python workers' garbage collection off the relay's per-batch path.

PySpark's worker daemon runs a full ``gc.collect()`` after every task a reused worker ran
(``pyspark/daemon.py``). A worker that publishes holds SQLAlchemy, pydantic, the
configuration and the target clients: tens of thousands of long-lived objects that each
collection walks again (22 ms for the imports alone, measured; most of a low-rate
micro-batch's Python CPU in a profile of the latency run). :func:`freeze_heap` moves what
a worker holds after its first task into the permanent generation, which collections
skip; what later tasks allocate is collected as before.
"""

from __future__ import annotations

import gc

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
