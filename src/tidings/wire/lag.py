"""When a peer that lags behind what it was sent counts as too slow: the servers' one rule.

The Eventer drops a slow subscriber and the Syncer a slow client by this rule, through
:meth:`tidings.wire.chatter.Connection.lagging`, so that a server's memory stays bounded
whatever its peers read, while a burst that a peer does read never drops it.
"""

from __future__ import annotations

import time


class LagWatch:
    """One connection's lag over time: since when (and with how much taken) it is over."""

    __slots__ = ("_over_since",)

    def __init__(self) -> None:
        #: Since when (and with how many bytes taken) more than the limit waits unsent.
        self._over_since: tuple[float, int] | None = None

    def judge(self, unsent: int, written: int, limit: int, grace: float, name: str) -> str | None:
        """Why the peer counts as too slow to be sent more, or None while it keeps up.

        ``unsent`` of the ``written`` bytes wait for the peer. Unsent bytes over ``limit``
        alone are not enough: a burst (a big reply and its notification) briefly exceeds any
        bound while the peer reads it. The peer is too slow once over ``limit`` it has taken
        nothing for ``grace`` seconds, or once over four times ``limit`` (the hard bound on
        what it may cost). ``name`` names the limit in the reason.
        """
        if unsent <= limit:
            self._over_since = None
            return None
        if unsent > 4 * limit:
            return f"{unsent} bytes unsent, over 4 x {name}={limit}"
        taken = written - unsent
        now = time.monotonic()
        if self._over_since is None or taken > self._over_since[1]:
            self._over_since = (now, taken)
            return None
        if now - self._over_since[0] > grace:
            return f"{unsent} bytes unsent, over {name}={limit}, and nothing taken for {grace:g} s"
        return None
