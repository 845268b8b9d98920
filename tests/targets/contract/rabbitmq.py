"""The rabbitmq (AMQP 0-9-1) kind in the contract suite: a topic exchange of the test's own
on the shared broker (127.0.0.1:5672), with durable queues bound to ``order.#`` and
``orders.#``, all deleted afterwards; a routing key no queue is bound to is unroutable."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import pytest

from bench.harness.processes import free_port
from tests.targets.contract.harness import NAME, Delivered, KindHarness, Sized, payload_n
from tests.targets.kinds.rabbitmq_support import Topology, headers, messages
from tests.targets.outbox_events import event
from tidings.events.outbox import OutboxEvent


class RabbitMQHarness(KindHarness):
    kind = "rabbitmq"
    template_key = "routing_key"
    destination_word = "routing key"
    bad_value = ("k" * 256, "the routing key is 256 bytes, over AMQP's 255")
    loop_thread = f"tidings-rabbitmq-{NAME}"
    minimal_entry: ClassVar[dict[str, Any]] = {"exchange": "events"}
    bad_entries: ClassVar[list[tuple[dict[str, Any], str]]] = [
        ({"routing_key": "orders.{headers.x"}, "unterminated"),
        ({"routing_key": "r" * 256}, "fixed text is over 255 bytes"),
        ({"servers": ["http://broker:5672/"]}, "is not an AMQP URL"),
        ({"servers": []}, "at least 1 item"),
        ({"servers": ["amqp://h:5672/?heartbeat=5"]}, "not in the URL"),
        ({"tls": {}}, "every server must be an amqps:// URL"),
        ({"exchange": "", "exchange_type": "topic"}, "exchange_type needs an exchange name"),
        ({"exchange_type": "queue"}, "exchange_type"),
        ({"exchange": "bad name"}, "exchange"),
        ({"max_message_size": 0}, "max_message_size"),
        ({"confirm_timeout": "soon"}, "not a duration"),
        ({"vhost": "/"}, "unknown key"),
    ]

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        super().__init__(request, tmp_path)
        self.topology = Topology()
        self.topology.declare_exchange()
        self.queues = [self.topology.queue("order.#"), self.topology.queue("orders.#")]

    def settings(self) -> dict[str, Any]:
        return {"exchange": self.topology.exchange, "confirm_timeout": "3s"}

    def template(self, *placeholders: str) -> str:
        return ".".join(placeholders)

    def destination(self, *values: str) -> str:
        return ".".join(values)

    def unreachable(self) -> dict[str, Any]:
        return {"servers": [f"amqp://127.0.0.1:{free_port()}/"]}

    def poison(self, seq: int, key: str) -> tuple[OutboxEvent, str]:
        """No queue is bound for its routing key: with ``mandatory`` it is returned."""
        stray = event(seq, partition_key=key, event_type="invoice.sent")
        return stray, (
            f"rabbitmq target '{NAME}': unroutable: no queue is bound to exchange "
            f"'{self.topology.exchange}' for routing key 'invoice.sent' (returned: 312 NO_ROUTE)"
        )

    @contextmanager
    def sized(self) -> Iterator[Sized]:
        """``max_message_size`` is the broker's setting, told to the target."""
        yield Sized(
            self.make(max_message_size=1000),
            event(2, payload='"' + "x" * 1000 + '"'),
            ["the payload is 1002 bytes, over the broker's max_message_size of 1000"],
            known_before_publish=True,
            delivered=lambda: self.delivered(2),
        )

    def delivered(self, expect: int) -> list[Delivered]:
        found = []
        for queue in self.queues:
            for message in messages(queue):
                fields = headers(message)
                found.append(
                    Delivered(
                        message.header.properties.message_id or "",
                        fields.get("Tidings-Partition-Key"),
                        payload_n(message.body),
                        message.routing_key or "",
                        {k: v for k, v in fields.items() if not k.startswith("Tidings-")},
                    )
                )
        return found

    def close(self) -> None:
        super().close()
        self.topology.remove()
