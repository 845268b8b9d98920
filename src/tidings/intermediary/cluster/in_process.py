"""A cluster of intermediaries in one process that splits under load and merges back
([109]-[110], [118]-[119]).

:class:`Cluster` owns a spatial :class:`~tidings.intermediary.publisher.simulation.Simulation`
(the publisher), a :class:`~.directory.Directory` and the members
(:class:`~.member.ClusterServer`, each on its own port with its own feed). :meth:`Cluster.step`
is one publisher tick: the simulation moves, every member applies its batch and ends the
epoch at that tick, then every member generates a round -- so members generating a view
from several states see one epoch.

Who is a member, and when one splits or merges, is the bookkeeping every cluster shares
(:mod:`.membership`); here a member is started in this process and a change of ownership is
followed by every member at once (:meth:`~.member.ClusterServer.refresh`), before the next
publisher tick.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tidings.errors import IntermediaryError
from tidings.intermediary.cluster.directory import Directory
from tidings.intermediary.cluster.member import ClusterServer
from tidings.intermediary.cluster.membership import LoadPolicy, Membership
from tidings.intermediary.cluster.responsibility import Partition
from tidings.intermediary.node.batches import UpdateBatch
from tidings.intermediary.node.scheduling import Scheduler
from tidings.intermediary.publisher.simulation import Simulation, SimulationFeed

log = logging.getLogger(__name__)


class Cluster(Membership[ClusterServer]):
    """Members sharing ``simulation`` as publisher, stepped together (see the module
    docstring). ``tick_s`` is the publisher's period (the frames/s measure uses it)."""

    def __init__(
        self,
        simulation: Simulation,
        partition: Partition,
        *,
        directory: Directory | None = None,
        policy: LoadPolicy | None = None,
        dt: float = 0.05,
        tick_s: float = 0.05,
        max_dropped: int = 1000,
        host: str = "127.0.0.1",
    ) -> None:
        super().__init__(
            "i", partition, directory if directory is not None else Directory(), policy, tick_s
        )
        self.simulation = simulation
        self.dt = dt
        self.tick_s = tick_s
        self.max_dropped = max_dropped
        self.host = host

    # -- members -----------------------------------------------------------------------

    async def _start_member(self, name: str) -> ClusterServer:
        feed = self.simulation.feed()
        member = ClusterServer(
            name,
            feed,
            self.directory,
            self.partition,
            dim=self.simulation.dim,
            peers=self.members.get,
            scheduler=Scheduler(per_epoch=True, max_dropped=self.max_dropped),
            source=self._source(feed),
        )
        await member.start(self.host)
        try:
            self.directory.join(name, member.url)
        except IntermediaryError:  # the directory cannot be written now: no member is left
            await member.aclose()
            raise
        return member

    async def _end_member(self, member: ClusterServer) -> None:
        await member.aclose()

    async def _stop(self, member: ClusterServer) -> None:
        if member.area is not None:
            member.area.release_all()
        await super()._stop(member)

    def _changed(self) -> None:
        """Ownership changed: every member re-cuts its upstream (before the next publisher
        tick, so the new owners' next batches hold the moved cells) and starts handovers."""
        for member in self.members.values():
            member.refresh()

    def _source(self, feed: SimulationFeed) -> Callable[[], list[UpdateBatch]]:
        """A member's batches: one per publisher tick it has not seen yet."""
        seen = [self.simulation.tick]

        def source() -> list[UpdateBatch]:
            if self.simulation.tick == seen[0]:
                return []
            seen[0] = self.simulation.tick
            return [feed.batch()]

        return source

    def load(self, member: ClusterServer) -> float:
        if self.policy is not None and self.policy.measure == "frames_per_s":
            return member.last_frames / self.tick_s
        return float(member.subscriptions())

    # -- ticks -------------------------------------------------------------------------

    def step(self) -> int:
        """One publisher tick through every member; returns the tick."""
        self.simulation.step(self.dt)
        for member in list(self.members.values()):
            member.ingest()
        for member in list(self.members.values()):
            member.serve()
        return self.simulation.tick

    async def _round(self) -> None:
        self.step()
        await self.balance()

    async def balance(self) -> None:
        """When no handover is under way, stop drained members, or else split the first
        overloaded member or merge the first underloaded one (:meth:`rebalance`)."""
        if any(member.handing() for member in self.members.values()):
            return
        await self.rebalance(
            {name: member.subscriptions() for name, member in self.members.items()},
            {name: self.load(member) for name, member in self.members.items()},
        )
