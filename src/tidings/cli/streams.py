"""``tidings`` commands of the FTN18 streams: consume, and streams status, unregister,
hash-password."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tidings.cli.common import ServerConfOption, app, console, err, fail, streams_app
from tidings.errors import TidingsError
from tidings.redaction import scrub

if TYPE_CHECKING:
    from tidings.config.streams import StreamServerConfig
    from tidings.server.store import EventStore


@app.command()
def consume(
    url: Annotated[
        str,
        typer.Argument(
            help="The stream's URL, e.g. http://127.0.0.1:8090/evt; for a redundant group, "
            "the URLs of its servers separated by commas (a lost connection moves to the next, "
            "and the consumer resumes there from its last acknowledged event)."
        ),
    ],
    component: Annotated[
        str, typer.Argument(help="Consumer component (1-16 of A-Z a-z 0-9 _); LIVE is live.")
    ],
    live: Annotated[bool, typer.Option(help="Consume live (component LIVE).")] = False,
    want: Annotated[
        str | None, typer.Option(help="Only these FTN18 types, comma separated.")
    ] = None,
    poll: Annotated[bool, typer.Option(help="Poll over HTTP instead of push.")] = False,
    count: Annotated[int | None, typer.Option(min=1, help="Stop after this many events.")] = None,
    connect_timeout: Annotated[
        float,
        typer.Option(
            min=0.1,
            max=86400,
            help="Give up if the stream cannot be reached at first within this many seconds "
            "(once reached, a lost connection is retried for ever, with a warning when it is "
            "lost and one when it is back).",
        ),
    ] = 30.0,
    user: Annotated[
        str, typer.Option(envvar="TIDINGS_STREAM_USER", help="User (env TIDINGS_STREAM_USER).")
    ] = "",
    password: Annotated[
        str,
        typer.Option(
            envvar="TIDINGS_STREAM_PASSWORD",
            help="Password (env TIDINGS_STREAM_PASSWORD; prompted for if unset).",
        ),
    ] = "",
    tls_ca_file: Annotated[
        Path | None,
        typer.Option(
            "--tls-ca-file",
            help="For https:// streams: the CA their certificates are verified against (PEM; "
            "default: the system's CAs).",
        ),
    ] = None,
) -> None:
    """Consume an FTN18 stream and print its events as JSON lines (reliable unless --live)."""
    import asyncio
    import json

    from tidings.errors import ConnectionClosed, StreamError
    from tidings.streams.client import LIVE, StreamEvent, consume

    if not user:
        err.print("error: give --user or set TIDINGS_STREAM_USER", markup=False)
        raise typer.Exit(2)
    if not password:
        password = typer.prompt("password", hide_input=True)
    if live:
        component = LIVE
    tls = None
    if tls_ca_file is not None:
        from tidings.config.tls import TlsClientConfig

        # loaded now: a file that is missing or not a CA is one line naming it (TlsError)
        tls = TlsClientConfig.model_construct(
            ca_file=str(tls_ca_file), cert_file=None, key_file=None, verify=True, server_name=None
        ).context()
    wanted = [t.strip() for t in want.split(",") if t.strip()] if want is not None else None
    urls = [u.strip() for u in url.split(",") if u.strip()]
    printed = 0
    done = asyncio.Event()

    async def show(event: StreamEvent) -> None:
        nonlocal printed
        if done.is_set():
            await asyncio.Event().wait()  # past --count: never acknowledge more
        sys.stdout.write(json.dumps(event.as_dict(), separators=(",", ":")) + "\n")
        sys.stdout.flush()
        printed += 1
        if count is not None and printed >= count:
            done.set()

    async def run() -> None:
        task = asyncio.create_task(
            consume(
                urls,
                user,
                password,
                component,
                show,
                want=wanted,
                push=not poll,
                connect_timeout=connect_timeout,
                tls=tls,
            )
        )
        waiter = asyncio.create_task(done.wait())
        finished, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        for pending in (task, waiter):
            pending.cancel()
        if task in finished:
            task.result()

    try:
        asyncio.run(run())
    except (StreamError, ConnectionClosed) as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def _stream_store(conf: Path | None) -> tuple[StreamServerConfig, EventStore]:
    """The server configuration with streams and its store, or a clear exit."""
    from tidings.config.streams import load_stream_server_config_file
    from tidings.streams.consumers.admin import open_store

    try:
        config = load_stream_server_config_file(conf)
        return config, open_store(config)
    except TidingsError as exc:
        fail(str(exc))


@streams_app.command("status")
def streams_status(
    conf: ServerConfOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Each stream's retained ids and its consumers' positions and lag."""
    import json

    from tidings.streams.consumers.admin import stream_status

    config, store = _stream_store(conf)
    try:
        statuses = [stream_status(store, stream) for stream in config.streams]
    except TidingsError as exc:
        fail(str(exc))
    finally:
        store.close()
    if as_json:
        sys.stdout.write(json.dumps([s.as_dict() for s in statuses], indent=2) + "\n")
        return
    if not statuses:
        console.print("no streams configured")
    for status in statuses:
        span = f"ids {status.first_id}..{status.last_id}" if status.last_id is not None else "empty"
        retention = "retention on" if status.retention else "keeps everything"
        console.print(f"{status.name} ({status.endpoint}): {span}, {retention}", markup=False)
        for c in status.consumers:
            acked = c.acked_at.isoformat(timespec="seconds") if c.acked_at else "never"
            console.print(
                f"  {c.user}:{c.component} at {c.position}, {c.behind} behind, "
                f"last acknowledged {acked}",
                markup=False,
            )


