"""The relay's lease: one relay publishes from an outbox, any other started on it stands by.

Two relays on one outbox and checkpoint would both read and publish every event and both
write the checkpoint's offsets. So a relay takes the ``relay`` lease
(:mod:`tidings.pipeline.lease`, reckoned on the database's clock) before it starts its Spark
query, and a second one waits for it, holding no events and running no query, and shows
itself as a standby (a ``relay-standby:`` row that ``tidings status`` lists).

Fencing, so that a relay which lost its lease has stopped publishing before another can
take over:

* The active relay renews every ``renew_every``. Its *fence* is the moment a renewal was
  sent, plus ``ttl`` minus one ``renew_every``: the database set the expiry at or after that
  send, so the fence falls before the lease can expire. A watchdog thread, apart from the
  renewing one (which may hang on a locked database), stops the query at the fence unless a
  later renewal moved it. A lost renewal (another owner holds the row) stops it at once.
* A paused or stalled driver (SIGSTOP, a long GC pause, a frozen VM) can miss its fence.
  Its work is fenced in the database too: each task checks the lease before each chunk it
  publishes and the driver checks it before recording a batch, so the stale relay writes
  no status and commits no batch of the checkpoint after its lease passed to another, and
  its source plans no batch (it writes no offsets to the checkpoint). What
  it sent in the chunk under way when it froze reaches the targets again from the new relay
  and the targets de-duplicate it by event id (the same as after a crash).
* Left: a driver frozen between its source's check and Spark's write of that batch's
  offsets can write the batch id the new relay writes too; Spark fails whichever query is
  second, and the active relay starts its query again (:mod:`tidings.pipeline.relay`).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import Engine, delete, select

from tidings.errors import RelayError
from tidings.logs import process_age_s
from tidings.outbox.schema import lease
from tidings.pipeline.lease import db_now, new_owner, release, still_held, try_acquire

if TYPE_CHECKING:
    from tidings.config.relay import RelayLeaseConfig

log = logging.getLogger(__name__)

#: The lease the active relay holds.
RELAY_LEASE = "relay"
#: Rows named so are standby relays announcing themselves (renewed while they wait).
STANDBY_PREFIX = "relay-standby:"
#: The job option that carries the holder's name to the tasks, which check it (the fence).
OWNER_OPTION = "relay_lease_owner"


class RelayLease:
    """One relay process's hold on the ``relay`` lease: waiting for it, keeping it, losing it."""

    def __init__(self, engine: Engine, settings: RelayLeaseConfig) -> None:
        self.engine = engine
        self.owner = new_owner()
        self.ttl = settings.ttl.total_seconds()
        self.renew_every = settings.renew_every.total_seconds()
        self.poll_every = settings.poll_every.total_seconds()
        self._standby_row = f"{STANDBY_PREFIX}{uuid.uuid4().hex}"
        self.lost = threading.Event()
        #: When the renewal that took the lease was sent (monotonic): where the fence starts.
        self.taken_at = 0.0

    def holder(self) -> str | None:
        """Who holds the relay lease now (database clock), if anyone."""
        with self.engine.connect() as conn:
            return conn.execute(
                select(lease.c.owner).where(
                    lease.c.name == RELAY_LEASE, lease.c.expires_at > db_now(conn)
                )
            ).scalar_one_or_none()

    def acquire(
        self,
        stop: threading.Event,
        *,
        patience: float | None = None,
        on_standby: Callable[[str], None] | None = None,
    ) -> bool:
        """Take the lease, standing by while another relay holds it; False if ``stop`` was
        set first. After ``patience`` seconds of standing by (None: no limit), a lease still
        held by another relay is a :class:`RelayError`."""
        give_up = None if patience is None else time.monotonic() + patience
        announced = False
        try:
            while not stop.is_set():
                sent = time.monotonic()
                if try_acquire(self.engine, RELAY_LEASE, self.owner, self.ttl):
                    self.taken_at = sent
                    self.lost.clear()
                    extra = {"owner": self.owner, "since_start_s": process_age_s()}
                    log.info("relay lease taken", extra=extra)
                    return True
                holder = self.holder() or "another relay"
                if give_up is not None and time.monotonic() >= give_up:
                    raise RelayError(
                        f"another relay holds the relay lease ({holder}) and is publishing "
                        "from this outbox; stop it first or run this one as its standby"
                    )
                if not announced:
                    log.info("relay standing by", extra={"owner": self.owner, "holder": holder})
                    if on_standby is not None:
                        on_standby(holder)
                    announced = True
                try_acquire(self.engine, self._standby_row, self.owner, self.ttl)
                stop.wait(self.poll_every)
            return False
        finally:
            if announced:
                with self.engine.begin() as conn:
                    conn.execute(delete(lease).where(lease.c.name == self._standby_row))

    def release(self) -> None:
        """Give the lease up at once (a clean stop), so a standby need not wait out the TTL."""
        release(self.engine, RELAY_LEASE, self.owner)

    def guard(self, on_lost: Callable[[], None]) -> LeaseGuard:
        """Renew the held lease in the background; call ``on_lost`` (once) at the fence."""
        return LeaseGuard(self, on_lost)


