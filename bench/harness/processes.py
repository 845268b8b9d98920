"""The processes the benchmarks and the tests start: servers in subprocesses, on free ports.

One way of starting each, shared by ``bench/`` and ``tests/`` (both import this module as
``bench.harness.processes`` from the checkout's root): ``tidings`` as a user runs it
(:func:`tidings_cli`), a ``tidings server``, a hat-event 0.8.5 server, a hat-monitor Monitor
Server or any other server configured by a YAML file, in a working directory of its own
(:class:`ServerProcess`), and a private ``nats-server`` with JetStream (:class:`NatsServer`).
Every start waits until the server's ports accept connections, and fails with what went
wrong (the process's exit, its log's tail) if they do not.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from bench.harness.paths import REPO

NATS_SERVER = "/usr/sbin/nats-server"
#: hat-event 0.8.5's server, installed beside this interpreter (a development dependency).
HAT_EVENT_SERVER = Path(sys.executable).with_name("hat-event-server")
#: hat-monitor's Monitor Server, the version hat-event 0.8.5 uses (a dependency of tidings).
HAT_MONITOR_SERVER = (sys.executable, "-m", "hat.monitor.server")
#: ``tidings`` as a user runs it, on this interpreter.
TIDINGS = (sys.executable, "-m", "tidings.cli")


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now, for a server about to be started."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def local_address(port: int, scheme: str = "tcp+sbs") -> str:
    """The event-server address (Eventer or Syncer) of ``port`` on the loopback (``scheme``
    ``ssl+sbs`` for TLS)."""
    return f"{scheme}://127.0.0.1:{port}"


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file ('' if it cannot be read)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def wait_for_port(
    port: int,
    timeout: float = 10.0,
    *,
    process: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
) -> None:
    """Wait until something accepts connections on 127.0.0.1:``port`` (a server started).

    A RuntimeError if nothing does within ``timeout`` seconds, or as soon as ``process`` (the
    server, if given) has exited; the message ends with the tail of ``log``, if given.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            pass
        if process is not None and process.poll() is not None:
            problem = f"exited with code {process.returncode} before listening on port {port}"
        elif time.monotonic() >= deadline:
            problem = f"nothing listens on 127.0.0.1:{port} after {timeout:g} s"
        else:
            time.sleep(0.05)
            continue
        raise RuntimeError(problem + (f"; the end of {log}:\n{log_tail(log)}" if log else ""))


def bench_env() -> dict[str, str]:
    """This process's environment with the checkout's root first on ``PYTHONPATH``: for a
    subprocess that runs a module of ``bench/`` (``python -m bench.x``) in another folder."""
    path = os.environ.get("PYTHONPATH")
    return os.environ | {"PYTHONPATH": str(REPO) + (os.pathsep + path if path else "")}


def tidings_cli(*args: str, **popen: Any) -> subprocess.Popen[bytes]:
    """``tidings ARGS`` as a user runs it, in a subprocess of this interpreter; ``popen``
    goes to :class:`subprocess.Popen` (cwd, env, output)."""
    return subprocess.Popen([*TIDINGS, *args], **popen)


