"""The layers of tidings hold: a part imports only the parts below it.

The order is ARCHITECTURE.md's "Layout: layers, bottom first", with the top-level modules
placed among the packages. Every ``import`` and ``from ... import`` in ``src/tidings`` counts,
at module level and inside functions alike (a lazy import is still a dependency), relative
ones resolved, and so does ``importlib.import_module`` of a constant name. A second check
loads the client and the event model in a fresh interpreter and looks for the database and
Spark stacks, which neither may need.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

import tidings
from tests.support.helpers import HEAVY, fresh_interpreter, heavy_modules_after, parse_python

#: Bottom first. Where ARCHITECTURE.md lists parts side by side (``errors``, ``events``;
#: ``config``, ``db``; ``outbox``, ``routing``; ``cli``, ``demo``) this fixes an order between
#: them: the one their imports already follow (the CLI runs the demo, so ``demo`` comes
#: first). ``tidings`` is the package itself, the public face above everything.
LAYERS = (
    "errors",
    "json_text",  # a peer's JSON object decoded, or a ProtocolError naming the peer
    "redaction",  # secrets kept out of errors, logs and shown configurations
    "events",  # the one event model: no SQLAlchemy, no Spark
    "address",  # tcp+sbs:// addresses, checked by the configuration, used by the wire
    "logs",
    "tasks",  # stopping a background asyncio task, one way for every part
    "accept",  # TCP accept under a per-address bound, TLS state only after a first byte
    "serving",  # uvicorn on a socket bound here, for the streams and the intermediaries
    "config",
    "db",
    "outbox",
    "routing",
    "wire",
    "server",
    "client",
    "targets",
    "pipeline",
    "streams",
    "intermediary",
    "system",  # the deployment as one: the whole-system check, the supervisor of its parts
    "console",  # the operator's web console: reads every part below, acts through the outbox
    "demo",
    "cli",
    "tidings",
)
RANK = {name: rank for rank, name in enumerate(LAYERS)}
PACKAGE = Path(tidings.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> str:
    """The layer of a module of tidings: its top-level package or module under tidings."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "tidings"


