"""A producer committing at a steady pace while a benchmark disturbs the relay: one event per
transaction, round-robin over a few partition keys, remembering each event's key so that the
benchmark can check per-key order at the target afterwards."""

from __future__ import annotations

import threading
import time

from tidings.outbox.producer import Outbox


class PacedProducer(threading.Thread):
    """One ``event_type`` event per transaction at ``rate`` a second over ``keys`` keys
    (``k0``, ``k1``, ...); :attr:`keys` maps each emitted event id to its key. Set
    :attr:`stop` to end it."""

    def __init__(self, outbox: Outbox, rate: float, keys: int, event_type: str) -> None:
        super().__init__(daemon=True)
        self.outbox, self.rate, self.key_count, self.event_type = outbox, rate, keys, event_type
        self.keys: dict[str, str] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        start, i = time.monotonic(), 0
        while not self.stop.is_set():
            with self.outbox.transaction() as tx:
                key = f"k{i % self.key_count}"
                self.keys[tx.emit(self.event_type, {"i": i}, partition_key=key)] = key
            i += 1
            delay = start + i / self.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
