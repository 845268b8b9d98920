"""FTN18 streams in Spark: the tidings_stream source (exactly once across restarts,
acknowledged on commit), the archiver and the aggregation job, on a real local SparkSession
against a real stream server."""

from __future__ import annotations

import json
import time

import pytest

from tests.support.stream_helpers import (
    PASSWORD,
    USER,
    add_events,
    poll,
    serving_in_thread,
    stream_server_config,
)
from tests.support.waiting import run
from tidings.server.store import EventStore
from tidings.streams.jobs import read_stream, start_aggregate, start_archive

pytestmark = [pytest.mark.spark, pytest.mark.sockets]


def _options(url: str, component: str) -> dict[str, str]:
    return {"url": url, "user": USER, "password": PASSWORD, "component": component}


def test_stream_source_reads_each_event_once_across_restarts_and_acknowledges_on_commit(
    spark, tmp_path
) -> None:
    config = stream_server_config(f"sqlite:///{tmp_path}/e.db", secure_channel=True)
    checkpoint = str(tmp_path / "checkpoint")
    got: list[int] = []

    def collect(frame, _batch: int) -> None:
        got.extend(row["id"] for row in frame.orderBy("id").collect())

    def drain(url: str) -> None:
        query = (
            read_stream(spark, _options(url, "SPARK"))
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert query.exception() is None

    with serving_in_thread(config) as server:
        first = run(add_events(server.url, 25))
        drain(server.url)
        assert got == first
        # Committed: the consumer's position is acknowledged on the server.
        assert run(poll(server.url, "SPARK"))["r"] == []
        second = run(add_events(server.url, 10))
        drain(server.url)
        assert got == first + second  # the restart read only the new events


def test_archiver_writes_parquet_and_holds_retention_until_archived(spark, tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/e.db"
    retention = {"enabled": True, "min_age": "0s", "every": "50ms"}
    config = stream_server_config(url, secure_channel=True, retention=retention)
    archive = tmp_path / "archive"
    with serving_in_thread(config) as server:
        ids = run(add_events(server.url, 12, "ORDER")) + run(add_events(server.url, 3, "PAY"))
        query = start_archive(
            spark, _options(server.url, "ARCHIVER"), str(archive), str(tmp_path / "cp"), once=True
        )
        query.awaitTermination(120)
        assert query.exception() is None
        frame = spark.read.parquet(str(archive))
        assert sorted(row["id"] for row in frame.collect()) == ids
        assert {row["type"] for row in frame.select("type").distinct().collect()} == {
            "ORDER",
            "PAY",
        }
        # The archiver acknowledged everything, so retention may discard it now.
        store = EventStore(url)
        try:
            for _ in range(200):
                left = {e.position for e in store.read(0, 1000)} & set(ids)
                if left == {ids[11], ids[14]}:
                    break
                time.sleep(0.05)
            assert left == {ids[11], ids[14]}  # only the latest of each type stays
        finally:
            store.close()


def test_aggregation_stores_each_source_event_once_in_its_order(spark, tmp_path) -> None:
    east = stream_server_config(f"sqlite:///{tmp_path}/east.db", secure_channel=True)
    west = stream_server_config(f"sqlite:///{tmp_path}/west.db", secure_channel=True)
    destination = f"sqlite:///{tmp_path}/aggregate.db"
    checkpoint = str(tmp_path / "cp")
    with serving_in_thread(east) as e, serving_in_thread(west) as w:
        east_ids = run(add_events(e.url, 20))
        west_ids = run(add_events(w.url, 15, "PAY"))
        sources = {"east": _options(e.url, "AGG"), "west": _options(w.url, "AGG")}
        for _ in range(2):  # a second run after "a crash" adds nothing twice
            query = start_aggregate(spark, sources, destination, ["agg"], checkpoint, once=True)
            query.awaitTermination(120)
            assert query.exception() is None
        more = run(add_events(e.url, 5))
        query = start_aggregate(spark, sources, destination, ["agg"], checkpoint, once=True)
        query.awaitTermination(120)
    store = EventStore(destination)
    try:
        stored = store.read(0, 1000)
    finally:
        store.close()
    by_source: dict[str, list[int]] = {}
    for event in stored:
        assert event.type[0] == "agg"
        by_source.setdefault(event.type[1], []).append(json.loads(event.payload)["i"])
    assert by_source["east"] == list(range(20)) + list(range(5))
    assert by_source["west"] == list(range(15))
    assert len(stored) == len(east_ids) + len(west_ids) + len(more)
    positions = [event.position for event in stored]
    assert positions == sorted(set(positions))  # new ids, increasing


def test_aggregate_command_runs_from_its_configuration(tmp_path) -> None:
    import os
    import subprocess
    import sys

    import yaml

    source = stream_server_config(f"sqlite:///{tmp_path}/src.db", secure_channel=True)
    destination = f"sqlite:///{tmp_path}/aggregate.db"
    with serving_in_thread(source) as server:
        ids = run(add_events(server.url, 7))
        config = {
            "sources": {
                "src": {
                    "url": server.url,
                    "user": USER,
                    "password_env": "TIDINGS_TEST_SOURCE_PASSWORD",
                    "component": "AGGCLI",
                }
            },
            "destination": {"database": destination, "type_prefix": ["agg"]},
            "checkpoint_dir": str(tmp_path / "cp"),
            "spark_master": "local[1]",
        }
        path = tmp_path / "aggregate.yaml"
        path.write_text(yaml.safe_dump(config))
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "tidings.cli",
                "streams",
                "aggregate",
                "-c",
                str(path),
                "--once",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            env=os.environ | {"TIDINGS_TEST_SOURCE_PASSWORD": PASSWORD},
        )
        assert done.returncode == 0, done.stderr[-2000:]
    store = EventStore(destination)
    try:
        stored = store.read(0, 100)
    finally:
        store.close()
    assert [json.loads(e.payload)["i"] for e in stored] == list(range(len(ids)))
    assert {e.type for e in stored} == {("agg", "src", "ORDER")}


def test_archive_command_archives_what_is_there(tmp_path) -> None:
    import os
    import subprocess
    import sys

    config = stream_server_config(f"sqlite:///{tmp_path}/e.db", secure_channel=True)
    with serving_in_thread(config) as server:
        ids = run(add_events(server.url, 6))
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "tidings.cli",
                "streams",
                "archive",
                server.url,
                "--dir",
                str(tmp_path / "archive"),
                "--checkpoint",
                str(tmp_path / "cp"),
                "--once",
                "--spark-master",
                "local[1]",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            env=os.environ | {"TIDINGS_STREAM_USER": USER, "TIDINGS_STREAM_PASSWORD": PASSWORD},
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert run(poll(server.url, "ARCHIVER"))["r"] == []  # acknowledged
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "archive")
    assert sorted(table.column("id").to_pylist()) == ids
