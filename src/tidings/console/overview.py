"""The state of every part of the deployment, as one snapshot the overview page shows.

Taken by the console's sampler every ``sample_every`` (not per page view: a page reads the
newest snapshot, so many operators cost the database nothing more), from what already
exists:

* the outbox's :func:`~tidings.pipeline.status.health_report` (per status and target, the
  oldest open event, keys held behind FAILED events, the relay's lag and last batch: all
  indexed reads), the FAILED events holding keys (``tidings events blocked``'s query, only
  when some keys are held) and the relay's lease;
* ``tidings run``'s state file, when the deployment runs under it (each part's state and
  restarts);
* each event server's Eventer port and each intermediary's port, tried with a TCP connect:
  a part is *up* when it accepts, *restarting* when ``tidings run`` is starting it again,
  else *down*;
* each stream's consumers and how far behind each is, read from the server's store as
  ``tidings streams status`` does.

Each source is read on its own: one that fails (the outbox database down, a store that
cannot be opened) is reported on the page with its error, and the others are still shown.
A target's breaker lives in the relay's memory; its effect is visible here as the target's
HELD events (held back while its breaker is open or it is unavailable).
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from tidings.config import TidingsConfig
from tidings.console.intermediaries import intermediaries_of
from tidings.outbox.incomplete import BlockingEvent, IncompleteEvents
from tidings.outbox.schema import ensure_schema
from tidings.pipeline.standby import RelayLeaseState, relay_lease_state
from tidings.pipeline.status import HealthReport, health_report
from tidings.redaction import scrub
from tidings.routing.table import current_routes
from tidings.streams.consumers.admin import StreamStatus, open_store, stream_status
from tidings.system.parts import host_port
from tidings.system.state import RUN_DIR_ENV, RunFiles, read_state

#: How long a port is given to accept before its part counts as down.
CONNECT_TIMEOUT_S = 0.5
#: The supervisor's states of a part on its way (back) up.
_COMING_UP = frozenset({"waiting", "starting"})


@dataclass
class PartView:
    """One part as the overview shows it."""

    name: str
    kind: str
    address: str
    state: str  # up, down, restarting, unknown
    restarts: int | None = None
    detail: str = ""


@dataclass
class Overview:
    """Everything the overview page shows, taken at ``at`` (epoch seconds)."""

    at: float
    health: HealthReport | None = None
    lease: RelayLeaseState | None = None
    parts: list[PartView] = field(default_factory=list)
    streams: dict[str, list[StreamStatus]] = field(default_factory=dict)
    #: The FAILED events holding keys, oldest first (at most 20).
    blocking: list[BlockingEvent] = field(default_factory=list)
    supervised: bool = False
    problems: list[str] = field(default_factory=list)


def take_overview(config: TidingsConfig, config_path: Path | None, engine: Engine) -> Overview:
    """A snapshot of the deployment now (blocking: run it in a worker thread)."""
    overview = Overview(time.time())
    try:
        ensure_schema(engine)  # the routes table may not exist yet on a new outbox
        routes = current_routes(config, engine)
        overview.health = health_report(engine, routes, errors=5)
        overview.lease = relay_lease_state(engine)
        if overview.health.keys_held_behind_failed:
            overview.blocking = IncompleteEvents(engine, routes.targets_for).blocking(20)
    except Exception as exc:  # the database down: said on the page, the rest still shown
        overview.problems.append(f"outbox database: {_one_line(exc)}")
    supervisor = _supervisor_state(config_path, overview)
    overview.parts = _parts(config, overview, supervisor)
    overview.streams = read_streams(config, overview.problems)
    return overview


def read_streams(config: TidingsConfig, problems: list[str]) -> dict[str, list[StreamStatus]]:
    """Each server's streams and their consumers, as ``tidings streams status`` reads them
    from the server's store; a store that cannot be read adds a line to ``problems``."""
    found = {}
    for name, server in config.servers.items():
        if not server.streams:
            continue
        try:
            store = open_store(server)
            try:
                found[name] = [stream_status(store, s) for s in server.streams]
            finally:
                store.close()
        except Exception as exc:
            problems.append(f"server {name}'s store: {_one_line(exc)}")
    return found


def _supervisor_state(config_path: Path | None, overview: Overview) -> dict[str, Any]:
    if config_path is None:
        return {}
    run_dir = os.environ.get(RUN_DIR_ENV)
    try:
        state = read_state(RunFiles.of(config_path, Path(run_dir) if run_dir else None))
    except Exception as exc:
        overview.problems.append(f"tidings run's state: {_one_line(exc)}")
        return {}
    if state is None or not state.get("running"):
        return {}
    overview.supervised = True
    parts: dict[str, Any] = state.get("parts", {})
    return parts


def _parts(config: TidingsConfig, overview: Overview, supervisor: dict[str, Any]) -> list[PartView]:
    """The relay, each server, each intermediary (with its port tried) and each target."""
    views = []
    lease = overview.lease
    relay_state = "unknown" if lease is None else ("up" if lease.active else "down")
    if config.targets:
        detail = "" if lease is None or not lease.active else f"lease held by {lease.active}"
        if lease is not None and lease.standby:
            detail += f"; standby: {', '.join(lease.standby)}"
        views.append(
            _with_supervisor(PartView("relay", "relay", "", relay_state, None, detail), supervisor)
        )
    for name, server in config.servers.items():
        address = server.eventer_server.address
        views.append(_probed(f"server.{name}", "server", address, supervisor))
    for part, settings in intermediaries_of(config).items():
        views.append(_probed(part, "intermediary", settings.listen, supervisor))
    health = overview.health
    for name, target in config.targets.items():
        figures = None if health is None else health.targets.get(name)
        if figures is None:
            state, detail = ("unknown", "") if health is None else ("ok", "nothing owed")
        elif figures.held:
            state = "held"
            detail = f"{figures.held} held (breaker open or target unavailable)"
        elif figures.failed:
            state, detail = "failing", f"{figures.failed} failed"
        else:
            state, detail = "ok", f"{figures.pending} pending"
        views.append(PartView(f"target.{name}", f"target ({target.kind})", "", state, None, detail))
    return views


def _probed(name: str, kind: str, address: str, supervisor: dict[str, Any]) -> PartView:
    host, port = host_port(address)
    state = "up" if _accepts(host, port) else "down"
    return _with_supervisor(PartView(name, kind, f"{host}:{port}", state), supervisor)


def _with_supervisor(view: PartView, supervisor: dict[str, Any]) -> PartView:
    """Add ``tidings run``'s restarts, and say *restarting* for a part it is bringing back."""
    part = supervisor.get(view.name)
    if part is not None:
        view.restarts = int(part.get("restarts", 0))
        if view.state != "up" and part.get("state") in _COMING_UP:
            view.state = "restarting"
    return view


def _accepts(host: str, port: int) -> bool:
    with (
        contextlib.suppress(OSError),
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S),
    ):
        return True
    return False


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return scrub(f"{type(exc).__name__}: {text[0] if text else ''}")[:300]
