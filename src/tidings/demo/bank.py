"""The demo's service: a small bank that writes accounts and emits their events in the same
transactions, through :class:`~tidings.outbox.producer.Outbox`.

Every operation is one transaction: the account row changes and its domain event is emitted
(partition key: the account, so one account's events stay in order). With ``rows=True`` the
changed row is emitted too, as a row event (:func:`~tidings.intermediary.views.rows.emit_row`),
so an intermediary can serve SQL views over the ``account`` table. A share of the transactions
is rolled back after emitting, as a service's failed requests are: their rows and their events
must appear nowhere.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from sqlalchemy import Engine

from tidings.intermediary.views.rows import emit_row
from tidings.outbox.producer import Outbox

#: The account table, as the bank's own schema.
ACCOUNT_DDL = (
    "CREATE TABLE IF NOT EXISTS account (id TEXT PRIMARY KEY, balance INTEGER, lim INTEGER)"
)
#: The kinds of operation after an account is opened (StatementViewed has no route in the
#: core demo: it ends UNROUTABLE there).
OPERATIONS = ("MoneyDeposited", "MoneyWithdrawn", "LimitChanged", "StatementViewed")


class _RolledBack(Exception):
    """Raised inside a transaction to roll it back on purpose."""


@dataclass
class BankRun:
    """What the bank did: operations committed and rolled back."""

    committed: int = 0
    rolled_back: int = 0


class Bank:
    """Performs random operations on accounts, at a steady rate."""

    def __init__(
        self,
        engine: Engine,
        outbox: Outbox,
        *,
        kinds: tuple[str, ...] = OPERATIONS,
        rows: bool = False,
        rollback_share: float = 0.0,
        seed: int = 7,
    ) -> None:
        self._engine = engine
        self._outbox = outbox
        self._kinds = kinds
        self._rows = rows
        self._rollback_share = rollback_share
        self._rng = random.Random(seed)
        self._accounts: list[str] = []
        with engine.begin() as conn:
            conn.exec_driver_sql(ACCOUNT_DDL)

    def run(self, operations: int, rate: float) -> BankRun:
        """Perform ``operations`` transactions at about ``rate`` a second."""
        done = BankRun()
        start = time.monotonic()
        for n in range(operations):
            try:
                self._operation(n)
                done.committed += 1
            except _RolledBack:
                done.rolled_back += 1
            delay = start + (n + 1) / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        return done

    def _operation(self, n: int) -> None:
        rng = self._rng
        opening = not self._accounts or rng.random() < 0.05
        account = f"ACC{len(self._accounts):05d}" if opening else rng.choice(self._accounts)
        fail = rng.random() < self._rollback_share
        with self._outbox.transaction() as tx:
            sql = tx.connection.exec_driver_sql
            if opening:
                sql("INSERT INTO account VALUES (?, 0, 1000)", (account,))
                tx.emit("AccountOpened", {"account": account}, partition_key=account)
            else:
                kind = rng.choice(self._kinds)
                amount = rng.randint(1, 500)
                if kind == "LimitChanged":
                    sql("UPDATE account SET lim = ? WHERE id = ?", (amount * 10, account))
                else:
                    sign = {"MoneyDeposited": 1, "MoneyWithdrawn": -1}.get(kind, 0)
                    sql(
                        "UPDATE account SET balance = balance + ? WHERE id = ?",
                        (sign * amount, account),
                    )
                tx.emit(
                    kind, {"account": account, "amount": amount, "op": n}, partition_key=account
                )
            if self._rows:
                row = sql("SELECT id, balance, lim FROM account WHERE id = ?", (account,)).one()
                emit_row(tx, "account", account, dict(row._mapping))
            if fail:
                raise _RolledBack
        if opening:
            self._accounts.append(account)
