"""Leases in the database: one replay, one housekeeping run and one active relay at a time.

Two replays working on the same held key could interleave its events, two housekeeping
runs could each settle the other's staged chunk, and two relays on one checkpoint would
both publish and both write its offsets; a lease row taken with a conditional UPDATE (the
same on SQLite and PostgreSQL) prevents that. A lease expires, so a holder that died does
not block the next one for longer than its TTL; its holder renews it by taking it again
with the same owner.

Expiry is reckoned on the database's clock, never the caller's: every contender compares
against the one clock, so a host whose clock is off cannot take a lease early or keep one
late. Owners are unique per acquisition (:func:`new_owner`), so an owner name is also the
fencing token: "the lease is still mine" is one indexed read of the row.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import (
    Connection,
    Engine,
    Float,
    and_,
    cast,
    func,
    insert,
    literal_column,
    or_,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.elements import ColumnElement

from tidings.db import is_mysql
from tidings.outbox.schema import lease


def new_owner() -> str:
    """A lease owner name unique to this call (host, process, random part)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def db_now(engine: Engine | Connection) -> ColumnElement[float]:
    """The database's clock in epoch seconds, as an SQL expression (sub-second on both)."""
    if engine.dialect.name == "sqlite":
        return cast((func.julianday("now") - 2440587.5) * 86400.0, Float)
    if is_mysql(engine.dialect.name):
        # SYSDATE, not NOW: the time of the call, as clock_timestamp() (NOW is the
        # statement's start). A DECIMAL with microseconds; + 0e0 makes it a DOUBLE.
        return literal_column("(UNIX_TIMESTAMP(SYSDATE(6)) + 0e0)", Float)
    return cast(func.extract("epoch", func.clock_timestamp()), Float)


def try_acquire(engine: Engine, name: str, owner: str, ttl: float) -> bool:
    """Take the lease ``name`` for ``ttl`` seconds unless someone else holds it."""
    with engine.begin() as conn:
        now = db_now(conn)
        taken = conn.execute(
            update(lease)
            .where(lease.c.name == name, or_(lease.c.expires_at < now, lease.c.owner == owner))
            .values(owner=owner, expires_at=now + ttl)
        ).rowcount
    if taken:
        return True
    try:
        with engine.begin() as conn:
            expires = conn.execute(select(db_now(conn) + ttl)).scalar_one()
            conn.execute(insert(lease).values(name=name, owner=owner, expires_at=expires))
        return True
    except IntegrityError:  # the row exists and is held by another owner
        return False


def still_held(conn: Connection, name: str, owner: str, margin: float = 0.0) -> bool:
    """Whether ``owner`` holds ``name`` for at least ``margin`` more seconds (database clock)."""
    row = conn.execute(
        select(lease.c.name).where(
            and_(
                lease.c.name == name,
                lease.c.owner == owner,
                lease.c.expires_at > db_now(conn) + margin,
            )
        )
    ).first()
    return row is not None


def release(engine: Engine, name: str, owner: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            update(lease).where(lease.c.name == name, lease.c.owner == owner).values(expires_at=0.0)
        )


@contextmanager
def held(engine: Engine, name: str, ttl: float) -> Iterator[bool]:
    """``with held(engine, "replay", 600) as mine:`` — ``mine`` says whether it was taken."""
    owner = new_owner()
    mine = try_acquire(engine, name, owner, ttl)
    try:
        yield mine
    finally:
        if mine:
            release(engine, name, owner)
