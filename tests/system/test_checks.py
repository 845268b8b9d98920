"""The whole-system check: each way the parts of one file can fail to fit is found and named
with both sides; the example deployment fits; ``config check`` fails with exit 2 on it."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import tidings.targets.registry  # noqa: F401 - enters the target kinds the files name
from tests.support.certificates import TlsSetup
from tidings.config import load_config, load_config_file
from tidings.config.passwords import hash_password
from tidings.system.checks import system_findings

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "system" / "tidings.yaml"
HASH = "scrypt$16384$8$1$AmjQnubfyy+o58nrE0UQpA==$14VdwIo3l2lfTYvej6Wcl3uHlkrZZeoxU16BcEn9jko="


def _base() -> dict[str, Any]:
    """A deployment that fits: one server fed by one target, a stream, an intermediary."""
    eventer = "tcp+sbs://127.0.0.1:23012"
    return {
        "targets": {"main": {"kind": "event_server", "address": eventer, "type_prefix": ["shop"]}},
        "routing": {"routes": {"OrderPlaced": ["main"], "rows.customer": ["main"]}},
        "servers": {
            "main": {
                "backend": {"module": "tidings.server.backends.sqlite", "db_path": "ev.db"},
                "engine": {"server_id": 1},
                "eventer_server": {"address": eventer},
                "stream_users": {"app": {"password_hash": HASH}},
                "streams": [
                    {"name": "s", "port": 8090, "types": {"PLACED": ["shop", "OrderPlaced"]}}
                ],
            }
        },
        "intermediaries": {
            "live": {
                "listen": "127.0.0.1:8100",
                "event_server": eventer,
                "row_type_prefix": ["shop"],
                "tables": {"customer": {"columns": {"id": "integer"}, "keyed_by": "id"}},
            }
        },
    }


def _findings(change: Any = None) -> list[str]:
    data = copy.deepcopy(_base())
    if change is not None:
        change(data)
    return system_findings(load_config(data))


def test_a_deployment_that_fits_has_no_findings_and_so_has_the_example() -> None:
    assert _findings() == []
    assert system_findings(load_config_file(EXAMPLE)) == []


def test_two_parts_on_one_port() -> None:
    def clash(d: dict[str, Any]) -> None:
        d["intermediaries"]["live"]["listen"] = "0.0.0.0:8090"

    assert _findings(clash) == [
        "servers.main.streams[0] and intermediaries.live.listen both listen on port 8090"
    ]


def test_the_console_on_a_port_another_part_listens_on() -> None:
    def clash(d: dict[str, Any]) -> None:
        d["console"] = {
            "port": 8090,
            "users": {"ops": {"password_hash": hash_password("pw", n=2**4)}},
        }

    assert _findings(clash) == ["servers.main.streams[0] and console both listen on port 8090"]


@pytest.mark.parametrize(
    ("listen", "clashes"),
    [
        ("localhost:8090", True),  # the stream's 127.0.0.1, by another name
        ("LocalHost:8090", True),
        ("[::]:8090", True),  # every address, IPv6's spelling
        ("127.0.0.2:8090", False),  # another address, the same port
        ("127.0.0.1:8091", False),
    ],
)
def test_a_port_clash_is_judged_as_binding_would(listen: str, clashes: bool) -> None:
    def listen_at(d: dict[str, Any]) -> None:
        d["intermediaries"]["live"]["listen"] = listen

    clash = "servers.main.streams[0] and intermediaries.live.listen both listen on port 8090"
    assert _findings(listen_at) == ([clash] if clashes else [])


def test_port_0_never_clashes() -> None:
    """Port 0 binds whichever port is free: two parts given it never meet, on one address
    or on every one."""

    def any_port(d: dict[str, Any]) -> None:
        live = d["intermediaries"]["live"]
        live["listen"] = "127.0.0.1:0"
        d["intermediaries"]["more"] = {**live, "listen": "0.0.0.0:0"}
        d["intermediaries"]["again"] = {**live, "listen": "localhost:0"}

    assert _findings(any_port) == []


def test_a_target_address_no_server_listens_on() -> None:
    def elsewhere(d: dict[str, Any]) -> None:
        d["targets"]["main"]["address"] = "tcp+sbs://127.0.0.1:23999"

    found = _findings(elsewhere)
    assert found[0] == (
        "targets.main.address tcp+sbs://127.0.0.1:23999: no configured server listens there "
        "(servers: main (tcp+sbs://127.0.0.1:23012))"
    )


def test_a_client_and_its_server_must_agree_on_tls(tmp_path: Path) -> None:
    """A server on ssl+sbs:// followed at tcp+sbs:// (or the other way round) would refuse
    every connection: named, with the scheme each side uses."""
    setup = TlsSetup(tmp_path)

    def secured(d: dict[str, Any]) -> None:
        server = d["servers"]["main"]["eventer_server"]
        server["address"] = "ssl+sbs://127.0.0.1:23012"
        server["tls"] = setup.server_tls().model_dump()

    found = _findings(secured)
    assert found == [
        f"{where} tcp+sbs://127.0.0.1:23012: server main listens there as "
        "ssl+sbs://127.0.0.1:23012; client and server must both use TLS (ssl+sbs://) or both "
        "not (tcp+sbs://)"
        for where in ("targets.main.address", "intermediaries.live.event_server")
    ]


def test_a_server_group_is_checked_address_by_address() -> None:
    """A target of several addresses feeds each configured server it names; one that no
    server listens on is named under ``addresses``."""

    def pair(d: dict[str, Any]) -> None:
        target = d["targets"]["main"]
        target["addresses"] = [target.pop("address"), "tcp+sbs://127.0.0.1:23999"]

    (found,) = _findings(pair)
    assert found.startswith("targets.main.addresses tcp+sbs://127.0.0.1:23999: no configured")


def test_a_stream_type_no_route_produces() -> None:
    def unrouted(d: dict[str, Any]) -> None:
        d["servers"]["main"]["streams"][0]["types"]["SHIPPED"] = ["shop", "OrderShipped"]

    assert _findings(unrouted) == [
        "servers.main.streams[0].types.SHIPPED ['shop', 'OrderShipped']: no route delivers "
        "such events into server main (the targets into it use type_prefix [shop])"
    ]


def test_a_type_prefix_that_differs_between_target_and_stream() -> None:
    def prefix(d: dict[str, Any]) -> None:
        d["servers"]["main"]["streams"][0]["types"] = {"PLACED": ["shops", "OrderPlaced"]}

    (found,) = _findings(prefix)
    assert "['shops', 'OrderPlaced']" in found and "use type_prefix [shop]" in found


def test_an_intermediary_table_fed_by_no_route() -> None:
    def unfed(d: dict[str, Any]) -> None:
        del d["routing"]["routes"]["rows.customer"]

    (found,) = _findings(unfed)
    assert found.startswith(
        "intermediaries.live.tables.customer: no route delivers its row events "
        "['shop', 'rows.customer'] into server main"
    )


def test_an_event_store_target_on_the_servers_file_feeds_it_and_default_routes_feed_all(
    tmp_path: Path,
) -> None:
    def local(d: dict[str, Any]) -> None:
        d["servers"]["main"]["backend"]["db_path"] = str(tmp_path / "ev.db")
        d["targets"]["main"] = {
            "kind": "event_store",
            "url": f"sqlite:///{tmp_path / 'ev.db'}",
            "type_prefix": ["shop"],
        }
        d["servers"]["main"]["streams"][0]["types"]["ANY"] = ["shop", "Other"]
        d["routing"]["default"] = ["main"]

    assert _findings(local) == []


def test_config_check_names_each_problem_and_exits_2(tmp_path: Path) -> None:
    data = _base()
    data["targets"]["main"]["address"] = "tcp+sbs://127.0.0.1:23999"
    path = tmp_path / "tidings.yaml"
    path.write_text(yaml.safe_dump(data))
    result = subprocess.run(
        [sys.executable, "-m", "tidings.cli", "config", "check", "-c", str(path)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert "error: targets.main.address tcp+sbs://127.0.0.1:23999: no configured" in result.stderr
    assert "the configuration cannot run: " in result.stderr


@pytest.mark.parametrize("path", [EXAMPLE])
def test_config_check_passes_the_example(path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tidings.cli", "config", "check", "-c", str(path)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "servers:" in result.stdout and "'***'" in result.stdout  # the hash is masked


TIER_EXAMPLE = EXAMPLE.parent / "tier.yaml"


def _with_tier(d: dict[str, Any]) -> None:
    d["intermediary_tiers"] = {
        "world": {
            "members": ["127.0.0.1:8301", "127.0.0.1:8302"],
            "spatial": {
                "upstream": "ws://127.0.0.1:8200/",
                "world_lo": [0, 0],
                "world_hi": [100, 100],
            },
        }
    }


def test_a_tier_that_fits_has_no_findings_and_so_has_its_example() -> None:
    assert _findings(_with_tier) == []
    assert system_findings(load_config_file(TIER_EXAMPLE)) == []


def test_a_tier_member_on_another_parts_port_and_a_tier_following_a_part() -> None:
    def clash(d: dict[str, Any]) -> None:
        _with_tier(d)
        d["intermediary_tiers"]["world"]["members"][1] = "127.0.0.1:8100"
        d["intermediary_tiers"]["world"]["spatial"]["upstream"] = "ws://127.0.0.1:8301/"

    assert _findings(clash) == [
        "intermediaries.live.listen and intermediary_tiers.world.members[1] both listen on "
        "port 8100",
        "intermediary_tiers.world.spatial.upstream ws://127.0.0.1:8301/: "
        "intermediary_tiers.world.members[0] listens there, not a spatial publisher",
    ]


def test_config_check_passes_the_tier_example() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tidings.cli", "config", "check", "-c", str(TIER_EXAMPLE)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "intermediary_tiers:" in result.stdout
