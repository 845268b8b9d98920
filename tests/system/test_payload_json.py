"""Payload convenience (issue 11, item 11): the JSON default hook of emit, on a real SQLite
event log, and the event server refusing NaN / Infinity in registered JSON payloads as emit
does, over a real socket with hat-event 0.8.5's client."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from enum import Enum
from pathlib import Path
from uuid import UUID

import hat.event.common as hat
import hat.event.eventer as hat_eventer
import pytest
from pydantic import BaseModel
from sqlalchemy import select

import tidings
from tests.support.server_helpers import running, warnings_of
from tests.support.waiting import run
from tidings import EmitError, Outbox, json_default, make_engine
from tidings.client import connect
from tidings.events.model import NewEvent, PayloadKind
from tidings.outbox.envelope import identity
from tidings.outbox.schema import outbox_event


class Colour(Enum):
    RED = "red"


@dataclass
class Line:
    sku: UUID
    price: Decimal
    shipped: date


class Order(BaseModel):
    id: UUID
    at: datetime
    lines: list[Line]


ORDER_ID = UUID("12345678-1234-5678-1234-567812345678")


def _outbox(tmp_path: Path, **hooks: object) -> Outbox:
    return Outbox(make_engine(f"sqlite:///{tmp_path / 'app.db'}"), transformer=identity, **hooks)


def _stored_payloads(outbox: Outbox) -> list[object]:
    with outbox.engine.connect() as conn:
        rows = conn.execute(select(outbox_event.c.payload).order_by(outbox_event.c.seq))
        return [json.loads(payload) for (payload,) in rows]


def test_the_hook_encodes_common_python_values(tmp_path: Path) -> None:
    outbox = _outbox(tmp_path, json_default=json_default)
    at = datetime(2024, 5, 1, 12, 30, tzinfo=UTC)
    line = Line(ORDER_ID, Decimal("10.50"), date(2024, 5, 2))
    with outbox.transaction() as tx:
        tx.emit(
            "OrderPlaced",
            {
                "order": Order(id=ORDER_ID, at=at, lines=[line]),
                "line": line,
                "tags": {"b", "a"},
                "colour": Colour.RED,
                "total": Decimal("1E+2"),
            },
        )
    [payload] = _stored_payloads(outbox)
    assert payload == {
        "order": {
            "id": str(ORDER_ID),
            "at": "2024-05-01T12:30:00Z",  # pydantic's JSON mode
            "lines": [{"sku": str(ORDER_ID), "price": "10.50", "shipped": "2024-05-02"}],
        },
        "line": {"sku": str(ORDER_ID), "price": "10.50", "shipped": "2024-05-02"},
        "tags": ["a", "b"],
        "colour": "red",
        "total": "1E+2",  # a decimal's exact text, not a float
    }
    assert tidings.json_default is json_default


def test_without_the_hook_such_values_are_refused_as_before(tmp_path: Path) -> None:
    outbox = _outbox(tmp_path)
    with (
        pytest.raises(EmitError, match="not JSON-serialisable: Object of type UUID"),
        outbox.transaction() as tx,
    ):
        tx.emit("OrderPlaced", {"id": ORDER_ID})
    assert _stored_payloads(outbox) == []


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        (Decimal("NaN"), "not a finite number"),
        (Decimal("-Infinity"), "not a finite number"),
        ({1.5j}, "Object of type complex"),  # a set's items go through the hook too
        (b"bytes", "Object of type bytes"),
    ],
)
def test_the_hook_refuses_what_json_cannot_hold(tmp_path: Path, value: object, needle: str) -> None:
    outbox = _outbox(tmp_path, json_default=json_default)
    with pytest.raises(EmitError, match=needle), outbox.transaction() as tx:
        tx.emit("Measured", {"v": value})
    assert _stored_payloads(outbox) == []


def test_nan_returned_by_a_hook_is_still_refused(tmp_path: Path) -> None:
    """The strict encoder checks what the hook returns: a user's hook cannot smuggle NaN."""
    outbox = _outbox(tmp_path, json_default=lambda value: math.nan)
    with (
        pytest.raises(EmitError, match="Out of range float values are not JSON compliant"),
        outbox.transaction() as tx,
    ):
        tx.emit("Measured", {"v": object()})
    assert _stored_payloads(outbox) == []


# --- the event server -------------------------------------------------------------------------


def _json_event(name: str, text: str, outbox_id: str | None = None) -> NewEvent:
    return NewEvent(
        type=("measured", name),
        payload=text.encode(),
        payload_kind=PayloadKind.JSON,
        outbox_event_id=outbox_id,
    )


@pytest.mark.sockets
def test_the_server_refuses_nan_and_infinity_per_event(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A client that sends NaN / Infinity in a JSON text (Python's json writes them by
    default; hat-event's client refuses them before sending, so tidings' client, which sends
    the text as given, plays the careless one): each such event fails alone, not stored; the
    other events of the same request are stored and the connection goes on (a hat-event
    client registers on it afterwards), for plain and outbox registrations. The refusals cost
    one log line per connection (later ones are counted, not written: one frame of bad
    events must not buy a line each), naming the first refused event and why."""

    async def main() -> None:
        async with running(tmp_path) as srv:
            client = await connect(srv.address)
            try:
                results = await client.register_with_response(
                    [
                        _json_event("ok", '{"v": 1.5}'),
                        _json_event("nan", '{"v": NaN}'),
                        _json_event("inf", "[Infinity]"),
                        _json_event("neg", "-Infinity"),
                        _json_event("after", '{"v": 2}'),
                    ]
                )
                assert [r is not None for r in results] == [True, False, False, False, True]
                outbox = await client.register_outbox(
                    [_json_event("obx-nan", "[NaN]", "o1"), _json_event("obx-ok", "[1]", "o2")]
                )
                assert [r is not None for r in outbox] == [False, True]
            finally:
                await client.aclose()
            hat_client = await hat_eventer.connect(srv.address, [])
            try:
                [later] = await hat_client.register_with_response(
                    [
                        hat.RegisterEvent(
                            event_type=("measured", "later"),
                            source_timestamp=None,
                            payload=hat.EventPayload(type=hat.EventPayloadType.JSON, data=3),
                        )
                    ]
                )
                assert later is not None and later.payload.data == 3
            finally:
                await hat_client.async_close()
            stored = [e for e in srv.store.read() if e.type[0] == "measured"]
            assert sorted(e.type[1] for e in stored) == ["after", "later", "obx-ok", "ok"]

    run(main())
    [line] = warnings_of(caplog)
    assert "event 1 " in line and "refused" in line, line
    assert "NaN is not a JSON number" in line, line
