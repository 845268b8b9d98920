"""The ``tidings`` command line, one module per part: :mod:`.demo`, :mod:`.pipeline` (relay,
replay, housekeep, status, routes), :mod:`.events` (incomplete events), :mod:`.server`,
:mod:`.hat_import` (import-hat),
:mod:`.streams` (consume, streams), :mod:`.fanout` (fanout-demo), :mod:`.intermediary`
(intermediary serve), :mod:`.system` (run: the whole deployment), :mod:`.tls` (a CA and
certificates), :mod:`.console` (the operator's web console) and :mod:`.config` (config
check, config schema).

Commands import what they run inside their bodies, so that ``tidings --help`` and a quick
command do not pay for Spark, SQLAlchemy or the server.
"""

from tidings.cli import (
    config,
    console,
    demo,
    events,
    fanout,
    hat_import,
    intermediary,
    pipeline,
    server,
    streams,
    system,
    tls,
)
from tidings.cli.common import app

__all__ = [
    "app",
    "config",
    "console",
    "demo",
    "events",
    "fanout",
    "hat_import",
    "intermediary",
    "pipeline",
    "server",
    "streams",
    "system",
    "tls",
]
