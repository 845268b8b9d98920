"""``tidings config``: check a configuration (resolved, secrets masked) and export its schema.

``check`` is what an operator runs before a deployment: the file is read as the commands
read it (``-c``, ``$TIDINGS_CONFIG``, ``./tidings.yaml``; ``${VAR}`` substituted, relative
paths resolved, defaults filled in) and printed as YAML, so what the relay will use is
seen, not guessed. Secrets are masked by where they sit, not by a list of today's keys: a
key whose name says secret (password, secret, token, key, credentials, nkey, seed), the
password of any URL (``scheme://user:password@host``), and wherever it appears, the value
of a substituted variable whose name says secret (``${DB_PASSWORD}``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from tidings.config import TidingsConfig
    from tidings.config.streams import StreamServerConfig

from tidings.cli.common import ConfigOption, ServerConfOption, config_app, err

MASK = "***"
#: A name that says it holds a secret: one of these words as a part of it (``_``, ``-``,
#: ``.`` or a case change separate the parts), unless it names a file, a path or the
#: variable a secret is read from (``password_hash_env``, ``credentials_file``).
_SECRET_WORD = re.compile(
    r"(?:^|[_.-])(password|passwd|pwd|secret|token|key|apikey|credentials?|creds|nkeys?|seed)"
    r"(?=$|[_.-])",
    re.IGNORECASE,
)
_NOT_A_SECRET = re.compile(r"[_.-](env|file|path|dir)$", re.IGNORECASE)
#: ``scheme://user:password@`` (a URL's password; the user and host stay readable).
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^/@:\s]*:)[^/@\s]+@")


def secret_name(name: str) -> bool:
    """Whether a key or variable named ``name`` holds a secret (see the module's rules)."""
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name)
    return bool(_SECRET_WORD.search(snake)) and not _NOT_A_SECRET.search(snake)


def masked(data: Any, secrets: set[str] | frozenset[str] = frozenset()) -> Any:
    """``data`` (a dumped configuration) with its secrets replaced by ``***``: values of
    secret-named keys, URL passwords, and every occurrence of a value in ``secrets``."""

    def text(value: str) -> str:
        for secret in sorted(secrets, key=len, reverse=True):
            value = value.replace(secret, MASK)
        return _URL_PASSWORD.sub(rf"\g<head>{MASK}@", value)

    def walk(node: Any, key: str | None) -> Any:
        if key is not None and secret_name(key) and node not in (None, "", [], {}):
            return MASK
        if isinstance(node, dict):
            return {k: walk(v, str(k)) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, None) for v in node]
        return text(node) if isinstance(node, str) else node

    return walk(data, None)


def _secret_values(variables: set[str]) -> set[str]:
    """The values of the substituted variables whose names say secret."""
    import os

    return {v for name in variables if secret_name(name) and (v := os.environ.get(name))}


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

    used: set[str] = set()
    findings: list[str] = []
    if server or conf is not None:
        from tidings.system.tls_files import server_tls_problems

        server_config = _server_config(conf, used)
        findings = server_tls_problems(server_config)
        data = server_config.model_dump(mode="json")
    else:
        from tidings.system.checks import system_findings
        from tidings.system.paths import unwritable_paths
        from tidings.system.tls_files import tls_problems

        loaded = _tidings_config(config, used)
        findings = unwritable_paths(loaded) + system_findings(loaded) + tls_problems(loaded)
        data = loaded.model_dump(mode="json")
    # typer.echo, not rich: the YAML must come out byte for byte (no markup, no emoji codes)
    typer.echo(yaml.safe_dump(masked(data, _secret_values(used)), sort_keys=False), nl=False)
    for finding in findings:
        err.print(f"error: {finding}", markup=False, highlight=False)
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


__all__ = ["MASK", "check", "masked", "schema", "secret_name"]
