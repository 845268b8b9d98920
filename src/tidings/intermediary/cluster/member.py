"""One member of a cluster of intermediaries (claims 9, 11; [75],
[108]-[111], Fig. 9): an :class:`~.transport.IntermediaryServer` that knows which slots of
responsibility it owns (:mod:`.directory`, :mod:`.responsibility`), redirects a subscription
it is not responsible for, and hands subscriptions over to another member without losing or
duplicating their streams.

**Redirect, not proxy.** A subscribe request for a slot another member owns is answered
``{"op": "moved", "key", "to": <url>, "owner": <name>, "via": [<names>]}``; the cluster
client (:mod:`.handover`) follows it at once and subscribes there. Proxying would route every
frame of the subscription through the wrong member forever (a second hop of latency and the
very load the cluster is split to avoid); a redirect costs one round trip, once. A client
sends back the members it already went through (``via``); a member that would send it to
one of them answers an error naming the loop (the directories disagree), and a client
follows at most :data:`~.handover.MAX_HOPS` redirects.

**Handover** (make before break). When a subscription's home slot now belongs to another
member (a split or merge moved the slot), this member pushes
``{"op": "handover", "key", "to", "owner"}`` to the subscriber and keeps serving. The client
subscribes at the new member, whose reply says the first epoch it serves completely
(``from_epoch`` = F: its upstream covers the subscription from the next publisher tick on),
then sends this member ``{"op": "release", "key", "before": F}`` (reply
``{"op": "releasing", "key"}``). This member serves the subscription until its epoch reaches
F - 1, then removes it and pushes ``{"op": "released", "key", "epoch"}`` after every frame of
it already offered. The client delivers the old member's frames below F, holds the new
member's frames from F until ``released``, then switches: per subscription the epochs
(publisher ticks) it delivers strictly increase, and none is skipped that the subscriber's
rate would have given it.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable, Hashable
from typing import Any

from tidings.errors import IntermediaryError
from tidings.intermediary.cluster.areas import AreaUpstream, Composer, areas
from tidings.intermediary.cluster.directory import Directory
from tidings.intermediary.cluster.peers import RemotePart
from tidings.intermediary.cluster.responsibility import Partition, RegionPartition
from tidings.intermediary.node.intermediary import Intermediary, Upstream, requests_of
from tidings.intermediary.node.publisher_store import SubscriptionRecord
from tidings.intermediary.node.scheduling import Scheduler
from tidings.intermediary.node.snapshot import Snapshot
from tidings.intermediary.regions.geometry import parse_region
from tidings.intermediary.serving.credentials import Credentials
from tidings.intermediary.serving.status import box_json, boxes_json
from tidings.intermediary.serving.transport import IntermediaryServer

log = logging.getLogger(__name__)

#: The most members a request may have gone through (``via``) before it is refused.
MAX_VIA = 8
#: The longest a subscribe reply waits for the member's own feed to apply its requests.
CATCH_UP_S = 10.0
#: The fields a cluster adds to a subscribe request.
CLUSTER_FIELDS = ("client", "via")


class ClusterServer(IntermediaryServer):
    """A member called ``name``, publishing from ``feed`` (its own upstream connection),
    responsible for the slots ``directory`` gives it under ``partition``.

    ``peers(name)`` finds another member of this process (for views spanning areas and for
    holding boxes on a member's behalf); members in other processes are reached through the
    directory's URLs only. Other keyword arguments go to :class:`IntermediaryServer`;
    ``tick_s=None`` (the default here) leaves stepping to the owner (a
    :class:`.in_process.Cluster`). ``remote_feed``: ``feed`` is in another process and applies
    requests later than its next batch, so a subscribe is answered once it applied them
    (:meth:`_feed_caught_up`). ``peer_credentials`` and ``peer_tls``: how it connects to a
    member in another process (as a member of the tier; verifying a ``wss://`` member).

    A subscription its subscriber's grant does not allow is refused here, before any
    redirect: every member holds the same grants, so the owner would refuse it too.
    """

    def __init__(
        self,
        name: str,
        feed: Upstream,
        directory: Directory,
        partition: Partition,
        *,
        dim: int,
        peers: Callable[[str], ClusterServer | None] = lambda name: None,
        scheduler: Scheduler | None = None,
        tick_s: float | None = None,
        remote_feed: bool = False,
        peer_credentials: Credentials | None = None,
        peer_tls: ssl.SSLContext | None = None,
        **options: object,
    ) -> None:
        self.name = name
        self.peer_credentials = peer_credentials
        self.peer_tls = peer_tls
        self.remote_feed = remote_feed
        self.feed = feed
        self.directory = directory
        self.partition = partition
        self.peers = peers
        self.area: AreaUpstream | None = None
        #: Members in other processes this one takes pieces of its views from.
        self._remotes: dict[str, RemotePart] = {}
        upstream: Upstream = feed
        if isinstance(partition, RegionPartition):
            self.area = AreaUpstream(name, partition, self.owners, self._feed_of)
            upstream = self.area
        node = Intermediary(
            dim,
            upstream,
            world=partition.world if isinstance(partition, RegionPartition) else None,
            scheduler=scheduler if scheduler is not None else Scheduler(per_epoch=True),
        )
        #: Cells this member took over, and the feed request count that covers them, while its
        #: remote feed has not applied that request (:meth:`_compose`).
        self._settling: tuple[int, frozenset[int]] | None = None
        if isinstance(partition, RegionPartition):
            self._composer = Composer(
                name, partition, self.owners, self._state_of, self._remotes.get
            )
            node.compose = self._compose
        super().__init__(node, tick_s=tick_s, **options)  # type: ignore[arg-type]
        #: The client id each subscriber declared (for responsibility by hash).
        self._clients: dict[Hashable, str | None] = {}
        #: Subscriptions being handed over: (subscriber, key) -> the epoch it started at.
        self._handing: dict[tuple[Hashable, str], int] = {}
        #: Subscriptions released from epoch F on: (subscriber, key) -> F.
        self._releasing: dict[tuple[Hashable, str], int] = {}
        #: Frames generated by the latest :meth:`serve` (the frames/s load measure).
        self.last_frames = 0
        #: Frames generated since the start (a member in its own process reports the rate).
        self.frames_served = 0
        self.handed_over = 0
        #: Epochs a subscriber has to follow a handover before it is forgotten.
        self.handover_epochs = 200
        self._owners: dict[int, str] = directory.owners()
        #: (connections opened, connections open) when :meth:`_forget_gone` last looked.
        self._connections_seen = (0, 0)
        self.host = "127.0.0.1"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        await super().start(host, port)
        self.host = host

    @property
    def url(self) -> str:
        """Where subscribers reach this member (what it writes in the directory)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}/"

    def owners(self) -> dict[int, str]:
        """The slots' owners as this member last read them (:meth:`refresh`)."""
        return self._owners

    def responsibility(self) -> dict[str, Any]:
        """What this member is responsible for, and the tier's split, as its ``/status``
        gives it (:mod:`tidings.intermediary.serving.status`): the slots by owner as last
        read and, under responsibility by region, each owner's cells of the world."""
        by_owner: dict[str, list[int]] = {}
        for slot, owner in sorted(self._owners.items()):
            by_owner.setdefault(owner, []).append(slot)
        found: dict[str, Any] = {
            "member": self.name,
            "partition": "region" if isinstance(self.partition, RegionPartition) else "hash",
            "slots": len(self.partition.slots),
            "owners": {owner: len(slots) for owner, slots in sorted(by_owner.items())},
        }
        if isinstance(self.partition, RegionPartition):
            cell = self.partition.cell
            found["world"] = box_json(self.partition.world)
            found["areas"] = {
                owner: boxes_json(cell(slot) for slot in slots)
                for owner, slots in sorted(by_owner.items())
            }
        return found

    def subscriptions(self) -> int:
        """How many subscriptions this member serves (the subscriptions load measure)."""
        return sum(1 for _ in self.intermediary.publishers.records())

    # -- peers -------------------------------------------------------------------------

    def _feed_of(self, name: str) -> Upstream | None:
        """Who holds pieces in ``name``'s cells: its feed in this process, else the member
        itself over the wire (None: not in the directory, so this member holds them)."""
        if name == self.name:
            return self.feed
        peer = self.peers(name)
        if peer is not None:
            return peer.feed
        if name not in self._remotes:
            try:
                member = self.directory.member(name)
            except IntermediaryError:
                return None
            self._remotes[name] = RemotePart(name, member.url, self.peer_credentials, self.peer_tls)
        return self._remotes[name]

    async def aclose(self) -> None:
        for remote in self._remotes.values():
            await remote.aclose()
        await super().aclose()

    def _state_of(self, name: str) -> Snapshot | None:
        peer = self.peers(name)
        return None if peer is None else peer.intermediary.state.snapshot()

    # -- requests ----------------------------------------------------------------------

    async def handle_request(
        self, subscriber: int, request: dict[str, object]
    ) -> dict[str, object]:
        op = request.get("op")
        if op == "subscribe" and "region" in request and not {"events", "sql"} & set(request):
            return await self._subscribe(subscriber, request)
        if op == "release":
            return self._release(subscriber, request)
        plain = {name: value for name, value in request.items() if name not in CLUSTER_FIELDS}
        reply = await super().handle_request(subscriber, plain)
        if op in ("subscribe", "unsubscribe"):  # no region of that key is handed over now
            self._handing.pop((subscriber, str(request.get("key"))), None)
            self._releasing.pop((subscriber, str(request.get("key"))), None)
        return reply

    async def _subscribe(self, subscriber: int, request: dict[str, object]) -> dict[str, object]:
        client = request.get("client")
        via = request.get("via", [])
        if (
            not isinstance(via, list)
            or len(via) > MAX_VIA
            or not all(isinstance(name, str) for name in via)
        ):
            raise IntermediaryError(f"request.via: expected at most {MAX_VIA} member names")
        self.check_region(subscriber, request.get("region"))
        self.refresh()  # decide on the owners just read; the upstream is cut along them
        name = self._owner_name(parse_region(request.get("region")), client)
        key = request.get("key")
        if name != self.name:
            owner = self.directory.member(name)
            if owner.name in via or self.name in via:
                path = " -> ".join([*via, self.name, owner.name])
                raise IntermediaryError(
                    f"forward loop: {path}; the members' directories disagree about who owns "
                    "this subscription"
                )
            return {
                "op": "moved",
                "key": key,
                "to": owner.url,
                "owner": owner.name,
                "via": [*via, self.name],
            }
        plain = {name: value for name, value in request.items() if name not in CLUSTER_FIELDS}
        reply = await super().handle_request(subscriber, plain)
        self._clients[subscriber] = client if isinstance(client, str) else None
        self._handing.pop((subscriber, str(key)), None)
        self._releasing.pop((subscriber, str(key)), None)
        if await self._feed_caught_up():
            reply["from_epoch"] = self.intermediary.state.epoch + 1
        reply["intermediary"] = self.name
        return reply

    async def _feed_caught_up(self) -> bool:
        """Wait until the batches of this member's own feed reflect every request made so far
        (True), when the feed is in another process and counts them. The node cannot see that
        through the cut along the cells (:class:`.areas.AreaUpstream` hides the counts, and a
        re-cut after the directory changed asks the feed for pieces outside any
        subscribe), so without this ``from_epoch`` could name an epoch whose state still
        lacks the new pieces and the subscriber would get a view missing entities. False:
        the feed does not count, or it did not catch up within :data:`CATCH_UP_S` (the reply
        keeps its epoch, and a warning says so)."""
        counts = requests_of(self.feed)
        if counts is None or not self.remote_feed:  # a feed here applies them by the next batch
            return False
        wanted = counts[0]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CATCH_UP_S
        while (counts := requests_of(self.feed)) is not None and counts[1] < wanted:
            if loop.time() > deadline:
                log.warning("%s: upstream did not apply a request in %s s", self.name, CATCH_UP_S)
                return False
            await asyncio.sleep(0.005)
        return True

    def _owner_name(self, region: object, client: object) -> str:
        """The name of the member owning ``region``'s home slot, by the owners last read
        (:meth:`refresh`); a slot nobody owns is an error naming it."""
        slot = self.partition.home(region, client if isinstance(client, str) else None)  # type: ignore[arg-type]
        name = self._owners.get(slot)
        if name is None:
            raise IntermediaryError(f"directory: no intermediary owns slot {slot}")
        return name

    def _release(self, subscriber: int, request: dict[str, object]) -> dict[str, object]:
        key, before = request.get("key"), request.get("before")
        if not isinstance(key, str) or key not in self.intermediary.publishers.subscriptions(
            subscriber
        ):
            raise IntermediaryError(f"release: no subscription {str(key)[:64]!r} here")
        if isinstance(before, bool) or not isinstance(before, int) or before < 1:
            raise IntermediaryError("release.before: expected the epoch the new member serves from")
        self._releasing[(subscriber, key)] = before
        return {"op": "releasing", "key": key}

    # -- handing over ------------------------------------------------------------------

    def refresh(self) -> bool:
        """If the directory's owners changed since this member last looked: re-cut its
        upstream along the new areas and hand over the subscriptions whose home moved.
        Called before every round, so members in separate processes follow the shared
        directory; a cluster in one process calls it on every member at once."""
        owners = self.directory.owners()
        if owners == self._owners:
            return False
        taken = {s for s, o in owners.items() if o == self.name and self._owners.get(s) != o}
        self._owners = owners
        if self.area is not None:
            self.area.recut()
            counts = requests_of(self.feed)
            if taken and counts is not None and self.remote_feed:
                before = set() if self._settling is None else self._settling[1]
                self._settling = (counts[0], frozenset(taken | before))
        self.rehome()
        return True

    def _compose(self, record: SubscriptionRecord, own: Snapshot) -> Snapshot | None:
        """The composer's state for ``record``, or None (no frame this round) while the
        record's view reaches into cells this member took over and its remote feed has not
        applied the request for them: its own state there is not filled yet (a member that
        died left them to it), and a frame would miss their entities."""
        if self._settling is not None:
            wanted, cells = self._settling
            counts = requests_of(self.feed)
            if counts is None or counts[1] >= wanted:
                self._settling = None
            elif cells.intersection(areas(self._composer.partition, record.subscription)):
                return None
        return self._composer(record, own)

    def rehome(self) -> int:
        """Push a handover for every subscription whose home slot another member owns now
        (after a split or merge moved slots); returns how many were started."""
        started = 0
        for record in list(self.intermediary.publishers.records()):
            ident = (record.subscriber, record.key)
            if ident in self._handing or ident in self._releasing:
                continue
            try:
                name = self._owner_name(record.subscription, self._clients.get(record.subscriber))
                if name == self.name:
                    continue
                owner = self.directory.member(name)
            except IntermediaryError as exc:
                log.warning("%s cannot place %r: %s", self.name, ident, exc)
                continue
            message = {"op": "handover", "key": record.key, "to": owner.url, "owner": name}
            if self.notify(record.subscriber, message):  # type: ignore[arg-type]
                self._handing[ident] = self.intermediary.state.epoch
                started += 1
        return started

    def serve(self) -> int:
        """Follow the directory, a round, then finish the releases whose last epoch was
        reached."""
        try:
            self.refresh()
        except IntermediaryError as exc:  # a directory being changed must not stop serving
            log.warning("%s: %s", self.name, exc)
        if self._owners and self.name not in self._owners.values():
            # Drained (its slots merged back): a subscription that was not handed over when
            # the slots moved (it arrived, or its handover was dropped, meanwhile) is
            # offered again each round until none is left, or the member never stops.
            self.rehome()
        self.last_frames = super().serve()
        self.frames_served += self.last_frames
        self._forget_gone()
        epoch = self.intermediary.state.epoch
        # A handover the subscriber did not follow within handover_epochs is forgotten (it
        # stays served here, and the next directory change offers it again), so a client
        # that ignores handovers cannot stall the cluster's rebalancing.
        for ident, started in list(self._handing.items()):
            if ident not in self._releasing and epoch - started > self.handover_epochs:
                del self._handing[ident]
        for (subscriber, key), before in list(self._releasing.items()):
            if epoch >= before - 1:
                del self._releasing[(subscriber, key)]
                self._handing.pop((subscriber, key), None)
                self.intermediary.unsubscribe(subscriber, key)
                self.notify(subscriber, {"op": "released", "key": key, "epoch": epoch})  # type: ignore[arg-type]
                self.handed_over += 1
        return self.last_frames

    def _forget_gone(self) -> None:
        """Drop what is kept about subscribers that disconnected (looked at when connections
        came or went since the last look: counting them alone misses one leaving while
        another arrives)."""
        seen = (self._next_id, len(self.connections))
        if seen == self._connections_seen:
            return
        self._connections_seen = seen
        self._clients = {s: c for s, c in self._clients.items() if s in self.connections}
        for table in (self._handing, self._releasing):
            for ident in [i for i in table if i[0] not in self.connections]:
                del table[ident]

    def releasing(self) -> int:
        """Subscriptions released to another member, served here until their last epoch."""
        return len(self._releasing)

    def handing(self) -> int:
        """Subscriptions whose handover is under way (:meth:`serve` forgets those not
        followed within :attr:`handover_epochs`)."""
        return len(self._handing)
