"""The rabbitmq target's publishing rate against raw aiormq publishing the same messages.

``python -m bench.rabbitmq [--quick]``: on the local broker (127.0.0.1:5672, guest/guest), a
durable queue bound to a fresh topic exchange takes N persistent messages of the same size,
published with ``mandatory`` and a publisher confirm for every one, twice per shape:

* through :class:`~tidings.targets.kinds.rabbitmq.target.RabbitMQTarget.publish`, in calls
  of ``call`` events as the relay makes them (what the target adds: its loop thread, routing
  keys, properties and headers, per-key chaining);
* by aiormq directly on one confirming channel, the same messages and confirmation level
  (aiormq is the asyncio client aio-pika stands on; the target uses it too, so the ratio is
  the target's own cost).

Two shapes: ``many keys`` (every event of a call has its own key: all in flight at once) and
``one key`` (a call is one key's run: each message waits for the confirm of the one before,
in both). The ratio target/raw is the figure (issue 31's goal: at least 0.8). The exchange
and queue are deleted afterwards.

Then the same for RabbitMQ **streams** (127.0.0.1:5552), into a fresh stream, in the same two
shapes:

* through :class:`~tidings.targets.kinds.rabbitmq_stream.target.RabbitMQStreamTarget`, with
  an outbox log (a SQLite file) attached, as the relay has: what the target adds is its loop
  thread, the AMQP 1.0 messages, and its exactly-once bookkeeping (the lease renewal and the
  publishing ids written per batch, the batch's assignments read);
* by rstream's own ``Producer`` with a named producer (de-duplication on, as the target's),
  the same messages (built as rstream's ``AMQPMessage``, encoded by rstream when sent) in the
  same calls with ``send_batch``, each call waiting for all its confirms.

A stream keeps a key's run in one batch in both, so the shapes differ only in the target's
bookkeeping per key. The stream is deleted afterwards. Prints the figures and writes
``bench/results/rabbitmq.*`` (run it on a quiet machine and put them on the issue).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import aiormq
from aiormq.abc import AbstractChannel
from pamqp.commands import Basic

from bench.harness.machine import code_version, machine_info, machine_text
from bench.harness.report import write_report
from tidings.events.outbox import OutboxEvent
from tidings.targets.kinds.rabbitmq.config import RabbitMQTargetConfig
from tidings.targets.kinds.rabbitmq.messages import message_headers, message_properties
from tidings.targets.kinds.rabbitmq.target import RabbitMQTarget
from tidings.targets.kinds.rabbitmq_stream.config import RabbitMQStreamTargetConfig
from tidings.targets.kinds.rabbitmq_stream.target import RabbitMQStreamTarget

BROKER = "amqp://guest:guest@127.0.0.1:5672/"
PAYLOAD = '{"specversion": "1.0", "type": "OrderCreated", "data": {"order": 1, "pad": "%s"}}'


def events(count: int, one_key: bool, size: int) -> list[OutboxEvent]:
    payload = PAYLOAD % ("x" * max(0, size - len(PAYLOAD)))
    now = datetime.now(UTC)
    return [
        OutboxEvent(
            seq=n + 1,
            event_id=str(uuid.uuid4()),
            event_type="OrderCreated",
            payload=payload,
            logged_at=now,
            partition_key="only" if one_key else f"k{n}",
            headers={"tenant": "acme"},
        )
        for n in range(count)
    ]


def through_target(exchange: str, batch: list[OutboxEvent], call: int) -> float:
    """Messages per second through the target, in calls of ``call`` events."""
    config = RabbitMQTargetConfig(kind="rabbitmq", exchange=exchange, servers=[BROKER])
    target = RabbitMQTarget("bench", config)
    try:
        assert target.publish(batch[:1]) == [None]  # connected before the clock starts
        started = time.perf_counter()
        for at in range(1, len(batch), call):
            results = target.publish(batch[at : at + call])
            assert not any(results), results
        return (len(batch) - 1) / (time.perf_counter() - started)
    finally:
        target.close()


async def raw(exchange: str, batch: list[OutboxEvent], call: int, one_key: bool) -> float:
    """Messages per second by aiormq directly, same messages and confirms."""
    connection = await aiormq.connect(BROKER)
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)

        async def send(event: OutboxEvent) -> None:
            confirmation = await channel.basic_publish(
                event.payload.encode(),
                exchange=exchange,
                routing_key=event.event_type,
                properties=message_properties(event, persistent=True),
                mandatory=True,
            )
            assert isinstance(confirmation, Basic.Ack)

        await send(batch[0])
        started = time.perf_counter()
        for at in range(1, len(batch), call):
            chunk = batch[at : at + call]
            if one_key:
                for event in chunk:
                    await send(event)
            else:
                await asyncio.gather(*(send(event) for event in chunk))
        return (len(batch) - 1) / (time.perf_counter() - started)
    finally:
        await connection.close()


def through_stream_target(stream: str, batch: list[OutboxEvent], call: int, log: Path) -> float:
    """Messages per second through the rabbitmq_stream target, in calls of ``call`` events,
    its producer references and ids kept in the SQLite log ``log``."""
    from tidings.db import make_engine
    from tidings.outbox.confirmations import ConfirmationLog
    from tidings.outbox.schema import ensure_schema

    engine = make_engine(f"sqlite:///{log}")
    ensure_schema(engine)
    config = RabbitMQStreamTargetConfig(kind="rabbitmq_stream", stream=stream, create_stream=True)
    target = RabbitMQStreamTarget("bench", config)
    target.attach_log(ConfirmationLog(engine))
    try:
        assert target.publish(batch[:1]) == [None]  # connected before the clock starts
        started = time.perf_counter()
        for at in range(1, len(batch), call):
            results = target.publish(batch[at : at + call])
            assert not any(results), results
        return (len(batch) - 1) / (time.perf_counter() - started)
    finally:
        target.close()
        engine.dispose()


async def raw_stream(stream: str, batch: list[OutboxEvent], call: int) -> float:
    """Messages per second by rstream's Producer (a named producer), same messages, each
    call's confirms awaited."""
    from rstream import AMQPMessage, ConfirmationStatus, Producer, Properties

    messages = [  # the same messages, as an rstream user builds them (encoded when sent)
        AMQPMessage(
            body=event.payload.encode(),
            properties=Properties(
                message_id=event.event_id,
                content_type="application/json",
                creation_time=int(event.logged_at.timestamp() * 1000),
            ),
            application_properties=dict(message_headers(event)),
        )
        for event in batch
    ]
    async with Producer("127.0.0.1", 5552, username="guest", password="guest") as producer:
        await producer.create_stream(stream, exists_ok=True)
        confirmed = 0
        enough = asyncio.Event()
        wanted = 0

        def count(status: ConfirmationStatus) -> None:
            nonlocal confirmed
            assert status.is_confirmed, status
            confirmed += 1
            if confirmed >= wanted:
                enough.set()

        async def send(chunk: list[AMQPMessage]) -> None:
            nonlocal wanted
            wanted += len(chunk)
            enough.clear()
            await producer.send_batch(
                stream, chunk, publisher_name="bench-raw", on_publish_confirm=count
            )
            await asyncio.wait_for(enough.wait(), 30)

        await send(messages[:1])
        started = time.perf_counter()
        for at in range(1, len(messages), call):
            await send(messages[at : at + call])
        return (len(messages) - 1) / (time.perf_counter() - started)


