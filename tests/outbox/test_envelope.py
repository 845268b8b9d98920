"""Headers in the CloudEvents envelope: which become attributes of their own, which travel
packed in ``tidingsheaders``, and that reading them back gives exactly what was emitted."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import select

from tidings.db import make_engine
from tidings.outbox.envelope import (
    ENVELOPE_ATTRIBUTES,
    HEADERS_ATTRIBUTE,
    EventDraft,
    cloudevents_envelope,
    envelope_headers,
    header_attributes,
    identity,
)
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import outbox_event


def _draft(headers: dict[str, str], **fields: str) -> EventDraft:
    return EventDraft(
        event_id="e-1",
        event_type="OrderPlaced",
        payload={"n": 1},
        logged_at=datetime(2026, 1, 1, tzinfo=UTC),
        version="1",
        originator="shop",
        headers=headers,
        **fields,
    )


@pytest.mark.parametrize(
    "name",
    ["tenant", "traceparent", "x1", "a" * 20, "0"],
)
def test_a_header_named_as_cloudevents_names_attributes_is_an_attribute(name: str) -> None:
    assert header_attributes({name: "v"}) == {name: "v"}


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("Tenant", "v", "upper case"),
        ("aggregate_type", "v", "underscore"),
        ("x-tenant", "v", "dash"),
        ("a" * 21, "v", "over 20 characters"),
        ("type", "v", "CloudEvents' own"),
        ("data", "v", "reserved by CloudEvents"),
        ("partitionkey", "v", "the envelope's own extension"),
        (HEADERS_ATTRIBUTE, "v", "the packed headers' own"),
        ("note", "a\tb", "a control character"),
        ("note", "\x85", "a C1 control character"),
        ("note", "\ufffe", "a noncharacter"),
    ],
)
def test_every_other_header_is_packed_in_one_attribute(name: str, value: str, why: str) -> None:
    attributes = header_attributes({name: value, "tenant": "eu"})
    packed = attributes.pop(HEADERS_ATTRIBUTE)
    assert attributes == {"tenant": "eu"}, why
    assert json.loads(packed) == {name: value}
    assert packed.isascii() and packed.isprintable()  # a CloudEvents String, whatever it holds


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"tenant": "eu"},
        {"Tenant": "EU", "tenant": "eu", "id": "forged", "empty": ""},
        {"a_b": "ü", "c-d": "tab\there", "e": "\U0001f600", "tidingsheaders": "{}"},
    ],
)
def test_the_headers_are_read_back_exactly(headers: dict[str, str]) -> None:
    envelope = json.loads(json.dumps(cloudevents_envelope(_draft(headers, partition_key="k"))))
    assert envelope_headers(envelope) == headers
    assert envelope["id"] == "e-1" and envelope["partitionkey"] == "k"  # not overridden


def test_an_event_without_headers_has_the_envelope_it_had() -> None:
    assert set(cloudevents_envelope(_draft({}))) == {
        "specversion",
        "id",
        "source",
        "type",
        "time",
        "datacontenttype",
        "dataversion",
        "data",
    }


def test_every_attribute_the_envelope_sets_is_reserved() -> None:
    full = cloudevents_envelope(_draft({}, partition_key="k", correlation_id="c"))
    assert set(full) <= ENVELOPE_ATTRIBUTES


def test_reading_ignores_what_cannot_be_a_header_and_refuses_a_broken_pack() -> None:
    envelope = {"specversion": "1.0", "id": "x", "sequence": 3, "tenant": "eu"}
    assert envelope_headers(envelope) == {"tenant": "eu"}
    for packed in ("not json", '["a"]', '{"a": 1}', 7):
        with pytest.raises(ValueError, match=f"{HEADERS_ATTRIBUTE} is not a JSON object"):
            envelope_headers({**envelope, HEADERS_ATTRIBUTE: packed})


def test_emit_puts_the_headers_in_the_stored_envelope_and_a_transformer_decides(
    tmp_path: Path,
) -> None:
    """The default transformer carries them; a transformer of the service's own gets them
    in ``draft.headers`` and publishes what it makes (``identity``: the bare payload)."""
    engine = make_engine(f"sqlite:///{tmp_path / 'app.db'}")
    headers = {"tenant": "eu", "Aggregate-Type": "order"}
    with Outbox(engine).transaction() as tx:
        tx.emit("OrderPlaced", {"n": 1}, headers=headers)
    with Outbox(engine, transformer=identity).transaction() as tx:
        tx.emit("OrderPlaced", {"n": 2}, headers=headers)
    with engine.connect() as conn:
        rows = conn.execute(select(outbox_event).order_by(outbox_event.c.seq)).all()
    assert [json.loads(row.headers) for row in rows] == [headers, headers]
    assert envelope_headers(json.loads(rows[0].payload)) == headers
    assert json.loads(rows[1].payload) == {"n": 2}
