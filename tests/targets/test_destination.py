"""Destination templates (:mod:`tidings.targets.destination`), rendered from real events.

The targets' tests show them on the wire (JetStream subjects, event-server types); these
pin the placeholder language itself.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from tidings.events.outbox import OutboxEvent
from tidings.targets.destination import DestinationTemplate, RenderError


def _event(**fields: Any) -> OutboxEvent:
    values: dict[str, Any] = {
        "seq": 7,
        "event_id": "e-7",
        "event_type": "OrderPlaced",
        "payload": '{"region": "eu", "qty": 3, "paid": true, "ratio": 0.5, "tags": ["a"], '
        '"data": {"shop": {"id": "s1"}}}',
        "logged_at": datetime(2026, 1, 1, tzinfo=UTC),
        "version": "2",
        "correlation_id": "corr",
        "originator": "shop",
        "partition_key": "order-1",
        "headers": {"aggregate_type": "order"},
    }
    return OutboxEvent(**(values | fields))


def _anything(value: str) -> str | None:
    return None


def _no_dots(value: str) -> str | None:
    return "holds a dot" if "." in value else None


@pytest.mark.parametrize(
    ("text", "rendered"),
    [
        ("{event_type}", "OrderPlaced"),
        ("{partition_key}/{originator}/{version}/{correlation_id}", "order-1/shop/2/corr"),
        ("orders.{headers.aggregate_type}", "orders.order"),
        ("{payload.region}-{payload.qty}-{payload.paid}-{payload.ratio}", "eu-3-true-0.5"),
        ("{payload.data.shop.id}", "s1"),
        ("cost $5 {{literal}}", "cost $5 {literal}"),
        ("plain", "plain"),
    ],
)
def test_placeholders_are_filled_from_the_event(text: str, rendered: str) -> None:
    assert DestinationTemplate(text, _anything).render(_event()) == rendered


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{aggregate_type}", "unknown placeholder {aggregate_type}"),
        ("{header.x}", "unknown placeholder {header.x}"),
        ("{payload.}", "unknown placeholder {payload.}"),
        ("{payload.data..id}", "unknown placeholder {payload.data..id}"),
        ("orders.{event_type", "unterminated placeholder"),
    ],
)
def test_a_bad_placeholder_is_refused_when_the_template_is_parsed(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("$", r"\$").replace(".", r"\.")):
        DestinationTemplate(text, _anything)


@pytest.mark.parametrize(
    ("text", "event", "reason"),
    [
        ("{headers.tenant}", _event(), "the event has no header 'tenant'"),
        ("{correlation_id}", _event(correlation_id=None), "the event has no correlation_id"),
        ("{payload.missing}", _event(), "the payload has no field 'missing' (or it is null)"),
        ("{payload.tags}", _event(), "payload field 'tags' is a JSON list"),
        (
            "{payload.data.shop.x}",
            _event(),
            "the payload has no field 'data.shop.x' (or it is null)",
        ),
        ("{payload.region.x}", _event(), "the payload has no field 'region.x' (or it is null)"),
        ("{payload.x}", _event(payload="[1]"), "the payload is a JSON list, not an object"),
        ("{payload.x}", _event(payload="{bad"), "the payload is not JSON"),
        ("{headers.aggregate_type}", _event(headers={"aggregate_type": "a.b"}), "holds a dot"),
    ],
)
def test_a_value_that_cannot_be_used_names_its_placeholder(
    text: str, event: OutboxEvent, reason: str
) -> None:
    with pytest.raises(RenderError) as raised:
        DestinationTemplate(text, _no_dots).render(event)

    assert str(raised.value).startswith(f"placeholder {text} of {text!r}")
    assert str(raised.value).endswith(reason)


def test_a_template_of_the_event_type_alone_is_rendered_once_per_type() -> None:
    seen: list[str] = []

    def rule(value: str) -> str | None:
        seen.append(value)
        return "a dot" if "." in value else None

    template = DestinationTemplate("t.{event_type}", rule)
    for _ in range(3):
        assert template.render(_event()) == "t.OrderPlaced"
        with pytest.raises(RenderError, match="a dot"):
            template.render(_event(event_type="order.placed"))

    assert seen == ["OrderPlaced", "order.placed"]
