"""The supervisor's rules, on small real child processes (Python one-liners standing in for
the parts, so that each rule's moment can be chosen): restart delays that double, stop at
their ceiling and fall back once a part stayed up; giving up on a part that keeps failing at
its start; a part that needs a server waits for it, and its exit while the server is away is
not held against it; the stop order, and SIGKILL to the whole group of a part that ignores
SIGTERM (which no tidings part does: a stand-in is the only way to see the grace run out).
``tidings run`` with the real parts: tests/system/test_run.py."""

from __future__ import annotations

import io
import logging
import socket
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import psutil
import pytest

from bench.harness.processes import free_port
from tests.support.run_helpers import gone
from tests.support.waiting import wait_until
from tidings.system.parts import Part, PartKind
from tidings.system.state import RunFiles, read_state
from tidings.system.supervisor import Supervisor


class Quick(Supervisor):
    """The supervisor's rules on a test's time scale."""

    first_delay_s = 0.05
    max_delay_s = 0.4
    stable_after_s = 1.0
    quick_exit_s = 1.0
    give_up_after = 10
    up_after_s = 0.2


def _part(
    name: str,
    kind: PartKind,
    code: str,
    *,
    ready_on: tuple[str, int] | None = None,
    needs: tuple[str, ...] = (),
) -> Part:
    return Part(name, kind, (sys.executable, "-c", textwrap.dedent(code)), ready_on, needs)


class Supervised:
    """A supervisor run in a thread of the test, its output kept."""

    def __init__(self, supervisor_class: type[Supervisor], parts: list[Part], tmp: Path) -> None:
        self.files = RunFiles.of(tmp / "deployment.yaml", tmp / "run")
        self.files.directory.mkdir()
        self.out = io.StringIO()
        self.supervisor = supervisor_class(parts, self.files, output=self.out)
        self.code: int | None = None
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        self.code = self.supervisor.run()

    def lines(self) -> list[str]:
        return self.out.getvalue().splitlines()

    def output(self) -> str:
        return self.out.getvalue()

    def part(self, name: str) -> dict[str, Any]:
        state = read_state(self.files)
        return {} if state is None else dict(state["parts"][name])

    def ended(self, timeout: float) -> int | None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), self.output()
        return self.code

    def stop(self, timeout: float = 30) -> int | None:
        self.supervisor.stop()
        return self.ended(timeout)


def _delays(caplog: pytest.LogCaptureFixture, part: str) -> list[float]:
    """The delays of ``part``'s restarts, as the structured log lines give them."""
    logged = [vars(r) for r in caplog.records if r.getMessage() == "part exited; restarting it"]
    return [fields["delay_s"] for fields in logged if fields["part"] == part]


def test_restart_delays_double_to_their_ceiling_and_fall_back_after_a_stable_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tidings.system.supervisor")
    runs = tmp_path / "runs"
    # runs 1-5 fail at once, run 6 stays up 1.5 s (longer than stable_after_s), then steady
    flaky = _part(
        "flaky",
        "server",
        f"""
        import pathlib, sys, time
        runs = pathlib.Path({str(runs)!r})
        n = len(runs.read_text()) + 1 if runs.exists() else 1
        runs.write_text("x" * n)
        print("run", n, flush=True)
        if n <= 5:
            sys.exit(3)
        time.sleep(1.5 if n == 6 else 300)
        sys.exit(4)
        """,
    )
    run = Supervised(Quick, [flaky], tmp_path)
    try:
        wait_until(lambda: run.part("flaky").get("restarts") == 6, 60, explain=run.output)
        wait_until(lambda: run.part("flaky").get("up", False), 30, explain=run.output)
    finally:
        assert run.stop() == 0, run.output()
    assert _delays(caplog, "flaky") == [0.05, 0.1, 0.2, 0.4, 0.4, 0.05]
    lines = run.lines()
    assert [line for line in lines if line.startswith("[flaky] run")] == [
        f"[flaky] run {n}" for n in range(1, 8)
    ]
    assert "[supervisor] flaky exited with code 3; restart 5 in 0.4 s" in lines
    assert "[supervisor] flaky exited with code 4; restart 6 in 0.05 s" in lines
    assert run.part("flaky")["state"] == "stopped"


def test_a_part_failing_at_its_start_is_given_up_on_and_the_others_stopped(
    tmp_path: Path,
) -> None:
    class GivesUp(Quick):
        give_up_after = 3

    refused = _part("refused", "server", "print('error: no such thing'); raise SystemExit(2)")
    fine = _part("fine", "server", "import time; print('fine', flush=True); time.sleep(300)")
    run = Supervised(GivesUp, [refused, fine], tmp_path)
    try:
        wait_until(lambda: "[fine] fine" in run.lines(), 30, explain=run.output)
        pid = run.part("fine")["pid"]
        assert run.ended(60) == 2
    finally:
        run.supervisor.stop()
    wait_until(lambda: gone(pid), 30)
    assert run.lines()[-1] == (
        "[supervisor] refused exited 3 times in a row within 1 s of its start "
        "(last exit code 2): error: no such thing; stopping the deployment"
    )
    assert run.part("refused")["state"] == "failed"
    assert run.part("fine")["state"] == "stopped"


