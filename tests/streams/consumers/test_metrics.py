"""The streams' metrics (issue 30: operational endpoints on loopback by default): served on
the event server's own metrics endpoint, never on a stream's port, over real sockets."""

from __future__ import annotations

import pytest

from tests.support.stream_helpers import add_events, call, poll, serving, stream_server_config
from tests.support.waiting import run
from tidings.config.streams import load_stream_server_config
from tidings.errors import ConfigError


def test_stream_metrics_show_positions_and_lag_on_the_servers_loopback_endpoint(
    tmp_path,
) -> None:
    """A stream's metrics name its users and consumers: they are served on the server's
    metrics endpoint (127.0.0.1 by default), not on the stream's own port, which consumers
    from anywhere may reach."""
    import httpx

    config = stream_server_config(f"sqlite:///{tmp_path}/e.db", secure_channel=True, metrics=True)

    async def scenario() -> str:
        async with serving(config) as server:
            for component in ("UP", "BEHIND"):
                await call(
                    server.url, "futoin.evt.poll:1.1:registerConsumer", {"component": component}
                )
            ids = await add_events(server.url, 6)
            await poll(server.url, "UP", ids[-1])
            await poll(server.url, "BEHIND", ids[1])
            async with httpx.AsyncClient() as client:
                on_stream_port = await client.get(server.url + "/metrics")
                response = await client.get(server.metrics_url)
            assert on_stream_port.status_code in (404, 405)
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/plain")
            return response.text

    text = run(scenario(), timeout=60)
    assert (
        'tidings_stream_consumer_lag_events{component="BEHIND",stream="s",user="ftn18"} 4.0' in text
    )
    assert 'tidings_stream_consumer_lag_events{component="UP",stream="s",user="ftn18"} 0.0' in text
    assert 'tidings_stream_id{end="last",stream="s"}' in text
    assert 'tidings_stream_push_sessions{stream="s"} 0.0' in text
    assert "tidings_server_events_registered_total" in text  # the server's own, alongside


def test_stream_metrics_need_the_servers_metrics_endpoint(tmp_path) -> None:
    config = stream_server_config(f"sqlite:///{tmp_path}/e.db", metrics=True)
    del config["metrics"]
    with pytest.raises(ConfigError, match=r"streams.0.metrics: .* add metrics: \{port: PORT\}"):
        load_stream_server_config(config)
