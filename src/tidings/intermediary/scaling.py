"""A cluster of intermediaries in one process that splits under load and merges back
([109]-[110], [118]-[119]; issue 12 item 5).

:class:`Cluster` owns a spatial :class:`~.simulation.Simulation` (the publisher), a
:class:`~.directory.Directory` and the members (:class:`~.cluster.ClusterServer`, each on its
own port with its own feed). :meth:`Cluster.step` is one publisher tick: the simulation
moves, every member applies its batch and ends the epoch at that tick, then every member
generates a round -- so members generating a view from several states see one epoch.

**Split and merge.** A member whose load (:class:`LoadPolicy`: its subscriptions, or the
frames it generated per second) is above ``high`` starts a new member and gives it half of
its slots; subscriptions whose home moved are handed over (:mod:`.cluster`). A member
started by a split whose load falls below ``low`` gives its slots back to the member it
split from, hands its subscriptions back and stops once it serves none. Slots move in one
directory transaction, and handovers are make-before-break, so no subscriber's stream loses
or repeats an epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from tidings.errors import IntermediaryError
from tidings.intermediary.cluster import ClusterServer
from tidings.intermediary.directory import Directory
from tidings.intermediary.responsibility import Partition
from tidings.intermediary.scheduling import Scheduler
from tidings.intermediary.simulation import Simulation, SimulationFeed
from tidings.intermediary.state import UpdateBatch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadPolicy:
    """When a member is overloaded (load > ``high``) or underloaded (load < ``low``), by
    ``measure``: ``"subscriptions"`` it serves, or ``"frames_per_s"`` it generates."""

    high: float
    low: float
    measure: Literal["subscriptions", "frames_per_s"] = "subscriptions"
    max_members: int = 8

    def __post_init__(self) -> None:
        if self.measure not in ("subscriptions", "frames_per_s"):
            raise IntermediaryError(f"load: unknown measure {self.measure!r}")
        if not 0 <= self.low < self.high:
            raise IntermediaryError("load: expected 0 <= low < high")
        if self.max_members < 1:
            raise IntermediaryError("load: max_members must be >= 1")


def changes(
    loads: Mapping[str, float], policy: LoadPolicy, parents: Mapping[str, str]
) -> Iterator[tuple[Literal["split", "merge"], str]]:
    """The changes to try, best first, one of which is made (shared by :class:`Cluster` and
    :class:`.processcluster.ProcessCluster`). ``loads``: each member's load by the policy's
    measure, in the order the members started; ``parents``: member -> the member it split
    from. An overloaded member splits while the cluster is below ``max_members`` (the caller
    tries the next if one cannot: a single slot does not split); an underloaded member
    started by a split merges back into its parent once its own splits have merged."""
    for name, load in loads.items():
        if load > policy.high and len(loads) < policy.max_members:
            yield "split", name
        elif load < policy.low and name in parents and name not in parents.values():
            yield "merge", name


class Cluster:
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
        self.simulation = simulation
        self.partition = partition
        self.directory = directory if directory is not None else Directory()
        self.policy = policy
        self.dt = dt
        self.tick_s = tick_s
        self.max_dropped = max_dropped
        self.host = host
        self.members: dict[str, ClusterServer] = {}
        #: A member started by a split -> the member it split from (where it merges back).
        self.parents: dict[str, str] = {}
        #: Members giving everything back, stopped once they serve nothing.
        self.draining: set[str] = set()
        self.splits = 0
        self.merges = 0
        self._serial = 0
        self._loop: asyncio.Task[None] | None = None

    # -- members -----------------------------------------------------------------------

    async def start(self) -> ClusterServer:
        """The first member, owning every slot."""
        first = await self._add()
        self.directory.assign(self.partition.slots, first.name)
        return first

    async def _add(self) -> ClusterServer:
        name = f"i{self._serial}"
        self._serial += 1
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
        self.members[name] = member
        return member

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

    async def run(self) -> None:
        """Tick every ``tick_s`` and balance, until cancelled."""
        while True:
            try:
                self.step()
                await self.balance()
            except Exception:  # one bad tick must not stop the cluster
                log.exception("cluster tick failed")
            await asyncio.sleep(self.tick_s)

    def start_loop(self) -> None:
        self._loop = asyncio.get_running_loop().create_task(self.run())

    # -- split and merge ---------------------------------------------------------------

    async def split(self, member: ClusterServer) -> ClusterServer | None:
        """Start a member and give it half of ``member``'s slots (None if it has one)."""
        slots = self.directory.slots_of(member.name)
        if len(slots) < 2:
            log.warning("cluster: %s has %d slot(s); it cannot split", member.name, len(slots))
            return None
        extra = await self._add()
        try:
            self.directory.assign(slots[len(slots) // 2 :], extra.name)
        except IntermediaryError:  # nothing moved: the new member goes again
            del self.members[extra.name]
            await extra.aclose()
            with contextlib.suppress(IntermediaryError):  # a row owning nothing is harmless
                self.directory.leave(extra.name)
            raise
        self.parents[extra.name] = member.name
        self._moved()
        self.splits += 1
        return extra

    def merge(self, member: ClusterServer) -> ClusterServer:
        """Give ``member``'s slots back to the member it split from; it stops once it serves
        no subscription (see :meth:`balance`). Returns the member taking over."""
        parent = self.members.get(self.parents.get(member.name, ""))
        if parent is None:
            raise IntermediaryError(f"cluster: {member.name!r} was not started by a split")
        self.directory.assign(self.directory.slots_of(member.name), parent.name)
        self.draining.add(member.name)
        self._moved()
        self.merges += 1
        return parent

    def _moved(self) -> None:
        """Ownership changed: every member re-cuts its upstream (before the next publisher
        tick, so the new owners' next batches hold the moved cells) and starts handovers."""
        for member in self.members.values():
            member.refresh()

    async def balance(self) -> None:
        """Stop drained members; then, when no handover is under way, split the first
        overloaded member or merge the first underloaded one (one change at a time, each
        judged on loads measured after the previous change settled)."""
        quiet = not any(member.handing() for member in self.members.values())
        for name in list(self.draining):
            if quiet and self.members[name].subscriptions() == 0:
                await self._stop(self.members[name])
        if self.policy is None or not quiet or self.draining:
            return
        loads = {name: self.load(member) for name, member in self.members.items()}
        for action, name in changes(loads, self.policy, self.parents):
            if action == "merge":
                self.merge(self.members[name])
                return
            if await self.split(self.members[name]) is not None:
                return

    async def _stop(self, member: ClusterServer) -> None:
        self.draining.discard(member.name)
        self.parents.pop(member.name, None)
        if member.area is not None:
            member.area.release_all()
        del self.members[member.name]
        self.directory.leave(member.name)
        await member.aclose()

    async def aclose(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
        for member in list(self.members.values()):
            await member.aclose()
        self.members.clear()
