"""What every listening port of tidings lets in before a server sees a byte: the
``max_connections_per_address`` and ``tls_handshake_timeout`` keys, one shape shared by the
Eventer's and the Syncer's sections, each stream and the intermediary's ``limits:``, so an
operator writes the same two keys everywhere (enforced by :mod:`tidings.accept`).

Kept in a module of its own so a part's section reuses it without importing another part's.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from pydantic import Field

from tidings.accept import DEFAULT_MAX_PER_ADDRESS, DEFAULT_TLS_HANDSHAKE_TIMEOUT, AcceptRules
from tidings.config.model import ZERO, Duration, StrictModel, parsed_durations, within

#: The longest TLS handshake timeout accepted (a longer one is a typo, and a gift to a flood).
_LONGEST = timedelta(minutes=5)


class ListenerLimitsConfig(StrictModel):
    """Bounds at a listening port's TCP accept (a section inherits these keys)."""

    max_connections_per_address: int | None = Field(
        default=DEFAULT_MAX_PER_ADDRESS,
        gt=0,
        le=1_000_000,
        description=(
            "Connections at once from one client address, counted from the TCP accept (before "
            "any TLS byte or credential); one more is closed at once and counted as "
            "``too_many_from_address``. Loopback is not exempt. Behind a proxy every client "
            "has the proxy's address: raise it there. null: no bound."
        ),
    )
    tls_handshake_timeout: Annotated[Duration, within(ZERO, _LONGEST)] = Field(
        default=timedelta(seconds=DEFAULT_TLS_HANDSHAKE_TIMEOUT),
        description=(
            "Over TLS: how long a new connection may stay silent (it is held as a bare socket "
            "until its first byte, no TLS state), and then how long its TLS handshake may "
            "take. A connection over either is closed and counted as refused."
        ),
    )

    _listener_durations = parsed_durations("tls_handshake_timeout")

    def accept_rules(self, tls: bool) -> AcceptRules:
        """The rules of a listener with these limits (``tls``: the port serves TLS)."""
        return AcceptRules(
            max_per_address=self.max_connections_per_address,
            first_byte_timeout=self.tls_handshake_timeout.total_seconds() if tls else None,
        )


def limits_of(limits: ListenerLimitsConfig | None) -> ListenerLimitsConfig:
    """``limits``, or the defaults when none are given."""
    return limits if limits is not None else _DEFAULTS


_DEFAULTS = ListenerLimitsConfig()
