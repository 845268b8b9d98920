"""Who is in a cluster of intermediaries, and when it splits or merges ([109]-[110],
[118]-[119]): one bookkeeping for the members of one process
(:class:`.in_process.Cluster`) and for members in their own processes
(:class:`.process_cluster.ProcessCluster`).

:class:`Membership` keeps the members by name in the order they started, which member each
one split from (where it merges back), which are draining, and the counts of splits and
merges; it moves slots in the shared :class:`~.directory.Directory`, one transaction per
change. A member whose load (:class:`LoadPolicy`: its subscriptions, or the frames it
generated per second) is above ``high`` splits: a new member starts and takes half of its
slots. A member started by a split whose load falls below ``low`` merges: its slots go back
to the member it split from, and it is stopped once it serves none. Subscriptions whose home
moved are handed over by the members themselves (:mod:`.member`), make-before-break, so no
subscriber's stream loses or repeats an epoch. Changes are made one at a time
(:meth:`Membership.rebalance`), each judged on loads measured after the previous one settled.

A subclass says how a member starts and ends, and what a change must be followed by.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Generic, Literal, Protocol, TypeVar

from tidings.errors import IntermediaryError
from tidings.intermediary.cluster.directory import Directory
from tidings.intermediary.cluster.responsibility import Partition
from tidings.tasks import stop_task

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
    """The changes to try, best first, one of which is made. ``loads``: each member's load
    by the policy's measure, in the order the members started; ``parents``: member -> the
    member it split from. An overloaded member splits while the cluster is below
    ``max_members`` (the caller tries the next if one cannot: a single slot does not split);
    an underloaded member started by a split merges back into its parent once its own splits
    have merged."""
    for name, load in loads.items():
        if load > policy.high and len(loads) < policy.max_members:
            yield "split", name
        elif load < policy.low and name in parents and name not in parents.values():
            yield "merge", name


class Member(Protocol):
    """A member as the bookkeeping sees it: its name in the directory."""

    @property
    def name(self) -> str: ...


M = TypeVar("M", bound=Member)


class Membership(ABC, Generic[M]):
    """The members of one cluster and the slots they own (see the module docstring).

    ``prefix`` names the members (``prefix`` and a serial number); ``directory`` is where
    their slots are; ``policy`` (None: never split or merge) decides the changes."""

    def __init__(
        self,
        prefix: str,
        partition: Partition,
        directory: Directory,
        policy: LoadPolicy | None,
        period_s: float,
    ) -> None:
        self.partition = partition
        self.directory = directory
        self.policy = policy
        #: The members by name, in the order they started.
        self.members: dict[str, M] = {}
        #: A member started by a split -> the member it split from (where it merges back).
        self.parents: dict[str, str] = {}
        #: Members giving everything back, stopped once they serve nothing.
        self.draining: set[str] = set()
        self.splits = 0
        self.merges = 0
        self._prefix = prefix
        self._serial = 0
        self._period_s = period_s
        self._loop: asyncio.Task[None] | None = None

    # -- what a subclass says ----------------------------------------------------------

    @abstractmethod
    async def _start_member(self, name: str) -> M:
        """Start a member called ``name``, serving and in the directory (owning nothing)."""

    @abstractmethod
    async def _end_member(self, member: M) -> None:
        """End a member (it no longer is in :attr:`members`, nor in the directory)."""

    def _changed(self) -> None:
        """Called after every change of membership or ownership."""

    @abstractmethod
    async def _round(self) -> None:
        """One round of :meth:`run` (balance, and whatever else the cluster does then)."""

    # -- members -----------------------------------------------------------------------

    async def start(self) -> M:
        """The first member, owning every slot."""
        first = await self._add()
        self.directory.assign(self.partition.slots, first.name)
        self._changed()
        return first

    async def _add(self) -> M:
        name = f"{self._prefix}{self._serial}"
        self._serial += 1
        member = await self._start_member(name)
        self.members[name] = member
        return member

    async def _stop(self, member: M) -> None:
        """A member out of the cluster: it leaves the directory, then ends."""
        self.members.pop(member.name, None)
        self.draining.discard(member.name)
        self.parents.pop(member.name, None)
        with contextlib.suppress(IntermediaryError):  # it owns nothing, or never joined
            self.directory.leave(member.name)
        await self._end_member(member)
        self._changed()

    # -- split and merge ---------------------------------------------------------------

    async def split(self, member: M) -> M | None:
        """Start a member and give it half of ``member``'s slots (None if it has one)."""
        slots = self.directory.slots_of(member.name)
        if len(slots) < 2:
            log.warning("cluster: %s has %d slot(s); it cannot split", member.name, len(slots))
            return None
        extra = await self._add()
        try:
            self.directory.assign(slots[len(slots) // 2 :], extra.name)
        except IntermediaryError:  # nothing moved: the new member goes again
            await self._stop(extra)
            raise
        self.parents[extra.name] = member.name
        self.splits += 1
        self._changed()
        return extra

    def merge(self, member: M) -> M:
        """Give ``member``'s slots back to the member it split from; it stops once it serves
        no subscription (see :meth:`rebalance`). Returns the member taking over."""
        parent = self.members.get(self.parents.get(member.name, ""))
        if parent is None:
            raise IntermediaryError(f"cluster: {member.name!r} was not started by a split")
        self.directory.assign(self.directory.slots_of(member.name), parent.name)
        self.draining.add(member.name)
        self.merges += 1
        self._changed()
        return parent

    async def rebalance(self, subscriptions: Mapping[str, int], loads: Mapping[str, float]) -> None:
        """With no handover under way (the caller's to know): stop the drained members that
        serve no subscription (``subscriptions``: each member's count); if none stopped and
        none is draining, make the first change :func:`changes` names on ``loads`` (each
        member's load by the policy's measure, measured after the previous change)."""
        drained = [name for name in self.draining if subscriptions.get(name) == 0]
        for name in drained:
            await self._stop(self.members[name])
        if self.policy is None or drained or self.draining:
            return
        for action, name in changes(loads, self.policy, self.parents):
            if action == "merge":
                self.merge(self.members[name])
                return
            if await self.split(self.members[name]) is not None:
                return

    # -- running -----------------------------------------------------------------------

    async def run(self) -> None:
        """A round every ``period_s`` until cancelled."""
        while True:
            try:
                await self._round()
            except Exception:  # one bad round must not stop the cluster
                log.exception("cluster: a round failed")
            await asyncio.sleep(self._period_s)

    def start_loop(self) -> None:
        self._loop = asyncio.get_running_loop().create_task(self.run())

    async def aclose(self) -> None:
        """Stop the loop and end every member."""
        if self._loop is not None:
            await stop_task(self._loop)
        for member in list(self.members.values()):
            await self._end_member(member)
        self.members.clear()
