"""The webhook target: POSTing outbox events to HTTP endpoints through httpx.

The relay calls :meth:`WebhookTarget.publish` synchronously from Spark tasks in plain
threads; the target owns one asyncio loop in a daemon thread
(:mod:`tidings.targets.loop_thread`) and one ``httpx.AsyncClient`` on it, so every calling
thread shares its kept-alive connections and the concurrency limit of each endpoint.

A call sends the first event of every ordering key at once (at most ``max_concurrency``
requests in flight per endpoint) and each later event of a key once the one before it was
confirmed, retries included: a key's events reach the endpoint in log order, and none
after one that failed (those are answered :func:`not_sent`, uncharged). What each answer
means is :mod:`tidings.targets.kinds.webhook.answers`; an endpoint that does not answer at
all makes the call :class:`~tidings.errors.TargetUnavailable` (nothing confirmed: the
relay's breaker opens and no event is charged) or, if some events were confirmed before it
went away, :class:`~tidings.errors.TargetCallFailed` with those confirmations.

Delivery is at-least-once: a request whose answer was lost is sent again, with the same
idempotency key (the event id), by which the receiver drops it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import ssl
from collections.abc import Sequence
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from tidings.errors import (
    ConfigError,
    TargetCallFailed,
    TargetError,
    TargetUnavailable,
    TlsError,
)
from tidings.events.outbox import OutboxEvent
from tidings.targets.base import Target
from tidings.targets.destination import RenderError
from tidings.targets.kinds.webhook.answers import (
    CONFIRMED,
    Outcome,
    body_piece,
    confirmed,
    retried,
    retry_after,
)
from tidings.targets.kinds.webhook.cloudevent import Request, cloudevent_request
from tidings.targets.kinds.webhook.config import WebhookTargetConfig, url_template
from tidings.targets.loop_thread import LoopThread

if TYPE_CHECKING:  # httpx is imported where a request is made: a process that only
    # validates configurations (every Spark worker does) does not load it.
    import httpx

_log = logging.getLogger("tidings.targets.kinds.webhook")

#: How many endpoints' concurrency limits a templated URL keeps (one per scheme, host, port).
_ENDPOINTS_KEPT = 10_000


def not_sent(culprit: OutboxEvent) -> str:
    return f"not sent: event seq {culprit.seq} of its key failed before it in this call"


class WebhookTarget(Target):
    """POSTs every event as a CloudEvent to its endpoint; 2xx confirms it."""

    atomic = False
    #: A key's events go one after another within a call; a run is bounded so that one call
    #: of a long run still returns within a bounded time.
    events_per_key = 100
    config_model = WebhookTargetConfig

    def __init__(self, name: str, config: WebhookTargetConfig) -> None:
        super().__init__(name)
        self.config = config
        # The auth headers are read at the first publish (:meth:`_headers`), not here: a
        # producer builds its routed targets to ask them for refusals at emit, and the
        # service's process need not hold the endpoint's credentials.
        self._fixed: dict[str, str] | None = None
        self._template = url_template(config.url)
        self._timeout = config.timeout.total_seconds()
        self._connect = config.connect_timeout.total_seconds()
        self._backoff = config.retry_backoff.total_seconds()
        self._max_wait = config.max_retry_after.total_seconds()
        self._client: httpx.AsyncClient | None = None
        self._limits: dict[str, asyncio.Semaphore] = {}
        self._closed = False
        self._runner = LoopThread(f"tidings-webhook-{name}")
        # The longest one event can take: every try connecting and waiting for its answer,
        # every wait between tries. A safety net for the calling thread only.
        tries = config.retries + 1
        self._per_event = tries * (self._connect + self._timeout) + config.retries * self._max_wait

    def publish(self, events: Sequence[OutboxEvent]) -> list[str | None]:
        """POST every event (a key's one after another); None per confirmed event, else why."""
        if self._closed:
            raise TargetError(f"webhook target {self.name!r} is closed")
        if not events:
            return []
        runs = _key_runs(events)
        waves = max(map(len, runs)) + math.ceil(len(events) / self.config.max_concurrency)
        timeout = waves * self._per_event + self._connect
        try:
            outcomes = self._runner.run(self._publish(events, runs), timeout)
        except concurrent.futures.TimeoutError:
            raise TargetCallFailed(
                f"webhook target {self.name!r}: no result within {timeout:g}s"
            ) from None
        return self._results(outcomes)

    def refusal(self, event: OutboxEvent) -> str | None:
        """The event has no URL (its template cannot be filled from it), or its body is
        larger than ``max_body_bytes``."""
        try:
            url = self._template.render(event)
        except RenderError as exc:
            return self._no_url(event, exc)
        if self.config.max_body_bytes is None:
            return None
        try:
            request = cloudevent_request(event, self.config.mode, self.config.source)
        except Exception:  # the relay names what is wrong with it; emit must not raise
            return None
        return self._oversize(url, request)

    def close(self) -> None:
        """Close the client's connections and stop the loop thread."""
        if self._closed:
            return
        self._closed = True
        if self._client is not None:
            try:
                self._runner.run(self._client.aclose(), self._connect + self._timeout)
            except Exception as exc:
                _log.debug("webhook target %s: closing: %s", self.name, exc)
        self._runner.stop()

    # -- one call ------------------------------------------------------------------------

    def _results(self, outcomes: list[Outcome]) -> list[str | None]:
        """The call's results, or the endpoint found down (see the module docstring)."""
        lost = next((o for o in outcomes if o.unreachable), None)
        if lost is None:
            return [o.error for o in outcomes]
        done = [o.error is None for o in outcomes]
        if not any(done):
            raise TargetUnavailable(str(lost.error))
        raise TargetCallFailed(
            f"{lost.error} ({sum(done)} of {len(done)} events confirmed before)", confirmed=done
        )

    async def _publish(self, events: Sequence[OutboxEvent], runs: list[list[int]]) -> list[Outcome]:
        client = self._http()
        fixed = self._headers()
        outcomes: list[Outcome] = [CONFIRMED] * len(events)
        down: set[str] = set()  # endpoints that did not answer in this call

        async def chain(run: list[int]) -> None:
            for position, index in enumerate(run):
                outcome = await self._deliver(client, fixed, events[index], down)
                outcomes[index] = outcome
                if outcome.error is not None:
                    for later in run[position + 1 :]:
                        outcomes[later] = Outcome(not_sent(events[index]), outcome.unreachable)
                    return

        await asyncio.gather(*(chain(run) for run in runs))
        return outcomes

    async def _deliver(
        self, client: httpx.AsyncClient, fixed: dict[str, str], event: OutboxEvent, down: set[str]
    ) -> Outcome:
        """POST one event until it is answered for good (retries included)."""
        import httpx

        try:
            url = self._template.render(event)
        except RenderError as exc:
            return Outcome(self._no_url(event, exc))
        try:
            request = cloudevent_request(event, self.config.mode, self.config.source)
        except ValueError as exc:  # an envelope whose data_base64 is not base64
            return Outcome(self._error(url, f"not a CloudEvent that can be sent: {exc}"))
        if (too_large := self._oversize(url, request)) is not None:
            return Outcome(too_large)
        headers = {**request.headers, **fixed, self.config.idempotency_header: event.event_id}
        endpoint = _endpoint(url)
        limit = self._limit(endpoint)
        tries = 0
        while True:
            if endpoint in down:
                return Outcome(self._error(url, "not sent: the endpoint did not answer"), True)
            tries += 1
            async with limit:
                try:
                    response = await client.post(url, content=request.body, headers=headers)
                except httpx.LocalProtocolError as exc:  # the request itself cannot be sent
                    return Outcome(self._error(url, _describe(exc)))
                except httpx.TransportError as exc:  # refused, timed out, connection lost
                    down.add(endpoint)
                    return Outcome(self._error(url, _describe(exc)), unreachable=True)
            status = response.status_code
            if confirmed(status):
                return CONFIRMED
            answer = f"answered {status} {response.reason_phrase}".rstrip()
            if body := body_piece(response.text):
                answer = f"{answer}: {body}"
            if not retried(status):
                return Outcome(self._error(url, f"refused: {answer}"))
            asked = retry_after(response.headers.get("Retry-After"))
            wait = max(self._backoff * 2 ** (tries - 1), asked or 0.0)
            if tries > self.config.retries:
                return Outcome(self._error(url, f"{answer} (tried {tries} times)"))
            if wait > self._max_wait:
                return Outcome(
                    self._error(
                        url,
                        f"{answer}, and asked to retry after {wait:g}s, over max_retry_after "
                        f"({self._max_wait:g}s)",
                    )
                )
            await asyncio.sleep(wait)

    def _oversize(self, url: str, request: Request) -> str | None:
        limit = self.config.max_body_bytes
        if limit is None or len(request.body) <= limit:
            return None
        return self._error(
            url, f"the body would be {len(request.body)} bytes, over max_body_bytes ({limit})"
        )

    def _error(self, url: str, cause: str) -> str:
        return f"webhook target {self.name!r}: POST {url}: {cause}"

    def _no_url(self, event: OutboxEvent, exc: RenderError) -> str:
        return (
            f"webhook target {self.name!r}: no URL for event {event.event_id} "
            f"(seq {event.seq}): {exc}"
        )

    # -- the client ----------------------------------------------------------------------

    def _limit(self, endpoint: str) -> asyncio.Semaphore:
        limit = self._limits.get(endpoint)
        if limit is None:
            if len(self._limits) >= _ENDPOINTS_KEPT:
                self._limits.clear()  # only limits nothing waits on go with their calls' ends
            limit = self._limits[endpoint] = asyncio.Semaphore(self.config.max_concurrency)
        return limit

    def _headers(self) -> dict[str, str]:
        """The fixed and auth headers, the latter read from the environment once; a variable
        that is not set makes the target unavailable (the events wait, uncharged, with the
        reason naming the header and the variable) until the relay runs with it."""
        if self._fixed is None:
            try:
                auth = self.config.auth_headers(f"targets.{self.name}")
            except ConfigError as exc:
                raise TargetUnavailable(f"webhook target {self.name!r}: {exc}") from None
            self._fixed = {**self.config.headers, **auth}
        return self._fixed

    def _http(self) -> httpx.AsyncClient:
        """The client, made on the loop on first use."""
        if self._client is None:
            import httpx

            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self._timeout, connect=self._connect, pool=None),
                limits=httpx.Limits(
                    max_connections=None,  # the per-endpoint limits bound them
                    max_keepalive_connections=4 * self.config.max_concurrency,
                ),
                verify=self._verify(),
                follow_redirects=False,
            )
        return self._client

    def _verify(self) -> ssl.SSLContext | bool:
        tls = self.config.tls
        if tls is None:
            return True
        if not tls.verify:
            _log.warning(
                "webhook target %s: tls.verify is false: the endpoint is not authenticated",
                self.name,
            )
        try:
            return tls.context()
        except TlsError as exc:
            raise TargetUnavailable(
                f"webhook target {self.name!r}: cannot load the TLS files: {exc}"
            ) from None


def _key_runs(events: Sequence[OutboxEvent]) -> list[list[int]]:
    """The indexes of ``events`` per ordering key, each run in call order."""
    runs: dict[str, list[int]] = {}
    for index, event in enumerate(events):
        runs.setdefault(event.ordering_key, []).append(index)
    return list(runs.values())


def _endpoint(url: str) -> str:
    """What a concurrency limit is kept per: the URL's scheme, host and port."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _describe(exc: BaseException) -> str:
    """Name the exception type too: httpx's timeouts often have no text."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
