"""``spark.readStream.format("tidings_stream")``: an FTN18 stream as a Spark streaming source.

The source is a registered reliable consumer (option ``component``) whose offset is the event
id. Spark's checkpoint holds the offsets, so a restarted query resumes exactly where its last
committed micro-batch ended; the consumer's position on the server is acknowledged only when
Spark has committed a micro-batch (:meth:`TidingsStreamReader.commit`, and the next
``latestOffset``, which the engine calls only once the previous batch committed), which keeps
retention from discarding an event before a query has it. A new query (no checkpoint) starts
at the consumer's position. A micro-batch reads the ids in ``(start, end]`` with stateless
``LIVE`` polls, so re-reading a batch after a failure gets the same events. Rows: ``id``,
``type``, ``data`` (JSON text), ``ts`` (UTC timestamp).

Options: ``url``, ``user``, ``password`` or ``password_env`` (the name of an environment
variable holding it, so that it stays out of query plans and logs), ``component``, ``want``
(comma-separated FTN18 types). Calls are plain HTTP (the driver and the tasks are
synchronous code).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow

from tidings.errors import ConfigError, StreamError
from tidings.pipeline.source.runner_exit import quiet_when_the_jvm_closes
from tidings.streams.client import LIVE, failure_reason, ftn3_outcome, http_url
from tidings.streams.protocol import ftn3
from tidings.streams.protocol.interfaces import COMPONENT

SCHEMA = "id LONG, type STRING, data STRING, ts TIMESTAMP"
_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class StreamOptions:
    """The source's options, checked."""

    url: str
    sec: str
    component: str
    want: list[str] | None

    @classmethod
    def of(cls, options: Mapping[str, str]) -> StreamOptions:
        missing = [key for key in ("url", "user", "component") if not options.get(key)]
        if missing:
            raise ConfigError(f"tidings_stream: missing option(s) {', '.join(missing)}")
        password = options.get("password")
        if password is None and options.get("password_env"):
            password = os.environ.get(options["password_env"])
        if not password:
            raise ConfigError(
                "tidings_stream: give the option password_env (a variable holding the "
                "password) or password"
            )
        component = options["component"]
        if component == LIVE or not COMPONENT.match(component):
            raise ConfigError(
                f"tidings_stream: component {component!r} must be a registrable component "
                "(1-16 of A-Z a-z 0-9 _, not LIVE)"
            )
        want = options.get("want")
        return cls(
            http_url(options["url"]),
            f"{options['user']}:{password}",
            component,
            None if want is None else [t.strip() for t in want.split(",") if t.strip()],
        )

    def call(self, func: str, params: dict[str, Any]) -> Any:
        """One call of ``futoin.evt.poll:1.1``; its result or StreamError."""
        body = ftn3.request(f"futoin.evt.poll:1.1:{func}", params, None, self.sec)
        try:
            response = httpx.post(
                self.url,
                content=body,
                headers={"Content-Type": "application/futoin+json"},
                timeout=_TIMEOUT_S,
            )
        except httpx.HTTPError as exc:
            raise StreamError(
                "CommError", f"cannot reach stream {self.url}: {failure_reason(exc)}"
            ) from exc
        return ftn3_outcome(self.url, response)

    def check(self) -> None:
        """Make the calls a new query starts with (register the consumer, poll with the
        ``want`` list), so that a job is refused in one line, before Spark starts, for an
        unreachable stream, a path that is no stream, a wrong password or a ``want`` of
        types the stream does not carry: inside the query each is a failed query and pages
        of Java and Python."""
        self.call("registerConsumer", {"component": self.component})
        self.poll(self.component, None)

    def poll(self, component: str, last_id: int | None) -> list[dict[str, Any]]:
        params = {
            "component": component,
            "last_id": None if not last_id else str(last_id),
            "want": self.want,
        }
        result: list[dict[str, Any]] = self.call("pollEvents", params)
        return result


@dataclass(frozen=True)
class IdRange(InputPartition):
    """The events with ``after < id <= upto``."""

    after: int
    upto: int


class TidingsStreamDataSource(DataSource):
    """Registered with ``spark.dataSource.register(TidingsStreamDataSource)``."""

    @classmethod
    def name(cls) -> str:
        return "tidings_stream"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: object) -> TidingsStreamReader:
        # Called in Spark's streaming source runner: a stopped query ends it quietly.
        quiet_when_the_jvm_closes()
        return TidingsStreamReader(self.options)


class TidingsStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets ``{"id": n}``; see the module docstring."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.stream = StreamOptions.of(options)
        #: Under ``trigger(availableNow=True)``: the newest id when the query started.
        self._until: int | None = None
        #: The highest position this reader has acknowledged.
        self._acked = 0

    def prepareForTriggerAvailableNow(self) -> None:
        self._until = self._newest(0)

    def initialOffset(self) -> dict[str, int]:
        """The consumer's position (registered here if it is new)."""
        self.stream.call("registerConsumer", {"component": self.stream.component})
        pending = self.stream.poll(self.stream.component, None)
        if pending:
            return {"id": int(pending[0]["id"]) - 1}
        return {"id": self._newest(0)}

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        floor = int(start["id"])
        # Micro-batches run one after the other, so the engine asks for the next one only
        # once the previous one (ending at ``start``) has committed; and it asks once more
        # before an availableNow query ends, when commit() is not called for the last batch.
        self._acknowledge(floor)
        if self._until is not None:
            return {"id": max(floor, self._until)}
        return {"id": self._newest(floor)}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[IdRange]:
        after, upto = int(start["id"]), int(end["id"])
        return [IdRange(after, upto)] if upto > after else []

    def read(self, partition: IdRange) -> Iterator[tuple[Any, ...]]:  # type: ignore[override]
        last = partition.after
        while last < partition.upto:
            events = self.stream.poll(LIVE, last)
            if not events:
                return  # discarded meanwhile (an unregistered source): nothing more there
            for event in events:
                event_id = int(event["id"])
                if event_id > partition.upto:
                    return
                yield (
                    event_id,
                    event["type"],
                    json.dumps(event.get("data"), separators=(",", ":"), ensure_ascii=False),
                    datetime.strptime(event["ts"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC),
                )
                last = event_id

    def commit(self, end: dict[str, int]) -> None:
        """Spark has committed everything up to ``end``: acknowledge it on the server."""
        self._acknowledge(int(end["id"]))

    def _acknowledge(self, position: int) -> None:
        if position > self._acked:
            self.stream.poll(self.stream.component, position)
            self._acked = position

    def _newest(self, floor: int) -> int:
        """The newest id of the stream (at least ``floor``)."""
        newest = self.stream.poll(LIVE, None)
        return max(floor, int(newest[-1]["id"])) if newest else floor
