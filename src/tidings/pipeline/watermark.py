"""The highest log sequence the relay may read without ever skipping a row.

SQLite serialises writers, so a sequence value is visible only after every lower one
committed or rolled back: the watermark is simply the highest ``seq``.

PostgreSQL hands out sequence values without waiting for commits, so ``seq`` 10 can become
visible after ``seq`` 11. tidings draws ``seq`` through ``tidings_next_seq()``, which first
gives the transaction its transaction id. A *probe* reads the sequence's last value ``v``
and then the snapshot's ``xmax`` (the next unassigned transaction id): every transaction
holding a value ``<= v`` has an id ``< xmax``. Once a later snapshot's ``xmin`` (the oldest
running transaction) reaches that ``xmax``, all of them have finished, and every row with
``seq <= v`` that will ever exist is visible. The watermark is the largest such ``v``.
The price: a long-running transaction anywhere in the cluster delays the relay until it
ends; it never makes it skip a row.
"""

from __future__ import annotations

from collections import deque

from sqlalchemy import Engine, func, select, text

from tidings.outbox.schema import outbox_event

_PROBES_KEPT = 256


class SafeWatermark:
    """Computes the safe read bound; keep one per reader, it remembers its probes."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._safe = 0
        self._probes: deque[tuple[int, int]] = deque(maxlen=_PROBES_KEPT)

    def __call__(self) -> int:
        if self.engine.dialect.name == "postgresql":
            return self._postgres()
        with self.engine.connect() as conn:
            highest = conn.execute(select(func.max(outbox_event.c.seq))).scalar() or 0
        self._safe = max(self._safe, highest)
        return self._safe

    def _postgres(self) -> int:
        with self.engine.connect() as conn:
            last, called = conn.execute(
                text("SELECT last_value, is_called FROM outbox_event_seq_seq")
            ).one()
            # A separate statement: a fresh snapshot taken *after* the sequence was read.
            xmax, xmin = conn.execute(
                text(
                    "SELECT pg_snapshot_xmax(s)::text::bigint, pg_snapshot_xmin(s)::text::bigint "
                    "FROM pg_current_snapshot() AS s"
                )
            ).one()
            conn.rollback()
        self._probes.append((last if called else 0, xmax))
        while self._probes and self._probes[0][1] <= xmin:
            self._safe = max(self._safe, self._probes.popleft()[0])
        return self._safe
