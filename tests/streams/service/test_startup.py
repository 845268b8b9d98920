"""Starting the streams: ``tidings server`` refuses bad streams before it opens anything, and
the streams' sockets."""

from __future__ import annotations

import os

from tests.support.stream_helpers import USER, stream_server_config


def test_tidings_server_refuses_bad_streams_before_it_starts(tmp_path) -> None:
    import subprocess
    import sys

    import yaml

    config = stream_server_config(f"sqlite:///{tmp_path}/e.db")
    config["stream_users"] = {USER: {"password_hash_env": "TIDINGS_TEST_UNSET_HASH"}}
    path = tmp_path / "server.yaml"
    for mutate, message in [
        (lambda c: None, "TIDINGS_TEST_UNSET_HASH is not set"),
        (lambda c: c["streams"][0]["types"].update({"LOW": [["orders", "*"]]}), "collide"),
    ]:
        mutate(config)
        path.write_text(yaml.safe_dump(config))
        done = subprocess.run(
            [sys.executable, "-m", "tidings.cli", "server", "--conf", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            env={k: v for k, v in os.environ.items() if k != "TIDINGS_TEST_UNSET_HASH"},
        )
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
        assert not (tmp_path / "e.db").exists()  # refused before the store was opened


def test_stream_sockets_ask_for_tcp_nodelay() -> None:
    """asyncio sets TCP_NODELAY on accepted connections only when the listening socket says
    it is TCP; without it each reply on a kept-alive HTTP connection waited ~40 ms."""
    import socket

    from tidings.serving import listen

    sock = listen("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        sock.close()