def kill_tree(proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """SIGKILL a process started with ``start_new_session=True`` and everything it started
    (the relay's JVM), as a crash would."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout)


#: hat's servers log warnings and errors only, to their output (the process's log file).
_HAT_LOG: dict[str, Any] = {
    "version": 1,
    "formatters": {"f": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"c": {"class": "logging.StreamHandler", "formatter": "f", "level": "WARNING"}},
    "root": {"level": "WARNING", "handlers": ["c"]},
    "disable_existing_loggers": False,
}


class ServerProcess:
    """A server in a subprocess, configured by ``server.yaml`` in its working directory and
    logging to ``server.log`` there; started, stopped (SIGTERM) or killed (SIGKILL to its
    process group, as a crash would) at will, and started again on the same files.

    Make one with :meth:`tidings`, :meth:`hat_event` or :meth:`hat_monitor`, or give the
    command (to which ``--conf server.yaml`` is added) and, for a module of ``bench/``,
    :func:`bench_env` as its ``env``.
    ``config_option`` is the option that names the file (``--conf``; ``-c`` for the
    ``tidings`` commands that read a whole ``tidings.yaml``; None: the command takes no
    file). ``ports`` are an event server's Eventer's (``"eventer"``) and, if it serves one, its
    Syncer's (``"syncer"``); :meth:`start` waits for those named in ``listening`` (default:
    all).
    """

    def __init__(
        self,
        command: Sequence[str],
        workdir: Path,
        config: dict[str, Any],
        ports: Mapping[str, int],
        listening: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        config_option: str | None = "--conf",
    ) -> None:
        self.workdir = workdir
        self._env = None if env is None else dict(env)
        self.ports = dict(ports)
        self.port = ports.get("eventer", 0)
        self.eventer = local_address(self.port)
        self._listening = list(ports) if listening is None else list(listening)
        self.config = workdir / "server.yaml"
        self.log_path = workdir / "server.log"
        workdir.mkdir(parents=True, exist_ok=True)
        self.config.write_text(yaml.safe_dump(config, sort_keys=False))
        self._command = [*command]
        if config_option is not None:
            self._command += [config_option, str(self.config)]
        self.proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def tidings(
        cls,
        workdir: Path,
        server_id: int,
        ports: Mapping[str, int],
        peers: Sequence[tuple[int, str]] = (),
        token: str | None = None,
        backend: dict[str, str] | None = None,
        eventer: dict[str, Any] | None = None,
        monitor: dict[str, str] | None = None,
    ) -> ServerProcess:
        """``tidings server`` on the SQLite backend (``ev.db``) unless ``backend`` says
        otherwise, ``eventer`` added to its Eventer's keys, syncing with ``peers`` ((server id,
        Syncer address) pairs) under ``token``, or with the peers a Monitor names (``monitor``:
        its client configuration; the Eventer then opens when the Monitor blesses the server,
        so :meth:`start` waits for the Syncer only)."""
        config: dict[str, Any] = {
            "type": "event",
            "backend": backend or {"module": "tidings.server.backends.sqlite", "db_path": "ev.db"},
            "engine": {"server_id": server_id, "modules": []},
            "eventer_server": {"address": local_address(ports["eventer"]), **(eventer or {})},
        }
        if "syncer" in ports:
            config["syncer_server"] = {"address": local_address(ports["syncer"])}
        config["syncer_token"] = token
        if monitor is not None:
            config["monitor"] = monitor
            return cls([*TIDINGS, "server"], workdir, config, ports, ["syncer"])
        config["syncer_peers"] = [
            {"server_id": peer_id, "address": address, "syncer_token": token}
            for peer_id, address in peers
        ]
        return cls([*TIDINGS, "server"], workdir, config, ports)

    @classmethod
    def hat_event(
        cls,
        workdir: Path,
        server_id: int,
        ports: Mapping[str, int],
        *,
        max_db_size: int = 100 * 2**20,
        monitor: dict[str, str] | None = None,
        token: str | None = None,
        tls_pem: Path | None = None,
        modules: list[dict[str, Any]] | None = None,
        python_path: Path | None = None,
    ) -> ServerProcess:
        """hat-event 0.8.5's own server on its lmdb backend (its memory backend is broken in
        0.8.5), logging warnings and errors only; in a Monitor group if ``monitor`` (its
        client configuration) is given, its Syncer token ``token``. With ``tls_pem`` (its
        certificate and key in one PEM file) it serves ``ssl+sbs://`` addresses, through
        :mod:`bench.harness.hat_tls_server`. ``modules`` is its ``engine.modules``, imported
        from ``python_path`` too if given."""
        scheme = "tcp+sbs" if tls_pem is None else "ssl+sbs"
        config: dict[str, Any] = {
            "type": "event",
            "log": _HAT_LOG,
            "backend": {
                "module": "hat.event.server.backends.lmdb",
                "db_path": str(workdir / "hat-event.db"),
                "max_db_size": max_db_size,
                "flush_period": 1,
                "conditions": [],
                "latest": {"subscriptions": [["*"]]},
                "ordered": [{"order_by": "TIMESTAMP", "subscriptions": [["*"]]}],
            },
            "engine": {"server_id": server_id, "modules": modules or []},
            "eventer_server": {"address": local_address(ports["eventer"], scheme)},
        }
        if "syncer" in ports:
            config["syncer_server"] = {"address": local_address(ports["syncer"], scheme)}
        if token is not None:
            config["syncer_token"] = token
        command = [str(HAT_EVENT_SERVER)]
        env = None
        if tls_pem is not None:
            command = [sys.executable, str(Path(__file__).with_name("hat_tls_server.py"))]
            env = {**os.environ, "HAT_TLS_PEM": str(tls_pem)}
        if python_path is not None:
            env = {**(env or os.environ), "PYTHONPATH": str(python_path)}
        if monitor is not None:
            config["monitor"] = monitor
            return cls(command, workdir, config, ports, ["syncer"], env=env)
        return cls(command, workdir, config, ports, env=env)

    @classmethod
    def hat_monitor(cls, workdir: Path, port: int, algorithm: str = "BLESS_ALL") -> ServerProcess:
        """hat-monitor's Monitor Server for components on ``port``, every group blessed by
        ``algorithm`` (``BLESS_ALL`` or ``BLESS_ONE``); its master and UI ports are free
        ones, and it has no parent Monitor."""
        config = {
            "type": "monitor",
            "log": _HAT_LOG,
            "server": {"address": local_address(port), "default_rank": 1},
            "master": {
                "address": local_address(free_port()),
                "default_algorithm": algorithm,
                "group_algorithms": {},
            },
            "slave": {
                "parents": [],
                "connect_timeout": 2,
                "connect_retry_count": 1,
                "connect_retry_delay": 0.5,
            },
            "ui": {"address": f"http://127.0.0.1:{free_port()}"},
        }
        return cls(HAT_MONITOR_SERVER, workdir, config, {"monitor": port})

    def start(self, timeout: float = 30.0) -> None:
        """Start the server (again, after :meth:`stop` or :meth:`kill`) and wait until its
        ports listen; if they do not, it is killed and the error says why."""
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self._command,
                cwd=self.workdir,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=self._env,
            )
        try:
            for name in self._listening:
                wait_for_port(self.ports[name], timeout, process=self.proc, log=self.log_path)
        except BaseException:
            self.kill()
            raise

    def log_tail(self, lines: int = 30) -> str:
        return log_tail(self.log_path, lines)

    def kill(self) -> None:
        """SIGKILL the server and whatever it started, as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            kill_tree(self.proc, 10)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the server and wait for it to exit; killed if it takes over ``timeout`` s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()


class NatsServer:
    """A private ``nats-server -js`` storing in ``store``, killed and started again at will
    (on the same storage)."""

    def __init__(self, port: int, store: Path) -> None:
        self.port = port
        self.url = f"nats://127.0.0.1:{port}"
        self._store = store
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> None:
        args = ["-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(self._store)]
        self._proc = subprocess.Popen(
            [NATS_SERVER, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_for_port(self.port, timeout, process=self._proc)

    def kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def suspend(self) -> None:
        """Freeze the server (SIGSTOP): its connections stay open, nothing is answered."""
        if self._proc is not None:
            self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self._proc is not None:
            self._proc.send_signal(signal.SIGCONT)
