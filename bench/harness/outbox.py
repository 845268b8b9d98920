"""What the relay benchmarks read back from an outbox: events per status, the newest
sequence number, and each event's delay from its commit to PUBLISHED, all from the outbox's
own rows, with no clock of the benchmark's own."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from tidings.events.timeutil import as_utc
from tidings.outbox.schema import outbox_event


def status_counts(engine: Any, upto: int | None = None) -> dict[str, int]:
    """Outbox events per status (of those up to sequence ``upto``, if given)."""
    query = select(outbox_event.c.status, func.count()).group_by(outbox_event.c.status)
    if upto is not None:
        query = query.where(outbox_event.c.seq <= upto)
    with engine.connect() as conn:
        return {status: count for status, count in conn.execute(query)}


def max_seq(engine: Any) -> int:
    """The outbox's newest sequence number (0 when empty)."""
    with engine.connect() as conn:
        return conn.execute(select(func.max(outbox_event.c.seq))).scalar() or 0


def publish_latencies_ms(
    engine: Any, since: float, until: float | None = None, *, exclude_keys: tuple[str, ...] = ()
) -> list[float]:
    """Commit -> PUBLISHED (``last_publish_at - logged_at``) in ms of the published outbox
    events logged in [since, until) (epoch seconds), leaving out ``exclude_keys``' events.

    Both timestamps come from the outbox row, so this is the delay a consumer sees from the
    producer's commit to the last target's confirmation, with no clock of the benchmark's own.
    """
    query = select(outbox_event.c.logged_at, outbox_event.c.last_publish_at).where(
        outbox_event.c.status == "PUBLISHED"
    )
    if exclude_keys:
        query = query.where(outbox_event.c.partition_key.not_in(exclude_keys))
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    return [
        (as_utc(done) - as_utc(logged)).total_seconds() * 1000
        for logged, done in rows
        if since <= as_utc(logged).timestamp()
        and (until is None or as_utc(logged).timestamp() < until)
    ]
