"""Who is responsible for what among many intermediaries ([75], [111]-[112]).

Responsibility is cut into numbered **slots** (a :mod:`.responsibility` partition says which
slot a subscription belongs to: a cell of the world, or a bucket of subscriber-id hashes),
and the directory says which intermediary owns each slot and where it listens. Every
intermediary of a cluster reads the same directory; a split or merge moves slots between
members in one transaction, so a reader sees a slot owned by exactly one member, before or
after the move.

One class, two places: a small SQLite table in a file shared by intermediaries in separate
processes on one machine (WAL mode, so readers never wait for the writer), or, with no path,
the same table in memory for intermediaries in one process. SQLite is in the standard
library, transactional and fast enough to be read on every subscribe request (tens of
microseconds); a cluster spanning machines would put the same two tables in a database all
of them reach.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tidings.errors import IntermediaryError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS members (name TEXT PRIMARY KEY, url TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS slots (
    slot INTEGER PRIMARY KEY,
    owner TEXT NOT NULL REFERENCES members(name)
);
CREATE TABLE IF NOT EXISTS loads (
    name TEXT PRIMARY KEY REFERENCES members(name) ON DELETE CASCADE,
    subscriptions INTEGER NOT NULL,
    frames_per_s REAL NOT NULL,
    handing INTEGER NOT NULL,
    at REAL NOT NULL
);
"""
#: The longest member name (it travels in redirects and error messages).
MAX_NAME = 64


@dataclass(frozen=True)
class Member:
    """One intermediary of the cluster: its name and the URL subscribers connect to."""

    name: str
    url: str


@dataclass(frozen=True)
class Load:
    """What a member in another process reported of itself (:meth:`Directory.report`): the
    subscriptions it serves, the frames it generates per second, the handovers it has under
    way, and when (Unix seconds) it measured them."""

    name: str
    subscriptions: int
    frames_per_s: float
    handing: int
    at: float


class Directory:
    """The shared table of members and slot owners (see the module docstring)."""

    def __init__(self, path: str | Path | None = None, *, timeout_s: float = 10.0) -> None:
        self.path = None if path is None else str(path)
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(
                ":memory:" if self.path is None else self.path,
                timeout=timeout_s,
                check_same_thread=False,
                isolation_level=None,
            )
        except sqlite3.Error as exc:
            raise IntermediaryError(f"directory {self.path}: {exc}") from None
        with self._locked() as db:
            if self.path is not None:
                db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA foreign_keys=ON")
            db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[sqlite3.Connection]:
        """The connection, one user at a time; SQLite's failures (a file locked past the
        timeout, unwritable, or not a database) become an error naming the file, which a
        member answers or logs and goes on with the owners it read last."""
        with self._lock:
            try:
                yield self._db
            except sqlite3.Error as exc:
                raise IntermediaryError(f"directory {self.path or '(in memory)'}: {exc}") from None

    # -- reading -----------------------------------------------------------------------

    def members(self) -> list[Member]:
        with self._locked() as db:
            rows = db.execute("SELECT name, url FROM members ORDER BY name").fetchall()
        return [Member(name, url) for name, url in rows]

    def member(self, name: str) -> Member:
        """The member called ``name``; an unknown name is an error naming it."""
        with self._locked() as db:
            row = db.execute("SELECT url FROM members WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise IntermediaryError(f"directory: no intermediary called {name!r:.80}")
        return Member(name, row[0])

    def slots_of(self, name: str) -> list[int]:
        with self._locked() as db:
            rows = db.execute(
                "SELECT slot FROM slots WHERE owner = ? ORDER BY slot", (name,)
            ).fetchall()
        return [slot for (slot,) in rows]

    def owners(self) -> dict[int, str]:
        """Every assigned slot and its owner's name."""
        with self._locked() as db:
            rows = db.execute("SELECT slot, owner FROM slots").fetchall()
        return dict(rows)

    def loads(self) -> dict[str, Load]:
        """The latest load each member reported (members that never reported are absent)."""
        with self._locked() as db:
            rows = db.execute(
                "SELECT name, subscriptions, frames_per_s, handing, at FROM loads"
            ).fetchall()
        return {row[0]: Load(*row) for row in rows}

    # -- changing ----------------------------------------------------------------------

    def join(self, name: str, url: str) -> Member:
        """Add (or move) a member."""
        if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
            raise IntermediaryError(f"directory: a name is 1..{MAX_NAME} characters")
        if not isinstance(url, str) or not url.startswith(("ws://", "wss://")):
            raise IntermediaryError(f"directory: {name!r} needs a ws:// URL, not {url!r:.80}")
        with self._locked() as db:
            db.execute(
                "INSERT INTO members (name, url) VALUES (?, ?) "
                "ON CONFLICT(name) DO UPDATE SET url = excluded.url",
                (name, url),
            )
        return Member(name, url)

    def report(self, load: Load) -> None:
        """Record a member's load (a member in its own process reports it periodically, for
        the supervisor that splits and merges, :class:`.process_cluster.ProcessCluster`)."""
        with self._locked() as db:
            try:
                db.execute(
                    "INSERT INTO loads (name, subscriptions, frames_per_s, handing, at) "
                    "VALUES (?, ?, ?, ?, ?) ON CONFLICT(name) DO UPDATE SET "
                    "subscriptions = excluded.subscriptions, "
                    "frames_per_s = excluded.frames_per_s, handing = excluded.handing, "
                    "at = excluded.at",
                    (load.name, load.subscriptions, load.frames_per_s, load.handing, load.at),
                )
            except sqlite3.IntegrityError:
                raise IntermediaryError(
                    f"directory: {load.name!r:.80} is not a member; join it first"
                ) from None

    def leave(self, name: str) -> None:
        """Remove a member that owns no slot any more."""
        with self._locked() as db:
            owned = db.execute("SELECT COUNT(*) FROM slots WHERE owner = ?", (name,)).fetchone()[0]
            if owned:
                raise IntermediaryError(
                    f"directory: {name!r} still owns {owned} slot(s); hand them over first"
                )
            db.execute("DELETE FROM members WHERE name = ?", (name,))

    def assign(self, slots: Iterable[int], owner: str) -> None:
        """Give ``slots`` to ``owner`` (a member), all in one transaction."""
        slots = [int(slot) for slot in slots]
        with self._locked() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany(
                    "INSERT INTO slots (slot, owner) VALUES (?, ?) "
                    "ON CONFLICT(slot) DO UPDATE SET owner = excluded.owner",
                    [(slot, owner) for slot in slots],
                )
                db.execute("COMMIT")
            except sqlite3.Error as exc:
                db.execute("ROLLBACK")
                if isinstance(exc, sqlite3.IntegrityError):
                    raise IntermediaryError(
                        f"directory: {owner!r:.80} is not a member; join it first"
                    ) from None
                raise
