"""``tidings demo --core``: the publishing core alone, outbox -> Spark relay -> embedded store.

A small bank writes accounts in SQLite and emits events in the same transactions; the relay
runs on local Spark and delivers to three streams of the embedded event store (one type
goes to two of them, one type has no route); the first publish calls to one stream fail on
purpose. The report ends by checking, from the stores themselves, that every routed event
arrived exactly once and in per-account order.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, func, select

from tidings.config import TidingsConfig, load_config
from tidings.db import make_engine
from tidings.demo.bank import Bank
from tidings.errors import TidingsError
from tidings.events.outbox import EventStatus
from tidings.events.timeutil import as_utc
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import outbox_event
from tidings.pipeline.source.queries import relay_watermark
from tidings.pipeline.status import StatusReport, status_report
from tidings.server.store import EventStore
from tidings.targets.kinds.event_store import EventStoreTargetConfig

ROUTES = {
    "AccountOpened": ["accounts"],
    "MoneyDeposited": ["accounts", "audit"],  # one type, two streams
    "MoneyWithdrawn": ["accounts", "audit"],
    "LimitChanged": ["risk"],
    "DemoStarted": ["audit"],
    # "StatementViewed" has no route: it ends UNROUTABLE
}


def demo_config(workdir: Path) -> TidingsConfig:
    store = f"sqlite:///{workdir / 'events.db'}"
    return load_config(
        {
            "database": {"url": f"sqlite:///{workdir / 'bank.db'}"},
            "outbox": {"originator": "demo-bank"},
            "targets": {
                "accounts": {
                    "kind": "event_store",
                    "url": store,
                    "type_prefix": ["accounts"],
                    "fault_file": str(workdir / "accounts.fault"),
                },
                "audit": {"kind": "event_store", "url": store, "type_prefix": ["audit"]},
                "risk": {"kind": "event_store", "url": store, "type_prefix": ["risk"]},
            },
            "routing": {"routes": ROUTES},
            "relay": {"checkpoint_dir": str(workdir / "checkpoint"), "trigger_interval": "100ms"},
        }
    )


#: How long each stage of a demo may take before it gives up on it.
STAGE_TIMEOUT_S = 120.0


@dataclass
class DemoResult:
    operations: int
    report: StatusReport
    latencies_ms: list[float]
    missing: int
    duplicates: int
    out_of_order: int
    seconds: float

    @property
    def ok(self) -> bool:
        routed_open = self.report.open_events
        return not (self.missing or self.duplicates or self.out_of_order or routed_open)


def _verify(config: TidingsConfig, engine: Engine) -> tuple[int, int, int]:
    """Count missing, duplicated and out-of-order deliveries, from the stores themselves."""
    expected: dict[str, list[tuple[str, int, str]]] = {}
    with engine.connect() as conn:
        for seq, event_id, etype, key in conn.execute(
            select(
                outbox_event.c.seq,
                outbox_event.c.event_id,
                outbox_event.c.event_type,
                outbox_event.c.partition_key,
            ).order_by(outbox_event.c.seq)
        ):
            for target in ROUTES.get(etype, []):
                expected.setdefault(target, []).append((event_id, seq, key))
    accounts = config.targets["accounts"]
    assert isinstance(accounts, EventStoreTargetConfig), "the demo's target is its event store"
    store = EventStore(accounts.url)
    try:
        stored = store.read(0, limit=10_000_000)
    finally:
        store.close()
    missing = duplicates = disorder = 0
    for target, events in expected.items():
        prefix = target
        seen: dict[str, int] = {}
        for ev in stored:
            if ev.type[0] == prefix and ev.outbox_event_id is not None:
                if ev.outbox_event_id in seen:
                    duplicates += 1
                seen[ev.outbox_event_id] = ev.position
        last_pos: dict[str, int] = {}
        for event_id, _seq, key in events:
            pos = seen.get(event_id)
            if pos is None:
                missing += 1
                continue
            if key in last_pos and pos < last_pos[key]:
                disorder += 1
            last_pos[key] = pos
    return missing, duplicates, disorder


def wait_until_delivered(engine: Engine, timeout: float) -> None:
    """Wait until nothing is open and the relay has committed its batch for the last row,
    so that stopping the query interrupts no batch; a TidingsError after ``timeout``."""
    deadline = time.monotonic() + timeout
    with engine.connect() as conn:
        last = conn.execute(select(func.max(outbox_event.c.seq))).scalar() or 0
    while time.monotonic() < deadline:
        if (relay_watermark(engine) or 0) >= last and not status_report(
            engine, per_target=False
        ).open_events:
            return
        time.sleep(0.1)
    raise TidingsError(f"the relay did not deliver everything within {timeout:.0f} s")


@contextmanager
def running_relay(
    config: TidingsConfig, engine: Engine, outbox: Outbox, say: Callable[[str], None]
) -> Iterator[None]:
    """The relay on local Spark for the block, warmed up first: one event emitted and
    delivered, so that Spark's workers are up before the demo's clock starts. Leaving the
    block stops the query (after its last committed batch, if the block waited for it)."""
    from tidings.pipeline.relay_query import start_relay
    from tidings.pipeline.spark import spark_session

    say("starting Spark (local) and the relay ...")
    spark = spark_session(config.relay, app_name="tidings-demo")
    query = start_relay(spark, config)
    try:
        with outbox.transaction() as tx:
            tx.emit("DemoStarted", {"pid": os.getpid()})
        wait_until_delivered(engine, STAGE_TIMEOUT_S)
        yield
    finally:
        query.stop()


def run_demo(
    workdir: Path,
    operations: int = 3000,
    rate: float = 1000.0,
    say: Callable[[str], None] = print,
) -> DemoResult:
    """Run the demo in ``workdir`` (wiped first) and return what it found."""
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    config = demo_config(workdir)
    (workdir / "accounts.fault").write_text("2")  # the next two publish calls fail
    engine = make_engine(config.database.url)
    outbox = Outbox(engine, config.outbox)
    with running_relay(config, engine, outbox, say):
        started = time.monotonic()
        say(f"performing {operations} domain operations at ~{rate:.0f}/s ...")
        Bank(engine, outbox).run(operations, rate)
        say("waiting for the relay to deliver everything ...")
        wait_until_delivered(engine, STAGE_TIMEOUT_S)
    seconds = time.monotonic() - started
    report = status_report(engine)
    with engine.connect() as conn:
        latencies = [
            (as_utc(done) - as_utc(logged)).total_seconds() * 1000
            for logged, done in conn.execute(
                select(outbox_event.c.logged_at, outbox_event.c.last_publish_at).where(
                    outbox_event.c.status == EventStatus.PUBLISHED.value
                )
            )
        ]
    missing, dups, disorder = _verify(config, engine)
    return DemoResult(operations, report, latencies, missing, dups, disorder, seconds)
