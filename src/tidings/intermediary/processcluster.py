"""A cluster of intermediaries in separate OS processes that splits under load and merges
back ([109]-[110], [118]-[119]; issue 12 item 5): the same decisions as the in-process
:class:`.scaling.Cluster`, but a split starts a new *process* (:mod:`.member_process`), so
an overloaded machine's other cores take the load.

The supervisor holds no subscriber and no state: it starts members, each fed by the
publisher over the wire (a :class:`.spatialfeed.SimulationServer`'s URL), all reading one
directory file (SQLite, WAL). Members report their load there (:class:`.directory.Load`);
the supervisor reads the loads, and to split it starts a member process and gives it half of
the overloaded member's slots in one directory transaction; to merge it gives a member's
slots back to the member it split from. Members follow the directory before every round and
hand over the subscriptions whose home moved, make-before-break (:mod:`.cluster`), so no
subscriber's stream loses or repeats an epoch. A drained member is stopped (it leaves the
directory, then gets SIGTERM) once it reports no subscription and nobody hands over. A
member whose process ends on its own is buried: its slots go to the member it split from,
and its subscribers, subscribing again through their entry (:mod:`.handover`), land there;
the epochs published meanwhile are lost to them, never repeated.

Decisions are taken one at a time and only on loads every member measured after the
previous change (their report time is later), so a change is judged on its effect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from tidings.errors import IntermediaryError
from tidings.intermediary import children
from tidings.intermediary.directory import Directory, Load
from tidings.intermediary.member_process import partition_spec
from tidings.intermediary.responsibility import Partition
from tidings.intermediary.scaling import LoadPolicy, changes

log = logging.getLogger(__name__)

#: Seconds a member process may take to connect upstream, listen and join.
START_TIMEOUT_S = 60.0


@dataclass
class MemberProcess:
    """A member the supervisor started: its name, URL and OS process."""

    name: str
    url: str
    process: asyncio.subprocess.Process


class ProcessCluster:
    """Members in their own processes, balanced by ``policy`` (see the module docstring).

    ``upstream``: the publisher's spatial feed URL; ``directory``: the directory file every
    member opens; ``dim``: the world's dimension. :meth:`start` starts the first member,
    owning every slot; :meth:`start_loop` balances every ``interval_s``; :meth:`aclose`
    stops every member."""

    def __init__(
        self,
        upstream: str,
        partition: Partition,
        directory: str | Path,
        *,
        dim: int,
        policy: LoadPolicy | None = None,
        host: str = "127.0.0.1",
        round_s: float = 0.01,
        report_s: float = 0.25,
        interval_s: float = 0.5,
    ) -> None:
        self.upstream = upstream
        self.partition = partition
        self.path = str(directory)
        self.directory = Directory(self.path)
        self.dim = dim
        self.policy = policy
        self.host = host
        self.round_s = round_s
        self.report_s = report_s
        self.interval_s = interval_s
        self.members: dict[str, MemberProcess] = {}
        #: A member started by a split -> the member it split from (where it merges back).
        self.parents: dict[str, str] = {}
        #: Members giving everything back, stopped once they serve nothing.
        self.draining: set[str] = set()
        self.splits = 0
        self.merges = 0
        self._serial = 0
        #: When the last change was made: loads measured before it are not judged on.
        self._changed_at = 0.0
        self._loop: asyncio.Task[None] | None = None
        self._partition = partition_spec(partition)

    async def start(self) -> MemberProcess:
        """The first member, owning every slot."""
        first = await self._spawn()
        self.directory.assign(self.partition.slots, first.name)
        self._changed_at = time.time()
        return first

    async def _spawn(self) -> MemberProcess:
        name = f"p{self._serial}"
        self._serial += 1
        plan = {
            "name": name,
            "directory": self.path,
            "partition": self._partition,
            "dim": self.dim,
            "upstream": self.upstream,
            "host": self.host,
            "round_s": self.round_s,
            "report_s": self.report_s,
        }
        process = await children.spawn("tidings.intermediary.member_process", plan)
        (url,) = await children.ready(process, f"cluster: member {name}", START_TIMEOUT_S)
        member = MemberProcess(name, url, process)
        self.members[name] = member
        return member

    # -- split and merge ---------------------------------------------------------------

    async def split(self, name: str) -> MemberProcess | None:
        """Start a member process and give it half of ``name``'s slots (None if it has
        one slot)."""
        slots = self.directory.slots_of(name)
        if len(slots) < 2:
            log.warning("cluster: %s has %d slot(s); it cannot split", name, len(slots))
            return None
        extra = await self._spawn()
        try:
            self.directory.assign(slots[len(slots) // 2 :], extra.name)
        except IntermediaryError:  # nothing moved: the new member goes again
            await self._stop(extra.name)
            raise
        self.parents[extra.name] = name
        self.splits += 1
        self._changed_at = time.time()
        return extra

    def merge(self, name: str) -> str:
        """Give ``name``'s slots back to the member it split from; it is stopped once it
        serves nothing (:meth:`balance`). Returns the member taking over."""
        parent = self.parents.get(name)
        if parent is None or parent not in self.members:
            raise IntermediaryError(f"cluster: {name!r} was not started by a split")
        self.directory.assign(self.directory.slots_of(name), parent)
        self.draining.add(name)
        self.merges += 1
        self._changed_at = time.time()
        return parent

    def _fresh_loads(self) -> dict[str, Load] | None:
        """Every member's load, if each was measured after the last change (else None)."""
        loads = self.directory.loads()
        fresh = {name: loads.get(name) for name in self.members}
        if any(load is None or load.at <= self._changed_at for load in fresh.values()):
            return None
        return fresh  # type: ignore[return-value]

    async def bury_dead(self) -> list[str]:
        """Members whose process ended on its own (killed, crashed): their slots go, in one
        transaction, to the member they split from (or the oldest one alive), and they leave
        the directory, so their subscribers, subscribing again through their entry, land on a
        live member. With no member left a new first member takes every slot. Returns the
        names buried."""
        dead = [name for name, m in self.members.items() if m.process.returncode is not None]
        for name in dead:
            process = self.members[name].process
            await children.end(process)  # its pipes closed: it exited already
            del self.members[name]
            heir = self.parents.get(name)
            while heir is not None and heir not in self.members:
                heir = self.parents.get(heir)
            if heir is None and self.members:
                heir = next(iter(self.members))
            if heir is None:
                heir = (await self._spawn()).name
            log.warning(
                "cluster: member %s exited (%s); %s takes its slots", name, process.returncode, heir
            )
            self.directory.assign(self.directory.slots_of(name), heir)
            with contextlib.suppress(IntermediaryError):
                self.directory.leave(name)
            for child, parent in list(self.parents.items()):
                if parent == name and child == heir:  # the heir is the root now
                    del self.parents[child]
                elif parent == name:
                    self.parents[child] = heir
            self.parents.pop(name, None)
            self.draining.discard(name)
            self._changed_at = time.time()
        return dead

    async def balance(self) -> None:
        """Bury dead members; stop drained ones; then, when no handover is under way, make
        the first change :func:`.scaling.changes` names (one at a time, judged on fresh
        loads)."""
        await self.bury_dead()
        loads = self._fresh_loads()
        if loads is None or any(load.handing for load in loads.values()):
            return
        for name in list(self.draining):
            if loads[name].subscriptions == 0:
                await self._stop(name)
        policy = self.policy
        if policy is None or self.draining or len(self.members) != len(loads):
            return
        measure = {
            name: float(load.subscriptions)
            if policy.measure == "subscriptions"
            else load.frames_per_s
            for name, load in loads.items()
        }
        for action, name in changes(measure, policy, self.parents):
            if action == "merge":
                self.merge(name)
                return
            if await self.split(name) is not None:
                return

    async def _stop(self, name: str) -> None:
        member = self.members.pop(name)
        self.draining.discard(name)
        self.parents.pop(name, None)
        with contextlib.suppress(IntermediaryError):  # it owns nothing, or never joined
            self.directory.leave(name)
        await children.end(member.process)
        self._changed_at = time.time()

    # -- running -----------------------------------------------------------------------

    async def run(self) -> None:
        """Balance every ``interval_s`` until cancelled."""
        while True:
            try:
                await self.balance()
            except Exception:  # one failed decision must not stop balancing
                log.exception("cluster: balancing failed")
            await asyncio.sleep(self.interval_s)

    def start_loop(self) -> None:
        self._loop = asyncio.get_running_loop().create_task(self.run())

    async def aclose(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
        for member in list(self.members.values()):
            await children.end(member.process)
        self.members.clear()
        self.directory.close()
