"""The TLS files of a deployment, loaded as the parts would load them: a certificate that is
not PEM, a key that does not belong to its certificate, a CA file without a certificate.

Loading the configuration checks that each file is there and readable; only loading it into
a TLS context tells whether it is what it should be, which the parts do when they start or
connect. ``tidings config check`` does it beforehand, one line per file that fails, naming
its key (:class:`~tidings.errors.TlsError` names the file and why).
"""

from __future__ import annotations

from collections.abc import Iterator

from tidings.config import TidingsConfig
from tidings.config.server import ServerConfig
from tidings.config.tls import TlsClientConfig, TlsServerConfig
from tidings.errors import TlsError


def tls_problems(config: TidingsConfig) -> list[str]:
    """One line per TLS section of ``tidings.yaml`` whose files cannot be loaded."""
    sections: list[tuple[str, TlsClientConfig | TlsServerConfig | None]] = [
        (f"targets.{name}.tls", getattr(target, "tls", None))
        for name, target in config.targets.items()
    ]
    intermediaries = {"intermediary": config.intermediary} | {
        f"intermediaries.{name}": section for name, section in config.intermediaries.items()
    }
    for key, section in intermediaries.items():
        sections += [
            (f"{key}.event_server_tls", section.event_server_tls),
            (f"{key}.tls", section.tls),
        ]
        if section.spatial is not None:
            sections.append((f"{key}.spatial.tls", section.spatial.tls))
    for name, tier in config.intermediary_tiers.items():
        at = f"intermediary_tiers.{name}"
        sections += [(f"{at}.tls", tier.tls), (f"{at}.peer_tls", tier.peer_tls)]
        sections.append((f"{at}.spatial.tls", tier.spatial.tls))
    for name, server in config.servers.items():
        sections += [(f"servers.{name}.{key}", tls) for key, tls in server_tls_sections(server)]
    return _problems(sections)


def server_tls_problems(config: ServerConfig) -> list[str]:
    """One line per TLS section of an event server's file whose files cannot be loaded."""
    return _problems(list(server_tls_sections(config)))


def server_tls_sections(
    config: ServerConfig,
) -> Iterator[tuple[str, TlsClientConfig | TlsServerConfig | None]]:
    yield "eventer_server.tls", config.eventer_server.tls
    if config.syncer_server is not None:
        yield "syncer_server.tls", config.syncer_server.tls
    yield "syncer_client.tls", config.syncer_client.tls


def _problems(sections: list[tuple[str, TlsClientConfig | TlsServerConfig | None]]) -> list[str]:
    problems = []
    for key, tls in sections:
        if tls is None or not isinstance(tls, TlsClientConfig | TlsServerConfig):
            continue
        try:
            tls.context()
        except TlsError as exc:
            problems.append(f"{key}: {exc}")
    return problems
