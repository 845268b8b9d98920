"""The redis_stream kind in the contract suite: streams named under a tag of the test's on
the shared server (127.0.0.1:6379), deleted afterwards; the size limit on a private
``redis-server`` that takes bulk strings of 1 MiB at most."""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import pytest
import redis

from bench.harness.processes import free_port
from tests.support.brokers import redis_server
from tests.targets.contract.harness import Delivered, KindHarness, Outage, Sized, payload_n
from tests.targets.outbox_events import event
from tidings.events.outbox import OutboxEvent

SHARED = "redis://127.0.0.1:6379/0"


def stream_entries(url: str, pattern: str) -> list[tuple[str, dict[str, str]]]:
    """Every entry of the streams whose names match ``pattern``: ``(stream, fields)``, each
    stream in its order."""
    client = redis.Redis.from_url(url)
    try:
        found = []
        for name in sorted(client.scan_iter(pattern, _type="stream")):
            for _, fields in client.xrange(name):
                decoded = {k.decode(): v.decode() for k, v in fields.items()}
                found.append((name.decode(), decoded))
        return found
    finally:
        client.close()


def as_delivered(stream: str, fields: dict[str, str]) -> Delivered:
    return Delivered(
        fields["event_id"],
        fields.get("partition_key"),
        payload_n(fields["payload"]),
        stream,
        json.loads(fields.get("headers", "{}")),
    )


class RedisStreamHarness(KindHarness):
    kind = "redis_stream"
    marks = (pytest.mark.redis,)
    template_key = "stream"
    destination_word = "stream"
    minimal_entry: ClassVar[dict[str, Any]] = {"stream": "s"}
    restartable = True
    bad_entries: ClassVar[list[tuple[dict[str, Any], str]]] = [
        ({"stream": ""}, "at least 1 character"),
        ({"url": "http://127.0.0.1:6379"}, "is not a redis:// or rediss:// URL"),
        ({"url": "redis://u:secret@127.0.0.1:6379"}, "give username and password_env instead"),
        ({"url": "redis://127.0.0.1:6379/x"}, "the database after the host must be a number"),
        ({"url": "redis://127.0.0.1:6379/0?ssl=true"}, "options in the URL are not read"),
        ({"maxlen": 0}, "maxlen"),
        ({"password_env": "NOT-A-NAME"}, "password_env"),
        ({"tls": {"verify": False}}, "the url is not rediss://"),
        ({"timeout": "forever"}, "not a duration"),
    ]

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        super().__init__(request, tmp_path)
        self.tag = f"tidings-test:{uuid.uuid4().hex[:12]}"

    def settings(self) -> dict[str, Any]:
        return {"url": SHARED, "stream": f"{self.tag}:{{event_type}}", "timeout": "2s"}

    def template(self, *placeholders: str) -> str:
        return ":".join([self.tag, *placeholders])

    def destination(self, *values: str) -> str:
        return ":".join([self.tag, *values])

    def unreachable(self) -> dict[str, Any]:
        return {"url": f"redis://127.0.0.1:{free_port()}/0"}

    def poison(self, seq: int, key: str) -> tuple[OutboxEvent, str]:
        """Its stream's key holds a string: Redis answers WRONGTYPE."""
        redis.Redis.from_url(SHARED).set(f"{self.tag}:poisoned", "not a stream")
        return event(seq, partition_key=key, event_type="poisoned"), "WRONGTYPE"

    @contextmanager
    def sized(self) -> Iterator[Sized]:
        server = redis_server(self.tmp_path / "small", "--proto-max-bulk-len", "1mb")
        server.start()
        url = f"redis://127.0.0.1:{server.port}/0"
        try:
            yield Sized(
                self.make(url=url),
                event(2, payload='"' + "x" * (1024 * 1024) + '"'),
                ["field 'payload' is 1048578 bytes", "proto-max-bulk-len of 1048576 bytes"],
                known_before_publish=False,  # learnt on connecting; Redis's default before
                delivered=lambda: [as_delivered(*e) for e in stream_entries(url, "*")],
            )
        finally:
            server.kill()

    @contextmanager
    def outage(self) -> Iterator[Outage]:
        """A private server with an fsync'd append-only file, SIGKILLed: no chance to save
        anything, yet nothing it acknowledged is lost."""
        server = redis_server(self.tmp_path / "r", "--appendonly", "yes", "--appendfsync", "always")
        server.start()
        url = f"redis://127.0.0.1:{server.port}/0"

        def restart() -> None:
            server.kill(signal.SIGKILL)
            time.sleep(0.5)
            server.start()

        def delivered(ids: set[str]) -> list[Delivered]:
            return [as_delivered(*entry) for entry in stream_entries(url, "traffic")]

        try:
            yield Outage(
                self.make(url=url, stream="traffic", timeout="1s"), 3000, restart, delivered
            )
        finally:
            server.kill()

    def delivered(self, expect: int) -> list[Delivered]:
        return [as_delivered(*entry) for entry in stream_entries(SHARED, f"{self.tag}*")]

    def close(self) -> None:
        super().close()
        shared = redis.Redis.from_url(SHARED)
        keys = list(shared.scan_iter(f"{self.tag}*"))
        if keys:
            shared.delete(*keys)
        shared.close()
