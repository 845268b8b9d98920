"""The whole-chain demo end to end: real SQLite, local Spark, the event server with its
module and stream, the intermediary, real sockets. Its verdict holds, and it is judged from
the stores (the verdict's own tests show each kind of failure is caught)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidings.demo import run_chain_demo

pytestmark = [pytest.mark.spark, pytest.mark.sockets]


def test_the_whole_chain_delivers_every_committed_event_to_every_reader(
    spark, tmp_path: Path
) -> None:
    result = run_chain_demo(tmp_path / "demo", operations=300, rate=300, say=lambda _: None)
    verdict = result.verdict
    assert verdict.ok, verdict.problems
    assert result.bank.committed + result.bank.rolled_back == 300
    assert result.bank.rolled_back > 0  # the bank rolled some back: their events appear nowhere
    assert [c.received - c.duplicates for c in verdict.consumers] == [verdict.committed] * 2
    assert verdict.live_received > 0 and verdict.view_rows > 0
    assert verdict.alerts_stored == verdict.alerts_expected
    assert result.deployment.path.is_file()
