"""The intermediaries page's reading: one without a metrics endpoint and one whose endpoint
does not answer are each said so (the page's figures from a running intermediary are in
``test_runner.py``, under ``tidings run``)."""

from __future__ import annotations

from bench.harness.processes import free_port
from tidings.config import load_config
from tidings.console.intermediaries import read_intermediaries


def test_an_intermediary_without_or_with_a_silent_endpoint_is_said_so() -> None:
    def section(**extra: object) -> dict[str, object]:
        return {
            "listen": f"127.0.0.1:{free_port()}",
            "event_server": f"tcp+sbs://127.0.0.1:{free_port()}",
            **extra,
        }

    config = load_config(
        {
            "intermediaries": {
                "plain": section(),
                "silent": section(metrics={"port": free_port()}),
            }
        }
    )
    views = {v.name: v for v in read_intermediaries(config)}
    assert views["intermediary.plain"].problem.startswith("no metrics endpoint")
    assert views["intermediary.silent"].problem.startswith("its metrics endpoint did not answer")
    assert not views["intermediary.silent"].figures
