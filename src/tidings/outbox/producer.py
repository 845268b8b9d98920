"""The producer API: domain writes and their events commit together or not at all.

Events are inserted into ``outbox_event`` on the *caller's own* connection, inside the
caller's transaction (patent claim 2, the design document's primary transaction). Three
ways in, one code path:

* ``outbox.emit(session, ...)`` with the service's SQLAlchemy ``Session``;
* ``outbox.emit(connection, ...)`` with a SQLAlchemy ``Connection``;
* ``with outbox.transaction() as tx: tx.connection.execute(...); tx.emit(...)``.

Excluded events (per-event flag or predicate) are not stored: they are handed to the
direct publisher after the transaction commits and carry no delivery guarantee.

A failed emit dooms its transaction, the same way in all three: every later emit in it and
its commit raise :class:`~tidings.errors.TransactionDoomed`, naming the first failure, so a
caught :class:`~tidings.errors.EmitError` can never let the domain write commit without its
events (guarantee 1). Rolling back (or leaving the ``with`` block) ends the doomed
transaction; the Session or Connection is then usable again.
"""

from __future__ import annotations

import json
import logging
import weakref
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy import event as sa_event
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from tidings.config import OutboxConfig
from tidings.db import driver_stamp, is_mysql, make_engine, placeholder
from tidings.errors import EmitError, TransactionDoomed
from tidings.events.ids import new_id
from tidings.events.outbox import EventStatus, OutboxEvent
from tidings.events.timeutil import utcnow
from tidings.outbox.checks import encode_body, make_draft
from tidings.outbox.envelope import (
    AttributeExtractor,
    EventDraft,
    ExclusionPredicate,
    JsonDefault,
    Transformer,
    cloudevents_envelope,
)
from tidings.outbox.schema import ensure_schema
from tidings.outbox.writers import claim_slot

DirectPublisher = Callable[[Sequence[OutboxEvent]], None]
#: Why a routed target will always refuse an event (that target's ``refusal``), or None.
TargetCheck = Callable[[OutboxEvent], str | None]
Bind = Session | Connection

_EVENT_COLUMNS = (
    "event_id, correlation_id, event_type, event_version, originator, partition_key, "
    "partition_bucket, payload, headers, logged_at, status, retry_count, created_at, "
    "updated_at, concurrency_version"
)
_ATTRIBUTE_COLUMNS = "attribute_id, event_id, attribute_key, attribute_value, updated_at"
_PENDING_KEY = "tidings_excluded_events"
#: The relay numbers an event only when it commits; a target sizing it at emit sees the
#: widest sequence number, so a header carrying it is counted at its largest.
EMIT_SEQ_PLACEHOLDER = 2**63 - 1
#: Transactions in which an emit failed, with the first failure's message (a string, so the
#: entry holds no frame that would keep the transaction alive).
_doomed: weakref.WeakKeyDictionary[object, str] = weakref.WeakKeyDictionary()
log = logging.getLogger(__name__)


def partition_bucket(partition_key: str | None, event_id: str) -> int:
    """A stable non-negative hash that sends all events of one key to the same relay task."""
    basis = partition_key if partition_key is not None else event_id
    return zlib.crc32(basis.encode("utf-8")) & 0x7FFFFFFF


def _insert_sql(table: str, columns: str, paramstyle: str) -> str:
    count = columns.count(",") + 1
    mark = placeholder(paramstyle)
    return f"INSERT INTO {table} ({columns}) VALUES ({', '.join([mark] * count)})"


