"""The interface every target implements.

A target is a place the relay publishes to: the embedded event store, a JetStream stream,
any other real broker. It is deliberately small so that adding one is one module: that
module defines the configuration model of its kind and a :class:`Target` subclass naming it
as ``config_model``, and :mod:`tidings.targets.registry` finds both.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from tidings.config import TargetConfig
from tidings.events.outbox import OutboxEvent

if TYPE_CHECKING:  # the database layer loads only where a log is attached
    from tidings.outbox.confirmations import ConfirmationLog


class Target(ABC):
    """Publishes outbox events somewhere and says, per event, whether it was confirmed.

    ``atomic`` targets confirm or refuse a whole call at once (one database transaction);
    the relay may then hand them several events of the same partition key in one call,
    in log order. A target that sends a key's events one after another itself, each only
    once the one before it is confirmed and none after one failed (those it answers with an
    error that is not charged: the first failed event is the one blamed), says so with
    ``events_per_key`` above 1: it is given up to that many of a key's events per call, in
    log order. Other targets are never given two events of the same key in one call, so
    that a failure cannot let a later event of that key overtake an earlier one.
    Targets must deduplicate by ``event_id`` where they can: a batch interrupted by a crash
    is published again.

    How a call reports failure tells the relay whom to blame:

    * an error string in the result: that event failed on its own (it is retried and
      charged a retry);
    * :class:`~tidings.errors.TargetUnavailable` raised: nothing was sent, the target is
      down; no event is charged and the relay's circuit breaker opens;
    * :class:`~tidings.errors.TargetCallFailed` (or any other exception) raised: the call
      failed as a whole and any of its events may be the cause; the relay splits the call
      until the failing event is alone.
    """

    atomic: bool = False
    events_per_key: int = 1
    #: The configuration model of this kind (its ``kind: Literal[...]`` names the kind). A
    #: target module's class sets it and is built as ``cls(name, config)``; a wrapper (fault
    #: injection, a test's stand-in) leaves it None and is no kind of its own.
    config_model: ClassVar[type[TargetConfig] | None] = None

    def __init__(self, name: str) -> None:
        self.name = name

    @abstractmethod
    def publish(self, events: Sequence[OutboxEvent]) -> list[str | None]:
        """Publish ``events``; return one entry per event: ``None`` if confirmed, else the error."""

    def refusal(self, event: OutboxEvent) -> str | None:
        """Why this target will always refuse ``event`` (e.g. too large), or None.

        The producer asks it at emit time for every target the event's type routes to, and
        the relay before sending, so an event that can never be delivered fails alone with
        this reason instead of failing the calls it shares with others. It must be cheap
        and must not raise; a target that cannot know yet answers None.
        """
        return None

    def attach_log(self, log: ConfirmationLog) -> None:  # noqa: B027 - optional hook
        """The outbox log in which the relay records this target's confirmations, given by
        the relay's and the replay's tasks before they publish (again for every task: the
        target is shared by the tasks of its process). A target that must know what was
        confirmed before by other processes (the ``event_server`` target, to send it again
        after a move) reads it there; most targets need nothing of it."""

    def close(self) -> None:  # noqa: B027 - optional hook, most targets hold nothing
        """Release connections; the target is not used afterwards."""
