"""Which server of a redundant event-server group the ``event_server`` target talks to.

A group is given either as an ordered list of Eventer addresses or as a Hat Monitor Server
and the group its event servers join. With a list, a connection is tried on each address in
its order, and the first that accepts is used until its connection breaks; servers that do
not serve clients (a ``BLESS_ONE`` standby keeps its Eventer closed) simply refuse. With a
Monitor, the target joins the Monitor as a Component (as hat-event 0.8.5's
``hat.event.eventer.client.Component`` does, through the same hat-monitor 0.7.2 client) and
connects to the ``eventer_server_address`` of the servers of the group whose blessing is
given and accepted: the blessed server with ``BLESS_ONE``, any with ``BLESS_ALL``. It thus
follows the Monitor's choice, not a list of its own.

While no server accepts, connecting goes round the candidates again for a short while (a
server that just died leaves the Monitor a moment to bless another, which then opens its
Eventer); after that the target counts as down (:class:`~tidings.errors.TargetUnavailable`)
and the relay's circuit breaker holds its events and probes again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import Field

from tidings.address import MonitorAddress
from tidings.config.model import StrictModel
from tidings.config.tls import TlsClientConfig
from tidings.errors import ConnectionClosed, TargetUnavailable

if TYPE_CHECKING:  # the client (and the wire) load where a connection is made
    from tidings.client import Client

log = logging.getLogger(__name__)

#: Longest wait for one address to accept a connection: an address that swallows packets
#: must not use up the whole wait while the next one would answer at once.
CONNECT_ATTEMPT_S = 1.0
#: Pause between two rounds of the candidates while none accepts.
ROUND_PAUSE_S = 0.2


class MonitorDiscoveryConfig(StrictModel):
    """Find the event server through a Hat Monitor Server, as hat-event 0.8.5 clients do:
    the target is a Monitor Component (``name`` in ``group``) and connects to a blessed
    event server of ``server_group``."""

    monitor_address: MonitorAddress = Field(
        description="The local Monitor Server to connect to (``tcp+sbs://``)."
    )
    server_group: str = Field(
        min_length=1,
        description="The Monitor group of the event servers (their ``monitor.group``).",
    )
    name: str = Field(
        default="tidings-relay",
        min_length=1,
        description="The target's own Monitor Component name.",
    )
    group: str = Field(
        default="tidings-relay",
        min_length=1,
        description="The target's own Monitor group (not the event servers' group).",
    )


def blessed_addresses(components: Iterable[Any], server_group: str) -> list[str]:
    """The Eventer addresses of the servers of ``server_group`` that serve clients, in the
    Monitor's order: hat-event 0.8.5's rule (the blessing requested is the one accepted)."""
    addresses = []
    for info in components:
        if info.group != server_group:
            continue
        token = info.blessing_req.token
        if token is None or token != info.blessing_res.token:
            continue
        address = info.data.get("eventer_server_address") if isinstance(info.data, dict) else None
        if isinstance(address, str) and address not in addresses:
            addresses.append(address)
    return addresses


class ServerGroup:
    """The servers one target may publish to; :meth:`connect` finds one that accepts.

    It lives on the target's event loop; the Monitor connection (Monitor mode) is made on
    first use and again after it is lost.
    """

    def __init__(
        self,
        who: str,
        addresses: Sequence[str],
        monitor: MonitorDiscoveryConfig | None,
        tls: TlsClientConfig | None = None,
    ) -> None:
        self._who = who
        self._addresses = list(addresses)
        self._monitor = monitor
        #: How servers at ``ssl+sbs://`` addresses are verified (None: the system's CAs).
        self._tls = tls
        self._monitor_client: Any = None

    def describe(self) -> str:
        """The group as an operator configured it, for errors and logs."""
        if self._monitor is not None:
            return (
                f"group {self._monitor.server_group!r} of the Monitor at "
                f"{self._monitor.monitor_address}"
            )
        return ", ".join(self._addresses)

    async def connect(self, wait: float, lost: str | None = None) -> tuple[Client, str]:
        """A connection to a server of the group and its address; TargetUnavailable if none
        accepted within ``wait`` seconds.

        ``lost`` is the server whose connection was just lost: it is tried last, since a
        killed server's listening socket may still take a connection for an instant.
        """
        from tidings.client import connect

        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        errors: dict[str, str] = {}
        while True:
            candidates = await self._candidates(errors)
            candidates.sort(key=lambda address: address == lost)  # stable: order kept
            for address in candidates:
                remaining = deadline - loop.time()
                try:
                    client = await connect(
                        address,
                        tls=self._tls,
                        timeout=max(0.05, min(CONNECT_ATTEMPT_S, remaining)),
                    )
                except (OSError, TimeoutError, ConnectionClosed) as exc:
                    errors[address] = f"{type(exc).__name__}: {exc}"
                    continue
                return client, address
            remaining = deadline - loop.time()
            if remaining <= 0:
                why = "; ".join(f"{where}: {error}" for where, error in errors.items())
                raise TargetUnavailable(
                    f"{self._who}: no server of {self.describe()} accepts a connection"
                    f" ({why or 'none is known'})"
                )
            await asyncio.sleep(min(ROUND_PAUSE_S, remaining))

    async def aclose(self) -> None:
        client, self._monitor_client = self._monitor_client, None
        if client is not None:
            await client.async_close()

    async def _candidates(self, errors: dict[str, str]) -> list[str]:
        """The addresses to try now, in order (an error is noted under the Monitor's address
        when it cannot be reached)."""
        if self._monitor is None:
            return list(self._addresses)
        import hat.monitor.client  # only targets configured with a Monitor load it

        where = self._monitor.monitor_address
        if self._monitor_client is None or self._monitor_client.is_closing:
            conf = {"name": self._monitor.name, "group": self._monitor.group}
            try:
                async with asyncio.timeout(CONNECT_ATTEMPT_S):
                    self._monitor_client = await hat.monitor.client.connect(
                        {**conf, "monitor_address": where}
                    )
            except (OSError, TimeoutError, ConnectionError) as exc:
                self._monitor_client = None
                errors[f"Monitor {where}"] = f"{type(exc).__name__}: {exc}"
                return []
            log.info("joined the Monitor at %s to follow %s", where, self.describe())
        found = blessed_addresses(self._monitor_client.components or [], self._monitor.server_group)
        if not found:
            errors[f"Monitor {where}"] = "names no blessed server of the group"
        return found
