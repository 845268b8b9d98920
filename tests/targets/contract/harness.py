"""What the contract suite needs to know of a target kind: a :class:`KindHarness` starts its
target against the real broker on this machine, reads back what the broker holds, makes an
event the broker (or the target) refuses, and breaks the connection.

A kind joins the suite with one subclass (a module of this folder) listed in
:data:`tests.targets.contract.conftest.KINDS`; every check of ``test_contract.py`` then runs
against it.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest

import tidings.targets.registry  # noqa: F401 - enters the target kinds into the config
from tests.targets.makers import target_config
from tidings.events.outbox import OutboxEvent
from tidings.targets.base import Target
from tidings.targets.registry import build_target

#: Every contract target's name, as its errors quote it.
NAME = "contract"


@dataclass(frozen=True)
class Delivered:
    """One message as the broker holds it (or the endpoint received it), in its order there:
    the event id, partition key, the ``n`` of the payload ``{"n": seq}``, the destination
    (stream, topic, routing key, subject, path) and the custom headers."""

    event_id: str
    key: str | None
    n: int
    destination: str
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Sized:
    """A target with a size limit, an event over it, and what its refusal must say.

    ``known_before_publish``: the target knows the limit before it first connects (from its
    configuration, or by asking the server); otherwise it learns it on connecting, and
    assumes the protocol's default before. ``delivered``: reads back what that broker
    holds (``None``: not read back)."""

    target: Target
    big: OutboxEvent
    fragments: list[str]
    known_before_publish: bool
    delivered: Any = None


@dataclass
class Outage:
    """A target on a private broker that a test may stop and start again under traffic:
    ``events`` to send, ``restart()`` stops the broker (its way: what it acknowledged must
    survive) and starts it again, ``delivered(ids)`` reads back what it holds (waiting, where
    messages are pushed, until every one of ``ids`` has arrived, or a while)."""

    target: Target
    events: int
    restart: Callable[[], None]
    delivered: Callable[[set[str]], list[Delivered]]


def payload_n(text: str | bytes) -> int:
    """The ``n`` of a payload: ``{"n": ...}`` as the tests send it, or the CloudEvents
    envelope an outbox wraps it in (``{"data": {"n": ...}}``)."""
    value = json.loads(text)
    return int(value["n"] if "n" in value else value["data"]["n"])


def config_entry(entry: dict[str, Any]) -> Any:
    """``entry`` validated as the configuration's target ``contract``."""
    return target_config(NAME, entry)


class KindHarness(ABC):
    """One target kind against its real broker, for one test; :meth:`close` undoes what
    :meth:`__init__` made (topics, queues, streams, subscribers, targets)."""

    kind: ClassVar[str]
    #: The markers of the servers it needs (``redis``, ``mqtt``, ...).
    marks: ClassVar[tuple[pytest.MarkDecorator, ...]] = ()
    #: The configuration key of the destination template, and what its errors call one.
    template_key: ClassVar[str]
    destination_word: ClassVar[str]
    #: A destination value the kind cannot take, and what the refusal says (None: any value).
    bad_value: ClassVar[tuple[str, str] | None] = None
    #: What an unreachable broker's TargetUnavailable says.
    unreachable_text: ClassVar[str] = "cannot connect"
    #: The thread a target runs its client in (None: the caller's).
    loop_thread: ClassVar[str | None] = None
    #: The fewest keys of a configuration entry besides ``kind``, and bad entries with what
    #: their ConfigError must say.
    minimal_entry: ClassVar[dict[str, Any]]
    bad_entries: ClassVar[list[tuple[dict[str, Any], str]]]
    #: The poison event's refusal is known at emit (the target refuses it, not the broker).
    poison_refused_at_emit: ClassVar[bool] = False
    #: It has :meth:`outage`: a private broker stopped and started under traffic.
    restartable: ClassVar[bool] = False

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        self.request = request
        self.tmp_path = tmp_path
        self._built: list[Target] = []

    # -- targets ------------------------------------------------------------------------

    @abstractmethod
    def settings(self) -> dict[str, Any]:
        """The entry of a target on the shared broker, every event to one destination."""

    def make(self, **overrides: Any) -> Target:
        """A target from the configuration (the registry builds it), closed by :meth:`close`."""
        entry = {"kind": self.kind, **self.settings(), **overrides}
        target = build_target(NAME, config_entry(entry))
        self._built.append(target)
        return target

    @classmethod
    def with_template(cls, template: str) -> dict[str, Any]:
        """The entry's keys that give its destinations by ``template``."""
        return {cls.template_key: template}

    @abstractmethod
    def template(self, *placeholders: str) -> str:
        """A destination template holding ``placeholders`` (one level each), under this
        test's own names."""

    @abstractmethod
    def destination(self, *values: str) -> str:
        """The destination :meth:`template` names for those placeholders' ``values``, as
        :meth:`delivered` reports it."""

    @abstractmethod
    def unreachable(self) -> dict[str, Any]:
        """Overrides that point a target at a port nothing listens on."""

    # -- refusals -----------------------------------------------------------------------

    @abstractmethod
    def poison(self, seq: int, key: str) -> tuple[OutboxEvent, str]:
        """An event of ``key`` the broker (or the target) refuses, and what its failure says."""

    @abstractmethod
    @contextmanager
    def sized(self) -> Iterator[Sized]:
        """A target with a size limit it checks at emit."""

    @contextmanager
    def outage(self) -> Iterator[Outage]:
        """A target on a private broker this test may restart (only if ``restartable``)."""
        raise NotImplementedError(f"the {self.kind} harness has no outage")
        yield  # pragma: no cover - a generator, for contextmanager

    # -- reading back ---------------------------------------------------------------------

    @abstractmethod
    def delivered(self, expect: int) -> list[Delivered]:
        """What the broker holds of this test's messages, in its order; where messages are
        pushed (MQTT), waits until ``expect`` have arrived (or a while)."""

    def close(self) -> None:
        for target in self._built:
            target.close()
