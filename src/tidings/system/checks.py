"""The whole-system check: do the parts of one ``tidings.yaml`` fit each other?

Each part's section is valid on its own once the file loads; what no single model can see is
how they meet. :func:`system_findings` looks at that, from the configuration alone (no
network, no files), and returns one line per problem naming both sides:

- two parts listening on one port (Eventer, Syncer, streams, metrics, intermediaries, the
  members of intermediary tiers, the relay's metrics, the console) as binding sees it:
  ``localhost`` is ``127.0.0.1``, an unspecified address such as ``0.0.0.0`` overlaps every
  other on its port, and port 0 (any free port) never clashes;
- an ``event_server`` target or an intermediary following an address no configured server
  listens on (checked when the file has ``servers:``), or following it with TLS where the
  server serves without, or the other way round;
- a stream type pattern that no route delivers into its server, naming the type prefixes
  the targets into that server use (so a prefix that differs between target and stream is
  named as such);
- an intermediary table whose row events no route delivers into the server it follows;
- an intermediary tier whose spatial upstream is where a part of the file listens.

A server counts as fed by an ``event_server`` target with its Eventer address, and by an
``event_store`` target on its SQLite file. Routes through ``routing.default`` and targets
with a ``type_template`` can deliver any type, so they satisfy every pattern of their
server: the check never claims what it cannot know.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tidings.address import is_tls
from tidings.config import TidingsConfig
from tidings.config.stream_types import type_patterns
from tidings.config.streams import StreamServerConfig
from tidings.events.matching import QueryType, matches
from tidings.system.parts import host_port

_ANY_HOST = {"0.0.0.0", "::", ""}
#: Names that bind where an address does (what ``localhost`` resolves to on every system
#: tidings runs on).
_SAME_AS = {"localhost": "127.0.0.1"}


@dataclass(frozen=True)
class _Listener:
    where: str
    host: str
    port: int


@dataclass
class _Feed:
    """What the routes deliver into one server: exact types, and whether anything goes."""

    types: set[tuple[str, ...]]
    prefixes: set[tuple[str, ...]]
    anything: bool = False


def _listeners(config: TidingsConfig) -> list[_Listener]:
    found: list[_Listener] = []
    for name, server in config.servers.items():
        at = f"servers.{name}"
        found.append(_Listener(f"{at}.eventer_server", *host_port(server.eventer_server.address)))
        if server.syncer_server is not None:
            found.append(_Listener(f"{at}.syncer_server", *host_port(server.syncer_server.address)))
        if server.metrics is not None:
            found.append(_Listener(f"{at}.metrics", server.metrics.address, server.metrics.port))
        ports_seen: set[tuple[str, int]] = set()
        for index, stream in enumerate(server.streams):
            if (stream.host, stream.port) not in ports_seen:  # a server's streams share a port
                ports_seen.add((stream.host, stream.port))
                found.append(_Listener(f"{at}.streams[{index}]", stream.host, stream.port))
    if config.targets and config.metrics.port is not None:
        found.append(_Listener("metrics", config.metrics.address, config.metrics.port))
    sections = dict(config.intermediaries)
    named = {f"intermediaries.{n}": s for n, s in sections.items()}
    if "intermediary" in config.model_fields_set:
        named["intermediary"] = config.intermediary
    found.extend(_Listener(f"{w}.listen", *host_port(s.listen)) for w, s in named.items())
    for name, tier in config.intermediary_tiers.items():
        found.extend(
            _Listener(f"intermediary_tiers.{name}.members[{i}]", *host_port(member))
            for i, member in enumerate(tier.members)
        )
    if config.console is not None:
        found.append(_Listener("console", config.console.host, config.console.port))
    return found


def _binds_together(a: _Listener, b: _Listener) -> bool:
    """Whether binding ``b`` fails once ``a`` is bound: one port (not 0, which binds any
    free one) on one address, an unspecified address taking the port on all of them."""
    if a.port != b.port or a.port == 0:
        return False
    hosts = [_SAME_AS.get(h.lower(), h.lower()) for h in (a.host, b.host)]
    return hosts[0] == hosts[1] or any(h in _ANY_HOST for h in hosts)


def _port_clashes(config: TidingsConfig) -> list[str]:
    listeners = _listeners(config)
    findings = []
    for i, a in enumerate(listeners):
        for b in listeners[i + 1 :]:
            if _binds_together(a, b):
                findings.append(f"{a.where} and {b.where} both listen on port {a.port}")
    return findings


def _tier_upstreams(config: TidingsConfig) -> list[str]:
    """A tier whose spatial upstream is where a part of the file listens: members would
    follow an intermediary, an event server or themselves, never a spatial publisher."""
    listeners = _listeners(config)
    findings = []
    for name, tier in config.intermediary_tiers.items():
        url = tier.spatial.upstream
        host, port = host_port(url.partition("://")[2].partition("/")[0])
        for listener in listeners:
            if listener.port == port and (listener.host == host or listener.host in _ANY_HOST):
                findings.append(
                    f"intermediary_tiers.{name}.spatial.upstream {url}: {listener.where} "
                    "listens there, not a spatial publisher"
                )
    return findings


def _server_addresses(config: TidingsConfig) -> dict[tuple[str, int], str]:
    return {host_port(s.eventer_server.address): n for n, s in config.servers.items()}


def _unserved_addresses(config: TidingsConfig) -> list[str]:
    if not config.servers:
        return []
    served = _server_addresses(config)
    listed = ", ".join(f"{n} ({s.eventer_server.address})" for n, s in config.servers.items())
    findings = []
    followers = [
        (
            f"targets.{name}.{'addresses' if getattr(target, 'addresses', None) else 'address'}",
            str(address),
        )
        for name, target in config.targets.items()
        if target.kind == "event_server"
        for address in getattr(target, "server_addresses", [])
    ]
    followers += [
        (f"intermediaries.{n}.event_server", address)
        for n, i in config.intermediaries.items()
        for address in i.event_servers
    ]
    for where, address in followers:
        server = served.get(host_port(address))
        if server is None:
            findings.append(
                f"{where} {address}: no configured server listens there (servers: {listed})"
            )
        elif is_tls(address) != is_tls(served_at := config.servers[server].eventer_server.address):
            findings.append(
                f"{where} {address}: server {server} listens there as {served_at}; client and "
                "server must both use TLS (ssl+sbs://) or both not (tcp+sbs://)"
            )
    return findings


def _sqlite_file(server: StreamServerConfig) -> Path | None:
    options = server.backend.options()
    if server.backend.module.endswith(".sqlite") and "db_path" in options:
        return server.resolve(str(options["db_path"])).resolve()
    return None


def _feeds(config: TidingsConfig) -> dict[str, _Feed]:
    """Per server, what the routes deliver into it."""
    by_address = _server_addresses(config)
    by_file = {f: n for n, s in config.servers.items() if (f := _sqlite_file(s)) is not None}
    into: dict[str, list[str]] = {name: [] for name in config.servers}  # server -> targets
    for name, target in config.targets.items():
        servers: list[str | None] = []
        if target.kind == "event_server":  # a redundant group: each of its servers
            addresses = getattr(target, "server_addresses", [])
            servers = [by_address.get(host_port(str(address))) for address in addresses]
        elif target.kind == "event_store":
            url = str(getattr(target, "url", ""))
            if url.startswith("sqlite:///"):
                servers = [by_file.get(Path(url.removeprefix("sqlite:///")).resolve())]
        for server in servers:
            if server is not None:
                into[server].append(name)
    feeds = {}
    for server, targets in into.items():
        feed = _Feed(set(), set())
        for name in targets:
            target = config.targets[name]
            prefix = tuple(getattr(target, "type_prefix", ()) or ())
            feed.prefixes.add(prefix)
            if getattr(target, "type_template", None) is not None or name in config.routing.default:
                feed.anything = True
            for event_type, names in config.routing.routes.items():
                if name in names:
                    feed.types.add((*prefix, event_type))
        feeds[server] = feed
    return feeds


def _delivers(feed: _Feed, pattern: QueryType) -> bool:
    return feed.anything or any(matches(t, pattern) for t in feed.types)


def _prefixes(feed: _Feed) -> str:
    shown = sorted("[" + ", ".join(p) + "]" for p in feed.prefixes)
    return f"the targets into it use type_prefix {' or '.join(shown) or 'none'}"


def _unfed_streams(config: TidingsConfig, feeds: dict[str, _Feed]) -> list[str]:
    findings = []
    for name, server in config.servers.items():
        feed = feeds[name]
        if not feed.prefixes:
            continue  # no target delivers into it: its events come from its own clients
        for index, stream in enumerate(server.streams):
            for type_name, patterns in type_patterns(stream.types).items():
                for pattern in patterns:
                    if not _delivers(feed, pattern):
                        findings.append(
                            f"servers.{name}.streams[{index}].types.{type_name} "
                            f"{list(pattern)}: no route delivers such events into server "
                            f"{name} ({_prefixes(feed)})"
                        )
    return findings


def _unfed_tables(config: TidingsConfig, feeds: dict[str, _Feed]) -> list[str]:
    by_address = _server_addresses(config)
    findings = []
    for name, section in config.intermediaries.items():
        server = by_address.get(host_port(section.event_servers[0]))
        if server is None:
            continue
        feed = feeds[server]
        for table in section.tables:
            row_type = (*section.row_type_prefix, f"rows.{table.lower()}")
            if not _delivers(feed, row_type):
                findings.append(
                    f"intermediaries.{name}.tables.{table}: no route delivers its row events "
                    f"{list(row_type)} into server {server} (route rows.{table.lower()} to a "
                    f"target into it; row_type_prefix {list(section.row_type_prefix)}, "
                    f"{_prefixes(feed)})"
                )
    return findings


def _module_problems(config: TidingsConfig) -> list[str]:
    """The engine modules of every server and ``event_store`` target that would not load."""
    from tidings.server.modules import module_problems  # the engine, only if checked

    problems: list[str] = []
    for name, server in config.servers.items():
        entries = [module.as_dict() for module in server.engine.modules]
        problems += module_problems(f"servers.{name}.engine.modules", entries)
    for name, target in config.targets.items():
        modules = getattr(target, "modules", None)
        if modules:
            entries = [module.as_dict() for module in modules]
            problems += module_problems(f"targets.{name}.modules", entries)
    return problems


def system_findings(config: TidingsConfig) -> list[str]:
    """Every problem in how the parts of ``config`` fit together, one line each."""
    feeds = _feeds(config)
    return [
        *_port_clashes(config),
        *_tier_upstreams(config),
        *_unserved_addresses(config),
        *_unfed_streams(config, feeds),
        *_unfed_tables(config, feeds),
        *_module_problems(config),
    ]
