"""The highest log sequence the relay may read without ever skipping a row.

SQLite serialises writers, so a sequence value is visible only after every lower one
committed or rolled back: the watermark is simply the highest ``seq``.

PostgreSQL hands out sequence values without waiting for commits, so ``seq`` 10 can become
visible after ``seq`` 11. tidings draws ``seq`` through ``tidings_next_seq()``, which first
gives the transaction its transaction id. A *probe* reads the sequence's last value ``v``
and then takes a transaction id ``x`` of its own (a short transaction that commits at
once): every transaction holding a value ``<= v`` got its id before ``v`` was read, so its
id is ``< x``. Once a later snapshot's ``xmin`` is above ``x``, none of them is running any
more (``x`` has completed, so every running id below it is in the snapshot), and every row
with ``seq <= v`` that will ever exist is visible. The watermark is the largest such ``v``.
(The snapshot's own ``xmax`` would not do: it is the last *completed* id plus one, and a
transaction that got its id later but still runs is not counted below it.)
A new probe is taken only when the sequence moved past every pending probe, so an idle
relay consumes no transaction ids. The price: a long-running transaction anywhere in the
cluster delays the relay until it ends; it never makes it skip a row.
"""

from __future__ import annotations

import time
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
            conn.commit()
            value: int = last if called else 0
            if value > self._safe and all(v < value for v, _ in self._probes):
                probe = text("SELECT pg_current_xact_id()::text::bigint")
                probe_xid: int = conn.execute(probe).scalar_one()
                conn.commit()
                self._probes.append((value, probe_xid))
            xmin: int = conn.execute(
                text("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
            ).scalar_one()
            conn.rollback()
        while self._probes and self._probes[0][1] < xmin:
            self._safe = max(self._safe, self._probes.popleft()[0])
        return self._safe

    def settle(self, timeout: float) -> int:
        """Probe until what is visible now is confirmed (or ``timeout`` passes)."""
        deadline = time.monotonic() + timeout
        bound = self()
        while self._probes and time.monotonic() < deadline:
            time.sleep(0.05)
            bound = self()
        return bound