def _import_module_argument(node: ast.Call) -> str | None:
    """The module an ``importlib.import_module("...")`` (or a bare ``import_module``) call
    with a constant string names; None for any other call."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name != "import_module" or not node.args:
        return None
    argument = node.args[0]
    if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
        return argument.value
    return None


def _imported(path: Path, node: ast.Import | ast.ImportFrom | ast.Call) -> list[str]:
    """The modules of tidings ``node`` imports (``from tidings import client`` is the client,
    ``importlib.import_module("tidings.x")`` imports ``tidings.x``)."""
    if isinstance(node, ast.Call):
        argument = _import_module_argument(node)
        names = [] if argument is None else [argument]
    elif isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = _module_name(path).split(".")
            if path.name != "__init__.py":
                package = package[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join([*package, *([base] if base else [])])
        names = [base]
        if base == "tidings":
            names = [f"tidings.{alias.name}" for alias in node.names]
    return [name for name in names if name == "tidings" or name.startswith("tidings.")]


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_module_is_placed_in_a_layer() -> None:
    unplaced = sorted({_layer(_module_name(p)) for p in _sources()} - set(LAYERS))
    assert not unplaced, f"parts of tidings missing from LAYERS: {unplaced}"


def test_no_module_imports_a_layer_above_its_own() -> None:
    violations = []
    for path in _sources():
        own = _layer(_module_name(path))
        tree = parse_python(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom | ast.Call):
                continue
            for target in _imported(path, node):
                layer = _layer(target)
                if layer not in RANK:  # ``from tidings import X`` of a name, not a module
                    layer = "tidings"
                if layer != own and RANK[layer] > RANK.get(own, -1):
                    where = path.relative_to(PACKAGE.parent.parent)
                    violations.append(
                        f"{where}:{node.lineno}: {ast.unparse(node)} ({own} imports {layer})"
                    )
    assert not violations, "imports against the layers:\n" + "\n".join(violations)


def test_the_layer_check_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    """The walker itself: imports inside functions and relative imports are resolved, and
    ``import_module`` with a constant name counts as an import (with a variable it cannot)."""
    source = (
        "from . import codec\n"
        "from ..server import store\n"
        "def later(name):\n"
        "    import tidings.pipeline.relay\n"
        "    from tidings import client\n"
        "    importlib.import_module('tidings.pipeline.metrics')\n"
        "    import_module('tidings.streams.app')\n"
        "    importlib.import_module(name)\n"
    )
    path = PACKAGE / "wire" / "example.py"
    found = [
        target
        for node in ast.walk(parse_python(source))
        if isinstance(node, ast.Import | ast.ImportFrom | ast.Call)
        for target in _imported(path, node)
    ]
    assert sorted(found) == [
        "tidings.client",
        "tidings.pipeline.metrics",
        "tidings.pipeline.relay",
        "tidings.server",
        "tidings.streams.app",
        "tidings.wire",
    ]


@pytest.mark.parametrize(
    "statement",
    [
        "import tidings.client",
        # every module of the event model, not just the package's __init__
        "import importlib, pkgutil, tidings.events\n"
        "for m in pkgutil.walk_packages(tidings.events.__path__, 'tidings.events.'):\n"
        "    importlib.import_module(m.name)",
    ],
    ids=["client", "events"],
)
def test_the_client_and_the_event_model_load_neither_sqlalchemy_nor_pyspark(
    statement: str,
) -> None:
    loaded = heavy_modules_after(statement)
    assert loaded == {top: [] for top in HEAVY}, f"{statement!r} loaded {loaded}"


def test_a_server_configuration_loads_no_other_part_of_the_server() -> None:
    """Validating ``tidings server``'s configuration needs neither the engine nor the store
    (nor their SQLAlchemy tables): ``tidings.config.server``, its model, imports nothing of the
    server."""
    loaded = fresh_interpreter(
        "import sys, tidings.config.server\n"
        "print(sorted(m for m in sys.modules if m.startswith('tidings.server.')))"
    )
    assert loaded == "[]"


# --- inside the packages: a declared order per package, and no cycle anywhere --------------

#: Inside each package of tidings, its modules and sub-packages bottom first (one line a
#: package, names apart by spaces): a module imports only the siblings listed before its own
#: (its package's ``__init__``, the package's face, may import them all, and no module of
#: the package imports it). Every package is here; docs/layout.md says what each one does.
PACKAGE_ORDER_TEXT: dict[str, str] = {
    "tidings": " ".join(LAYERS[:-1]),
    "tidings.events": "timeutil ids model sources matching data_filter validation query outbox",
    "tidings.config": (
        "model metrics listener login_throttle loading passwords tls certificates console targets "
        "relay intermediary_access intermediary "
        "intermediary_tier eventer_access log_retention server stream_types stream_access streams "
        "tidings_file"
    ),
    "tidings.outbox": "envelope schema confirmations stream_ids checks incomplete writers producer",
    "tidings.routing": "table",
    "tidings.targets": "base destination loop_thread faults rounds secrets kinds registry routed",
    "tidings.targets.kinds": (
        "event_store server_group resend_window event_server_config event_server jetstream "
        "rabbitmq rabbitmq_stream redis_stream mqtt webhook"
    ),
    "tidings.targets.kinds.jetstream": "messages stream config security calls target",
    "tidings.targets.kinds.rabbitmq": "messages config target",
    "tidings.targets.kinds.rabbitmq_stream": "messages config connection sender target",
    "tidings.targets.kinds.redis_stream": "entries config connection target",
    "tidings.targets.kinds.mqtt": "messages config link target",
    "tidings.targets.kinds.webhook": "answers cloudevent config target",
    "tidings.pipeline": (
        "class_archive jobconfig publishing lease standby source spark replay relay_query "
        "warmup relay archive_layout housekeeping status metrics"
    ),
    "tidings.pipeline.publishing": "retry breaker outcome delivery publisher",
    "tidings.pipeline.source": "runner_exit slices watermark queries workerheap task datasource",
    "tidings.pipeline.housekeeping": "selection archiving run",
    "tidings.wire": (
        "lag receive_queue prescan codec envelope frame_reader chatter chatter_client "
        "chatter_server"
    ),
    "tidings.server": (
        "store backends module_interface engine hat_modules modules writing change_feed "
        "async_engine eventer syncer log_retention monitor metrics hat_lmdb hat_import runner"
    ),
    "tidings.server.store": (
        "driver schema counters copies sources planning appending facade type_patterns queries "
        "latest_by_key "
        "positions retention census limits"
    ),
    "tidings.server.backends": "postgresql sqlite",
    "tidings.server.writing": "queue durability",
    "tidings.server.eventer": "counters access notify query_replies registrations server",
    "tidings.server.syncer": "common client server",
    "tidings.streams": "protocol typemap consumers service client spark_source jobs",
    "tidings.streams.protocol": "ftn3 interfaces encoding channel",
    "tidings.streams.consumers": ("replication positions sync compaction retention admin metrics"),
    "tidings.streams.service": (
        "auth refusals slow_clients selection access feed reader push sessions functions app runner"
    ),
    "tidings.intermediary": (
        "staleness regions node views feed publisher serving client cluster measurement"
    ),
    "tidings.intermediary.regions": "geometry coverage coveredcells grid",
    "tidings.intermediary.node": (
        "batches buffers snapshot state scheduling generation roundgen placements publisher_store "
        "subscriber_store subscribe applied intermediary"
    ),
    "tidings.intermediary.views": (
        "patterns grants rows primitives sqlviews sqltables messages eventviews resync "
        "event_server_upstream"
    ),
    "tidings.intermediary.feed": "wire remote resilient",
    "tidings.intermediary.publisher": "simulation server",
    "tidings.intermediary.serving": (
        "credentials addresses access page envelope counters limits ring announcer connection "
        "requests transport status metrics service"
    ),
    "tidings.intermediary.client": "subscriber client handover",
    "tidings.intermediary.cluster": (
        "responsibility directory children peers areas member membership in_process "
        "member_process process_cluster tier"
    ),
    "tidings.intermediary.measurement": (
        "wsreceive fanout intermediary_process subscriber_process demo"
    ),
    "tidings.system": "parts checks paths tls_files state children supervisor",
    "tidings.console": (
        "logins audit history drawing intermediaries overview browse routes tail actions app runner"
    ),
    "tidings.demo": "bank alerts deployment watchers verdict core chain",
    "tidings.cli": (
        "common relay_progress config events server hat_import streams intermediary tls fanout "
        "system console pipeline demo __main__"
    ),
}
PACKAGE_ORDER = {package: tuple(order.split()) for package, order in PACKAGE_ORDER_TEXT.items()}


@functools.cache
def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in _sources()}


@functools.cache
def _edges() -> dict[str, set[str]]:
    """Every module of tidings to the modules of tidings it imports (lazy, ``TYPE_CHECKING``
    and relative imports included): ``from pkg import name`` is an edge to ``pkg.name`` where
    that is a module, else to ``pkg`` (its ``__init__``)."""
    modules = _modules()

    def resolve(name: str) -> str:
        while name not in modules:
            name = name.rpartition(".")[0]
        return name

    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(parse_python(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                bases = _imported(path, node)
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for base in bases
                    for alias in node.names
                ]
            elif isinstance(node, ast.Import | ast.Call):
                targets = _imported(path, node)
            else:
                continue
            edges[name].update(resolve(target) for target in targets)
        edges[name].discard(name)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles() -> None:
    cycles = _cycles(_edges())
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_check_finds_a_cycle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(edges) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def _packages() -> list[str]:
    return sorted(_module_name(path) for path in _sources() if path.name == "__init__.py")


def _children(package: str) -> set[str]:
    depth = package.count(".") + 1
    return {
        name.split(".")[depth]
        for name in _modules()
        if name.startswith(package + ".") and name.count(".") >= depth
    }


def test_every_package_declares_the_order_of_its_modules() -> None:
    problems = []
    for package in _packages():
        declared = PACKAGE_ORDER.get(package)
        if declared is None:
            problems.append(f"{package}: no declared order")
            continue
        children = _children(package)
        if missing := sorted(children - set(declared)):
            problems.append(f"{package}: not placed: {missing}")
        if stale := sorted(set(declared) - children):
            problems.append(f"{package}: no such module: {stale}")
    assert not problems, "PACKAGE_ORDER:\n" + "\n".join(problems)


def test_inside_a_package_a_module_imports_only_siblings_before_its_own() -> None:
    violations = []
    for source, targets in _edges().items():
        for target in targets:
            for package, order in PACKAGE_ORDER.items():
                prefix = package + "."
                if not (source.startswith(prefix) and target.startswith(prefix)):
                    continue
                own = source[len(prefix) :].split(".")[0]
                other = target[len(prefix) :].split(".")[0]
                if (
                    own != other
                    and own in order
                    and other in order
                    and order.index(other) > order.index(own)
                ):
                    violations.append(f"{source} imports {target} ({own} is below {other})")
            # ``python -m`` runs a package's ``__main__`` on top of its face
            if source.startswith(target + ".") and not source.endswith(".__main__"):
                violations.append(f"{source} imports its own package's face {target}")
    assert not violations, "imports against a package's order:\n" + "\n".join(sorted(violations))


def test_the_docs_layout_page_names_every_package() -> None:
    """docs/layout.md mirrors the tree: every package and sub-package has its line."""
    page = (PACKAGE.parent.parent / "docs" / "layout.md").read_text()
    missing = [package for package in _packages() if f"| `{package}` |" not in page]
    assert not missing, f"docs/layout.md has no line for: {missing}"
