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

MySQL/MariaDB (InnoDB) hands out AUTO_INCREMENT values the same way, and shows no
transaction horizon that can be trusted, so each emitting transaction locks its producer
connection's *slot* row before it draws a ``seq`` (:mod:`tidings.outbox.writers`). A probe
there reads the AUTO_INCREMENT counter ``c`` (every value drawn so far is below it), then
the slots locked at that moment with their committed ``claims``. Every transaction that can
still commit a ``seq < c`` holds one of those slots; once each has been seen free, or with
other committed ``claims`` (its holder committed, or a later holder did after it ended),
they have all ended and every row below ``c`` that will ever exist is visible. Nothing here
waits on a lock: the locked slots are found with ``SKIP LOCKED``. The price is the same as
on PostgreSQL, but narrower: only a long transaction *that emitted* delays the relay.
"""

from __future__ import annotations

import time
from collections import deque

from sqlalchemy import Engine, func, select, text

from tidings.db import is_mysql
from tidings.outbox.schema import outbox_event
from tidings.outbox.writers import locked_claims

_PROBES_KEPT = 256
#: The next AUTO_INCREMENT value of the log (MySQL/MariaDB): every seq drawn is below it.
_AUTO_INCREMENT = text(
    "SELECT AUTO_INCREMENT FROM information_schema.TABLES "
    "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_event'"
)


class SafeWatermark:
    """Computes the safe read bound; keep one per reader, it remembers its probes."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._safe = 0
        self._probes: deque[tuple[int, int]] = deque(maxlen=_PROBES_KEPT)
        #: MySQL's pending probes: a counter value and the slots (with their committed
        #: claims) whose holders must end before it may be read up to.
        self._slot_probes: deque[tuple[int, dict[int, int]]] = deque(maxlen=_PROBES_KEPT)

    def __call__(self) -> int:
        if self.engine.dialect.name == "postgresql":
            return self._postgres()
        if is_mysql(self.engine.dialect.name):
            return self._mysql()
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

    def _mysql(self) -> int:
        with self.engine.connect() as base:
            conn = base.execution_options(isolation_level="AUTOCOMMIT")
            if not self.engine.dialect.is_mariadb:  # type: ignore[attr-defined]
                # MySQL 8 caches table statistics for a day by default; a stale counter is
                # safe (lower) but would hold the relay back.
                conn.execute(text("SET SESSION information_schema_stats_expiry = 0"))
            counter = conn.execute(_AUTO_INCREMENT).scalar()
            value = int(counter) - 1 if counter else 0
            if value > self._safe and all(v < value for v, _ in self._slot_probes):
                self._slot_probes.append((value, locked_claims(conn)))
            waiting = sorted({slot for _, busy in self._slot_probes for slot in busy})
            now = locked_claims(conn, waiting) if waiting else {}
        for _, busy in self._slot_probes:
            for slot in [s for s, claims in busy.items() if now.get(s) != claims]:
                del busy[slot]  # seen free, or committed again: its holder then has ended
        while self._slot_probes and not self._slot_probes[0][1]:
            self._safe = max(self._safe, self._slot_probes.popleft()[0])
        return self._safe

    @property
    def _pending(self) -> bool:
        return bool(self._probes or self._slot_probes)

    def settle(self, timeout: float) -> int:
        """Probe until what is visible now is confirmed (or ``timeout`` passes)."""
        deadline = time.monotonic() + timeout
        bound = self()
        while self._pending and time.monotonic() < deadline:
            time.sleep(0.05)
            bound = self()
        return bound
