"""Whether an upstream is stale, with every change kept until the server has told its
subscribers: :class:`Staleness`.

Why a log of changes and not a flag: the serving loop asks each upstream once a tick (20 ms
by default) and tells subscribers when the answer changed. A loss ridden out between two
asks (the redundant peer answered at once) read fresh at both, so subscribers were told
neither that the upstream was lost nor that it was back, although what it sent meanwhile
came late. With the changes kept, every loss is announced, then its end, in order.
"""

from __future__ import annotations

from collections import deque

#: Changes kept unread at most: a holder that never reads them (an upstream used without a
#: server) must not grow; the oldest are dropped, the newest (the state now) are kept.
_MAX_UNREAD = 64


class Staleness:
    """An upstream's staleness: :attr:`why` it is stale now (None: fresh), and the changes
    since the last :meth:`changes`. Starts at ``why`` (not a change: the server that reads
    first compares it with what it told)."""

    __slots__ = ("_changes", "why")

    def __init__(self, why: str | None) -> None:
        #: Why the upstream is stale (None while connected and in sync).
        self.why = why
        self._changes: deque[str | None] = deque(maxlen=_MAX_UNREAD)

    def lost(self, why: str) -> None:
        """The upstream is stale from now, because of ``why``."""
        self.why = why
        self._changes.append(why)

    def fresh(self) -> None:
        """The upstream is back and caught up."""
        self.why = None
        self._changes.append(None)

    def changes(self) -> list[str | None]:
        """Every state taken since the last call, oldest first (the last is :attr:`why`), or
        ``[why]`` when there was no change: what a reader compares with what it told."""
        if not self._changes:
            return [self.why]
        taken = list(self._changes)
        self._changes.clear()
        return taken
