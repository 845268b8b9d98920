"""What a task of the log source is handed, and what it yields.

Apart from the data source's classes (:mod:`~tidings.pipeline.source.datasource`) so that
the log's queries and the task's work can name a slice without importing the classes that
hand them out: the source plans slices, the queries read them, the task publishes them.
Like the data source, this module loads nothing but PySpark's data source API.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

#: What the source's tasks yield: one row per task, the summary of what it published (JSON).
SCHEMA = "summary string"


@dataclass(frozen=True)
class LogSlice(InputPartition):
    """Rows with ``after < seq <= upto`` whose bucket falls to this partition."""

    after: int
    upto: int
    index: int
    count: int
    open_before: float | None = None  # replay: only open rows logged before this epoch time
    stuck_at: int | None = None  # replay: leave out keys with a FAILED event retried this often
    carry_upto: int | None = None  # carry-over: first the open rows with seq <= this
    carry_limit: int = 0  # ... at most this many of them, oldest first
