"""Writer slots: how the relay knows, on MySQL/MariaDB, that no lower ``seq`` can still commit.

InnoDB hands out AUTO_INCREMENT values when a row is inserted, not when it commits, so
``seq`` 10 can become visible after ``seq`` 11 (PostgreSQL's sequences do the same). A
reader that took "the highest visible seq" as its bound would skip 10 for good. MySQL has
no transaction horizon a client can read reliably (``information_schema.innodb_trx`` is a
cache refreshed at most every 100 ms and cut short when it grows), so tidings makes one:

* every producer connection owns a row of ``tidings_writer`` (its *slot*), made and
  committed on a connection of its own the first time that producer connection emits, so
  the row is visible to every reader before anything depends on it;
* every emit first updates its slot (``claims = claims + 1``), in the caller's transaction,
  *before* its INSERT draws a ``seq``: the transaction then holds the slot's row lock until
  it commits or rolls back;
* the relay (:mod:`tidings.pipeline.source.watermark`) reads the AUTO_INCREMENT counter,
  then which slots are locked (``SKIP LOCKED`` tells without waiting), and reads no further
  than that counter until each of those slots has been seen free or its committed
  ``claims`` has changed: either means the transaction that held it then has ended.

Any transaction holding a ``seq`` below the counter drew it before the counter was read,
and locked its slot before that, so it is among the locked slots; once it ended, its rows
are committed (and visible to any later snapshot) or gone. Rows written into
``outbox_event`` by other means than :class:`tidings.outbox.producer.Outbox` must take a
slot the same way (:func:`claim_slot`), or the relay may skip them.

Slots are never deleted: a pooled connection remembers its slot, and an update of a deleted
one would find nothing. There is one small row per producer connection ever opened.
"""

from __future__ import annotations

from sqlalchemy import Connection, insert, select, text

from tidings.errors import EmitError
from tidings.outbox.schema import writer

#: Where a pooled connection remembers its slot (its ``info`` lives as long as the
#: connection does).
_SLOT_KEY = "tidings_writer_slot"
_CLAIM = "UPDATE tidings_writer SET claims = claims + 1 WHERE slot = %s"


def claim_slot(conn: Connection) -> None:
    """Lock this connection's slot in its current transaction (made on first use).

    Called before each INSERT into ``outbox_event`` (every emit, not once per transaction:
    a rolled-back savepoint may have undone an earlier claim's row change, and with it the
    lock the relay waits on). The row exists and is committed before it is updated here, so
    the update takes a record lock only, never a gap lock that another insert could wait on.
    """
    dbapi = conn.connection.dbapi_connection
    autocommit = getattr(dbapi, "get_autocommit", None)
    if autocommit is not None and autocommit():
        # Each statement would commit alone: the slot's lock would end before the INSERT
        # draws its seq, and the relay could pass that seq before it commits.
        raise EmitError(
            "emit needs a transaction: this MySQL connection is in autocommit mode (its "
            "isolation_level is AUTOCOMMIT), where the event and the domain write cannot "
            "commit together"
        )
    info = conn.connection.info
    slot = info.get(_SLOT_KEY)
    if slot is None:
        slot = info[_SLOT_KEY] = _new_slot(conn)
    if conn.exec_driver_sql(_CLAIM, (slot,)).rowcount != 1:
        info.pop(_SLOT_KEY, None)
        raise EmitError(
            f"this connection's writer slot {slot} is missing from tidings_writer (was the "
            "table emptied?); roll the transaction back and retry: the retry makes a new slot"
        )


def _new_slot(conn: Connection) -> int:
    """A new slot row, committed at once on another connection of the same engine."""
    with conn.engine.connect() as other:
        made = other.execute(insert(writer).values(claims=0))
        other.commit()
    key = made.inserted_primary_key
    if key is None:  # cannot happen with an AUTO_INCREMENT key; said for the type checker
        raise EmitError("the database gave no key for a new tidings_writer row")
    return int(key[0])


def locked_claims(conn: Connection, slots: list[int] | None = None) -> dict[int, int]:
    """The slots (of ``slots``, or all) that a transaction holds now, each with its committed
    ``claims``; does not wait for any lock.

    ``claims`` is read first (a consistent read: an uncommitted claim is not seen), then the
    free slots. A slot held across both reads keeps its committed ``claims`` until its holder
    ends, so a later read that finds it free or with other ``claims`` proves that holder
    ended. ``conn`` must be in autocommit mode: the shared locks the second read takes on the
    free rows are released as the statement ends, so no producer ever waits on the relay.
    """
    if slots is not None and not slots:
        return {}
    query = select(writer.c.slot, writer.c.claims)
    where = ""
    if slots is not None:
        query = query.where(writer.c.slot.in_(slots))
        where = f" WHERE slot IN ({', '.join(str(int(s)) for s in slots)})"
    claims = {slot: count for slot, count in conn.execute(query)}
    free = conn.execute(
        text(f"SELECT slot FROM tidings_writer{where} LOCK IN SHARE MODE SKIP LOCKED")
    )
    for (slot,) in free:
        claims.pop(slot, None)
    return claims
