"""``tidings config``: check a configuration (resolved, secrets masked) and export its schema.

``check`` is what an operator runs before a deployment: the file is read as the commands
read it (``-c``, ``$TIDINGS_CONFIG``, ``./tidings.yaml``; ``${VAR}`` substituted, relative
paths resolved, defaults filled in) and printed as YAML, so what the relay will use is
seen, not guessed. Secrets are masked by where they sit (:mod:`tidings.redaction`): a key
whose name says secret, the password of any URL, and wherever it appears, the value of a
substituted variable whose name says secret (``${DB_PASSWORD}``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from tidings.config import TidingsConfig
    from tidings.config.streams import StreamServerConfig

from tidings.cli.common import ConfigOption, ServerConfOption, config_app, err
from tidings.redaction import masked, scrub


@config_app.command("check")
def check(
    config: ConfigOption = None,
    server: Annotated[
        bool, typer.Option("--server", help="Check an event server configuration (--conf).")
    ] = False,
    conf: ServerConfOption = None,
) -> None:
    """Validate the configuration and print it resolved (YAML), secrets masked; then check
    that its parts fit together (ports, addresses, type prefixes, stream type maps, table
    feeds) and that the files and directories it writes can be written. Exit 2 with the
    errors if it is invalid, its parts do not fit, a path cannot be written, or a TLS file
    is not what it should be (not PEM, a key of another certificate)."""
    import yaml

    from tidings.config.loading import secret_values

    used: set[str] = set()
    findings: list[str] = []
    if server or conf is not None:
        from tidings.server.modules import module_problems
        from tidings.system.tls_files import server_tls_problems

        server_config = _server_config(conf, used)
        entries = [module.as_dict() for module in server_config.engine.modules]
        findings = server_tls_problems(server_config) + module_problems("engine.modules", entries)
        data = server_config.model_dump(mode="json")
    else:
        from tidings.system.checks import system_findings
        from tidings.system.paths import unwritable_paths
        from tidings.system.tls_files import tls_problems

        loaded = _tidings_config(config, used)
        findings = unwritable_paths(loaded) + system_findings(loaded) + tls_problems(loaded)
        data = loaded.model_dump(mode="json")
    # typer.echo, not rich: the YAML must come out byte for byte (no markup, no emoji codes)
    typer.echo(yaml.safe_dump(masked(data, secret_values(used)), sort_keys=False), nl=False)
    for finding in findings:
        err.print(f"error: {scrub(finding)}", markup=False, highlight=False)
    if findings:
        err.print(
            f"the configuration cannot run: {len(findings)} problem(s) above",
            markup=False,
            highlight=False,
        )
        raise typer.Exit(2)


def _tidings_config(path: Path | None, used: set[str]) -> TidingsConfig:
    from tidings.cli.common import load_or_exit
    from tidings.config import find_config_file, load_config_file

    path = find_config_file(path)
    if path is None:
        return load_or_exit(None)
    import tidings.targets.registry  # noqa: F401 - enters the target kinds a configuration names

    return load_config_file(path, used=used)


def _server_config(path: Path | None, used: set[str]) -> StreamServerConfig:
    from tidings.config import read_config_data
    from tidings.config.server import default_config_path
    from tidings.config.streams import load_stream_server_config

    path = path if path is not None else default_config_path()
    data = read_config_data(path, used=used)
    return load_stream_server_config(data, path.resolve().parent)


@config_app.command("schema")
def schema(
    server: Annotated[
        bool, typer.Option("--server", help="The event server's configuration instead.")
    ] = False,
) -> None:
    """Print the JSON Schema of the configuration file (of tidings, or of the event server
    with --server), for editors and CI checks; it describes values after ${VAR} substitution."""
    if server:
        from tidings.config.streams import StreamServerConfig

        document = StreamServerConfig.model_json_schema()
        document.get("properties", {}).pop("base_dir", None)  # set by the loader, not a key
    else:
        import tidings.targets.registry  # noqa: F401 - the target kinds of targets: entries
        from tidings.config import config_json_schema

        document = config_json_schema()
    document.setdefault("$schema", "https://json-schema.org/draft/2020-12/schema")
    typer.echo(json.dumps(document, indent=2))


__all__ = ["check", "schema"]
