"""Destination templates: a target's subject or event type built from each event's fields.

Debezium's outbox router picks a topic per event with ``route.by.field`` and
``route.topic.replacement``; tidings does the same inside a target, so one route (or one
wildcard route) can fan 200 event types out to 200 subjects without listing them. A template
is text with placeholders::

    orders.{headers.aggregate_type}            (a JetStream subject)
    ["orders", "{payload.region}", "{event_type}"]   (an event-server type, per segment)

Placeholders: ``{event_type}``, ``{partition_key}``, ``{originator}``, ``{version}``,
``{correlation_id}``, ``{headers.NAME}`` (a custom header, exact name) and
``{payload.FIELD}`` (a field of the JSON payload as published: a string, a number or a
boolean; ``FIELD`` may be a dotted path into nested objects, as ``{payload.data.region}``
under the default CloudEvents envelope, where the service's own payload is ``data``).
``{{`` and ``}}`` write literal braces. Braces, not ``${...}``: a configuration file's
``${NAME}`` is an environment variable (:mod:`tidings.config`), replaced when the file is
read, and a template must reach the target as written.

A template is parsed when the configuration is validated, so an unknown placeholder is a
configuration error naming it. Rendering happens per event: a value that is missing, or
that the target's ``value_rule`` refuses (a NATS subject token cannot hold ``.``, ``*``,
``>`` or blanks), raises :class:`RenderError` naming the placeholder; the target turns it
into that event's error at that target, never the whole call's. The payload is parsed only
by templates that read it, once per event, and a template that reads nothing but the event
type caches its result per type.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tidings.events.outbox import OutboxEvent

#: Placeholders that read one attribute of the event (the name is the attribute).
EVENT_FIELDS = ("event_type", "partition_key", "originator", "version", "correlation_id")
_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
_QUALIFIED = re.compile(r"^(headers|payload)\.(.+)$")
#: How many event types' renderings a template that reads only the type keeps.
_CACHE_LIMIT = 10_000

#: Why a placeholder's value cannot be used (None if it can); targets pass their own.
ValueRule = Callable[[str], str | None]


class RenderError(ValueError):
    """One event's destination cannot be built; the message names the placeholder."""


@dataclass(frozen=True, slots=True)
class _Field:
    """One placeholder: ``source`` is "event", "headers" or "payload"; ``name`` what in it."""

    source: str
    name: str

    @property
    def text(self) -> str:
        return f"{{{self.name}}}" if self.source == "event" else f"{{{self.source}.{self.name}}}"


def _placeholder(name: str) -> _Field:
    name = name.strip()
    if name in EVENT_FIELDS:
        return _Field("event", name)
    if (m := _QUALIFIED.match(name)) and not (m.group(1) == "payload" and "" in m[2].split(".")):
        return _Field(m.group(1), m.group(2))
    raise ValueError(
        f"unknown placeholder {{{name}}} (use {{{'}, {'.join(EVENT_FIELDS)}}}, "
        "{headers.NAME} or {payload.FIELD})"
    )


class DestinationTemplate:
    """A parsed template; :meth:`render` builds one event's destination from it."""

    def __init__(self, text: str, value_rule: ValueRule) -> None:
        """Parse ``text``; ValueError (a configuration error) names a bad placeholder."""
        self.text = text
        self._rule = value_rule
        parts: list[str | _Field] = []
        end = 0
        for m in _PLACEHOLDER.finditer(text):
            parts.append(text[end : m.start()])
            token = m.group(0)
            if token in ("{{", "}}"):
                parts.append(token[0])
            elif m.group(1) is None:
                raise ValueError(
                    f"unterminated placeholder in {text!r} (write {{NAME}}; {{{{ and }}}} "
                    "are literal braces)"
                )
            else:
                parts.append(_placeholder(m.group(1)))
            end = m.end()
        parts.append(text[end:])
        self._parts = tuple(p for p in parts if p != "")
        self.fields = tuple(p for p in self._parts if isinstance(p, _Field))
        self._reads_payload = any(f.source == "payload" for f in self.fields)
        self._by_type_only = all(f == _Field("event", "event_type") for f in self.fields)
        self._cache: dict[str, str | RenderError] = {}

    def literal_shape(self, placeholder: str) -> str:
        """The template with every placeholder replaced by ``placeholder`` (for checks made
        at configuration time, e.g. which NATS subjects it can produce)."""
        return "".join(p if isinstance(p, str) else placeholder for p in self._parts)

    def render(self, event: OutboxEvent) -> str:
        """``event``'s destination; RenderError names the placeholder that cannot be filled."""
        if not self._by_type_only:
            return self._render(event)
        found = self._cache.get(event.event_type)
        if found is None:
            try:
                found = self._render(event)
            except RenderError as exc:
                found = exc
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[event.event_type] = found
        if isinstance(found, RenderError):
            raise RenderError(str(found))
        return found

    def _render(self, event: OutboxEvent) -> str:
        payload = _payload_object(event) if self._reads_payload else None
        out: list[str] = []
        for part in self._parts:
            if isinstance(part, str):
                out.append(part)
                continue
            value = _value(part, event, payload)
            if isinstance(value, _Missing):
                raise RenderError(f"placeholder {part.text} of {self.text!r}: {value.why}")
            if (why := self._rule(value)) is not None:
                raise RenderError(f"placeholder {part.text} of {self.text!r} is {value!r}: {why}")
            out.append(value)
        return "".join(out)


@dataclass(frozen=True, slots=True)
class _Missing:
    why: str


def _payload_object(event: OutboxEvent) -> dict[str, Any] | _Missing:
    try:
        value = json.loads(event.payload)
    except ValueError:
        return _Missing("the payload is not JSON")
    if not isinstance(value, dict):
        return _Missing(f"the payload is a JSON {type(value).__name__}, not an object")
    return value


def _value(field: _Field, event: OutboxEvent, payload: dict[str, Any] | _Missing | None) -> Any:
    if field.source == "event":
        value = getattr(event, field.name)
        return _Missing(f"the event has no {field.name}") if value is None else value
    if field.source == "headers":
        value = event.headers.get(field.name)
        return _Missing(f"the event has no header {field.name!r}") if value is None else value
    assert payload is not None
    if isinstance(payload, _Missing):
        return payload
    value = payload
    for step in field.name.split("."):
        value = value.get(step) if isinstance(value, dict) else None
    if value is None:
        return _Missing(f"the payload has no field {field.name!r} (or it is null)")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    if not isinstance(value, str):
        return _Missing(f"payload field {field.name!r} is a JSON {type(value).__name__}")
    return value
