"""The Redis Streams target: ``XADD`` per event through redis-py, confirmed by its reply.

The relay calls :meth:`RedisStreamTarget.publish` from Spark executor threads; redis-py is
synchronous and its client is shared by threads (each call borrows a connection of its
pool), so no event loop is needed. A call goes in rounds (:mod:`tidings.targets.rounds`):
each round is one pipeline (one write, one read) of the next event of every ordering key,
so a key's events are stored in call order and none is stored after one that failed.

Delivery is at-least-once: an entry Redis stored but whose reply was lost (the connection
broke) is added again when the relay retries, as a second entry with the same ``event_id``
field. Consumers drop it by that field (see docs/guides/targets.md).

redis-py's own retries are off: a command it sent again after a reconnect would be sent
after this target had reported it failed, and a server that is down must open the relay's
breaker at once, not after redis-py's backoff.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tidings.errors import TargetCallFailed, TargetError, TargetUnavailable
from tidings.events.outbox import OutboxEvent
from tidings.targets.base import Target
from tidings.targets.destination import RenderError
from tidings.targets.kinds.redis_stream.config import RedisStreamTargetConfig, stream_template
from tidings.targets.kinds.redis_stream.entries import (
    Limits,
    command_error,
    describe,
    entry_fields,
    oversize,
    server_state,
)
from tidings.targets.rounds import Rounds

if TYPE_CHECKING:  # redis-py is imported where a connection is made: a process that only
    # validates configurations (every Spark worker does) does not load it.
    import redis

_log = logging.getLogger("tidings.targets.kinds.redis_stream")


class RedisStreamTarget(Target):
    """Adds events to Redis streams; connects lazily, reconnects after failures."""

    atomic = False
    #: A key's events go one round after another (one round trip each), so a run is bounded
    #: to keep one call within seconds.
    events_per_key = 100
    config_model = RedisStreamTargetConfig

    def __init__(self, name: str, config: RedisStreamTargetConfig) -> None:
        super().__init__(name)
        self.config = config
        self._template = stream_template(config.stream)
        self._timeout = config.timeout.total_seconds()
        self._lock = threading.Lock()
        self._client: redis.Redis | None = None
        self._limits: Limits | None = None
        self._closed = False

    def publish(self, events: Sequence[OutboxEvent]) -> list[str | None]:
        """``XADD`` every event; None per event whose entry was added, else why."""
        if self._closed:
            raise TargetError(f"redis_stream target {self.name!r} is closed")
        if not events:
            return []
        try:
            client, limits = self._connection()
        except TargetError as exc:
            raise TargetUnavailable(f"redis_stream target {self.name!r}: {exc}") from None
        rounds = Rounds(events)
        while sent := rounds.next_round():
            self._round(client, limits, rounds, sent)
        return rounds.results

    def refusal(self, event: OutboxEvent) -> str | None:
        """The event has no stream (its template cannot be filled from it), or its entry is
        larger than the server takes. Limits not read yet are Redis's defaults: a producer
        does not connect in its transaction for them."""
        try:
            stream = self._template.render(event)
        except RenderError as exc:
            return self._no_stream(event, exc)
        problem = oversize(stream, entry_fields(event), self._limits or Limits())
        return None if problem is None else self._error(stream, problem)

    def close(self) -> None:
        """Close the connections; the target is not used afterwards."""
        self._closed = True
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()
            client.connection_pool.disconnect()

    # -- one round -----------------------------------------------------------------------

    def _round(self, client: redis.Redis, limits: Limits, rounds: Rounds, sent: list[int]) -> None:
        """Send the events ``sent`` (one per key) in one pipeline and settle their replies."""
        pipe = client.pipeline(transaction=False)
        added: list[tuple[int, str]] = []
        for index in sent:
            event = rounds.events[index]
            try:
                stream = self._template.render(event)
            except RenderError as exc:
                rounds.fail(index, self._no_stream(event, exc))
                continue
            fields = entry_fields(event)
            if (problem := oversize(stream, fields, limits)) is not None:
                rounds.fail(index, self._error(stream, problem))
                continue
            pipe.xadd(
                stream,
                fields,  # type: ignore[arg-type]  # bytes fields, as redis-py sends them
                maxlen=self.config.maxlen,
                approximate=self.config.maxlen_approximate,
            )
            added.append((index, stream))
        if not added:
            return
        errors = _redis().exceptions
        link_errors = (errors.ConnectionError, errors.TimeoutError, OSError)
        try:
            replies = pipe.execute(raise_on_error=False)
        except link_errors as exc:
            self._lost(client, rounds, describe(exc))
        except errors.RedisError as exc:
            raise TargetCallFailed(
                f"redis_stream target {self.name!r}: the pipeline failed: {describe(exc)}",
                confirmed=rounds.confirmed,
            ) from None
        busy: list[str] = []
        for (index, stream), reply in zip(added, replies, strict=True):
            if not isinstance(reply, Exception):
                rounds.confirm(index)
            elif isinstance(reply, link_errors):
                self._lost(client, rounds, describe(reply))
            elif server_state(reply):
                busy.append(command_error(reply))
                rounds.fail(index, self._error(stream, command_error(reply)))
            else:
                rounds.fail(index, self._error(stream, command_error(reply)))
        if busy:
            self._server_cannot_write(rounds, busy[0])

    def _lost(self, client: redis.Redis, rounds: Rounds, cause: str) -> None:
        """The connection broke during a round: which of its entries were stored is not
        known. A server that cannot be reached again is down (no event is blamed); one that
        can was perhaps closed on by one entry: the relay narrows the call down."""
        client.connection_pool.disconnect()
        try:
            client.ping()
        except Exception as exc:  # redis-py's errors, or the socket's
            raise TargetUnavailable(
                f"redis_stream target {self.name!r}: the server went away during the call "
                f"({cause}) and cannot be reached ({describe(exc)})"
            ) from None
        raise TargetCallFailed(
            f"redis_stream target {self.name!r}: the connection was lost during the call ({cause})",
            confirmed=rounds.confirmed,
        )

    def _server_cannot_write(self, rounds: Rounds, cause: str) -> None:
        """An out-of-memory, loading or read-only server refuses every entry alike: no event
        is to blame. Nothing confirmed yet: the target is down; else the call fails as a
        whole with what was confirmed."""
        message = f"redis_stream target {self.name!r}: the server refuses writes: {cause}"
        if not any(rounds.confirmed):
            raise TargetUnavailable(message)
        raise TargetCallFailed(message, confirmed=rounds.confirmed)

    def _error(self, stream: str, cause: str) -> str:
        return f"redis_stream target {self.name!r}: XADD to {stream!r} failed: {cause}"

    def _no_stream(self, event: OutboxEvent, exc: RenderError) -> str:
        return (
            f"redis_stream target {self.name!r}: no stream for event {event.event_id} "
            f"(seq {event.seq}): {exc}"
        )

    # -- connection ----------------------------------------------------------------------

    def _connection(self) -> tuple[redis.Redis, Limits]:
        """The client and the server's limits, connecting (and reading them) if needed."""
        with self._lock:
            if self._client is None:
                from tidings.targets.kinds.redis_stream.connection import open_client

                client = open_client(self.name, self.config)
                try:
                    self._limits = self._read_limits(client)
                except Exception as exc:  # redis-py's errors, or the socket's
                    client.close()
                    client.connection_pool.disconnect()
                    raise TargetError(
                        f"cannot connect to {self._where()}: {describe(exc)}"
                    ) from None
                self._client = client
            assert self._limits is not None
            return self._client, self._limits

    def _read_limits(self, client: redis.Redis) -> Limits:
        """The server's ``proto-max-bulk-len`` and ``client-query-buffer-limit``; Redis's
        defaults where the ACL user may not read them (logged once)."""
        client.ping()
        try:
            found = client.config_get("proto-max-bulk-len", "client-query-buffer-limit")
        except _redis().ResponseError as exc:
            _log.info(
                "redis_stream target %s: cannot read the server's limits (%s); assuming "
                "Redis's defaults",
                self.name,
                command_error(exc),
            )
            return Limits()
        values = {_text(k): int(_text(v)) for k, v in dict(found).items()}
        defaults = Limits()
        return Limits(
            max_bulk=values.get("proto-max-bulk-len", defaults.max_bulk),
            max_query=values.get("client-query-buffer-limit", defaults.max_query),
        )

    def _where(self) -> str:
        return self.config.url


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _redis() -> Any:
    """redis-py, imported on first use (see the note at the imports)."""
    import redis

    return redis
