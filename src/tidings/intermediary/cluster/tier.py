"""A deployed tier of intermediaries (claims 9, 11; [108]-[112]): a fixed set of members,
each its own process on the address the configuration gives it, responsibility split among
them, and a supervisor that replaces a member that dies.

The members are the process cluster's (:mod:`.member_process`): each follows the spatial
publisher, reads the shared directory before every round, redirects a subscription it is not
responsible for and hands subscriptions over when their slot moves. What a tier adds to the
:class:`.process_cluster.ProcessCluster` it is:

* **Seats.** Member ``i`` listens on the ``i``-th configured address and owns the ``i``-th
  contiguous share of the slots (with cells along the first axis, member 0 the west of the
  world, and so on), so subscribers can be given every member's URL and enter anywhere.
* **Failover.** Every ``check_every`` the supervisor looks at its children; one that exited
  (SIGKILL, a crash, its upstream lost) is noticed at once, as its process has ended. Its slots are
  spread over the survivors (the one with fewest first), one directory transaction per heir,
  and it leaves the directory. Its subscribers' connections closed when it died; their
  clients (:class:`~tidings.intermediary.client.handover.ClusterClient`, given several entry
  URLs) subscribe again at any live member, which redirects them to the new owner. The ticks
  published meanwhile are lost to them, never repeated, and a view spanning the dead member's
  cells is recomposed from the heir's.
* **Replacement** (``replace_dead``). The next round starts a new member on the dead one's
  seat (its address, free again) and gives it its share back; the survivors hand those
  subscriptions over to it make-before-break, so no subscriber loses an epoch twice. With
  every member dead, a member is started whatever ``replace_dead`` says, and takes all.

* **Security.** The members share the tier's ``tls:``, ``subscribers:`` and ``anonymous:``,
  so a subscriber proves the same identity at every member and is held to the same grant
  wherever a redirect or a handover takes it; the members take pieces of views from each
  other as members, with a token the supervisor makes for the run
  (:func:`.member_process.member_security`).

No splitting or merging: a deployed tier's size is what the operator configured.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tidings.config.intermediary_access import SubscriberAccess
from tidings.config.intermediary_tier import IntermediaryTierConfig
from tidings.config.passwords import new_token
from tidings.errors import IntermediaryError
from tidings.intermediary.cluster import children
from tidings.intermediary.cluster.member_process import member_security
from tidings.intermediary.cluster.process_cluster import MemberProcess, ProcessCluster
from tidings.intermediary.cluster.responsibility import HashPartition, Partition, RegionPartition
from tidings.intermediary.regions.geometry import Box
from tidings.intermediary.serving.access import Gatekeeper

log = logging.getLogger(__name__)

#: The longest pause between tries to start a replacement that failed to start.
MAX_PAUSE_S = 10.0


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def tier_partition(config: IntermediaryTierConfig) -> Partition:
    """The slots a tier's responsibility is cut into."""
    if config.responsibility.by == "hash":
        return HashPartition(config.responsibility.buckets)
    world = Box(tuple(config.spatial.world_lo), tuple(config.spatial.world_hi))
    return RegionPartition(world, config.grid())


def shares(slots: int, members: int) -> list[range]:
    """``slots`` cut into ``members`` contiguous shares, as even as they go (the first ones
    one larger)."""
    size, extra = divmod(slots, members)
    cuts = [0]
    for i in range(members):
        cuts.append(cuts[-1] + size + (1 if i < extra else 0))
    return [range(a, b) for a, b in itertools.pairwise(cuts)]


