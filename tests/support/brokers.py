"""Private redis-server and mosquitto processes for the Redis Streams and MQTT target tests.

The kill-and-restart, size-limit, ACL and TLS tests need a server configured their way, or
one they may stop; they start their own on a free port in a temporary folder, so the shared
servers (:6379, :1883) are never stopped or reconfigured for anyone else.
"""

from __future__ import annotations

import getpass
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bench.harness.processes import free_port, wait_for_port
from tidings.errors import TargetCallFailed, TargetUnavailable
from tidings.events.outbox import OutboxEvent
from tidings.targets.base import Target


class PrivateServer:
    """A server process started from ``command`` (``{port}`` filled in) on a port of its
    own, in ``directory``; :meth:`start` again after :meth:`kill` reuses port and folder."""

    def __init__(self, directory: Path, command: list[str], port: int | None = None) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self._command = [part.replace("{port}", str(self.port)) for part in command]
        self._process: subprocess.Popen[bytes] | None = None
        self._log = directory / "server.log"

    def start(self) -> None:
        with self._log.open("ab") as log:
            self._process = subprocess.Popen(
                self._command, cwd=self.directory, stdout=log, stderr=subprocess.STDOUT
            )
        wait_for_port(self.port, 15.0, process=self._process, log=self._log)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Stop it with ``sig`` (SIGKILL: no chance to save anything) and wait."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(sig)
            self._process.wait(30)
        self._process = None


def redis_server(directory: Path, *settings: str) -> PrivateServer:
    """A redis-server on a free port; ``settings`` are more ``--name value`` arguments."""
    return PrivateServer(
        directory,
        ["redis-server", "--port", "{port}", "--bind", "127.0.0.1", "--save", "",
         "--dir", str(directory), *settings],
    )  # fmt: skip


def mosquitto(
    directory: Path, settings: str = "allow_anonymous true", *, port: int | None = None
) -> PrivateServer:
    """A mosquitto broker listening on a free port, ``settings`` its file's other lines
    (the listener's own options, ``allow_anonymous``, ``persistence``...)."""
    port = port or free_port()
    config = directory / "mosquitto.conf"
    directory.mkdir(parents=True, exist_ok=True)
    # ``user``: a broker started as root would switch to the mosquitto user, who cannot read
    # the test's files (ACL, passwords, certificates) in its private temporary folder.
    user = getpass.getuser()
    config.write_text(f"user {user}\nlistener {port} 127.0.0.1\n{settings}\n")
    return PrivateServer(directory, ["mosquitto", "-c", str(config)], port=port)


def deliver_all(
    target: Target,
    events: list[OutboxEvent],
    per_call: int = 40,
    deadline_s: float = 120.0,
    *,
    pace_s: float = 0.0,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Publish ``events`` (in log order) as the relay would until every one is confirmed:
    calls of up to ``per_call`` events, a key's events in order, what failed or was not
    confirmed sent again in the next call (a key's later events wait behind it), a pause
    after a failed call. Returns how many calls failed as a whole (the target unavailable or
    the call failed); raises if the events are not all confirmed within ``deadline_s``.
    ``pace_s``: a pause after every call, so that traffic lasts; ``progress`` is told how
    many events are confirmed after every call."""
    pending = list(events)
    failed_calls = 0
    deadline = time.monotonic() + deadline_s
    while pending:
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(pending)} events still unconfirmed")
        call = pending[:per_call]
        try:
            results = target.publish(call)
        except TargetCallFailed as exc:
            failed_calls += 1
            done = {id(e) for e, ok in zip(call, exc.confirmed, strict=False) if ok}
            results = [None if id(e) in done else "failed" for e in call]
            time.sleep(0.1)
        except TargetUnavailable:
            failed_calls += 1
            time.sleep(0.1)
            continue
        # An event is done only if it and every earlier one of its key in the call were
        # confirmed: the relay never lets a key's later event be confirmed past a failure.
        blocked: set[str] = set()
        left = []
        for event, result in zip(call, results, strict=True):
            if result is not None or event.ordering_key in blocked:
                blocked.add(event.ordering_key)
                left.append(event)
        pending = left + pending[per_call:]
        if progress is not None:
            progress(len(events) - len(pending))
        time.sleep(pace_s)
    return failed_calls


class Traffic(threading.Thread):
    """:func:`deliver_all` in a thread, paced, so that a test can stop the server while
    events are still flowing (:meth:`wait_until` a share of them is confirmed)."""

    def __init__(self, target: Target, events: list[OutboxEvent], pace_s: float = 0.01) -> None:
        super().__init__(name="traffic", daemon=True)
        self.target, self.events, self.pace_s = target, events, pace_s
        self.confirmed = 0
        self.failed_calls = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.failed_calls = deliver_all(
                self.target, self.events, pace_s=self.pace_s, progress=self._progress
            )
        except BaseException as exc:
            self.error = exc

    def _progress(self, confirmed: int) -> None:
        self.confirmed = confirmed

    def wait_until(self, share: float, timeout: float = 60.0) -> None:
        """Until ``share`` of the events are confirmed (AssertionError after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while self.confirmed < share * len(self.events):
            assert self.is_alive() and time.monotonic() < deadline, "the traffic stalled"
            time.sleep(0.01)


def first_seen_order(entries: list[tuple[str, str, int]]) -> dict[str, list[int]]:
    """Per key, the seqs of ``(event_id, key, seq)`` entries as a consumer that drops an
    event id it has seen already would process them."""
    seen: set[str] = set()
    order: dict[str, list[int]] = {}
    for event_id, key, seq in entries:
        if event_id not in seen:
            seen.add(event_id)
            order.setdefault(key, []).append(seq)
    return order
