"""The TLS settings (``tls:`` sections): files checked on load and named when they cannot
be used, paths relative to the configuration file, and the same shape in every file that
has them (the server's Eventer and Syncer, the event_server target, the intermediary)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

import tidings.targets.registry  # noqa: F401 - enters the target kinds the files name
from tests.support.certificates import TestCA, TlsSetup
from tidings.config import load_config, load_config_file
from tidings.config.loading import validate_config
from tidings.config.server import load_server_config, load_server_config_file
from tidings.config.tls import TlsClientConfig, TlsServerConfig
from tidings.errors import ConfigError, TlsError


def server_file(tmp_path: Path, **eventer: Any) -> dict[str, Any]:
    return {
        "type": "event",
        "backend": {"module": "tidings.server.backends.sqlite", "db_path": "events.db"},
        "engine": {"server_id": 1},
        "eventer_server": {"address": "ssl+sbs://0.0.0.0:23012", **eventer},
    }


def test_paths_are_relative_to_the_configuration_file(tmp_path: Path) -> None:
    setup = TlsSetup(tmp_path / "pki")
    tls = {"cert_file": "pki/tidings-test-server.crt", "key_file": "pki/tidings-test-server.key"}
    path = tmp_path / "event.yaml"
    path.write_text(
        yaml.safe_dump(server_file(tmp_path, tls={**tls, "ca_file": "pki/tidings-test-ca.pem"}))
    )
    config = load_server_config_file(path)
    assert config.eventer_server.tls is not None
    assert config.eventer_server.tls.cert_file == str(setup.server.cert)
    assert config.eventer_server.tls.ca_file == str(setup.ca.cert)
    assert config.eventer_server.tls.mutual
    config.eventer_server.tls.context()  # the files load


@pytest.mark.parametrize("key", ["cert_file", "key_file", "ca_file"])
def test_a_missing_file_is_named_with_its_key(tmp_path: Path, key: str) -> None:
    setup = TlsSetup(tmp_path)
    tls = {**setup.server_tls(mutual=True).model_dump(), key: str(tmp_path / "nowhere.pem")}
    with pytest.raises(
        ConfigError, match=f"eventer_server.tls.{key}: tls.{key} .*nowhere.pem' does not exist"
    ):
        load_server_config(server_file(tmp_path, tls=tls))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    setup = TlsSetup(tmp_path)
    setup.server.key.chmod(0)
    with pytest.raises(ConfigError, match=r"tls.key_file .* is not readable"):
        TlsServerConfig(cert_file=str(setup.server.cert), key_file=str(setup.server.key))


def test_files_that_are_not_what_they_should_be_are_named_when_loaded(tmp_path: Path) -> None:
    setup = TlsSetup(tmp_path)
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    other_key = TestCA(tmp_path / "other", "other").client("x").key

    bad_cert = TlsServerConfig(cert_file=str(garbage), key_file=str(setup.server.key))
    with pytest.raises(TlsError, match=r"tls.cert_file '.*garbage.pem'.*not a PEM certificate"):
        bad_cert.context()
    mismatch = TlsServerConfig(cert_file=str(setup.server.cert), key_file=str(other_key))
    with pytest.raises(TlsError, match=r"the key does not belong to the certificate"):
        mismatch.context()
    bad_ca = TlsClientConfig(ca_file=str(garbage))
    with pytest.raises(TlsError, match=r"tls.ca_file '.*garbage.pem': not a PEM CA certificate"):
        bad_ca.context()
    # A file deleted after the configuration was read: named too, when it is loaded.
    vanishing = setup.client_tls("gone")
    assert vanishing.cert_file is not None
    Path(vanishing.cert_file).unlink()
    with pytest.raises(TlsError, match=r"gone.crt'.*cannot be read"):
        vanishing.context()
    assert isinstance(TlsError("x"), OSError)  # a reconnecting client retries, as on any OSError


def test_client_settings_that_contradict_each_other_are_refused(tmp_path: Path) -> None:
    setup = TlsSetup(tmp_path)
    with pytest.raises(ValueError, match=r"key_file is set without tls.cert_file"):
        TlsClientConfig(key_file=str(setup.server.key))
    with pytest.raises(ValueError, match=r"verify is false"):
        TlsClientConfig(verify=False, ca_file=str(setup.ca.cert))
    with pytest.raises(ConfigError, match=r"ca: unknown key"):
        validate_config(TlsClientConfig, {"ca": str(setup.ca.cert)})


def test_the_address_scheme_and_tls_must_agree_in_the_server_file(tmp_path: Path) -> None:
    setup = TlsSetup(tmp_path)
    with pytest.raises(ConfigError, match=r"eventer_server: .*ssl\+sbs: tls .* must be set"):
        load_server_config(server_file(tmp_path))
    tls = setup.server_tls().model_dump()
    plain = {"address": "tcp+sbs://127.0.0.1:23012", "tls": tls}
    with pytest.raises(
        ConfigError, match=r"eventer_server: tls is set: the address must be ssl\+sbs"
    ):
        load_server_config({**server_file(tmp_path), "eventer_server": plain})
    syncer = {"address": "ssl+sbs://0.0.0.0:23013"}
    with pytest.raises(ConfigError, match=r"syncer_server: .*ssl\+sbs: tls"):
        load_server_config({**server_file(tmp_path, tls=tls), "syncer_server": syncer})
    config = load_server_config(
        {
            **server_file(tmp_path, tls=tls),
            "syncer_server": {**syncer, "tls": setup.server_tls(mutual=True).model_dump()},
            "syncer_client": {"tls": setup.client_tls("server-1").model_dump()},
            "syncer_peers": [{"server_id": 2, "address": "ssl+sbs://127.0.0.1:23113"}],
        }
    )
    assert config.syncer_server is not None and config.syncer_server.tls is not None
    assert config.syncer_client.tls is not None
    assert config.syncer_client.tls.cert_file is not None


def test_a_monitor_address_stays_plaintext(tmp_path: Path) -> None:
    monitor = {"name": "a", "group": "g", "monitor_address": "ssl+sbs://127.0.0.1:23010"}
    with pytest.raises(ConfigError, match=r"monitor.monitor_address: .*hat-monitor 0.7.2"):
        load_server_config(
            {
                **server_file(tmp_path, tls=TlsSetup(tmp_path).server_tls().model_dump()),
                "monitor": monitor,
            }
        )


def test_the_relay_target_and_the_intermediary_take_the_same_shape(tmp_path: Path) -> None:
    setup = TlsSetup(tmp_path)
    tls = setup.client_tls("relay").model_dump()
    config = load_config(
        {
            "targets": {
                "server": {
                    "kind": "event_server",
                    "address": "ssl+sbs://127.0.0.1:23012",
                    "tls": tls,
                }
            },
            "intermediary": {"event_server": "ssl+sbs://127.0.0.1:23012", "event_server_tls": tls},
        }
    )
    target = config.targets["server"]
    assert target.tls == TlsClientConfig(**tls)
    assert config.intermediary.event_server_tls == TlsClientConfig(**tls)
    with pytest.raises(
        ConfigError, match=r"targets.server.event_server: tls is set, but no address is ssl\+sbs"
    ):
        load_config({"targets": {"server": {"kind": "event_server", "tls": tls}}})
    with pytest.raises(ConfigError, match=r"event_server_tls is set, but no event_server address"):
        load_config({"intermediary": {"event_server_tls": tls}})
    # tidings.yaml's relative paths are relative to it too.
    (tmp_path / "tidings.yaml").write_text(
        yaml.safe_dump(
            {
                "intermediary": {
                    "event_server": "ssl+sbs://127.0.0.1:23012",
                    "event_server_tls": {"ca_file": setup.ca.cert.name},
                }
            }
        )
    )
    loaded = load_config_file(tmp_path / "tidings.yaml")
    assert loaded.intermediary.event_server_tls is not None
    assert loaded.intermediary.event_server_tls.ca_file == str(setup.ca.cert)


def test_an_encrypted_key_is_refused_without_a_passphrase_prompt(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    setup = TlsSetup(tmp_path)
    key = serialization.load_pem_private_key(setup.server.key.read_bytes(), password=None)
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"passphrase"),
        )
    )
    config = TlsServerConfig(cert_file=str(setup.server.cert), key_file=str(encrypted))
    with pytest.raises(TlsError, match=r"encrypted.key'.*the private key is encrypted"):
        config.context()