class LeaseGuard:
    """The renewing thread and the watchdog that fences the active relay (a context manager)."""

    def __init__(self, lease: RelayLease, on_lost: Callable[[], None]) -> None:
        self.lease = lease
        self.on_lost = on_lost
        self._fence_at = lease.taken_at + lease.ttl - lease.renew_every
        self._moved = threading.Condition()
        self._done = threading.Event()
        self._threads = [
            threading.Thread(target=self._renew, name="relay-lease-renew", daemon=True),
            threading.Thread(target=self._watch, name="relay-lease-fence", daemon=True),
        ]

    def __enter__(self) -> LeaseGuard:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        with self._moved:
            self._moved.notify_all()
        for thread in self._threads:
            thread.join(timeout=5)

    def _renew(self) -> None:
        lease = self.lease
        while not self._done.wait(lease.renew_every):
            sent = time.monotonic()
            try:
                mine = try_acquire(lease.engine, RELAY_LEASE, lease.owner, lease.ttl)
            except Exception:  # the database is away: the watchdog fences if it stays so
                log.warning("relay lease renewal failed", exc_info=True)
                continue
            if not mine:
                self._lose("another relay took the relay lease")
                return
            with self._moved:
                self._fence_at = sent + lease.ttl - lease.renew_every
                self._moved.notify_all()

    def _watch(self) -> None:
        with self._moved:
            while not self._done.is_set():
                left = self._fence_at - time.monotonic()
                if left <= 0:
                    break
                self._moved.wait(left)
        if not self._done.is_set():
            self._lose("the relay lease was not renewed in time")

    def _lose(self, why: str) -> None:
        if self.lease.lost.is_set() or self._done.is_set():
            return
        log.error("relay lease lost; stopping the query", extra={"reason": why})
        self.lease.lost.set()
        self.on_lost()


def check_fence(engine: Engine, options: Mapping[str, str]) -> None:
    """In a relay task or batch: raise :class:`RelayError` if this relay no longer holds
    its lease, so a stale relay writes no status and commits no batch."""
    owner = options.get(OWNER_OPTION)
    if not owner:
        return  # not a leased relay (a replay, or a job started by a library caller)
    with engine.connect() as conn:
        if not still_held(conn, RELAY_LEASE, owner):
            raise RelayError(f"relay {owner} lost its lease; another relay publishes now")


@dataclass(frozen=True)
class RelayLeaseState:
    """What ``tidings status`` shows of the relays: the active one and those standing by."""

    active: str | None
    expires_in_s: float | None
    standby: tuple[str, ...]

    def as_json(self) -> dict[str, object]:
        return {
            "active": self.active,
            "expires_in_s": self.expires_in_s,
            "standby": list(self.standby),
        }


def relay_lease_state(engine: Engine) -> RelayLeaseState:
    """The relay lease's holder (if unexpired) and the standby relays still announcing."""
    with engine.connect() as conn:
        now = conn.execute(select(db_now(conn))).scalar_one()
        rows = conn.execute(
            select(lease.c.name, lease.c.owner, lease.c.expires_at).where(
                lease.c.expires_at > now,
                (lease.c.name == RELAY_LEASE) | lease.c.name.startswith(STANDBY_PREFIX),
            )
        ).all()
    active = next((r for r in rows if r.name == RELAY_LEASE), None)
    return RelayLeaseState(
        active=None if active is None else active.owner,
        expires_in_s=None if active is None else round(active.expires_at - now, 1),
        standby=tuple(sorted(r.owner for r in rows if r.name != RELAY_LEASE)),
    )
