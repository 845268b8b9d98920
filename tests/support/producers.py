"""Producers that commit out of sequence order: the hard case for a relay reading the event
log by sequence number.

Threads write through the outbox producer API, each transaction taking its sequence numbers
when it emits and then holding on before it commits, a share of them for several of the
relay's trigger intervals, while the other threads commit later-numbered transactions. A share
of the transactions is rolled back after emitting: their events must appear nowhere. Each
transaction also checks, just before it ends, whether a transaction numbered after it, with
an event of one of its partition keys, has already committed (PostgreSQL's READ COMMITTED
shows every statement what committed before it), so a test can assert that commits really
landed out of order where order matters. (Transactions that lock the same domain row cannot
do that: the lock orders them, and their sequence numbers with them.)
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field

from sqlalchemy import Connection, select

from tidings.outbox.producer import Outbox, OutboxTransaction
from tidings.outbox.schema import outbox_event

#: A transaction's writes: the domain write and its emits on ``tx`` (``rng`` is the thread's
#: own, ``thread`` its number); returns the event ids emitted.
Write = Callable[[OutboxTransaction, random.Random, int], list[str]]


class _RollBack(Exception):
    """Raised inside a transaction to roll it back on purpose."""


@dataclass(eq=False)
class OutOfOrderProducers:
    """``threads`` threads running ``write`` in transactions until :meth:`stop`."""

    outbox: Outbox
    write: Write
    _: KW_ONLY
    threads: int = 4
    rollback_share: float = 0.1
    long_hold_share: float = 0.2
    long_hold: tuple[float, float] = (0.2, 1.0)
    pause: tuple[float, float] = (0.03, 0.08)
    #: Event ids of committed transactions, and of those rolled back.
    committed: list[str] = field(default_factory=list, init=False)
    rolled_back: list[str] = field(default_factory=list, init=False)
    #: Committed transactions that a later-numbered one with an event of the same
    #: partition key had committed before.
    overtaken: int = field(default=0, init=False)
    _errors: list[BaseException] = field(default_factory=list, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _threads: list[threading.Thread] = field(init=False)

    def __post_init__(self) -> None:
        self._threads = [
            threading.Thread(target=self._run, args=(n,), name=f"producer-{n}", daemon=True)
            for n in range(self.threads)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Stop the threads after their current transaction; a thread's failure (anything but
        the rollbacks it made on purpose) is raised here."""
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
            assert not thread.is_alive(), f"{thread.name} did not stop"
        if self._errors:
            raise self._errors[0]

    def _run(self, number: int) -> None:
        try:
            rng = random.Random(number)
            while not self._stop.is_set():
                self._transaction(rng, number)
                time.sleep(rng.uniform(*self.pause))
        except BaseException as exc:
            self._errors.append(exc)

    def _transaction(self, rng: random.Random, number: int) -> None:
        roll_back = rng.random() < self.rollback_share
        if rng.random() < self.long_hold_share:
            hold = rng.uniform(*self.long_hold)
        else:
            hold = rng.uniform(0, 0.02)
        emitted: list[str] = []
        try:
            with self.outbox.transaction() as tx:
                emitted = self.write(tx, rng, number)
                time.sleep(hold)  # numbered already; others commit meanwhile
                overtaken = _overtaken(tx.connection, emitted)
                if roll_back:
                    raise _RollBack
        except _RollBack:
            with self._lock:
                self.rolled_back.extend(emitted)
            return
        with self._lock:
            self.committed.extend(emitted)
            self.overtaken += overtaken


def _overtaken(conn: Connection, emitted: list[str]) -> bool:
    """Whether another transaction has committed an event of one of ``emitted``'s partition
    keys numbered after it."""
    own, other = outbox_event.alias("own"), outbox_event.alias("other")
    later = (
        select(other.c.seq)
        .join(own, other.c.partition_key == own.c.partition_key)
        .where(own.c.event_id.in_(emitted), other.c.event_id.not_in(emitted))
        .where(other.c.seq > own.c.seq)
        .limit(1)
    )
    return conn.execute(later).first() is not None