def _stream_admin(stream: str) -> None:
    """Delete ``stream`` if it is there."""
    from rstream import Producer

    async def delete() -> None:
        async with Producer("127.0.0.1", 5552, username="guest", password="guest") as producer:
            await producer.delete_stream(stream, missing_ok=True)

    asyncio.run(delete())


def stream_rows(count: int, call: int, size: int) -> list[tuple[str, int, float, float]]:
    """(shape, messages, target msg/s, raw rstream msg/s) for both shapes, each in a stream
    of its own, deleted afterwards."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="tidings-bench-") as folder:
        for shape, one_key in (("many keys", False), ("one key", True)):
            n = count if not one_key else max(1_001, count // 10)
            ours, theirs = (f"tidings-bench-{uuid.uuid4().hex[:8]}" for _ in range(2))
            try:
                log = Path(folder) / f"{ours}.db"
                target_rate = through_stream_target(ours, events(n, one_key, size), call, log)
                raw_rate = asyncio.run(raw_stream(theirs, events(n, one_key, size), call))
            finally:
                _stream_admin(ours)
                _stream_admin(theirs)
            rows.append((shape, n - 1, target_rate, raw_rate))
    return rows


async def _admin(action: str, exchange: str, queue: str) -> None:
    connection = await aiormq.connect(BROKER)
    try:
        channel: AbstractChannel = await connection.channel()
        if action == "make":
            await channel.exchange_declare(exchange, exchange_type="topic", durable=True)
            await channel.queue_declare(queue, durable=True)
            await channel.queue_bind(queue, exchange, routing_key="#")
        elif action == "purge":
            await channel.queue_purge(queue)
        else:
            await channel.queue_delete(queue)
            await channel.exchange_delete(exchange)
    finally:
        await connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.rabbitmq", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes: check that it runs")
    parser.add_argument("--size", type=int, default=512, help="payload bytes (default 512)")
    args = parser.parse_args()
    count, call = (2_001, 500) if args.quick else (50_001, 1_000)
    tag = uuid.uuid4().hex[:8]
    exchange, queue = f"tidings-bench-{tag}", f"tidings-bench-{tag}"
    asyncio.run(_admin("make", exchange, queue))
    header = [
        "| shape | messages | tidings target msg/s | raw aiormq msg/s | ratio |",
        "|---|---:|---:|---:|---:|",
    ]
    print("\n".join(header))
    rows: list[dict[str, object]] = []
    try:
        for shape, one_key in (("many keys", False), ("one key", True)):
            n = count if not one_key else max(1_001, count // 10)
            target_rate = through_target(exchange, events(n, one_key, args.size), call)
            asyncio.run(_admin("purge", exchange, queue))
            raw_rate = asyncio.run(raw(exchange, events(n, one_key, args.size), call, one_key))
            asyncio.run(_admin("purge", exchange, queue))
            ratio = target_rate / raw_rate
            line = f"| {shape} | {n - 1} | {target_rate:,.0f} | {raw_rate:,.0f} | {ratio:.2f} |"
            print(line)
            header.append(line)
            rows.append(
                {
                    "shape": shape,
                    "messages": n - 1,
                    "target_msg_s": round(target_rate, 1),
                    "raw_aiormq_msg_s": round(raw_rate, 1),
                    "ratio": round(ratio, 3),
                }
            )
    finally:
        asyncio.run(_admin("delete", exchange, queue))
    streams = [
        "| shape | messages | tidings rabbitmq_stream msg/s | raw rstream msg/s | ratio |",
        "|---|---:|---:|---:|---:|",
    ]
    print("\n".join(["", *streams]))
    for shape, n, target_rate, raw_rate in stream_rows(count, call, args.size):
        ratio = target_rate / raw_rate
        line = f"| {shape} | {n} | {target_rate:,.0f} | {raw_rate:,.0f} | {ratio:.2f} |"
        print(line)
        streams.append(line)
        rows.append(
            {
                "shape": f"stream, {shape}",
                "messages": n,
                "target_msg_s": round(target_rate, 1),
                "raw_rstream_msg_s": round(raw_rate, 1),
                "ratio": round(ratio, 3),
            }
        )
    machine = machine_info(spark=False)
    result = {"machine": machine, "code": code_version(), "payload_bytes": args.size, "rows": rows}
    text = "\n".join(
        [
            "# RabbitMQ targets beside raw aiormq and rstream",
            "",
            f"Run `.venv/bin/python -m bench.rabbitmq{' --quick' if args.quick else ''}` on "
            f"{machine['date']}; {code_version()}.",
            "",
            machine_text(machine),
            "",
            "Publisher confirms on both sides; the goal is a ratio of at least 0.8.",
            "",
            *header,
            "",
            "RabbitMQ streams: the rabbitmq_stream target (exactly once, its ids in a SQLite "
            "outbox log) beside rstream's Producer with a named producer, confirms awaited "
            "per call on both sides.",
            "",
            *streams,
        ]
    )
    paths = write_report("rabbitmq", result, text + "\n")
    print(f"wrote {paths[0]} and {paths[1]}")


if __name__ == "__main__":
    main()
