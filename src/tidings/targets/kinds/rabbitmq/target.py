"""The RabbitMQ target: publishing outbox events to one exchange over AMQP 0-9-1 (aiormq).

The relay calls :meth:`RabbitMQTarget.publish` synchronously from Spark tasks running in
plain threads, while aiormq is asyncio-only; as the JetStream target does, this one owns a
private event loop in a daemon thread (:mod:`tidings.targets.loop_thread`) and one
connection with one confirming channel, which every calling thread shares.

A call publishes the first event of every ordering key at once and each later event of a
key once the broker confirmed the one before it, so a key's messages reach their queues in
log order and none follows one that failed. Whom a failure is charged to:

* the broker returned the message (``mandatory``: no queue takes its routing key) or
  refused it (``basic.nack``), or it cannot be sent at all (no routing key, too large):
  that event's error, the rest of its key not sent;
* no broker can be reached, the exchange does not exist (or is of another type), or the
  broker confirmed nothing within ``confirm_timeout`` (a memory or disk alarm blocks
  publishers): :class:`~tidings.errors.TargetUnavailable`, nothing charged;
* the connection or channel broke during the call, or confirms stopped after some came:
  :class:`~tidings.errors.TargetCallFailed` with what was confirmed, so the relay narrows
  the call down (a lone event whose channel the broker closed is refused with the reason).

At-least-once: a message whose confirm was lost with the connection may be in its queue and
is published again; consumers de-duplicate by ``message_id`` (the event id).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import ssl
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote, urlsplit, urlunsplit

from tidings.errors import TargetCallFailed, TargetError, TargetUnavailable
from tidings.events.outbox import OutboxEvent
from tidings.redaction import hide_url_credentials
from tidings.targets.base import Target
from tidings.targets.destination import RenderError
from tidings.targets.kinds.rabbitmq.config import RabbitMQTargetConfig
from tidings.targets.kinds.rabbitmq.messages import (
    DEFAULT_FRAME_MAX,
    describe,
    message_properties,
    oversize,
    routing_key_problem,
    routing_key_template,
)
from tidings.targets.loop_thread import LoopThread

if TYPE_CHECKING:  # aiormq is imported where a connection is made: a process that only
    # validates configurations (every Spark worker does) does not load it.
    from aiormq.abc import AbstractChannel, AbstractConnection
    from pamqp.commands import Basic

_log = logging.getLogger("tidings.targets.kinds.rabbitmq")


def not_sent(culprit: OutboxEvent) -> str:
    return f"not sent: event seq {culprit.seq} of its key failed before it in this call"


@dataclass
class _Call:
    """One publish call: every event's result, which were confirmed, and what broke it."""

    events: Sequence[OutboxEvent]
    results: list[str | None]
    confirmed: list[bool]
    broken: BaseException | None = None  # the connection or channel failed under the call
    stalled: bool = False  # a confirm did not come within confirm_timeout
    sent: int = 0

    def fail(self, index: int, run: deque[int], error: str) -> None:
        """Event ``index`` failed with ``error``; the rest of its key's run is not sent."""
        self.results[index] = error
        while run:
            self.results[run.popleft()] = not_sent(self.events[index])