@streams_app.command("unregister")
def streams_unregister(
    stream: str, user: str, component: str, conf: ServerConfOption = None
) -> None:
    """Forget a registered consumer, so that it no longer holds events back."""
    from tidings.streams.consumers.admin import unregister_named

    config, store = _stream_store(conf)
    try:
        try:
            found = unregister_named(config, store, stream, user, component)
        except TidingsError as exc:
            fail(str(exc))
        if not found:
            err.print(f"no consumer {user}:{component} of stream {stream}", markup=False)
            raise typer.Exit(1)
    finally:
        store.close()
    console.print(f"{user}:{component} of {stream} unregistered", markup=False)


@streams_app.command("hash-password")
def streams_hash_password() -> None:
    """Print the hash of a password (read from stdin, or prompted for) for stream_users."""
    from tidings.config.passwords import hash_password

    if sys.stdin.isatty():
        password = typer.prompt("password", hide_input=True, confirmation_prompt=True)
    else:
        password = sys.stdin.readline().rstrip("\n")
    try:
        sys.stdout.write(hash_password(password) + "\n")
    except TidingsError as exc:
        fail(str(exc))


def _run_query(query: object, once: bool) -> None:
    """Wait for a streaming query: to its end with --once, else until Ctrl-C."""
    try:
        query.awaitTermination()  # type: ignore[attr-defined]
    except KeyboardInterrupt:
        query.stop()  # type: ignore[attr-defined]
    error = query.exception()  # type: ignore[attr-defined]
    if error is not None:
        err.print(f"error: the query failed: {scrub(str(error))}", markup=False)
        raise typer.Exit(1)
    if once:
        console.print("done: everything available was processed", markup=False)


@streams_app.command("archive")
def streams_archive(
    url: Annotated[str, typer.Argument(help="The stream's URL.")],
    archive_dir: Annotated[Path, typer.Option("--dir", help="Parquet archive directory.")],
    checkpoint: Annotated[
        Path, typer.Option(help="Spark checkpoint directory (keep it with the archive).")
    ],
    component: Annotated[str, typer.Option(help="The archiver's consumer component.")] = (
        "ARCHIVER"
    ),
    user: Annotated[
        str, typer.Option(envvar="TIDINGS_STREAM_USER", help="User (env TIDINGS_STREAM_USER).")
    ] = "",
    once: Annotated[bool, typer.Option(help="Archive what is there now, then stop.")] = False,
    spark_master: Annotated[str, typer.Option(help="Spark master URL.")] = "local[*]",
) -> None:
    """Archive a stream as Parquet (day/type partitions), as a registered consumer: with
    retention on, nothing is discarded before it is archived. The password comes from
    TIDINGS_STREAM_PASSWORD."""
    from pydantic import ValidationError

    from tidings.config import RelayConfig
    from tidings.config.loading import error_message
    from tidings.config.streams import StreamSourceConfig
    from tidings.pipeline.spark import spark_session
    from tidings.streams.jobs import start_archive
    from tidings.streams.spark_source import StreamOptions

    try:
        source = StreamSourceConfig(
            url=url, user=user, password_env="TIDINGS_STREAM_PASSWORD", component=component
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        fail(f"{'.'.join(map(str, first['loc']))}: {error_message(first)}")
    StreamOptions.of(source.options()).check()  # before Spark: one line if it fails
    spark = spark_session(RelayConfig(spark_master=spark_master), "tidings-stream-archive")
    try:
        query = start_archive(spark, source.options(), str(archive_dir), str(checkpoint), once=once)
    except TidingsError as exc:
        fail(str(exc))
    _run_query(query, once)


@streams_app.command("aggregate")
def streams_aggregate(
    config: Annotated[Path, typer.Option("--config", "-c", help="Aggregation YAML file.")],
    once: Annotated[bool, typer.Option(help="Aggregate what is there now, then stop.")] = False,
) -> None:
    """Aggregate several FTN18 streams into one event store with new ids (FTN18 2.3.3):
    each source's order kept, each event stored once across restarts."""
    from tidings.config import RelayConfig, read_config_data, validate_config
    from tidings.config.streams import AggregateConfig
    from tidings.pipeline.spark import spark_session
    from tidings.streams.jobs import start_aggregate
    from tidings.streams.spark_source import StreamOptions

    try:
        cfg = validate_config(AggregateConfig, read_config_data(config), "aggregation")
    except TidingsError as exc:
        fail(str(exc))
    for name, source in cfg.sources.items():  # before Spark: one line if one fails
        try:
            StreamOptions.of(source.options()).check()
        except TidingsError as exc:
            fail(f"source {name!r}: {exc}")
    spark = spark_session(RelayConfig(spark_master=cfg.spark_master), "tidings-stream-aggregate")
    query = start_aggregate(
        spark,
        {name: source.options() for name, source in cfg.sources.items()},
        cfg.destination.database,
        cfg.destination.type_prefix,
        cfg.checkpoint_dir,
        server_id=cfg.destination.server_id,
        once=once,
        every=cfg.trigger_interval,
    )
    _run_query(query, once)