class Outbox:
    """Emits events into the event log inside the caller's database transaction."""

    def __init__(
        self,
        engine: Engine | str,
        config: OutboxConfig | None = None,
        *,
        transformer: Transformer = cloudevents_envelope,
        attribute_extractor: AttributeExtractor | None = None,
        exclude: ExclusionPredicate | None = None,
        direct_publisher: DirectPublisher | None = None,
        target_check: TargetCheck | None = None,
        json_default: JsonDefault | None = None,
        create_schema: bool = True,
    ) -> None:
        """``json_default`` (``json.dumps``'s ``default``) encodes payload values JSON has no
        type for; :func:`tidings.json_default` handles dates, decimals, UUIDs, dataclasses
        and pydantic models. Without it such a value is an :class:`EmitError`."""
        self.engine = make_engine(engine) if isinstance(engine, str) else engine
        self.config = config or OutboxConfig()
        self.transformer = transformer
        self.attribute_extractor = attribute_extractor
        self.exclude = exclude
        self.direct_publisher = direct_publisher
        self.target_check = target_check
        self.json_default = json_default
        if create_schema:
            ensure_schema(self.engine)
        style = self.engine.dialect.paramstyle
        self._insert_event = _insert_sql("outbox_event", _EVENT_COLUMNS, style)
        self._insert_attribute = _insert_sql("outbox_event_attribute", _ATTRIBUTE_COLUMNS, style)
        self._stamp = driver_stamp(self.engine.dialect.name)
        #: MySQL/MariaDB: an emit locks its connection's writer slot before drawing a seq.
        self._claims_slot = is_mysql(self.engine.dialect.name)

    @contextmanager
    def transaction(self) -> Iterator[OutboxTransaction]:
        """A transaction of tidings' own: commit on success, roll back on any exception.

        A transaction in which an emit failed is not committed even if the failure was
        caught: leaving the block rolls it back and raises :class:`TransactionDoomed`.
        """
        with self.engine.connect() as conn:
            tx = OutboxTransaction(self, conn)
            with conn.begin():
                yield tx
                _refuse_commit(conn.get_transaction())
            excluded, tx.excluded = tx.excluded, []
        self._publish_excluded(excluded)

    def emit(
        self,
        bind: Bind | OutboxTransaction,
        event_type: str,
        payload: Any,
        *,
        partition_key: str | None = None,
        correlation_id: str | None = None,
        headers: Mapping[str, str] | None = None,
        version: str = "1",
        event_id: str | None = None,
        exclude: bool = False,
    ) -> str:
        """Add one event to the caller's transaction and return its event id.

        On invalid input :class:`EmitError` is raised and the caller's transaction doomed:
        its commit raises :class:`TransactionDoomed`, so neither the domain write nor any
        of its events can commit, even if the caller catches the error and goes on.
        """
        _refuse_emit(bind)
        try:
            draft = make_draft(
                event_type,
                payload,
                partition_key=partition_key,
                correlation_id=correlation_id,
                headers=headers,
                version=version,
                event_id=event_id,
                originator=self.config.originator,
            )
            body = encode_body(
                draft, self.transformer, self.config.max_payload_bytes, self.json_default
            )
            self._check_targets(draft, body)
            excluded = exclude or (self.exclude is not None and self.exclude(draft))
            if excluded:
                self._defer_excluded(bind, draft, body)
            else:
                self._insert(_connection_of(bind), draft, body)
        except IntegrityError:
            error = EmitError(f"event id {event_id!r} is already in the event log")
            _doom(bind, error)
            raise error from None
        except EmitError as error:
            _doom(bind, error)
            raise
        return draft.event_id

    # -- internals -------------------------------------------------------------------------

    def _check_targets(self, draft: EventDraft, body: str) -> None:
        """Refuse now what a routed target will always refuse, sized as it will travel."""
        if self.target_check is None:
            return
        reason = self.target_check(_event_of(draft, body, EMIT_SEQ_PLACEHOLDER))
        if reason is not None:
            raise EmitError(f"{draft.event_type!r} event refused at emit: {reason}")

    def _insert(self, conn: Connection, draft: EventDraft, body: str) -> None:
        now = utcnow()
        stamp = self._stamp
        if self._claims_slot:
            claim_slot(conn)
        conn.exec_driver_sql(
            self._insert_event,
            (
                draft.event_id,
                draft.correlation_id,
                draft.event_type,
                draft.version,
                draft.originator,
                draft.partition_key,
                partition_bucket(draft.partition_key, draft.event_id),
                body,
                json.dumps(dict(draft.headers), separators=(",", ":")),
                stamp(draft.logged_at),
                EventStatus.PENDING.value,
                0,
                stamp(now),
                stamp(now),
                1,
            ),
        )
        if self.attribute_extractor is not None:
            attributes = self.attribute_extractor(draft)
            rows = [
                (
                    new_id(),
                    draft.event_id,
                    str(key),
                    None if value is None else str(value),
                    stamp(now),
                )
                for key, value in attributes.items()
            ]
            if rows:
                conn.exec_driver_sql(self._insert_attribute, rows)

    def _defer_excluded(self, bind: Bind | OutboxTransaction, draft: EventDraft, body: str) -> None:
        if self.direct_publisher is None:
            raise EmitError(
                f"event {draft.event_type!r} is excluded from the outbox but this Outbox has no "
                "direct publisher: build it with tidings.targets.routed.outbox_from_config(config) "
                "or pass direct_publisher="
            )
        deferred = _event_of(draft, body, seq=0)  # not in the log: no sequence number
        if isinstance(bind, OutboxTransaction):
            bind.excluded.append(deferred)
            return
        if not isinstance(bind, Session):
            raise EmitError(
                "an excluded event needs a Session or outbox.transaction(): a bare Connection "
                "has no after-commit hook to publish it from"
            )
        if not sa_event.contains(bind, "after_commit", self._after_session_commit):
            sa_event.listen(bind, "after_commit", self._after_session_commit)
            sa_event.listen(bind, "after_soft_rollback", _forget_excluded)
        bind.connection()  # begin the transaction, so its commit or rollback is seen
        bind.info.setdefault(_PENDING_KEY, []).append(deferred)

    def _after_session_commit(self, session: Session) -> None:
        self._publish_excluded(session.info.pop(_PENDING_KEY, None) or [])

    def _publish_excluded(self, events: Sequence[OutboxEvent]) -> None:
        """After the commit: a failure here must not look like a failed commit to the caller."""
        if not events or self.direct_publisher is None:
            return
        try:
            self.direct_publisher(events)
        except Exception:
            log.exception("publishing excluded events failed", extra={"events": len(events)})