def test_a_part_needing_a_server_waits_for_it_and_is_not_blamed_for_its_absence(
    tmp_path: Path,
) -> None:
    class OneStrike(Quick):
        give_up_after = 1  # any exit counted against a part ends the deployment

    port = free_port()
    server = _part(
        "a",
        "server",
        f"""
        import socket, time
        time.sleep(1.2)  # up late, so that its own exit below is not a quick one
        listener = socket.create_server(("127.0.0.1", {port}))
        print("listening", flush=True)
        held = []
        while True:
            held.append(listener.accept()[0])
        """,
        ready_on=("127.0.0.1", port),
    )
    client = _part(
        "b",
        "intermediary",
        f"""
        import socket, sys
        try:
            connection = socket.create_connection(("127.0.0.1", {port}))
        except OSError:
            sys.exit(2)
        print("connected", flush=True)
        connection.recv(1)  # until the server goes away
        sys.exit(2)
        """,
        needs=("a",),
    )
    run = Supervised(OneStrike, [server, client], tmp_path)
    try:
        wait_until(lambda: run.part("b").get("pid") is not None, 30, explain=run.output)
        assert run.part("a")["up"]
        psutil.Process(run.part("a")["pid"]).kill()  # the server crashes as its client starts
        wait_until(lambda: run.part("b").get("restarts") == 1, 30, explain=run.output)
        wait_until(lambda: run.part("b")["up"] and run.part("a")["up"], 30, explain=run.output)
        with socket.create_connection(("127.0.0.1", port)):
            pass
        assert run.part("b")["restarts"] == 1  # not started again while its server was down
        assert run.part("a")["restarts"] == 1
    finally:
        assert run.stop() == 0, run.output()
    lines = run.lines()
    assert "[supervisor] b exited with code 2; restart 1 in 0.05 s once a is up" in lines
    listening = [i for i, line in enumerate(lines) if line == "[a] listening"]
    assert len(listening) == 2
    assert lines.index("[supervisor] a exited with code -9; restart 1 in 0.05 s") < listening[1]
    # b's second start came after a's second start
    assert [i for i, line in enumerate(lines) if line == "[b] connected"][-1] > listening[1]


def test_parts_start_servers_first_and_stop_clients_first_the_stubborn_killed(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "journal"
    stoppable = """
        import pathlib, signal, sys, time
        journal = pathlib.Path({journal!r})
        def note(what):
            with journal.open("a") as out:
                out.write(what + "\\n")
        def stop(*_):
            note("{name} stopping")
            time.sleep(0.3)
            note("{name} stopped")
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        note("{name} started")
        print("started", flush=True)
        while True:
            time.sleep(1)
        """
    stubborn = """
        import pathlib, signal, subprocess, time
        def ignore(*_):
            with pathlib.Path({journal!r}).open("a") as out:
                out.write("i SIGTERM ignored\\n")
        signal.signal(signal.SIGTERM, ignore)
        helper = subprocess.Popen(["sleep", "300"])  # in its group: killed with it
        print("helper", helper.pid, flush=True)
        while True:
            time.sleep(1)
        """
    parts = [
        _part("i", "intermediary", stubborn.format(journal=str(journal))),
        _part("r", "relay", stoppable.format(journal=str(journal), name="r")),
        _part("s", "server", stoppable.format(journal=str(journal), name="s")),
    ]
    run = Supervised(Quick, parts, tmp_path)
    try:
        wait_until(
            lambda: all(run.part(p).get("up", False) for p in ("i", "r", "s")),
            30,
            explain=run.output,
        )
        helper = next(
            int(line.split()[-1]) for line in run.lines() if line.startswith("[i] helper")
        )
    finally:
        assert run.stop(60) == 0, run.output()
    assert journal.read_text().splitlines() == [
        "s started",  # servers first: the others once it is up
        "r started",
        "i SIGTERM ignored",  # clients first: the intermediary, given its grace, then killed
        "r stopping",
        "r stopped",
        "s stopping",
        "s stopped",
    ]
    lines = run.lines()
    assert "[supervisor] i did not stop within 10 s; killed it" in lines
    wait_until(lambda: gone(helper), 30)
    assert {run.part(p)["state"] for p in ("i", "r", "s")} == {"stopped"}
