"""The emit size rule: what a routed target will always refuse is refused at emit.

Against the real NATS server on 127.0.0.1:4222, whose announced ``max_payload`` (1 MiB)
counts the payload and the header block together, while ``outbox.max_payload_bytes`` counts
only the stored body.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import nats
import pytest
from sqlalchemy import Engine, func, select

from tests.support.helpers import SHARED_URL, delete_stream, stream_messages
from tests.support.waiting import run
from tidings.config import TidingsConfig, load_config
from tidings.errors import EmitError
from tidings.events.outbox import OutboxEvent
from tidings.outbox.envelope import identity
from tidings.outbox.producer import EMIT_SEQ_PLACEHOLDER, Outbox, OutboxTransaction
from tidings.outbox.schema import outbox_event
from tidings.routing.table import add_route
from tidings.targets.kinds.jetstream.messages import header_block_size, message_headers
from tidings.targets.registry import shared_target
from tidings.targets.routed import RoutedTargets, outbox_from_config

TARGET = "emit-js"
EVENT_ID = "5d0b7c1e-8f0a-4a7e-9d7e-2b7c4f7e1a01"
HEADERS = {"tenant": "eu"}


def _announced_max_payload() -> int:
    async def ask() -> int:
        nc = await nats.connect(SHARED_URL)
        try:
            return nc.max_payload
        finally:
            await nc.close()

    return run(ask())


@pytest.fixture
def config(tmp_path: Path) -> Iterator[TidingsConfig]:
    """SQLite in ``tmp_path``; events of type Big routed to a JetStream stream of their own."""
    tag = uuid.uuid4().hex[:12]
    stream = f"TIDINGS_EMIT_{tag}"
    cfg = load_config(
        {
            "database": {"url": f"sqlite:///{tmp_path / 'app.db'}"},
            "targets": {
                TARGET: {
                    "kind": "jetstream",
                    "servers": [SHARED_URL],
                    "stream": stream,
                    "subject_prefix": f"tidings_emit.{tag}",
                    "ack_timeout": "2s",
                }
            },
            "routing": {"routes": {"Big": [TARGET]}},
        }
    )
    yield cfg
    shared_target(TARGET, cfg.targets[TARGET]).close()
    delete_stream(stream)


def _header_bytes(config: TidingsConfig) -> int:
    """The header block of a Big event with ``HEADERS``, sized as emit sizes it.

    ``logged_at`` is read at emit; a time with microseconds gives its longest ISO form (on
    the one-in-a-million whole second it is 7 bytes shorter: the margins below allow it).
    """
    probe = OutboxEvent(
        seq=EMIT_SEQ_PLACEHOLDER,
        event_id=EVENT_ID,
        event_type="Big",
        payload="",
        logged_at=datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
        originator=config.outbox.originator,
        partition_key="k",
        headers=HEADERS,
    )
    return header_block_size(message_headers(probe))


def _payload_of_body_size(size: int) -> str:
    """A payload whose JSON body (identity transformer: a JSON string) is ``size`` bytes."""
    return "x" * (size - 2)


def _emit_big(tx: OutboxTransaction, body: int) -> None:
    """Emit the Big event with ``HEADERS`` whose body is ``body`` bytes."""
    tx.emit(
        "Big", _payload_of_body_size(body), partition_key="k", event_id=EVENT_ID, headers=HEADERS
    )


def _count(engine: Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(outbox_event)).scalar_one()


pytestmark = pytest.mark.nats


def test_payload_plus_headers_over_the_servers_max_payload_is_refused_at_emit(
    config: TidingsConfig,
) -> None:
    limit = _announced_max_payload()
    headers = _header_bytes(config)
    body = limit - headers + 8  # 8 bytes over, even on a whole-second logged_at
    assert body <= config.outbox.max_payload_bytes  # the outbox's own limit lets it pass
    outbox = outbox_from_config(config, transformer=identity)
    with pytest.raises(EmitError) as raised, outbox.transaction() as tx:
        _emit_big(tx, body)
    message = str(raised.value)
    assert f"jetstream target {TARGET!r}" in message
    assert f"would be {body + headers} bytes (payload {body} + headers {headers})" in message
    assert f"over the NATS server's max_payload of {limit} bytes" in message
    assert _count(outbox.engine) == 0


def test_an_event_that_fits_with_its_headers_is_emitted_and_delivered(
    config: TidingsConfig,
) -> None:
    limit = _announced_max_payload()
    body = limit - _header_bytes(config)  # exactly at the limit
    outbox = outbox_from_config(config, transformer=identity)
    with outbox.transaction() as tx:
        _emit_big(tx, body)
        # the same size, excluded: published straight to the stream after commit
        tx.emit("Big", _payload_of_body_size(body), partition_key="k", exclude=True)
    assert _count(outbox.engine) == 1
    stream = config.targets[TARGET].stream
    delivered = stream_messages(stream)
    assert [len(m.data) for m in delivered] == [body]
    assert json.loads(delivered[0].data) == _payload_of_body_size(body)


def test_a_plain_outbox_knows_no_targets_and_checks_only_its_own_limit(
    config: TidingsConfig,
) -> None:
    body = _announced_max_payload()  # too big for JetStream with any header
    outbox = Outbox(config.database.url, config.outbox, transformer=identity)
    with outbox.transaction() as tx:
        tx.emit("Big", _payload_of_body_size(body))
    assert _count(outbox.engine) == 1


def test_routes_are_read_again_after_their_time_to_live(config: TidingsConfig) -> None:
    """Emit does not query the routing table per event, and still sees a new route soon."""
    engine = outbox_from_config(config).engine
    targets = RoutedTargets(config, engine, routes_ttl=1.0)  # room for a slow add_route
    assert [t.name for t in targets.targets_for("Small")] == []
    add_route(engine, "Small", TARGET)
    assert [t.name for t in targets.targets_for("Small")] == []  # cached
    time.sleep(1.05)
    assert [t.name for t in targets.targets_for("Small")] == [TARGET]
