"""The fan-out measurement, end to end on real processes and sockets: the benchmark's quick
mode and ``tidings fanout-demo`` run small, and say what they measured (no timing is
asserted: the figures depend on the machine)."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench.harness.processes import TIDINGS
from tidings.errors import IntermediaryError
from tidings.intermediary.measurement.fanout import FanoutConfig, run_fanout

REPO = Path(__file__).resolve().parents[3]
KEYS = (
    "machine",
    "subscribers",
    "entities",
    "tick_hz",
    "delivered_updates_s",
    "staleness_p50_ms",
    "staleness_p99_ms",
    "min_rate_fraction",
    "upstream_ratio_vs_direct",
    "memory_per_subscriber_kib",
    "max_subscribers_held",
)


def test_the_benchmark_runs_end_to_end_in_quick_mode(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "bench.fanout", "--quick", "--results", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads((tmp_path / "fanout.json").read_text())
    assert set(KEYS) <= set(result)
    assert (result["subscribers"], result["entities"], result["tick_hz"]) == (40, 2000, 10.0)
    # Frames arrived, carrying the publisher's tick time, from a tier that sent upstream.
    assert result["delivered_updates_s"] > 0
    assert 0 < result["staleness_p50_ms"] <= result["staleness_p99_ms"] < math.inf
    assert result["min_rate_fraction"] > 0
    assert result["upstream_ratio_vs_direct"] > 0
    assert isinstance(result["max_subscribers_held"], int)
    assert "| staleness p99 |" in (tmp_path / "fanout.md").read_text()


def test_the_demo_prints_its_figures_and_writes_a_png(tmp_path: Path) -> None:
    png = tmp_path / "plot" / "fanout.png"
    args = ["--subscribers", "12", "--entities", "1000", "--intermediaries", "2"]
    args += ["--processes", "2", "--duration", "1", "--warmup", "0.5", "--png", str(png)]
    run = subprocess.run(
        [*TIDINGS, "fanout-demo", *args], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert "12 subscribers in 2 processes, 2 intermediaries, 1000 agents" in out
    for figure in ("delivered updates:", "staleness (publisher tick -> receipt): p50", "upstream:"):
        assert figure in out
    assert "with every subscriber on the publisher" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("field", "value"),
    [("subscribers", 0), ("tick_hz", math.nan), ("relative_share", 2.0), ("processes", True)],
)
def test_a_bad_configuration_is_refused_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(IntermediaryError, match=f"fanout: {field}"):
        FanoutConfig(**{field: value})  # type: ignore[arg-type]


def test_one_subscriber_process_takes_hundreds_of_subscribers() -> None:
    """A process's plan line is ~200 bytes a subscriber: 400 of them are past asyncio's
    default 64 KiB line (the benchmark's search put 400 in each of five processes)."""
    config = FanoutConfig(
        subscribers=400, entities=2000, processes=1, intermediaries=1, duration_s=1, warmup_s=0.5
    )
    assert len(json.dumps({"subscribers": plan_for(config)})) > 64 * 1024
    result = asyncio.run(run_fanout(config))
    assert result.disconnected == 0 and result.delivered_updates_s > 0


def plan_for(config: FanoutConfig) -> list[dict]:
    from tidings.intermediary.measurement.fanout import plan_subscribers
    from tidings.intermediary.publisher.simulation import Simulation
    from tidings.intermediary.regions.geometry import Box

    size = config.world_size
    sim = Simulation(config.entities, Box((0.0, 0.0), (size, size)), seed=config.seed)
    return plan_subscribers(config, sim, ["ws://127.0.0.1:1/"])
