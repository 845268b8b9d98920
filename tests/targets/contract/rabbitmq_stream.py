"""The rabbitmq_stream kind in the contract suite: streams named under a tag of the test's on
the shared broker (127.0.0.1:5552), created by the target, read back with rstream's own
consumer and deleted afterwards. The target keeps its producer references and publishing ids
in an outbox log: each target the harness makes gets one (a SQLite file of the test's), as
the relay's tasks attach theirs."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import pytest

from bench.harness.processes import free_port
from tests.targets.contract.harness import NAME, Delivered, KindHarness, Sized, payload_n
from tests.targets.kinds.rabbitmq_stream_support import admin, read_stream
from tests.targets.outbox_events import event
from tidings.db import make_engine
from tidings.events.outbox import OutboxEvent
from tidings.outbox.confirmations import ConfirmationLog
from tidings.outbox.schema import ensure_schema
from tidings.targets.base import Target


def streams_named(prefix: str) -> list[str]:
    """The broker's streams (queues) whose names start with ``prefix``, sorted."""
    listed = subprocess.run(
        ["rabbitmqctl", "-q", "list_queues", "name"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.split()
    return sorted(name for name in listed if name.startswith(prefix))


class RabbitMQStreamHarness(KindHarness):
    kind = "rabbitmq_stream"
    template_key = "stream"
    destination_word = "stream"
    bad_value = ("k" * 256, "over RabbitMQ's 255")
    loop_thread = f"tidings-rabbitmq-stream-{NAME}"
    minimal_entry: ClassVar[dict[str, Any]] = {"stream": "orders"}
    poison_refused_at_emit = True
    bad_entries: ClassVar[list[tuple[dict[str, Any], str]]] = [
        ({"stream": "orders-{headers.x"}, "unterminated"),
        ({"stream": "s" * 256}, "fixed text is over 255 bytes"),
        ({"servers": ["amqp://127.0.0.1:5672/"]}, "is not a RabbitMQ stream URL"),
        ({"servers": []}, "at least 1 item"),
        ({"servers": ["rabbitmq-stream://h:5552/?tls=1"]}, "not in the URL"),
        ({"tls": {}}, "every server must be a rabbitmq-stream+tls:// URL"),
        ({"producers": 0}, "producers"),
        ({"producer_lease": "2s", "confirm_timeout": "5s"}, "longer than confirm_timeout"),
        ({"frame_max": 100}, "frame_max"),
        ({"confirm_timeout": "soon"}, "not a duration"),
    ]

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        super().__init__(request, tmp_path)
        self.tag = f"tidings-test-{uuid.uuid4().hex[:12]}"
        self.log = make_engine(f"sqlite:///{tmp_path / 'stream-ids.db'}")
        ensure_schema(self.log)

    def settings(self) -> dict[str, Any]:
        return {
            "stream": f"{self.tag}.{{event_type}}",
            "create_stream": True,
            "confirm_timeout": "2s",
            "producer_lease": "3s",
        }

    def make(self, **overrides: Any) -> Target:
        target = super().make(**overrides)
        target.attach_log(ConfirmationLog(self.log))
        return target

    def template(self, *placeholders: str) -> str:
        return ".".join([self.tag, *placeholders])

    def destination(self, *values: str) -> str:
        return ".".join([self.tag, *values])

    def unreachable(self) -> dict[str, Any]:
        return {"servers": [f"rabbitmq-stream://127.0.0.1:{free_port()}/"]}

    def poison(self, seq: int, key: str) -> tuple[OutboxEvent, str]:
        """Its type makes a stream name over 255 bytes: the target refuses it."""
        return event(seq, partition_key=key, event_type="t" * 250), "over RabbitMQ's 255"

    @contextmanager
    def sized(self) -> Iterator[Sized]:
        """``frame_max``, the target's own setting: a message must fit in one frame."""
        yield Sized(
            self.make(frame_max=8192),
            event(2, payload='"' + "x" * 9000 + '"'),
            ["over the connection's frame_max of 8192 bytes"],
            known_before_publish=True,
            delivered=lambda: self.delivered(3),
        )

    def delivered(self, expect: int) -> list[Delivered]:
        found = []
        for stream in streams_named(self.tag):
            for read in read_stream(stream, 1, timeout=10):
                found.append(
                    Delivered(
                        read.message_id,
                        read.properties.get("Tidings-Partition-Key"),
                        payload_n(read.body),
                        stream,
                        {k: v for k, v in read.properties.items() if not k.startswith("Tidings-")},
                    )
                )
        return found

    def close(self) -> None:
        super().close()
        for stream in streams_named(self.tag):
            admin("delete", stream)
        self.log.dispose()
