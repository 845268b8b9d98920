"""The replay lease: one holder at a time, released or expired for the next."""

from __future__ import annotations

from pathlib import Path

from tidings.db import make_engine
from tidings.outbox.schema import ensure_schema
from tidings.pipeline.lease import held, release, try_acquire


def test_one_holder_at_a_time_then_release_or_expiry(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'app.db'}")
    ensure_schema(engine)
    assert try_acquire(engine, "replay", "a", ttl=60)
    assert not try_acquire(engine, "replay", "b", ttl=60)
    assert try_acquire(engine, "replay", "a", ttl=60)  # the holder may renew
    release(engine, "replay", "a")
    assert try_acquire(engine, "replay", "b", ttl=-1)  # taken, already expired
    assert try_acquire(engine, "replay", "c", ttl=60)  # so the next one gets it
    with held(engine, "replay", 60) as mine:
        assert not mine
    release(engine, "replay", "c")
    with held(engine, "replay", 60) as mine:
        assert mine
        with held(engine, "replay", 60) as second:
            assert not second
    assert try_acquire(engine, "replay", "d", ttl=60)  # released on leaving the block
