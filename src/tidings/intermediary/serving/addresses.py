"""Limits per client address at an intermediary's WebSocket (issue 30): how many connections
one address may hold, and a throttle on the logins it fails.

The global ``max_connections`` keeps a server alive, but lets one client take every seat;
:class:`AddressSlots` bounds the connections of each address, counted from the start of the
handshake (so one address cannot queue more password checks than it has seats either), and
checked before any credential. :class:`LoginThrottle` counts the credentials an address
presented and had refused; past ``max_failures`` within ``window_s`` the address is refused
for ``block_s`` before its credentials are looked at: a flood of wrong passwords then costs
a dictionary lookup each, not ~50 ms of scrypt, and the cores stay with the subscribers who
know theirs. A known subscriber behind the same address (a NAT, a proxy) is refused too while
it lasts: the price of not hashing for anyone there.

Both are bounded in memory whatever the addresses: an address leaves :class:`AddressSlots`
with its last connection, and :class:`LoginThrottle` keeps at most :data:`MAX_TRACKED`
addresses (those whose window and block are over go first, then the oldest), so a client
with many addresses can at worst make the throttle forget, never grow.

Addresses are the peer's IP as the socket says (no proxy headers are trusted), ``None`` for
one the server could not tell (counted as one address).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

#: Addresses the throttle remembers at most.
MAX_TRACKED = 100_000


class AddressSlots:
    """Connections held per address, at most ``limit`` each (None: no limit)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self._held: dict[str | None, int] = {}

    def take(self, address: str | None) -> bool:
        """Take a seat for ``address``; False (nothing taken) if it holds ``limit`` already."""
        held = self._held.get(address, 0)
        if self.limit is not None and held >= self.limit:
            return False
        self._held[address] = held + 1
        return True

    def give_back(self, address: str | None) -> None:
        """Free a seat :meth:`take` gave ``address``."""
        held = self._held.get(address, 0) - 1
        if held > 0:
            self._held[address] = held
        else:
            self._held.pop(address, None)

    def held(self, address: str | None) -> int:
        return self._held.get(address, 0)

    def refusal(self, address: str | None) -> str:
        """The close reason of a connection refused by :meth:`take`."""
        return f"too many connections from {address or 'your address'} (at most {self.limit})"


@dataclass
class _Failures:
    times: deque[float] = field(default_factory=deque)
    blocked_until: float = 0.0


class LoginThrottle:
    """Refused logins per address; an address past ``max_failures`` within ``window_s`` is
    refused for ``block_s`` (see the module docstring)."""

    def __init__(
        self,
        max_failures: int,
        window_s: float,
        block_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_tracked: int = MAX_TRACKED,
    ) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self.block_s = block_s
        self.clock = clock
        self.max_tracked = max_tracked
        self._by_address: dict[str | None, _Failures] = {}
        #: Addresses blocked, since the start (each block counted once).
        self.blocks = 0

    def blocked(self, address: str | None) -> float | None:
        """Seconds ``address`` is still refused for, or None if it may try."""
        failures = self._by_address.get(address)
        if failures is None:
            return None
        left = failures.blocked_until - self.clock()
        return left if left > 0 else None

    def failed(self, address: str | None) -> None:
        """``address`` presented credentials that were refused."""
        now = self.clock()
        failures = self._by_address.get(address)
        if failures is None:
            self._make_room(now)
            failures = self._by_address[address] = _Failures()
        times = failures.times
        times.append(now)
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if len(times) >= self.max_failures:
            times.clear()
            failures.blocked_until = now + self.block_s
            self.blocks += 1

    def _make_room(self, now: float) -> None:
        if len(self._by_address) < self.max_tracked:
            return
        for address, failures in list(self._by_address.items()):
            last = failures.times[-1] if failures.times else float("-inf")
            if failures.blocked_until <= now and last <= now - self.window_s:
                del self._by_address[address]
        # Down to nine tenths, the oldest first (dict order): the scan above then runs once
        # per tenth of the table at most, not once per new address.
        keep = self.max_tracked * 9 // 10
        while len(self._by_address) > keep:
            del self._by_address[next(iter(self._by_address))]

    def tracked(self) -> int:
        """Addresses remembered now."""
        return len(self._by_address)
