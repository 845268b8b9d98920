"""A cluster of intermediaries in separate OS processes that splits under load and merges
back ([109]-[110], [118]-[119]): the same decisions as the in-process
:class:`.in_process.Cluster`, but a split starts a new *process* (:mod:`.member_process`), so
an overloaded machine's other cores take the load.

The supervisor holds no subscriber and no state: it starts members, each fed by the publisher over
the wire (a :class:`~tidings.intermediary.publisher.server.SimulationServer`'s URL), all reading one
directory file (SQLite, WAL). Members report their load there (:class:`.directory.Load`); the
supervisor reads the loads, and to split it starts a member process and gives it half of the
overloaded member's slots in one directory transaction; to merge it gives a member's slots back to
the member it split from. Members follow the directory before every round and hand over the
subscriptions whose home moved, make-before-break (:mod:`.member`), so no subscriber's stream loses
or repeats an epoch. A drained member is stopped (it leaves the directory, then gets SIGTERM) once
it reports no subscription and nobody hands over. A member whose process ends on its own is buried:
its slots go to the member it split from, and its subscribers, subscribing again through their entry
(:mod:`.handover`), land there; the epochs published meanwhile are lost to them, never repeated.

Decisions are taken one at a time (the bookkeeping every cluster shares, :mod:`.membership`)
and only on loads every member measured after the previous change (their report time is
later), so a change is judged on its effect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidings.errors import IntermediaryError
from tidings.intermediary.cluster import children
from tidings.intermediary.cluster.directory import Directory, Load
from tidings.intermediary.cluster.membership import LoadPolicy, Membership
from tidings.intermediary.cluster.responsibility import Partition, partition_spec

log = logging.getLogger(__name__)

#: Seconds a member process may take to connect upstream, listen and join.
START_TIMEOUT_S = 60.0


@dataclass
class MemberProcess:
    """A member the supervisor started: its name, URL and OS process."""

    name: str
    url: str
    process: asyncio.subprocess.Process


class ProcessCluster(Membership[MemberProcess]):
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
        security: dict[str, Any] | None = None,
    ) -> None:
        self.path = str(directory)
        super().__init__("p", partition, Directory(self.path), policy, interval_s)
        self.upstream = upstream
        self.dim = dim
        self.host = host
        self.round_s = round_s
        self.report_s = report_s
        self.interval_s = interval_s
        #: Each member's plan's ``security`` (:func:`.member_process.member_security`; None:
        #: plaintext, anonymous subscribers from this machine).
        self.security = security
        #: When the last change was made: loads measured before it are not judged on.
        self._changed_at = 0.0
        self._partition = partition_spec(partition)

    # -- members -----------------------------------------------------------------------

    def _address(self, name: str) -> tuple[str, int]:
        """Where member ``name`` listens: any free port of :attr:`host` (a deployed tier
        gives each member its configured address, :class:`.tier.Tier`)."""
        return self.host, 0

    async def _start_member(self, name: str) -> MemberProcess:
        host, port = self._address(name)
        plan = {
            "name": name,
            "directory": self.path,
            "partition": self._partition,
            "dim": self.dim,
            "upstream": self.upstream,
            "host": host,
            "port": port,
            "round_s": self.round_s,
            "report_s": self.report_s,
        }
        if self.security is not None:
            plan["security"] = self.security
        plan.update(self._plan_extras(name))
        process = await children.spawn("tidings.intermediary.cluster.member_process", plan)
        (url,) = await children.ready(process, f"cluster: member {name}", START_TIMEOUT_S)
        return MemberProcess(name, url, process)

    def _plan_extras(self, name: str) -> dict[str, Any]:
        """More keys of member ``name``'s plan (a deployed tier adds its metrics port)."""
        return {}

    async def _end_member(self, member: MemberProcess) -> None:
        await children.end(member.process)

    def _changed(self) -> None:
        self._changed_at = time.time()

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
                heir = (await self._add()).name
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
            self._changed()
        return dead

    async def balance(self) -> None:
        """Bury dead members; then, on fresh loads and with no handover under way, stop
        drained members or make the first change the policy names (:meth:`rebalance`)."""
        await self.bury_dead()
        loads = self._fresh_loads()
        if loads is None or any(load.handing for load in loads.values()):
            return
        by_measure = self.policy is not None and self.policy.measure == "frames_per_s"
        await self.rebalance(
            {name: load.subscriptions for name, load in loads.items()},
            {
                name: load.frames_per_s if by_measure else float(load.subscriptions)
                for name, load in loads.items()
            },
        )

    async def _round(self) -> None:
        await self.balance()

    async def aclose(self) -> None:
        await super().aclose()
        self.directory.close()