class RabbitMQTarget(Target):
    """Publishes events to one exchange; connects lazily, reconnects after failures.

    aiormq does not reconnect by itself, and this target does not ask it to: a lost
    connection is dropped, and the next :meth:`publish` opens a new one (and checks the
    exchange again).
    """

    atomic = False
    #: A key's events go one confirm after another within a call; a run is bounded so that
    #: one call of a long run still returns within seconds.
    events_per_key = 500
    config_model = RabbitMQTargetConfig

    def __init__(self, name: str, config: RabbitMQTargetConfig) -> None:
        super().__init__(name)
        self.config = config
        self._timeout = config.confirm_timeout.total_seconds()
        self._template = routing_key_template(config.routing_key)
        self._tls: ssl.SSLContext | None = None
        self._connection: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._connect_lock = asyncio.Lock()
        self._frame_max = DEFAULT_FRAME_MAX  # as the broker announced it on connect
        self._closed = False
        self._runner = LoopThread(f"tidings-rabbitmq-{name}")
        # A safety net for the calling thread only: each step has its own bound (a connect
        # per server, a few channel requests, one confirm per event of a key's run).
        self._call_timeout = (len(config.servers) + 4) * self._timeout

    # -- the Target interface ------------------------------------------------------------

    def publish(self, events: Sequence[OutboxEvent]) -> list[str | None]:
        """Publish ``events``, a key's events one confirm after another; None per confirmed
        event, else why it was not."""
        if self._closed:
            raise TargetError(f"rabbitmq target {self.name!r} is closed")
        if not events:
            return []
        runs = _key_runs(events)
        timeout = self._call_timeout + max(map(len, runs)) * self._timeout
        try:
            return self._runner.run(self._publish(events, runs), timeout)
        except concurrent.futures.TimeoutError:
            raise TargetCallFailed(
                f"rabbitmq target {self.name!r}: no result within {timeout:g}s"
            ) from None

    def refusal(self, event: OutboxEvent) -> str | None:
        """The event has no routing key (its template cannot be filled, or the key is over
        255 bytes), or its message is larger than the broker takes. Needs no connection:
        the limits are the configured ``max_message_size`` and the broker's ``frame_max``
        (RabbitMQ's default until a connection learned it)."""
        prepared = self._prepare(event)
        return prepared if isinstance(prepared, str) else None

    def close(self) -> None:
        """Close the connection and stop the loop thread; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._runner.started:
            try:
                self._runner.run(self._disconnect(), self._timeout + 1)
            except concurrent.futures.TimeoutError:
                _log.warning("rabbitmq target %s: close did not finish", self.name)
        self._runner.stop()

    # -- one call ------------------------------------------------------------------------

    async def _publish(
        self, events: Sequence[OutboxEvent], runs: list[deque[int]]
    ) -> list[str | None]:
        try:
            channel = await self._channel_ready()
        except TargetError as exc:
            raise TargetUnavailable(f"rabbitmq target {self.name!r}: {exc}") from None
        call = _Call(events, [None] * len(events), [False] * len(events))
        await asyncio.gather(*(self._send_run(channel, call, run) for run in runs))
        if call.broken is not None or call.stalled:
            await self._blame(call)
        return call.results

    async def _send_run(self, channel: AbstractChannel, call: _Call, run: deque[int]) -> None:
        """Publish one key's events in call order, each once the one before it is confirmed."""
        from aiormq.exceptions import DeliveryError, PublishError
        from pamqp.commands import Basic

        while run and call.broken is None and not call.stalled:
            index = run.popleft()
            event = call.events[index]
            prepared = self._prepare(event)
            if isinstance(prepared, str):
                call.fail(index, run, prepared)
                return
            routing_key, properties = prepared
            call.sent += 1
            try:
                confirmation = await channel.basic_publish(
                    event.payload.encode(),
                    exchange=self.config.exchange,
                    routing_key=routing_key,
                    properties=properties,
                    mandatory=self.config.mandatory,
                    timeout=self._timeout,
                )
            except PublishError as exc:  # returned: no queue takes this routing key
                call.fail(index, run, self._unroutable(routing_key, exc))
                return
            except DeliveryError as exc:
                call.fail(index, run, self._error(routing_key, f"refused by the broker ({exc})"))
                return
            except TimeoutError:
                call.stalled = True
                call.fail(index, run, self._error(routing_key, self._no_confirm()))
                return
            except Exception as exc:  # the channel or the connection broke
                call.broken = call.broken or exc
                call.fail(index, run, self._error(routing_key, describe(exc)))
                return
            if not isinstance(confirmation, Basic.Ack):
                call.fail(index, run, self._error(routing_key, f"not confirmed: {confirmation}"))
                return
            call.confirmed[index] = True
        while run:  # the call broke or stalled under another key: the rest waits
            index = run.popleft()
            call.results[index] = (
                f"rabbitmq target {self.name!r}: not sent: the call failed under another key"
            )

    async def _blame(self, call: _Call) -> None:
        """Raise if the broker, not one message, is why the call failed; else return (a lone
        event's own error stands).

        The connection is dropped first (a channel with confirms outstanding cannot be
        trusted), then: a broker that cannot be reached again, a missing exchange, or one
        that confirmed nothing in time is unavailable (nothing charged); a call of several
        events that broke is narrowed by the relay (TargetCallFailed, with what was
        confirmed); a lone event whose channel the broker closed is refused with the reason.
        """
        from aiormq.exceptions import ChannelNotFoundEntity

        broken = call.broken
        await self._disconnect()
        if isinstance(broken, ChannelNotFoundEntity):
            raise TargetUnavailable(
                f"rabbitmq target {self.name!r}: the broker refused the exchange: "
                f"{describe(broken)}"
            )
        if call.stalled and not any(call.confirmed):
            raise TargetUnavailable(
                f"rabbitmq target {self.name!r}: the broker confirmed none of {call.sent} "
                f"messages within {self._timeout:g}s (a memory or disk alarm blocks publishers)"
            )
        if broken is not None:
            try:
                await self._channel_ready()
            except TargetError as exc:
                raise TargetUnavailable(
                    f"rabbitmq target {self.name!r}: the connection broke during the call "
                    f"({describe(broken)}) and {exc}"
                ) from None
            if len(call.events) == 1:
                return
            raise TargetCallFailed(
                f"rabbitmq target {self.name!r}: the connection or channel broke during the "
                f"call ({describe(broken)})",
                confirmed=call.confirmed,
            )
        raise TargetCallFailed(
            f"rabbitmq target {self.name!r}: the broker stopped confirming during the call "
            f"({call.confirmed.count(True)} of {call.sent} confirmed, then none for "
            f"{self._timeout:g}s)",
            confirmed=call.confirmed,
        )

    def _prepare(self, event: OutboxEvent) -> tuple[str, Basic.Properties] | str:
        """``event``'s routing key and properties, or why it cannot be sent."""
        try:
            routing_key = self._template.render(event)
        except RenderError as exc:
            return self._no_key(event, str(exc))
        if (problem := routing_key_problem(routing_key)) is not None:
            return self._no_key(event, problem)
        try:
            properties = message_properties(event, self.config.persistent)
            too_big = oversize(
                len(event.payload.encode()),
                properties,
                self.config.max_message_size,
                self._frame_max,
            )
        except Exception as exc:  # pamqp refuses a property or a header
            return self._error(routing_key, f"cannot encode its properties: {describe(exc)}")
        if too_big is not None:
            return self._error(routing_key, too_big)
        return routing_key, properties

    def _unroutable(self, routing_key: str, exc: BaseException) -> str:
        from aiormq.exceptions import PublishError

        reply = ""
        if isinstance(exc, PublishError) and exc.message is not None:
            delivery = exc.message.delivery
            reply = f"{getattr(delivery, 'reply_code', '')} {getattr(delivery, 'reply_text', '')}"
        return (
            f"rabbitmq target {self.name!r}: unroutable: no queue is bound to exchange "
            f"{self._exchange_name()} for routing key {routing_key!r} (returned: "
            f"{reply.strip() or describe(exc)})"
        )

    def _error(self, routing_key: str, cause: str) -> str:
        return (
            f"rabbitmq target {self.name!r}: publish to exchange {self._exchange_name()} "
            f"with routing key {routing_key!r} failed: {cause}"
        )

    def _no_key(self, event: OutboxEvent, cause: str) -> str:
        return (
            f"rabbitmq target {self.name!r}: no routing key for event {event.event_id} "
            f"(seq {event.seq}): {cause}"
        )

    def _no_confirm(self) -> str:
        return f"no confirm within {self._timeout:g}s"

    def _exchange_name(self) -> str:
        return repr(self.config.exchange) if self.config.exchange else "'' (the default)"

    # -- connection ----------------------------------------------------------------------

    async def _channel_ready(self) -> AbstractChannel:
        """The live confirming channel, opening a connection if there is none."""
        async with self._connect_lock:
            channel, connection = self._channel, self._connection
            if channel is None or channel.is_closed or connection is None or connection.is_closed:
                await self._disconnect()
                self._connection, self._channel = await self._open()
            assert self._channel is not None
            return self._channel

    async def _open(self) -> tuple[AbstractConnection, AbstractChannel]:
        """Connect to the first broker that answers, open a confirming channel and check (or
        declare) the exchange; TargetError says why not."""
        connection = await self._connect_any()
        try:
            async with asyncio.timeout(self._timeout):
                channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
                await self._check_exchange(channel)
        except BaseException as exc:
            await _close_quietly(connection)
            if isinstance(exc, Exception):
                raise TargetError(self._exchange_problem(exc)) from None
            raise
        tune = getattr(connection, "connection_tune", None)
        if tune is not None and tune.frame_max:
            self._frame_max = int(tune.frame_max)
        return connection, channel

    async def _check_exchange(self, channel: AbstractChannel) -> None:
        exchange = self.config.exchange
        if not exchange:
            return  # the default exchange always exists
        if self.config.exchange_type is None:
            await channel.exchange_declare(exchange, passive=True)
        else:
            await channel.exchange_declare(
                exchange, exchange_type=self.config.exchange_type, durable=True
            )

    def _exchange_problem(self, exc: Exception) -> str:
        from aiormq.exceptions import ChannelNotFoundEntity, ChannelPreconditionFailed

        exchange = self.config.exchange
        if isinstance(exc, ChannelNotFoundEntity):
            return f"exchange {exchange!r} does not exist (set exchange_type to declare it)"
        if isinstance(exc, ChannelPreconditionFailed):
            return (
                f"exchange {exchange!r} exists with other settings than type "
                f"{self.config.exchange_type!r}, durable: {describe(exc)}"
            )
        if isinstance(exc, TimeoutError):
            return f"no channel within {self._timeout:g}s"
        return f"cannot open a channel: {describe(exc)}"

    async def _connect_any(self) -> AbstractConnection:
        """Try the brokers in configured order, each within ``confirm_timeout``."""
        import aiormq

        causes: list[str] = []
        for server in self.config.servers:
            url = self._url(server)
            options: dict[str, object] = {}
            if server.startswith("amqps:"):
                options["context"] = self._tls_context()
                if self.config.tls is not None and self.config.tls.server_name is not None:
                    options["server_hostname"] = self.config.tls.server_name
            try:
                async with asyncio.timeout(self._timeout):
                    return await aiormq.connect(
                        url,
                        client_properties={"connection_name": f"tidings-{self.name}"},
                        **options,
                    )
            except Exception as exc:
                cause = "timed out" if isinstance(exc, TimeoutError) else describe(exc)
                causes.append(hide_url_credentials(f"{server}: {cause}"))
        raise TargetError(f"cannot connect ({'; '.join(causes)})")

    def _url(self, server: str) -> str:
        """``server`` with the configured user and password in it (quoted), if any."""
        parts = urlsplit(server)
        user = parts.username if self.config.username is None else self.config.username
        password = parts.password if self.config.password is None else self.config.password
        if user is None and password is None:
            return server
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        userinfo = quote(user or "guest", safe="")
        if password is not None:
            userinfo += f":{quote(password, safe='')}"
        netloc = f"{userinfo}@{host}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            if self.config.tls is None:
                self._tls = ssl.create_default_context()
            else:
                try:
                    self._tls = self.config.tls.context()
                except Exception as exc:
                    raise TargetError(f"cannot load the TLS files: {exc}") from None
        return self._tls

    async def _disconnect(self) -> None:
        """Close the connection if there is one; never raise."""
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None:
            await _close_quietly(connection)


async def _close_quietly(connection: AbstractConnection) -> None:
    try:
        async with asyncio.timeout(2):
            await connection.close()
    except Exception as exc:  # a broken connection has nothing left to close
        _log.debug("rabbitmq target: closing: %s", describe(exc))


def _key_runs(events: Sequence[OutboxEvent]) -> list[deque[int]]:
    """The indexes of ``events`` per ordering key, each run in call order."""
    runs: dict[str, deque[int]] = {}
    for index, event in enumerate(events):
        runs.setdefault(event.ordering_key, deque()).append(index)
    return list(runs.values())
