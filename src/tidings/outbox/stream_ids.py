"""What the outbox log records of the ``rabbitmq_stream`` target's producers: which sender
holds which producer reference, and the publishing id each event was sent under.

RabbitMQ de-duplicates a stream's messages per named producer (its *reference*): it stores a
message only if its publishing id is above the last one stored for that reference, and
confirms the others without storing them. Exactly-once into the stream then needs three
things the broker cannot give, and this module keeps them in the outbox database, beside the
events, on SQLite, PostgreSQL and MySQL/MariaDB alike:

* **one sender per reference at a time**: ``tidings_stream_producer`` holds, per (target,
  stream), a small pool of slots (slot ``n`` is the reference ``<target>.producer-<n>``),
  each taken by one sender with a lease (:meth:`StreamIds.take`, a compare-and-set
  update), renewed with every send and released cleanly, or left to expire when its sender
  died or lost its connection;
* **the id of every event, written before the event is sent** (``tidings_stream_publish``,
  one set-based write per batch, in the same transaction that renews the lease:
  :meth:`StreamIds.assign`), so that a sender taking a reference after a crash knows what
  the last one sent;
* **reconciliation** against the broker's last stored id ``L`` for the reference
  (:meth:`StreamIds.reconcile`): an event assigned an id up to ``L`` is stored and is
  confirmed without sending; an assignment above ``L`` was not stored and is dropped, so the
  event is sent again under a new id, above ``L``.

The target (:mod:`tidings.targets.kinds.rabbitmq_stream`) drives this; the design notes
(docs/design/rabbitmq-streams.md) say why it is exactly-once and what it relies on.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    and_,
    delete,
    exists,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.dialects import mysql, postgresql, sqlite

from tidings.db import is_mysql
from tidings.outbox.schema import outbox_event, stream_producer, stream_publish

#: ``holder`` of a slot whose sender gave it up with messages perhaps still in flight: it
#: may be reconciled once ``expires_at`` has passed, never renewed.
ABANDONED = "(abandoned)"
#: How many event ids go into one ``IN`` list.
_CHUNK = 500


@dataclass(frozen=True)
class Assignment:
    """Where one event was sent: its stream, producer slot and publishing id."""

    stream: str
    slot: int
    publishing_id: int


def reference(target: str, slot: int) -> str:
    """The producer reference (the broker's de-duplication name) of ``slot`` of ``target``."""
    return f"{target}.producer-{slot}"


class StreamIds:
    """The producer slots and publishing ids of one ``rabbitmq_stream`` target in one log."""

    def __init__(self, engine: Engine, target: str) -> None:
        self.engine = engine
        self.target = target

    # -- slots ---------------------------------------------------------------------------

    def take(
        self, stream: str, holder: str, lease: float, pool: int, slot: int | None = None
    ) -> int | float:
        """Take a free slot of ``stream`` (``slot``: that one) for ``holder`` for ``lease``
        seconds: its number, or, if none is free, how many seconds until the first held one
        expires (a float). Free: never taken, released, or its lease expired."""
        now = time.time()
        wanted = range(pool) if slot is None else [slot]
        with self.engine.begin() as conn:
            _insert_missing(conn, [self._slot_row(stream, n) for n in wanted])
        for n in wanted:
            with self.engine.begin() as conn:
                taken = conn.execute(
                    update(stream_producer)
                    .where(
                        self._slot(stream, n),
                        or_(stream_producer.c.holder.is_(None), stream_producer.c.expires_at < now),
                    )
                    .values(holder=holder, expires_at=now + lease)
                ).rowcount
            if taken == 1:
                return n
        with self.engine.connect() as conn:
            soonest = conn.execute(
                select(stream_producer.c.expires_at)
                .where(
                    stream_producer.c.target == self.target,
                    stream_producer.c.stream == stream,
                    stream_producer.c.slot.in_(list(wanted)),
                )
                .order_by(stream_producer.c.expires_at)
                .limit(1)
            ).scalar_one()
        return max(float(soonest) - now, 0.0) + 0.001

    def release(self, stream: str, slot: int, holder: str) -> None:
        """Give the slot back: nothing sent under it is in flight."""
        self._set_holder(stream, slot, holder, None, 0.0)

    def abandon(self, stream: str, slot: int, holder: str, lease: float) -> None:
        """Give the slot up with messages perhaps in flight: nobody may reconcile it for
        ``lease`` seconds, by when the broker has stored or dropped them."""
        self._set_holder(stream, slot, holder, ABANDONED, time.time() + lease)

    def _set_holder(
        self, stream: str, slot: int, holder: str, new: str | None, expires_at: float
    ) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                update(stream_producer)
                .where(self._slot(stream, slot), stream_producer.c.holder == holder)
                .values(holder=new, expires_at=expires_at)
            )

    # -- publishing ids ------------------------------------------------------------------

    def assign(
        self,
        stream: str,
        slot: int,
        holder: str,
        lease: float,
        ids: Sequence[tuple[str, int]],
    ) -> bool:
        """Record that each ``(event id, publishing id)`` of ``ids`` is about to be sent under
        ``slot``, renewing ``holder``'s lease, in one transaction; False (nothing written) if
        the lease is no longer ``holder``'s."""
        with self.engine.begin() as conn:
            renewed = conn.execute(
                update(stream_producer)
                .where(self._slot(stream, slot), stream_producer.c.holder == holder)
                .values(expires_at=time.time() + lease)
            ).rowcount
            if renewed != 1:
                return False
            self._forget(conn, [event_id for event_id, _ in ids])
            if ids:
                conn.execute(
                    insert(stream_publish),
                    [
                        {
                            "target": self.target,
                            "event_id": event_id,
                            "stream": stream,
                            "slot": slot,
                            "publishing_id": publishing_id,
                        }
                        for event_id, publishing_id in ids
                    ],
                )
        return True

    def assignments(self, event_ids: Iterable[str]) -> dict[str, Assignment]:
        """The recorded assignment of each of ``event_ids`` that has one."""
        found: dict[str, Assignment] = {}
        wanted = list(event_ids)
        with self.engine.connect() as conn:
            for start in range(0, len(wanted), _CHUNK):
                rows = conn.execute(
                    select(
                        stream_publish.c.event_id,
                        stream_publish.c.stream,
                        stream_publish.c.slot,
                        stream_publish.c.publishing_id,
                    ).where(
                        stream_publish.c.target == self.target,
                        stream_publish.c.event_id.in_(wanted[start : start + _CHUNK]),
                    )
                )
                for event_id, stream, slot, publishing_id in rows:
                    found[event_id] = Assignment(stream, int(slot), int(publishing_id))
        return found

    def forget(self, event_ids: Sequence[str]) -> None:
        """Drop the assignments of ``event_ids``: the broker refused their messages."""
        with self.engine.begin() as conn:
            self._forget(conn, event_ids)

    def reconcile(self, stream: str, slot: int, last_stored: int) -> None:
        """The broker's last stored id for the slot's reference is ``last_stored``: drop the
        assignments above it (never stored, and never will be: the caller holds the slot)."""
        with self.engine.begin() as conn:
            conn.execute(
                delete(stream_publish).where(
                    stream_publish.c.target == self.target,
                    stream_publish.c.stream == stream,
                    stream_publish.c.slot == slot,
                    stream_publish.c.publishing_id > last_stored,
                )
            )

    def forget_published(self) -> int:
        """Drop the assignments of events that are PUBLISHED or gone from the log: the relay
        recorded them, and will not hand them to the target again. The number dropped."""
        still_open = exists().where(
            outbox_event.c.event_id == stream_publish.c.event_id,
            outbox_event.c.status != "PUBLISHED",
        )
        with self.engine.begin() as conn:
            return int(
                conn.execute(
                    delete(stream_publish).where(
                        stream_publish.c.target == self.target, ~still_open
                    )
                ).rowcount
            )

    # -- helpers -------------------------------------------------------------------------

    def _forget(self, conn: Connection, event_ids: Sequence[str]) -> None:
        for start in range(0, len(event_ids), _CHUNK):
            conn.execute(
                delete(stream_publish).where(
                    stream_publish.c.target == self.target,
                    stream_publish.c.event_id.in_(list(event_ids[start : start + _CHUNK])),
                )
            )

    def _slot(self, stream: str, slot: int) -> ColumnElement[bool]:
        return and_(
            stream_producer.c.target == self.target,
            stream_producer.c.stream == stream,
            stream_producer.c.slot == slot,
        )

    def _slot_row(self, stream: str, slot: int) -> dict[str, object]:
        return {
            "target": self.target,
            "stream": stream,
            "slot": slot,
            "holder": None,
            "expires_at": 0.0,
        }


def _insert_missing(conn: Connection, rows: list[dict[str, object]]) -> None:
    """Insert the slot rows that are not there yet, leaving existing ones as they are."""
    name = conn.dialect.name
    if name == "postgresql":
        conn.execute(postgresql.insert(stream_producer).on_conflict_do_nothing(), rows)
    elif is_mysql(name):
        conn.execute(mysql.insert(stream_producer).prefix_with("IGNORE"), rows)
    else:
        conn.execute(sqlite.insert(stream_producer).on_conflict_do_nothing(), rows)
