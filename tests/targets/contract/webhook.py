"""The webhook kind in the contract suite: POSTs to paths under a tag of the test's on the
test endpoint (:mod:`tests.targets.kinds.webhook_server`, one process for the session),
which answers each event as its ``act`` header asks and logs every request."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import pytest

from bench.harness.processes import free_port
from tests.targets.contract.harness import Delivered, KindHarness, Sized, payload_n
from tests.targets.kinds.webhook_support import HookServer
from tests.targets.outbox_events import event
from tidings.events.outbox import OutboxEvent

#: The CloudEvents attributes the target sets from the row; other ``ce-`` headers are the
#: event's custom headers.
ATTRIBUTES = {"specversion", "id", "source", "type", "time", "subject", "partitionkey",
              "datacontenttype", "dataversion", "correlationid"}  # fmt: skip


class WebhookHarness(KindHarness):
    kind = "webhook"
    template_key = "url"
    destination_word = "URL"
    bad_value = ("a/b", "letters, digits")
    unreachable_text = "ConnectError"
    minimal_entry: ClassVar[dict[str, Any]] = {"url": "http://127.0.0.1:1/x"}
    bad_entries: ClassVar[list[tuple[dict[str, Any], str]]] = [
        ({"url": "ftp://example.com/x"}, "absolute http:// or https:// URL"),
        ({"url": "/hooks"}, "absolute http:// or https:// URL"),
        ({"url": "https://user:pw@example.com/x"}, "holds credentials"),
        ({"headers": {"Authorization": "Bearer x"}}, "looks like a credential"),
        ({"headers": {"X-Api-Key": "x"}}, "looks like a credential"),
        ({"headers": {"ce-id": "x"}}, "set by the target itself"),
        ({"headers_env": {"X-A": "1BAD"}}, "not a variable name"),
        ({"headers": {"X-A": "1"}, "headers_env": {"x-a": "A"}}, "given twice"),
        ({"tls": {"verify": False}}, "not https://"),
        ({"mode": "batched"}, "mode"),
        ({"max_concurrency": 0}, "max_concurrency"),
    ]

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        super().__init__(request, tmp_path)
        self.server: HookServer = request.getfixturevalue("hook_server")
        self.tag = uuid.uuid4().hex[:12]

    def settings(self) -> dict[str, Any]:
        return {"url": f"{self.server.url}/{self.tag}", "retry_backoff": "10ms"}

    def template(self, *placeholders: str) -> str:
        return "/".join([self.server.url, self.tag, *placeholders])

    def destination(self, *values: str) -> str:
        return "/".join(["", self.tag, *values])

    def unreachable(self) -> dict[str, Any]:
        return {"url": f"http://127.0.0.1:{free_port()}/x"}

    def poison(self, seq: int, key: str) -> tuple[OutboxEvent, str]:
        """The endpoint answers 422: a 4xx other than 408 and 429 refuses the event."""
        refused = event(seq, partition_key=key, headers={"act": "refuse"})
        return refused, "refused: answered 422 Unprocessable"

    @contextmanager
    def sized(self) -> Iterator[Sized]:
        yield Sized(
            self.make(max_body_bytes=300),
            event(2, payload=json.dumps({"blob": "x" * 400})),
            ["the body would be", "over max_body_bytes (300)"],
            known_before_publish=True,
            delivered=lambda: self.delivered(2),
        )

    def delivered(self, expect: int) -> list[Delivered]:
        found = []
        for request in self.server.requests():
            if request["status"] != 200 or not request["path"].startswith(f"/{self.tag}"):
                continue
            headers = request["headers"]
            custom = {k[3:]: v for k, v in headers.items() if k.startswith("ce-")}
            found.append(
                Delivered(
                    headers["ce-id"],
                    headers.get("ce-partitionkey"),
                    payload_n(request["body"]),
                    request["path"],
                    {k: v for k, v in custom.items() if k not in ATTRIBUTES},
                )
            )
        return found
