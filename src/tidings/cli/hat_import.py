"""``tidings import-hat``: a hat-event 0.8.5 lmdb database into a tidings event store.

A command of its own, beside ``tidings server`` rather than under it, so that ``tidings
server``'s options keep meaning the server to run.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from tidings.cli.common import app, console, err, fail

#: Seconds between two progress lines.
_PROGRESS_EVERY_S = 2.0


@app.command("import-hat")
def import_hat(
    lmdb_path: Annotated[
        Path, typer.Argument(help="The hat-event 0.8.5 lmdb database (its backend's db_path).")
    ],
    conf: Annotated[
        Path | None,
        typer.Option(
            "--conf",
            help="The tidings server's configuration: import into the store of its backend, "
            "as its engine.server_id.",
        ),
    ] = None,
    url: Annotated[
        str | None,
        typer.Option(
            help="Or the store's database URL (sqlite:///FILE, postgresql://...).",
        ),
    ] = None,
    batch: Annotated[int, typer.Option(min=1, help="Events per transaction.")] = 5000,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Import the events of a hat-event 0.8.5 lmdb database (ids, timestamps, types,
    payloads) into a tidings event store, continue its servers' session numbering, and
    check the result (count and latest event per type). Run it again to finish an
    interrupted import; a finished one imports nothing more. Exit code 1 if the check finds
    a difference."""
    import json
    import sys

    from tidings.config.streams import load_stream_server_config_file
    from tidings.server.backends import open_backend
    from tidings.server.hat_import import import_hat as run_import
    from tidings.server.store import EventStore

    if (conf is None) == (url is None):
        fail("give the store to import into: --conf SERVER_FILE or --url DATABASE_URL")
    if conf is not None:
        cfg = load_stream_server_config_file(conf)
        store = open_backend(
            cfg.backend.module, cfg.backend.options(), cfg.engine.server_id, cfg.base_dir
        )
    else:
        assert url is not None
        store = EventStore(url)
    started = time.monotonic()
    last_shown = 0.0  # the first batch is shown at once

    def progress(imported: int) -> None:
        nonlocal last_shown
        now = time.monotonic()
        if now - last_shown >= _PROGRESS_EVERY_S:
            last_shown = now
            err.print(f"import-hat: {imported} events imported into {store.url} ...", markup=False)

    try:
        report = run_import(lmdb_path, store, batch=batch, progress=progress)
    finally:
        store.close()
    seconds = time.monotonic() - started
    if as_json:
        sys.stdout.write(json.dumps(report.as_json(), indent=2) + "\n")
    else:
        servers = ", ".join(
            f"server {s} after {i.session}/{i.instance}" for s, i in sorted(report.servers.items())
        )
        console.print(
            f"{report.imported} events imported in {seconds:.1f} s; numbering continues: "
            f"{servers or 'no servers'}",
            markup=False,
        )
        verdict = "equal" if report.equal else "DIFFERENT"
        console.print(
            f"checked {report.checked_events} events of {report.checked_types} types: "
            f"counts and latest event per type {verdict}",
            markup=False,
        )
        for difference in report.differences:
            console.print(f"  {difference}", markup=False)
    if not report.equal:
        raise typer.Exit(1)
