"""What an operator may do from the console, each through the code ``tidings events`` runs
(:class:`~tidings.outbox.incomplete.IncompleteEvents`) and each recorded in the audit trail.

The checks that an action is allowed (a logged-in operator, a confirmed form with its CSRF
token) are the pages' (:mod:`.app`); here is what the action does and what is recorded:
the user, the action, what it applied to, and its outcome (how many events changed, or the
error that stopped it).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from sqlalchemy import Engine

from tidings.config import TidingsConfig
from tidings.console.audit import AuditTrail
from tidings.console.routes import unroutable_matching
from tidings.errors import TidingsError
from tidings.events.outbox import EventStatus
from tidings.outbox.incomplete import EventFilter, IncompleteEvents
from tidings.routing.table import add_route
from tidings.streams.consumers.admin import open_store, unregister_named
from tidings.targets.routed import incomplete_events_from_config

#: The actions, by the name forms send, with what each says it does (the confirmation page).
ACTIONS: dict[str, str] = {
    "resubmit": "Resubmit: hand the event back to the relay (targets that confirmed it are "
    "not sent it again).",
    "park": "Park: set the event aside with a reason; the later events of its key flow on "
    "without it.",
    "unpark": "Unpark: resubmit the parked event; it reaches its targets after the events of "
    "its key that flowed meanwhile.",
    "redrive": "Re-drive: resubmit the UNROUTABLE events of this type (or prefix ending in "
    "*) to the routes now in force.",
    "unregister": "Unregister the consumer: forget its position, so that it no longer holds "
    "the stream's events back (it starts again from where it asks, if it comes back).",
    "route": "Add a route: send this type (or prefix ending in *) to the target from the "
    "relay's next micro-batch on (a row of the tidings_route table, as tidings routes add).",
}
#: What a single event's resubmit takes: the events the relay gave up on, and those it had
#: no route for.
_RESUBMITTABLE = frozenset({EventStatus.FAILED, EventStatus.UNROUTABLE})


class OutboxEvents:
    """The outbox's incomplete events (as ``tidings events`` sees them, with the routes in
    force), opened at first use: the console starts, and says what is wrong, while the
    outbox database is down. Blocking: call it from a worker thread."""

    def __init__(self, config: TidingsConfig, engine: Engine) -> None:
        self.config = config
        self.engine = engine
        self._events: IncompleteEvents | None = None
        self._lock = threading.Lock()

    def get(self) -> IncompleteEvents:
        with self._lock:
            if self._events is None:
                self._events = incomplete_events_from_config(self.config, self.engine)
            return self._events


@dataclass(frozen=True)
class Outcome:
    """What an action did, in a sentence for the page."""

    changed: int
    message: str


class Actions:
    """The actions on one outbox, recorded in one audit trail."""

    def __init__(self, outbox: OutboxEvents, audit: AuditTrail) -> None:
        self.outbox = outbox
        self.audit = audit

    def run(
        self, user: str, action: str, subject: str, reason: str = "", target: str = ""
    ) -> Outcome:
        """Do ``action`` on ``subject`` (an event id; for ``redrive`` and ``route`` an event
        type or prefix; ``route`` sends it to ``target``) for ``user``, and record it; a
        TidingsError (a bad subject, a park without a reason) is recorded too, and raised."""
        if action not in ACTIONS:
            raise TidingsError(f"unknown action {action!r} (actions: {', '.join(ACTIONS)})")
        on = {"route": f"{subject} -> {target}", "unregister": f"{subject} {target}"}.get(
            action, subject
        )
        try:
            outcome = self._do(action, subject, reason, target)
        except TidingsError as exc:
            self.audit.record(user, action, on, reason=reason, error=str(exc))
            raise
        self.audit.record(user, action, on, reason=reason, changed=outcome.changed)
        return outcome

    def _do(self, action: str, subject: str, reason: str, target: str) -> Outcome:
        if action == "route":
            return self._route(subject, target)
        if action == "unregister":
            return self._unregister(subject, target)
        events = self.outbox.get()
        if action == "redrive":
            where = EventFilter(
                statuses=frozenset({EventStatus.UNROUTABLE}), event_type=subject or None
            )
            count = events.resubmit(where)
            return Outcome(
                count, f"re-drove {count} UNROUTABLE event(s) of {subject or 'any type'}"
            )
        if action == "park":
            parked = events.park([subject], reason)
            if not parked:
                return Outcome(0, f"not parked: {subject} is not a PENDING, HELD or FAILED event")
            return Outcome(1, f"parked {subject}; the later events of its key flow on")
        if action == "unpark":
            count = events.unpark([subject])
            if not count:
                return Outcome(0, f"not unparked: {subject} is not a PARKED event")
            return Outcome(count, f"unparked and resubmitted {subject}")
        count = events.resubmit(EventFilter(statuses=_RESUBMITTABLE, event_ids=(subject,)))
        if not count:
            return Outcome(0, f"not resubmitted: {subject} is not a FAILED or UNROUTABLE event")
        return Outcome(count, f"resubmitted {subject}; the relay sends it in key order")

    def _route(self, key: str, target: str) -> Outcome:
        """``tidings routes add KEY TARGET``: the target must be one of the file's."""
        targets = self.outbox.config.targets
        if target not in targets:
            names = ", ".join(sorted(targets)) or "none"
            raise TidingsError(f"unknown target {target!r} (defined targets: {names})")
        add_route(self.outbox.engine, key, target)
        waiting = unroutable_matching(self.outbox.get(), key)
        return Outcome(
            1, f"{key} -> {target} added; {waiting} UNROUTABLE event(s) match it (re-drive them)"
        )

    def _unregister(self, where: str, user: str) -> Outcome:
        """``tidings streams unregister``: ``where`` is ``SERVER/STREAM/COMPONENT``."""
        server, _, rest = where.partition("/")
        stream, _, component = rest.partition("/")
        servers = self.outbox.config.servers
        if server not in servers:
            names = ", ".join(sorted(servers)) or "none"
            raise TidingsError(f"no server {server!r} in the configuration (servers: {names})")
        store = open_store(servers[server])
        try:
            if not unregister_named(servers[server], store, stream, user, component):
                return Outcome(0, f"no consumer {user}:{component} of stream {stream}")
        finally:
            store.close()
        return Outcome(1, f"{user}:{component} of {stream} unregistered")
