"""What the Eventer server counts as it serves, kept apart from it because it outlives it.

A server in a Monitor group opens a new Eventer server each time it is blessed, and its
metrics (:mod:`tidings.server.metrics`) report what all of them served: the runner keeps one
:class:`EventerCounters` and hands it to each.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EventerCounters:
    """What the Eventer server counts as it serves (plain ints: increments on the loop)."""

    register_requests: int = 0
    queries: int = 0
    notifications: int = 0
    #: TLS handshakes refused (each logged by :mod:`tidings.wire.chatter_server`), silent
    #: connections to a TLS port included.
    refused_handshakes: int = 0
    #: Connections closed at accept: their address held ``max_connections_per_address``.
    refused_connections: int = 0
    #: Connections refused for who they are (an unknown certificate identity, an anonymous
    #: client where anonymous ones are not served), and logins refused.
    refused_clients: int = 0
    refused_logins: int = 0
    #: Events not registered, queries and subscriptions narrowed or refused, by grant
    #: (:mod:`tidings.server.eventer.access`).
    refused_events: int = 0
    refused_queries: int = 0
    refused_subscriptions: int = 0