class Tier(ProcessCluster):
    """The members of one configured tier (see the module docstring): :meth:`start_all`
    starts every seat's member, :meth:`start_loop` watches them, :meth:`aclose` ends them.

    ``name`` prefixes the members' names (``world-0``, ``world-1``, ...; a replacement gets
    the next number); ``directory``: the file the members share (a private temporary one by
    default, removed by :meth:`aclose`)."""

    def __init__(
        self, name: str, config: IntermediaryTierConfig, directory: str | Path | None = None
    ) -> None:
        self._tmp = None
        if directory is None:
            self._tmp = tempfile.TemporaryDirectory(prefix=f"tidings-tier-{name}-")
            directory = Path(self._tmp.name) / "directory.db"
        partition = tier_partition(config)
        access = SubscriberAccess(subscribers=config.subscribers, anonymous=config.anonymous)
        Gatekeeper.from_config(access)  # a hash variable not set: named here, not by a member
        security = member_security(
            access, config.tls, config.peer_tls, config.spatial.tls, new_token()
        )
        super().__init__(
            config.spatial.upstream,
            partition,
            directory,
            dim=len(config.spatial.world_lo),
            policy=None,
            round_s=config.round.total_seconds(),
            interval_s=config.check_every.total_seconds(),
            security=security,
        )
        self._prefix = f"{name}-"
        self.config = config
        self.replace_dead = config.replace_dead
        self.seats = [_host_port(address) for address in config.members]
        self.share = shares(len(partition.slots), len(self.seats))
        #: Member name -> its seat (index into :attr:`seats` and :attr:`share`).
        self.seat_of: dict[str, int] = {}
        #: Seats whose member died and was not replaced yet, oldest first.
        self.vacant: list[int] = []
        #: Called with the name of each member found dead (after its slots moved).
        self.on_death: Callable[[str], None] = lambda name: None
        self._starting: list[int] = []
        #: After a replacement failed to start: the pause before the next try (doubling up
        #: to MAX_PAUSE_S, so a publisher that is away is not met by a process every round).
        self._pause_s = 0.0
        self._retry_at = 0.0

    def _address(self, name: str) -> tuple[str, int]:
        seat = self._starting.pop(0)
        self.seat_of[name] = seat
        return self.seats[seat]

    def _plan_extras(self, name: str) -> dict[str, Any]:
        """The member's metrics endpoint: the configured port plus its seat's index."""
        metrics = self.config.metrics
        if metrics.port is None:
            return {}
        return {"metrics": {"address": metrics.address, "port": metrics.port + self.seat_of[name]}}

    async def _seat(self, seat: int) -> MemberProcess:
        """Start a member on ``seat`` (listening on its address, owning nothing yet)."""
        self._starting.append(seat)
        try:
            return await self._add()
        finally:
            with contextlib.suppress(ValueError):
                self._starting.remove(seat)

    async def start_all(self) -> list[MemberProcess]:
        """Every seat's member, each owning its share; if one cannot start, those started
        end and the error names it."""
        try:
            started = [await self._seat(seat) for seat in range(len(self.seats))]
        except BaseException:
            await self.aclose()
            raise
        for member in started:
            self.directory.assign(self.share[self.seat_of[member.name]], member.name)
        self._changed()
        return started

    async def bury_dead(self) -> list[str]:
        """Members whose process ended on its own: their slots spread over the survivors
        (each slot to the one owning fewest then), they leave the directory, and their seats
        wait for a replacement. With no survivor their slots stay theirs until
        :meth:`refill` starts a member, which takes them."""
        dead = [name for name, m in self.members.items() if m.process.returncode is not None]
        for name in dead:
            member = self.members.pop(name)
            await children.end(member.process)
            self.vacant.append(self.seat_of.pop(name))
            slots = self.directory.slots_of(name)
            owned = {n: len(self.directory.slots_of(n)) for n in self.members}
            given: dict[str, list[int]] = {n: [] for n in self.members}
            for slot in slots if owned else []:
                heir = min(owned, key=lambda n: owned[n])
                given[heir].append(slot)
                owned[heir] += 1
            for heir, moved in given.items():
                if moved:
                    self.directory.assign(moved, heir)
            with contextlib.suppress(IntermediaryError):  # no survivor: it keeps them
                self.directory.leave(name)
            log.warning(
                "tier: member %s exited (%s); its %d slot(s) went to %s",
                name,
                member.process.returncode,
                len(slots),
                ", ".join(self.members) or "nobody until a member starts",
            )
            self._changed()
            self.on_death(name)
        return dead

    async def refill(self) -> MemberProcess | None:
        """A new member on the oldest vacant seat, given that seat's share back and every
        slot no live member owns (None: no seat is vacant, or :attr:`replace_dead` is off
        and some member lives). One that cannot start (its address still taken, the
        publisher away) is logged, and tried again after a pause that doubles up to
        :data:`MAX_PAUSE_S`."""
        if not self.vacant or (not self.replace_dead and self.members):
            return None
        if time.monotonic() < self._retry_at:
            return None
        seat = self.vacant[0]
        try:
            member = await self._seat(seat)
        except IntermediaryError as exc:
            self._pause_s = min(2 * self._pause_s, MAX_PAUSE_S) if self._pause_s else 0.5
            self._retry_at = time.monotonic() + self._pause_s
            log.warning("tier: seat %s: %s; tried again in %.1f s", seat, exc, self._pause_s)
            return None
        self._pause_s, self._retry_at = 0.0, 0.0
        self.vacant.pop(0)
        owners = self.directory.owners()
        orphans = [slot for slot, owner in owners.items() if owner not in self.members]
        self.directory.assign(sorted({*self.share[seat], *orphans}), member.name)
        for gone in {owners[slot] for slot in orphans}:
            with contextlib.suppress(IntermediaryError):
                self.directory.leave(gone)
        self._changed()
        log.warning("tier: %s replaces seat %d at %s", member.name, seat, member.url)
        return member

    async def _round(self) -> None:
        await self.bury_dead()
        await self.refill()

    async def aclose(self) -> None:
        await super().aclose()
        if self._tmp is not None:
            self._tmp.cleanup()


async def serve_tier(
    name: str,
    config: IntermediaryTierConfig,
    stop: asyncio.Event,
    ready: Callable[[list[MemberProcess]], None] = lambda members: None,
) -> None:
    """Run tier ``name`` until ``stop`` is set: start every member, call ``ready`` with
    them, watch and replace them, then end them all."""
    tier = Tier(name, config)
    members = await tier.start_all()
    tier.on_death = lambda dead: log.warning("tier %s: member %s died", name, dead)
    try:
        ready(members)
        tier.start_loop()
        await stop.wait()
    finally:
        await tier.aclose()
