"""Accepting TCP connections before a server sees them: a bound on the connections of each
client address, and, on a TLS listener, no TLS state for a client that has sent nothing.

Why: asyncio's TLS transport allocates a 256 KiB buffer for every connection the moment it
is accepted, before the client has sent a byte, and keeps it until the handshake ends or
times out (60 s unless the server says otherwise; uvicorn does not). 2,000 connections that
never send a ClientHello grew an intermediary by 570 MiB (``bench.hostile``). And the
per-address limits that existed counted later (at the WebSocket handshake, after TLS), or
not at all.

A :class:`GuardedListener` owns the listening socket and accepts on it itself:

- a connection from an address that holds ``max_per_address`` connections already is closed
  at once, before any byte is read, and reported as :data:`TOO_MANY_FROM_ADDRESS`;
- on a TLS listener (``first_byte_timeout`` set), an accepted connection waits as a bare
  socket (a file descriptor, no transport, no buffer) until the client sends its first byte;
  one that sends nothing for ``first_byte_timeout`` seconds is closed and reported as
  :data:`SILENT_TLS`, and one whose first byte cannot begin a TLS handshake (plaintext: a
  hat frame, an HTTP request) is closed at once and reported as :data:`NOT_TLS`. The
  server's own TLS handshake (with its own timeout) starts after;
- the rest are handed to the server through :attr:`GuardedListener.handoff`: a stand-in
  listening socket that any asyncio server takes as its ``sock`` (``asyncio.start_server``,
  uvicorn's ``sockets``, websockets' ``serve``) and whose ``accept`` returns the connections
  let through. One implementation for every listener, whatever serves behind it.

A connection's seat is given back when its socket is closed, by whoever closes it (the
accepted sockets are :class:`_Seated`), so a protocol switch behind it (HTTP upgraded to a
WebSocket, TLS started on a stream) changes nothing. Addresses are the peer's IP as the
socket says (no proxy header is trusted); loopback is not exempt (an attacker on the same
machine is still an attacker; raise the limit where a local proxy fronts every client).
Everything runs on the event loop that made the listener, which must be asyncio's own
(a selector loop, what every tidings part runs on): the stand-in socket works because such
a loop accepts by calling the listening socket's ``accept``. uvloop (the fan-out
benchmark's processes) accepts in libuv on the file descriptor instead; there the server is
given the listening socket itself, nothing is enforced at accept, and a warning says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import socket
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tidings.logs import OncePerCause

log = logging.getLogger(__name__)

#: A connection closed at accept: its address holds ``max_per_address`` already.
TOO_MANY_FROM_ADDRESS = "too_many_from_address"
#: A connection to a TLS listener closed for sending nothing within ``first_byte_timeout``.
SILENT_TLS = "tls_handshake_timeout"
#: A connection to a TLS listener closed because its first byte cannot begin a TLS handshake
#: (plaintext sent to a TLS port).
NOT_TLS = "not_tls"
#: The first byte of every TLS handshake: a record of content type 22 (handshake).
_TLS_HANDSHAKE_RECORD = 0x16
#: What is read of a refused plaintext client before closing (what it sent at once).
_DRAIN_BYTES = 65536
#: The default bound per client address, and the default TLS handshake timeout (seconds).
DEFAULT_MAX_PER_ADDRESS = 100
DEFAULT_TLS_HANDSHAKE_TIMEOUT = 10.0
#: Connections accepted per wake-up of the loop, at most (others wait for the next turn).
_ACCEPT_BATCH = 128
#: Seconds accepting pauses for when the process is out of file descriptors or memory.
_ACCEPT_RETRY_S = 1.0
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

#: Told of each connection closed at accept: (reason, client address).
Refused = Callable[[str, str], None]


@dataclass(frozen=True)
class AcceptRules:
    """What a listener lets through."""

    #: Connections at once from one client address (None: no bound).
    max_per_address: int | None = DEFAULT_MAX_PER_ADDRESS
    #: A TLS listener's wait for the client's first byte, in seconds (None: a plaintext
    #: listener, connections are handed over at once).
    first_byte_timeout: float | None = None


def listen(host: str, port: int, send_buffer: int | None = None) -> socket.socket:
    """A listening TCP socket whose connections send small replies at once (and, with
    ``send_buffer``, hold at most that much unsent data per peer: accepted connections
    inherit SO_SNDBUF on Linux).

    Made with ``IPPROTO_TCP`` named: asyncio sets TCP_NODELAY on accepted connections only
    for sockets whose protocol says TCP, and ``socket.create_server`` leaves it 0. Without
    it, Nagle's algorithm held each reply on a kept-alive HTTP connection until the client's
    delayed ACK: ~40 ms a request.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if send_buffer is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
        sock.bind((host, port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock


class _Seated(socket.socket):
    """An accepted connection holding a seat of its address, given back when it is closed."""

    _release: Callable[[], None] | None = None

    def close(self) -> None:
        release, self._release = self._release, None
        try:
            super().close()
        finally:
            if release is not None:
                release()

    def detach(self) -> int:
        release, self._release = self._release, None
        if release is not None:
            release()
        return super().detach()


class _Handoff(socket.socket):
    """The stand-in listening socket a server is given: readable while connections wait for
    it (a byte on a socket pair rings it), and its ``accept`` returns them."""

    _guard: GuardedListener

    def accept(self) -> tuple[socket.socket, Any]:
        return self._guard._next(self)

    def listen(self, backlog: int = 0) -> None:
        """Nothing: the real socket listens (asyncio calls this when it starts serving)."""

    def getsockname(self) -> Any:
        return self._guard.address

    def close(self) -> None:
        super().close()
        self._guard.close()


class GuardedListener:
    """Accepts on ``sock`` under ``rules``, reporting each refusal to ``on_refused``; the
    connections let through go to whoever serves :attr:`handoff`. Make it on the event loop
    that serves; closing :attr:`handoff` (the server's close does) closes it."""

    def __init__(self, sock: socket.socket, rules: AcceptRules, on_refused: Refused | None = None):
        self.rules = rules
        self._sock = sock
        self._fd = sock.fileno()
        self._on_refused = on_refused
        self._loop = asyncio.get_running_loop()
        #: The listening address (the chosen port after binding port 0), also once closed.
        self.address = sock.getsockname()
        self._held: dict[str, int] = {}
        self._waiting: dict[_Seated, asyncio.TimerHandle] = {}
        self._ready: deque[tuple[_Seated, Any]] = deque()
        self._problems = OncePerCause(log)
        self._closed = False
        #: The socket the server is given to listen on.
        self.handoff: socket.socket = sock
        if not isinstance(self._loop, asyncio.selector_events.BaseSelectorEventLoop):
            log.warning(
                "no accept limits on %s: the event loop %s accepts without Python "
                "(per-address bound and first-byte wait not enforced)",
                self.address,
                type(self._loop).__name__,
            )
            self._closed = True  # the server owns the socket, and closes it
            return
        bell, rung = socket.socketpair()
        bell.setblocking(False)
        self._bell = bell
        handoff = _Handoff(rung.family, rung.type, rung.proto, fileno=rung.detach())
        handoff._guard = self
        handoff.setblocking(False)
        self.handoff = handoff
        sock.setblocking(False)
        self._loop.add_reader(self._fd, self._accept)

    @property
    def port(self) -> int:
        port: int = self.address[1]
        return port

    def held(self, address: str) -> int:
        """Connections ``address`` holds now (waiting for their first byte included)."""
        return self._held.get(address, 0)

    def close(self) -> None:
        """Stop accepting and close every connection not handed over yet."""
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._fd)
        self._sock.close()
        for seated, timer in self._waiting.items():
            timer.cancel()
            self._loop.remove_reader(seated.fileno())
            seated.close()
        self._waiting.clear()
        while self._ready:
            self._ready.popleft()[0].close()
        self._bell.close()
        self.handoff.close()

    # -- accepting ---------------------------------------------------------------------

    def _accept(self) -> None:
        for _ in range(_ACCEPT_BATCH):
            try:
                conn, peer = self._sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                self._problems.log(
                    logging.ERROR,
                    ("accept", exc.errno),
                    f"cannot accept connections on {self.address}: {exc.strerror or exc}",
                )
                if exc.errno in _OUT_OF_RESOURCES and not self._closed:
                    # As asyncio does: stop for a while rather than spin on the error.
                    self._loop.remove_reader(self._fd)
                    self._loop.call_later(_ACCEPT_RETRY_S, self._resume)
                return
            self._admit(conn, peer)

    def _resume(self) -> None:
        if not self._closed:
            self._loop.add_reader(self._fd, self._accept)

    def _admit(self, conn: socket.socket, peer: Any) -> None:
        address = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        held = self._held.get(address, 0)
        limit = self.rules.max_per_address
        if limit is not None and held >= limit:
            conn.close()
            self._refuse(
                TOO_MANY_FROM_ADDRESS,
                address,
                f"too many connections from {address} (at most {limit}): closed at accept",
            )
            return
        seated = _Seated(conn.family, conn.type, conn.proto, fileno=conn.detach())
        self._held[address] = held + 1
        seated._release = functools.partial(self._give_back, address)
        seated.setblocking(False)
        timeout = self.rules.first_byte_timeout
        if timeout is None:
            self._hand_over(seated, peer)
            return
        self._loop.add_reader(seated.fileno(), self._first_byte, seated, peer)
        self._waiting[seated] = self._loop.call_later(timeout, self._silent, seated, address)

    def _first_byte(self, seated: _Seated, peer: Any) -> None:
        """The client sent something (or hung up): the server takes it from here, unless
        what it sent is not TLS.

        Plaintext is refused here, from the first byte peeked at, rather than by the server's
        handshake: a failed handshake costs asyncio's TLS state and OpenSSL's (2,000
        plaintext frames grew the Eventer's peak memory by 109 MiB), a peek costs nothing.
        """
        try:
            head = seated.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return  # woken with nothing to read: keep waiting
        except OSError:
            head = b""  # reset: the server meets the error and reports it
        timer = self._waiting.pop(seated, None)
        self._loop.remove_reader(seated.fileno())
        if timer is not None:
            timer.cancel()
        if head and head[0] != _TLS_HANDSHAKE_RECORD:
            with contextlib.suppress(OSError):
                seated.recv(_DRAIN_BYTES)  # read, so that the close is a FIN, not a reset
            seated.close()
            address = str(peer[0]) if isinstance(peer, tuple) else str(peer)
            self._refuse(
                NOT_TLS,
                address,
                f"TLS handshake with {address} refused: the first byte is not a TLS "
                "handshake's (plaintext sent to a TLS port? the client must use TLS): closed",
            )
            return
        self._hand_over(seated, peer)

    def _silent(self, seated: _Seated, address: str) -> None:
        self._waiting.pop(seated, None)
        self._loop.remove_reader(seated.fileno())
        seated.close()
        self._refuse(
            SILENT_TLS,
            address,
            f"no TLS handshake from {address} within {self.rules.first_byte_timeout:g} s: "
            "nothing sent, closed",
        )

    def _hand_over(self, seated: _Seated, peer: Any) -> None:
        if self._closed:
            seated.close()
            return
        self._ready.append((seated, peer))
        if len(self._ready) == 1:
            # Full: rung already and unanswered, so it stays readable.
            with contextlib.suppress(BlockingIOError):
                self._bell.send(b"\0")

    def _next(self, handoff: socket.socket) -> tuple[socket.socket, Any]:
        """The next connection let through, for the server's accept; BlockingIOError when
        there is none (the bell is silenced then, to ring at the next one)."""
        if self._ready:
            return self._ready.popleft()
        try:
            while handoff.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        raise BlockingIOError(errno.EAGAIN, "no connection waiting")

    def _give_back(self, address: str) -> None:
        held = self._held.get(address, 0) - 1
        if held > 0:
            self._held[address] = held
        else:
            self._held.pop(address, None)

    def _refuse(self, reason: str, address: str, message: str) -> None:
        # Once per reason, not per address: a client with many addresses must not buy a log
        # line per connection.
        self._problems.log(
            logging.WARNING,
            reason,
            f"{message} (repeats are counted, not logged)",
            extra={"peer": address, "reason": reason},
        )
        if self._on_refused is not None:
            self._on_refused(reason, address)