class OutboxTransaction:
    """The ``tx`` of ``with outbox.transaction() as tx``: a connection and an emit."""

    def __init__(self, outbox: Outbox, connection: Connection) -> None:
        self.outbox = outbox
        self.connection = connection
        self.excluded: list[OutboxEvent] = []

    def emit(self, event_type: str, payload: Any, **kwargs: Any) -> str:
        """Emit an event in this transaction; same arguments as :meth:`Outbox.emit`."""
        return self.outbox.emit(self, event_type, payload, **kwargs)


def _connection_of(bind: Bind | OutboxTransaction) -> Connection:
    if isinstance(bind, OutboxTransaction):
        return bind.connection
    if isinstance(bind, Session):
        return bind.connection()
    if isinstance(bind, Connection):
        return bind
    raise EmitError(f"emit needs a Session, Connection or outbox transaction, got {bind!r}")


def _event_of(draft: EventDraft, body: str, seq: int) -> OutboxEvent:
    """The event as the relay (or the direct publisher) will hand it to a target."""
    return OutboxEvent(
        seq=seq,
        event_id=draft.event_id,
        event_type=draft.event_type,
        payload=body,
        logged_at=draft.logged_at,
        version=draft.version,
        correlation_id=draft.correlation_id,
        originator=draft.originator,
        partition_key=draft.partition_key,
        headers=dict(draft.headers),
    )


# -- doomed transactions ---------------------------------------------------------------------
#
# A failed emit does not roll back at once: SQLAlchemy would begin a fresh transaction on the
# caller's next statement, and a caught error would let that one commit the domain write
# without its events. The transaction stays open and is marked instead; its commit is refused
# by a hook on the Session (``before_commit``: nothing is flushed) or on the Connection
# (``commit``), and ``outbox.transaction()`` checks before it commits.


def _transaction_of(bind: object) -> object | None:
    """The caller's root transaction that an emit on ``bind`` joins, if one has begun (None
    for anything else a caller may have passed: emit refuses it)."""
    if isinstance(bind, OutboxTransaction):
        return bind.connection.get_transaction()
    if isinstance(bind, Session | Connection):
        return bind.get_transaction()
    return None


def _doom(bind: object, error: EmitError) -> None:
    """Mark the transaction of ``bind`` so that it can only be rolled back."""
    if isinstance(bind, OutboxTransaction):
        bind = bind.connection
    if isinstance(bind, Session):
        bind.connection()  # begin the transaction if the failure came before any statement
        if not sa_event.contains(bind, "before_commit", _refuse_session_commit):
            sa_event.listen(bind, "before_commit", _refuse_session_commit)
    elif isinstance(bind, Connection):
        if not bind.in_transaction():
            bind.begin()  # the caller's next statement would otherwise begin an undoomed one
        if not sa_event.contains(bind, "commit", _refuse_connection_commit):
            sa_event.listen(bind, "commit", _refuse_connection_commit)
    else:
        return  # not a transaction: emit already said so
    transaction = bind.get_transaction()
    if transaction is not None and transaction not in _doomed:
        _doomed[transaction] = f"{type(error).__name__}: {error}"


def _doom_cause(transaction: object | None) -> str | None:
    """The first failed emit of ``transaction``, or None if it may commit."""
    if transaction is None or not _doomed:
        return None
    return _doomed.get(transaction)


def _refuse_emit(bind: Bind | OutboxTransaction) -> None:
    if (cause := _doom_cause(_transaction_of(bind))) is not None:
        raise TransactionDoomed(
            f"emit refused: an earlier emit in this transaction failed ({cause}); "
            "the transaction can only be rolled back"
        )


def _refuse_commit(transaction: object | None) -> None:
    if (cause := _doom_cause(transaction)) is not None:
        raise TransactionDoomed(
            f"transaction not committed: an emit in it failed ({cause}); nothing of it is "
            "written, it can only be rolled back"
        )


def _refuse_session_commit(session: Session) -> None:
    _refuse_commit(session.get_transaction())


def _refuse_connection_commit(conn: Connection) -> None:
    transaction = conn.get_transaction()
    if _doom_cause(transaction) is not None:
        # SQLAlchemy marks a transaction whose commit raised as ended and will not roll it
        # back; roll the database transaction back here, so nothing of it can commit later.
        conn.engine.dialect.do_rollback(conn.connection)
    _refuse_commit(transaction)


def _forget_excluded(session: Session, _previous: object) -> None:
    session.info.pop(_PENDING_KEY, None)
