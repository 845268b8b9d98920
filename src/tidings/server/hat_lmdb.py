"""A hat-event 0.8.5 lmdb database, read through hat's own backend code.

hat-event's lmdb backend (``hat.event.server.backends.lmdb``) keeps every stored event once
per place that holds it: the latest event of each type (``LATEST_DATA``) and the time series
(``ORDERED_DATA``, one partition per ``ordered`` entry of its configuration, cut by their
limits). Its ``REF`` table lists each stored event's id, ordered by ``(server, session,
instance)``, with where its copies are: that is the list of the events the database holds,
the one hat's Syncer serves from (``query_flushed``). ``SYSTEM`` holds each server's last
registered id, which may lie past the last event kept (conditions, subscriptions and limits
decide what is kept).

The database is opened read-only with hat's own ``ext_create_env`` and its records decoded
by hat's own ``encoder``, so what is read is what hat-event itself would read; an event
becomes a tidings event through the Syncer's wire conversion (hat's ``event_to_sbs``, then
:func:`tidings.wire.codec.event_from_sbs`), exactly as if a hat peer had sent it. Reading a
database while its server runs is safe (an lmdb read transaction is a snapshot); hat-event
needs to be installed (``pip install 'tidings[hat]'``).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

from tidings.errors import HatImportError
from tidings.events.model import EventId, StoredEvent
from tidings.wire.codec import event_from_sbs


def _hat(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise HatImportError(
            f"reading a hat-event lmdb database needs hat-event 0.8.5 installed "
            f"(pip install 'tidings[hat]'): {exc}"
        ) from exc


class HatLmdb:
    """One hat-event lmdb database file, open read-only; a context manager (closes it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._common = _hat("hat.event.server.backends.lmdb.common")
        self._encoder = _hat("hat.event.server.backends.lmdb.encoder")
        self._hat_common = _hat("hat.event.common")
        lmdb = _hat("lmdb")
        if not path.is_file():
            problem = "not a file (give the backend's db_path)" if path.exists() else "no such file"
            raise HatImportError(f"hat-event lmdb database {path}: {problem}")
        try:
            self._env = self._common.ext_create_env(path, readonly=True)
        except lmdb.Error as exc:
            raise HatImportError(f"hat-event lmdb database {path}: cannot open: {exc}") from exc
        try:
            types = self._common.DbType
            self._dbs = {t: self._common.ext_open_db(self._env, t) for t in types}
        except lmdb.Error as exc:
            self._env.close()
            raise HatImportError(
                f"hat-event lmdb database {path}: not a hat-event 0.8.5 database "
                f"(its tables cannot be opened: {exc})"
            ) from exc
        self._txn = self._env.begin(buffers=True)

    def __enter__(self) -> HatLmdb:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._txn.abort()
        self._env.close()

    @contextlib.contextmanager
    def _decoding(self, table: str, key: Any) -> Iterator[None]:
        """Turn a record hat's encoder cannot read (another program's lmdb with the same
        table names, another hat version's, a damaged file) into one clear error."""
        try:
            yield
        except HatImportError:
            raise
        except Exception as exc:  # foreign bytes make hat's decoders raise anything
            raise HatImportError(
                f"hat-event lmdb database {self.path}: the {table} record {bytes(key)[:32]!r} "
                f"is not hat-event 0.8.5's ({type(exc).__name__}: {exc}); not a hat-event "
                "0.8.5 database, or a damaged one"
            ) from exc

    def last_ids(self) -> dict[int, EventId]:
        """Each server's last registered id, as hat's ``SYSTEM`` table records it."""
        found: dict[int, EventId] = {}
        for key, value in self._txn.cursor(self._dbs[self._common.DbType.SYSTEM]):
            with self._decoding("SYSTEM", key):
                server = self._encoder.decode_system_db_key(bytes(key))
                last, _ = self._encoder.decode_system_db_value(bytes(value))
                found[server] = EventId(last.server, last.session, last.instance)
        return found

    def events(self, server: int, after: EventId) -> Iterator[StoredEvent]:
        """The stored events of ``server`` after ``after``, in id order (hat's timestamps
        only grow along a server's ids)."""
        hat_id = self._hat_common.EventId
        start = self._encoder.encode_ref_db_key(hat_id(after.server, after.session, after.instance))
        stop = self._encoder.encode_ref_db_key(hat_id(server + 1, 0, 0))
        cursor = self._txn.cursor(self._dbs[self._common.DbType.REF])
        available = cursor.set_range(start)
        if available and bytes(cursor.key()) == start:
            available = cursor.next()
        while available and bytes(cursor.key()) < stop:
            with self._decoding("REF", cursor.key()):
                refs = self._encoder.decode_ref_db_value(bytes(cursor.value()))
                event = self._event(min(refs, key=repr)) if refs else None
            if event is not None:
                yield event
            available = cursor.next()

    def latest(self) -> list[StoredEvent]:
        """The events of hat's latest-per-type table."""
        cursor = self._txn.cursor(self._dbs[self._common.DbType.LATEST_DATA])
        decode = self._encoder.decode_latest_data_db_value
        found = []
        for key, value in cursor:
            with self._decoding("LATEST_DATA", key):
                found.append(self._converted(decode(bytes(value))))
        return found

    def _event(self, ref: Any) -> StoredEvent:
        """The event a ``REF`` entry points to, from the table it names."""
        common, encoder = self._common, self._encoder
        if isinstance(ref, common.LatestEventRef):
            table, key = common.DbType.LATEST_DATA, encoder.encode_latest_data_db_key(ref.key)
            decode = encoder.decode_latest_data_db_value
        elif isinstance(ref, common.OrderedEventRef):
            table, key = common.DbType.ORDERED_DATA, encoder.encode_ordered_data_db_key(ref.key)
            decode = encoder.decode_ordered_data_db_value
        else:
            raise HatImportError(f"hat-event lmdb database {self.path}: unknown reference {ref!r}")
        value = self._txn.get(key, db=self._dbs[table])
        if value is None:
            raise HatImportError(f"hat-event lmdb database {self.path}: {ref!r} points to no event")
        return self._converted(decode(bytes(value)))

    def _converted(self, event: Any) -> StoredEvent:
        """A hat ``Event`` as tidings stores it: through the Syncer's wire conversion."""
        return event_from_sbs(self._hat_common.event_to_sbs(event), "hat lmdb event")
