"""The ``tidings`` command line, one module per part: :mod:`.pipeline` (demo, relay,
replay, housekeep, status, routes), :mod:`.events` (incomplete events), :mod:`.server` and
:mod:`.streams` (consume, streams).

Commands import what they run inside their bodies, so that ``tidings --help`` and a quick
command do not pay for Spark, SQLAlchemy or the server.
"""

from tidings.cli import events, pipeline, server, streams
from tidings.cli.common import app

__all__ = ["app", "events", "pipeline", "server", "streams"]
