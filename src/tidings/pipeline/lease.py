"""A lease in the database, so that only one replay (or housekeeping) runs at a time.

Two replays working on the same held key could interleave its events, and two housekeeping
runs could each settle the other's staged chunk; a lease row taken with a conditional
UPDATE (the same on SQLite and PostgreSQL) prevents that. A lease expires, so a job that
died does not block the next one for longer than its TTL; its holder renews it by taking
it again with the same owner.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, insert, or_, update
from sqlalchemy.exc import IntegrityError

from tidings.outbox.schema import lease


def new_owner() -> str:
    """A lease owner name unique to this call (host, process, random part)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def try_acquire(engine: Engine, name: str, owner: str, ttl: float) -> bool:
    """Take the lease ``name`` for ``ttl`` seconds unless someone else holds it."""
    now = time.time()
    with engine.begin() as conn:
        taken = conn.execute(
            update(lease)
            .where(lease.c.name == name, or_(lease.c.expires_at < now, lease.c.owner == owner))
            .values(owner=owner, expires_at=now + ttl)
        ).rowcount
    if taken:
        return True
    try:
        with engine.begin() as conn:
            conn.execute(insert(lease).values(name=name, owner=owner, expires_at=now + ttl))
        return True
    except IntegrityError:  # the row exists and is held by another owner
        return False


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
