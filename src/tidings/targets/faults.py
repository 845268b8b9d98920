"""Fault injection for targets, for the demo and the failure tests.

A real target cannot be made to fail on cue for exactly N calls, so a target can be given a
``fault_file``. While the file holds ``down``, every publish fails; while it holds a number
N > 0, the next N publish calls fail and the number counts down (across processes: the file
is locked while it is updated). No file, or 0: the target works normally. This is the only
place tidings fakes a failure, and it is named for what it is.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tidings.events.outbox import OutboxEvent
from tidings.targets.base import Target

if TYPE_CHECKING:
    from tidings.outbox.confirmations import ConfirmationLog


def _take_fault(path: Path) -> bool:
    """Consume one injected failure; True if this call must fail."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False
    with os.fdopen(fd, "r+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        text = handle.read().strip()
        if text == "down":
            return True
        remaining = int(text or 0)
        if remaining <= 0:
            return False
        handle.seek(0)
        handle.truncate()
        handle.write(str(remaining - 1))
        return True


class FaultInjectingTarget(Target):
    """Wraps a real target and fails on cue, as the fault file says."""

    def __init__(self, inner: Target, fault_file: str) -> None:
        super().__init__(inner.name)
        self.inner = inner
        self.atomic = inner.atomic
        self.events_per_key = inner.events_per_key
        self.fault_file = Path(fault_file)

    def publish(self, events: Sequence[OutboxEvent]) -> list[str | None]:
        if _take_fault(self.fault_file):
            return [f"target {self.name!r}: injected failure ({self.fault_file})"] * len(events)
        return self.inner.publish(events)

    def refusal(self, event: OutboxEvent) -> str | None:
        return self.inner.refusal(event)

    def attach_log(self, log: ConfirmationLog) -> None:
        self.inner.attach_log(log)

    def close(self) -> None:
        self.inner.close()
