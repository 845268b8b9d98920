"""The double-buffered columnar state store: no reader ever sees a half-applied epoch, both
buffers converge after each swap, upserts and deletions, 50,000 entities without a Python
object each, and bad input refused with a message naming the problem."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidings.errors import UsageError
from tidings.intermediary.node.batches import Column, UpdateBatch
from tidings.intermediary.node.snapshot import Snapshot
from tidings.intermediary.node.state import StateStore

COLUMNS = {"velocity": Column("float64", width=3), "kind": Column("int64", default=-1)}


def store3() -> StateStore:
    return StateStore(3, COLUMNS, initial_capacity=4)


def batch_at(ids: np.ndarray, value: float, dim: int = 3) -> UpdateBatch:
    """Every column of every entity set to ``value`` (the epoch, in the atomicity test)."""
    n = len(ids)
    return UpdateBatch(
        ids=ids,
        positions=np.full((n, dim), value),
        columns={"velocity": np.full((n, 3), value), "kind": np.full(n, int(value))},
    )


def test_readers_never_see_a_half_applied_epoch() -> None:
    """A writer sets every entity's columns to the epoch number, in several batches per epoch
    (and adds and removes entities); readers assert every row of a snapshot carries its
    epoch. Bounded by epochs, not time."""
    store = store3()
    epochs = 300
    base = np.arange(0, 2000, dtype=np.int64)
    # Epoch 0 is the empty store; make every later epoch carry its number everywhere.
    done = threading.Event()
    failures: list[str] = []
    seen: list[set[int]] = []

    def writer() -> None:
        try:
            for epoch in range(1, epochs + 1):
                # Ids change from epoch to epoch (upserts and deletions), in three batches.
                ids = base[epoch % 7 :: 1 + epoch % 3]
                gone = np.setdiff1d(base, ids)
                store.apply(batch_at(ids[: len(ids) // 2], epoch))
                store.apply(UpdateBatch(delete=gone))
                store.apply(batch_at(ids[len(ids) // 2 :], epoch))
                assert store.end_epoch() == epoch
        except Exception as exc:  # pragma: no cover - reported by the assertion below
            failures.append(f"writer: {exc!r}")
        finally:
            done.set()

    def reader() -> None:
        mine: set[int] = set()
        held: Snapshot | None = None
        while not done.is_set() or not mine:
            snap = store.snapshot()
            mine.add(snap.epoch)
            problem = check(snap)
            if problem:
                failures.append(problem)
                return
            # Hold every 5th snapshot across later swaps, then check it is unchanged.
            if held is not None:
                problem = check(held)
                if problem:
                    failures.append("held " + problem)
                    return
            if len(mine) % 5 == 0:
                held = snap
        seen.append(mine)

    def check(snap: Snapshot) -> str | None:
        e = snap.epoch
        if e == 0:
            return None if len(snap) == 0 else f"epoch 0 has {len(snap)} rows"
        expected = base[e % 7 :: 1 + e % 3]
        if not np.array_equal(snap.ids, expected):
            return f"epoch {e}: ids are not the epoch's"
        if not (
            np.all(snap.positions == e)
            and np.all(snap.column("velocity") == e)
            and np.all(snap.column("kind") == e)
        ):
            return f"epoch {e}: a row carries another epoch's value"
        return None

    readers = [threading.Thread(target=reader) for _ in range(3)]
    write = threading.Thread(target=writer)
    for thread in readers:
        thread.start()
    write.start()
    write.join()
    for thread in readers:
        thread.join()
    assert failures == []
    assert store.epoch == epochs
    assert store.buffers_converged()
    # The readers saw the epochs advance (more than one epoch each).
    assert all(len(epochs_seen) > 1 for epochs_seen in seen)


def test_a_kept_array_is_not_overwritten_by_later_epochs() -> None:
    """An array taken out of a snapshot stays as it was even after the snapshot is dropped:
    the store copies instead of writing into a buffer someone still reads."""
    store = store3()
    store.apply(batch_at(np.arange(10), 1.0))
    store.end_epoch()
    positions = store.snapshot().positions  # the snapshot itself is gone at once
    for epoch in (2.0, 3.0, 4.0):
        store.apply(batch_at(np.arange(10), epoch))
        store.end_epoch()
    assert np.all(positions == 1.0)
    assert store.detached >= 1
    assert np.all(store.snapshot().positions == 4.0)
    assert not positions.flags.writeable


def test_no_copy_when_nobody_holds_the_old_epoch() -> None:
    store = store3()
    for epoch in range(1, 20):
        store.apply(batch_at(np.arange(100), epoch))
        store.end_epoch()
        snap = store.snapshot()
        assert np.all(snap.positions == epoch)
        del snap
    assert store.detached == 0


def test_both_buffers_hold_the_same_data_after_end_epoch() -> None:
    store = store3()
    rng = np.random.default_rng(7)
    for _ in range(30):
        ids = rng.choice(500, size=rng.integers(1, 200), replace=True)
        store.apply(UpdateBatch(ids=ids, positions=rng.normal(size=(len(ids), 3)), columns={}))
        store.apply(UpdateBatch(delete=rng.choice(500, size=20)))
        assert store.pending == 2
        store.end_epoch()
        assert store.pending == 0
        assert store.buffers_converged()
    # Updates waiting in the inert buffer are not visible yet.
    before = store.snapshot()
    store.apply(batch_at(np.array([10_000]), 9.0))
    assert 10_000 not in store.snapshot().ids
    assert store.snapshot().epoch == before.epoch
    store.end_epoch()
    assert store.snapshot().position_of(10_000).tolist() == [9.0, 9.0, 9.0]


def test_upserts_deletions_and_defaults() -> None:
    store = store3()
    store.apply(
        UpdateBatch(
            ids=[30, 10, 20],
            positions=[[3, 3, 3], [1, 1, 1], [2, 2, 2]],
            columns={"kind": [3, 1, 2]},
        )
    )
    store.end_epoch()
    snap = store.snapshot()
    assert snap.ids.tolist() == [10, 20, 30]
    assert snap.positions[:, 0].tolist() == [1, 2, 3]
    assert snap.column("kind").tolist() == [1, 2, 3]
    # velocity was not given: the column's default (0) for new entities.
    assert snap.column("velocity").tolist() == [[0, 0, 0]] * 3
    # Update one (velocity only given; kind kept), insert two, delete one, delete unknown.
    store.apply(
        UpdateBatch(
            ids=[20, 5, 25],
            positions=[[9, 9, 9], [0.5, 0, 0], [2.5, 0, 0]],
            columns={"velocity": [[1, 0, 0], [2, 0, 0], [3, 0, 0]]},
            delete=[30, 999],
        )
    )
    store.end_epoch()
    snap = store.snapshot()
    assert snap.ids.tolist() == [5, 10, 20, 25]
    assert snap.positions[:, 0].tolist() == [0.5, 1, 9, 2.5]
    assert snap.column("kind").tolist() == [-1, 1, 2, -1]
    assert snap.column("velocity")[:, 0].tolist() == [2, 0, 1, 3]
    assert snap.rows_of([25, 30, 5]).tolist() == [3, -1, 0]
    assert snap.position_of(30) is None
    assert store.buffers_converged()


def test_duplicate_ids_in_one_batch_last_wins() -> None:
    store = StateStore(2)
    store.apply(UpdateBatch(ids=[1, 2, 1, 1], positions=[[1, 1], [2, 2], [3, 3], [4, 4]]))
    store.end_epoch()
    snap = store.snapshot()
    assert snap.ids.tolist() == [1, 2]
    assert snap.positions.tolist() == [[4, 4], [2, 2]]


def test_growth_and_shrink_keep_the_data() -> None:
    store = StateStore(2, initial_capacity=1)
    ids = np.arange(5000)[::-1]
    store.apply(UpdateBatch(ids=ids, positions=np.stack([ids, -ids], axis=1)))
    store.end_epoch()
    store.apply(UpdateBatch(delete=np.arange(10, 5000)))
    store.end_epoch()
    snap = store.snapshot()
    assert snap.ids.tolist() == list(range(10))
    assert snap.positions[:, 1].tolist() == [-i for i in range(10)]
    assert store.buffers_converged()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(0, 40), max_size=15),
            st.lists(st.integers(0, 40), max_size=5),
            st.booleans(),
        ),
        max_size=12,
    )
)
def test_matches_a_dict_reference(batches: list[tuple[list[int], list[int], bool]]) -> None:
    """Any sequence of batches and epoch ends leaves the store as a plain dict would."""
    store = StateStore(2, {"kind": Column("int64")}, initial_capacity=2)
    reference: dict[int, tuple[float, int]] = {}
    visible: dict[int, tuple[float, int]] = {}
    for step, (ups, dels, end) in enumerate(batches):
        dels = [d for d in dels if d not in ups]
        values = [float(step * 100 + i) for i in range(len(ups))]
        store.apply(
            UpdateBatch(
                ids=np.array(ups, dtype=np.int64),
                positions=np.array([[v, -v] for v in values]).reshape(len(ups), 2),
                columns={"kind": np.full(len(ups), step, dtype=np.int64)},
                delete=np.array(dels, dtype=np.int64),
            )
        )
        for entity, value in zip(ups, values, strict=True):
            reference[entity] = (value, step)
        for entity in dels:
            reference.pop(entity, None)
        if end:
            store.end_epoch()
            visible = dict(reference)
        snap = store.snapshot()
        assert snap.ids.tolist() == sorted(visible)
        assert snap.positions[:, 0].tolist() == [visible[i][0] for i in sorted(visible)]
        assert snap.column("kind").tolist() == [visible[i][1] for i in sorted(visible)]
    assert store.buffers_converged()


def test_50000_entities_in_3d_are_columns_not_objects() -> None:
    store = StateStore(3, {"kind": Column("int64")})
    n = 50_000
    rng = np.random.default_rng(1)
    ids = rng.permutation(n).astype(np.int64) * 3
    positions = rng.uniform(-100, 100, size=(n, 3))
    store.apply(UpdateBatch(ids=ids, positions=positions, columns={"kind": ids % 5}))
    store.end_epoch()
    snap = store.snapshot()
    assert len(snap) == n
    assert snap.ids.dtype == np.int64 and snap.ids.shape == (n,)
    assert snap.positions.dtype == np.float64 and snap.positions.shape == (n, 3)
    assert snap.column("kind").shape == (n,)
    # The snapshot is views of the store's arrays, not copies, and not writable.
    assert snap.positions.base is not None
    assert not snap.positions.flags.writeable and not snap.ids.flags.writeable
    with pytest.raises(ValueError):
        snap.positions[0, 0] = 1.0
    # A sphere of radius 50 around the origin, vectorised, and one kind.
    mask = (np.einsum("ij,ij->i", snap.positions, snap.positions) <= 50.0**2) & (
        snap.column("kind") == 2
    )
    rows = snap.rows_in(mask)
    assert rows.dtype == np.int64
    expected = {
        int(i) for i, p in zip(ids, positions, strict=True) if float(p @ p) <= 2500.0 and i % 5 == 2
    }
    assert set(snap.ids[rows].tolist()) == expected
    assert np.all(np.diff(snap.ids) > 0)  # sorted: the id -> row map is searchsorted
    found = snap.rows_of(ids[:1000])
    assert np.array_equal(snap.ids[found], ids[:1000])


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        (UpdateBatch(ids=[1, 2], positions=[[0, 0, 0], [np.nan, 0, 0]]), "id 2 is not finite"),
        (UpdateBatch(ids=[7], positions=[[np.inf, 0, 0]]), "id 7 is not finite"),
        (UpdateBatch(ids=[1], positions=[[0, 0]]), "shape (1, 3)"),
        (UpdateBatch(ids=[1]), "no positions"),
        (UpdateBatch(ids=[1.5], positions=[[0, 0, 0]]), "ids must be integers"),
        (UpdateBatch(ids=[[1]], positions=[[0, 0, 0]]), "one-dimensional"),
        (UpdateBatch(ids=["a"], positions=[[0, 0, 0]]), "ids must be integers"),
        (UpdateBatch(ids=[1], positions=[["x", 0, 0]]), "must be numbers"),
        (
            UpdateBatch(ids=[1], positions=[[0, 0, 0]], columns={"mass": [1.0]}),
            "unknown columns ['mass']",
        ),
        (
            UpdateBatch(ids=[1], positions=[[0, 0, 0]], columns={"kind": [1.5]}),
            "column 'kind' must be integers",
        ),
        (
            UpdateBatch(ids=[3], positions=[[0, 0, 0]], columns={"velocity": [[0, np.nan, 0]]}),
            "column 'velocity' of id 3 is not finite",
        ),
        (UpdateBatch(ids=[4], positions=[[0, 0, 0]], delete=[4]), "both upserted and deleted"),
    ],
)
def test_bad_batches_are_refused_and_change_nothing(batch: UpdateBatch, message: str) -> None:
    store = store3()
    store.apply(batch_at(np.array([1, 2]), 1.0))
    with pytest.raises(UsageError) as caught:
        store.apply(batch)
    assert message in str(caught.value)
    assert store.pending == 1
    store.end_epoch()
    assert store.snapshot().ids.tolist() == [1, 2]
    assert store.buffers_converged()


def test_bad_construction_and_limits() -> None:
    for dim in (1, 4, True):
        with pytest.raises(UsageError, match="dim must be 2 or 3"):
            StateStore(dim)
    with pytest.raises(UsageError, match="column name"):
        StateStore(2, {"positions": Column()})
    with pytest.raises(UsageError, match="dtype"):
        Column("float32")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="max_entities"):
        StateStore(2, max_entities=0)
    store = StateStore(2, max_entities=3)
    store.apply(UpdateBatch(ids=[1, 2], positions=np.zeros((2, 2))))
    with pytest.raises(UsageError, match="at most 3"):
        store.apply(UpdateBatch(ids=[3, 4], positions=np.zeros((2, 2))))
    store.apply(UpdateBatch(ids=[2, 3], positions=np.zeros((2, 2))))  # 2 exists: 3 in all
    with pytest.raises(UsageError, match="UpdateBatch"):
        store.apply({"ids": [1]})  # type: ignore[arg-type]
    snap = store.snapshot()
    with pytest.raises(UsageError, match="bool array of shape"):
        snap.rows_in(np.ones(5))
    with pytest.raises(UsageError, match="no column 'kind'"):
        snap.column("kind")
