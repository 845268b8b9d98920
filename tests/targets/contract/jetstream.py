"""The jetstream kind in the contract suite: a stream and subject prefix of the test's own on
the shared NATS server (127.0.0.1:4222, NATS's default ``max_payload`` of 1 MiB), deleted
afterwards."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import pytest

from bench.harness.processes import free_port
from tests.support.helpers import SHARED_URL, delete_stream, stream_messages
from tests.targets.contract.harness import NAME, Delivered, KindHarness, Sized, payload_n
from tests.targets.outbox_events import event
from tidings.events.outbox import OutboxEvent
from tidings.targets.kinds.jetstream.messages import header_block_size, message_headers

MAX_PAYLOAD = 1024 * 1024


def message_size(sent: OutboxEvent) -> tuple[int, int]:
    """``(payload bytes, header bytes)`` of the message ``sent`` becomes."""
    return len(sent.payload.encode()), header_block_size(message_headers(sent))


def just_over_the_limit(limit: int) -> OutboxEvent:
    """An event whose payload fits ``limit`` alone, but not with its headers."""
    probe = event(2)
    _, header_bytes = message_size(probe)
    payload = '"' + "x" * (limit - header_bytes // 2) + '"'
    return event(2, event_id=probe.event_id, payload=payload)


class JetStreamHarness(KindHarness):
    kind = "jetstream"
    marks = (pytest.mark.nats,)
    template_key = "subject_template"
    destination_word = "subject"
    bad_value = ("order.v2", "is 'order.v2': a NATS subject token cannot hold '.'")
    loop_thread = f"tidings-jetstream-{NAME}"
    minimal_entry: ClassVar[dict[str, Any]] = {"stream": "S", "subject_prefix": "p"}
    bad_entries: ClassVar[list[tuple[dict[str, Any], str]]] = [
        ({"subject_prefix": None, "subject_template": "orders.{headers.x"}, "unterminated"),
        (
            {"subject_prefix": None, "subject_template": "orders.{event_type}.>"},
            "is not a NATS subject",
        ),
        ({"subject_template": "orders.{event_type}"}, "exactly one of subject_prefix"),
        ({"subject_prefix": None}, "exactly one of subject_prefix"),
        ({"create_stream": "sometimes"}, "create_stream"),
        ({"on_mismatch": "shrug"}, "on_mismatch"),
        ({"storage": "tape"}, "storage"),
        ({"max_age": "forever"}, "not a duration"),
    ]

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        super().__init__(request, tmp_path)
        tag = uuid.uuid4().hex[:12]
        self.stream, self.prefix = f"TIDINGS_TEST_{tag}", f"tidings_test.{tag}"

    def settings(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "subject_prefix": self.prefix,
            "servers": [SHARED_URL],
            "ack_timeout": "2s",
        }

    @classmethod
    def with_template(cls, template: str) -> dict[str, Any]:
        return {"subject_prefix": None, "subject_template": template}

    def template(self, *placeholders: str) -> str:
        return ".".join([self.prefix, *placeholders])

    def destination(self, *values: str) -> str:
        return ".".join([self.prefix, *values])

    def unreachable(self) -> dict[str, Any]:
        return {"servers": [f"nats://127.0.0.1:{free_port()}"]}

    def poison(self, seq: int, key: str) -> tuple[OutboxEvent, str]:
        """A header name with a space: nats-py will not send it."""
        return event(seq, partition_key=key, headers={"Bad Header": "x"}), "BadHeaderError"

    @contextmanager
    def sized(self) -> Iterator[Sized]:
        """The limit is the server's ``max_payload``, asked of it before any publish."""
        big = just_over_the_limit(MAX_PAYLOAD)
        payload, header_bytes = message_size(big)
        assert payload <= MAX_PAYLOAD < payload + header_bytes
        yield Sized(
            self.make(),
            big,
            [
                f"payload {payload} + headers {header_bytes}",
                f"over the NATS server's max_payload of {MAX_PAYLOAD} bytes",
            ],
            known_before_publish=True,
            delivered=lambda: self.delivered(2),
        )

    def delivered(self, expect: int) -> list[Delivered]:
        found = []
        for msg in stream_messages(self.stream):
            fields = msg.headers or {}
            found.append(
                Delivered(
                    fields["Nats-Msg-Id"],
                    fields.get("Tidings-Partition-Key"),
                    payload_n(msg.data),
                    msg.subject,
                    {k: v for k, v in fields.items() if not k.startswith(("Tidings-", "Nats-"))},
                )
            )
        return found

    def close(self) -> None:
        super().close()
        delete_stream(self.stream)
