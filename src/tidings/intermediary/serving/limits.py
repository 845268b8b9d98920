"""The bounds of an intermediary's server, per server, per address and per connection
(:mod:`.transport` enforces them; ``tidings intermediary serve`` fills them from its
``limits:`` section, :class:`tidings.config.IntermediaryLimitsConfig`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TransportLimits:
    """Bounds per server, per client address and per connection."""

    max_message_bytes: int = 64 * 1024
    #: Requests (subscribe/unsubscribe) per connection: a bucket of ``burst`` refilled at
    #: ``requests_per_s``.
    requests_per_s: float = 20.0
    burst: int = 40
    max_connections: int = 10_000
    #: Connections at once from one client address, handshakes under way included (None:
    #: no bound but ``max_connections``; :mod:`.addresses`).
    max_connections_per_address: int | None = None
    close_timeout_s: float = 10.0
    #: Over TLS: how long a new connection may stay silent (held as a bare socket), and then
    #: take for its TLS handshake (:mod:`tidings.accept`).
    tls_handshake_timeout_s: float = 10.0
    #: SO_SNDBUF of accepted connections (None: the kernel's default and autotuning).
    send_buffer_bytes: int | None = None
    #: Event and status messages the one ring every connection reads holds from earlier
    #: ticks (:mod:`.ring`); past this the oldest are dropped, and a subscriber that lost one
    #: of its own is too slow and is closed.
    max_queued_messages: int = 10_000
    #: The ring's bytes, bounded the same way (None: no bound in bytes).
    max_queued_bytes: int | None = 16 * 1024 * 1024
