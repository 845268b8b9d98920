"""Redundancy through a Hat Monitor Server, as hat-event 0.8.5 does it (``monitor:``).

The server joins the Monitor as a Component through the real ``hat-monitor`` client library
(the version hat-event 0.8.5 depends on): it publishes the component data hat-event publishes
(``server_id``, ``eventer_server_address``, ``syncer_server_address``, ``syncer_token``),
follows the Monitor's global state and keeps one Syncer client per peer: a component of the
same group, not itself, whose data names a server id and a Syncer address and whose token
matches ours (hat-event's rule: with no token of ours, any peer). Peers are connected as they
appear, reconnected when their address changes and disconnected when they leave the state
(hat-event 0.8.5 keeps retrying a gone peer forever; a gone peer here costs nothing).

The Monitor also decides when this server serves clients. As in hat-event, the engine's
STARTED event, the Eventer server and what is attached to it run only while the Monitor
blesses the component (``BLESS_ALL``: always; ``BLESS_ONE``: the one chosen server of the
group); a server without the blessing keeps its store, its Syncer server and its Syncer
clients, so it stays in sync and takes over with everything. A lost Monitor connection ends
the server, as it ends hat-event's: a supervisor starts it again, and no two servers of a
``BLESS_ONE`` group ever serve at once because one lost sight of the Monitor.

Component data comes over the network from other servers: a peer entry that is not what
hat-event publishes is ignored with a warning, once, and harms nothing else.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from tidings.address import parse_address
from tidings.config.server import ServerConfig
from tidings.errors import ConfigError, ConnectionClosed
from tidings.server.async_engine import AsyncEngine
from tidings.server.syncer.client import SyncerClient

log = logging.getLogger(__name__)

#: The blessed part of a server: runs until cancelled, when the blessing goes.
ActiveRun = Callable[[], Awaitable[None]]


def component_data(config: ServerConfig) -> dict[str, Any]:
    """What the server publishes as its Monitor Component data (hat-event 0.8.5's keys)."""
    data: dict[str, Any] = {
        "server_id": config.engine.server_id,
        "eventer_server_address": config.eventer_server.address,
    }
    if config.syncer_server is not None:
        data["syncer_server_address"] = config.syncer_server.address
    if config.syncer_token is not None:
        data["syncer_token"] = config.syncer_token
    return data


def find_peers(
    components: Iterable[Any], own: Any, group: str, server_id: int, token: str | None
) -> tuple[dict[int, str], dict[Any, str]]:
    """The peers to sync with, ``{server id: Syncer address}``, among the Monitor's
    ``components`` (hat-monitor ``ComponentInfo``), and why each other group member is not
    one (``{(cid, mid): reason}``). ``own`` is this server's own component info."""
    peers: dict[int, str] = {}
    ignored: dict[Any, str] = {}
    for info in components:
        if info.group != group or info == own:
            continue
        data = info.data if isinstance(info.data, dict) else {}
        if "server_id" not in data or "syncer_server_address" not in data:
            continue  # not an event server with a Syncer server: nothing to sync from
        reason = _unfit(data, server_id, token)
        if reason is None:
            peers[data["server_id"]] = data["syncer_server_address"]
        else:
            ignored[(info.cid, info.mid)] = f"component {info.name!r}: {reason}"
    return peers, ignored


def _unfit(data: dict[str, Any], server_id: int, token: str | None) -> str | None:
    """Why a group member's data does not make it a peer, or None if it does."""
    peer_id = data["server_id"]
    if isinstance(peer_id, bool) or not isinstance(peer_id, int) or not 1 <= peer_id < 2**63:
        return f"server_id {peer_id!r} is not a positive 64-bit integer"
    if peer_id == server_id:
        return f"server_id {peer_id} is this server's own; every server needs its own id"
    try:
        parse_address(data["syncer_server_address"])
    except ConfigError as exc:
        return f"syncer_server_address: {exc}"
    if token is not None and data.get("syncer_token") != token:
        return "its syncer_token differs from ours (neither is shown)"
    return None


class MonitorLink:
    """This server's membership of a Monitor group: its Component, and its Syncer clients
    to the peers the global state names. Make it with :meth:`start`; :meth:`wait_lost`
    returns when the Monitor connection or the Component ends."""

    def __init__(self, config: ServerConfig, engine: AsyncEngine, client: Any) -> None:
        assert config.monitor is not None
        self._config = config
        self._engine = engine
        self._client = client
        self._component: Any = None
        self.peers: dict[int, SyncerClient] = {}
        self._changed = asyncio.Event()
        self._warned: dict[Any, str] = {}
        self._follower: asyncio.Task[None] | None = None
        self._unregister: Any = None
        #: Why the blessed part ended on its own (it ends the server), if it did.
        self._failure: BaseException | None = None

    @classmethod
    async def start(
        cls, config: ServerConfig, engine: AsyncEngine, active: ActiveRun
    ) -> MonitorLink:
        """Connect to the Monitor, publish the component data, start following the peers
        and run ``active`` whenever the Monitor blesses this server."""
        import hat.monitor.client  # only servers configured with a Monitor load it

        assert config.monitor is not None
        address = config.monitor.monitor_address
        try:
            client = await hat.monitor.client.connect(
                config.monitor.model_dump(), component_data(config)
            )
        except (OSError, ConnectionError) as exc:
            raise ConnectionClosed(
                f"monitor: cannot connect to the Monitor Server at {address}: {exc}"
            ) from exc
        link = cls(config, engine, client)
        try:
            link._unregister = client.register_change_cb(link._changed.set)
            link._follower = asyncio.create_task(link._follow(), name="monitor peers")
            link._component = hat.monitor.client.Component(client, link._run_active, active)
            link._component.set_ready(True)
        except BaseException:
            await link.aclose()
            raise
        log.info(
            "joined monitor group %s as %s at %s",
            config.monitor.group,
            config.monitor.name,
            address,
            extra={"group": config.monitor.group, "component": config.monitor.name},
        )
        return link

    async def wait_lost(self) -> BaseException:
        """Wait until the Monitor connection or this server's Component ends; return why:
        the blessed part's own failure, or the lost connection."""
        waits = [
            asyncio.ensure_future(self._client.wait_closing()),
            asyncio.ensure_future(self._component.wait_closing()),
        ]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        if self._failure is not None:
            return self._failure
        assert self._config.monitor is not None
        return ConnectionClosed(
            f"monitor: the connection to the Monitor Server at "
            f"{self._config.monitor.monitor_address} ended"
        )

    async def aclose(self) -> None:
        """Leave the group: the blessed part stops, the Syncer clients disconnect."""
        if self._component is not None:
            await self._component.async_close()
        if self._unregister is not None:
            self._unregister.cancel()
        if self._follower is not None:
            self._follower.cancel()
            await asyncio.wait([self._follower])  # (see SyncerClient.aclose)
        for peer in list(self.peers.values()):
            await peer.aclose()
        self.peers.clear()
        await self._client.async_close()

    async def _run_active(self, component: Any, active: ActiveRun) -> None:
        """The Component's run callback: hat-monitor cancels it when the blessing goes, and
        closes the Component when it ends otherwise."""
        log.info("monitor blessed this server: serving clients")
        try:
            await active()
        except asyncio.CancelledError:
            log.info("no longer serving clients (the blessing went, or the server stops)")
            raise
        except Exception as exc:
            self._failure = exc
            raise

    async def _follow(self) -> None:
        """Keep one Syncer client per peer of the current global state."""
        self._changed.set()
        while True:
            await self._changed.wait()
            self._changed.clear()
            try:
                await self._reconcile()
            except Exception:
                log.exception("monitor: could not follow the peers; retrying on next change")

    async def _reconcile(self) -> None:
        monitor = self._config.monitor
        assert monitor is not None
        wanted, ignored = find_peers(
            self._client.components or [],
            self._client.info,
            monitor.group,
            self._config.engine.server_id,
            self._config.syncer_token,
        )
        for key, reason in ignored.items():
            if self._warned.get(key) != reason:
                log.warning("monitor: not syncing with %s", reason)
        self._warned = ignored
        for server_id, peer in list(self.peers.items()):
            if wanted.get(server_id) != peer.address:
                del self.peers[server_id]
                await peer.aclose()
                log.info("monitor: peer server %d left (%s)", server_id, peer.address)
        for server_id, address in wanted.items():
            if server_id not in self.peers:
                peer = SyncerClient(
                    address,
                    self._engine,
                    server_id,
                    client_name=str(self._config.engine.server_id),
                    tls=self._config.syncer_client.tls,
                )
                self.peers[server_id] = peer
                await peer.start()
                log.info("monitor: syncing with peer server %d at %s", server_id, address)
