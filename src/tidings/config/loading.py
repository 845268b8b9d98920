"""From a configuration file to a validated model: reading the YAML, replacing ``${VAR}`` from
the environment, and turning validation errors into messages that name the key.

Every file tidings reads goes through here, so they all behave alike: a
:class:`~tidings.errors.ConfigError` names the offending key path and the value found there
(a typo is found from the message alone), and ``${VAR}`` and ``${VAR:-default}`` in a file's
string values are replaced when it is read, so secrets need not be written in it (``$${``
writes a literal ``${``). An error never shows a secret (:mod:`tidings.redaction`): not the
value of a secret-named key, not a URL's password, not the value of a key it refuses (a
misspelt key may well hold a password), and a section or the whole file only by its size.
The secrets of every file read are remembered, so that logs and errors scrub them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from tidings.config.model import spoken_duration
from tidings.errors import ConfigError
from tidings.redaction import remember, scrub, secret_name, secrets_in, shown_url

#: The longest value an error shows whole.
_SHOWN_CHARS = 80


def shown_value(path: tuple[int | str, ...], value: Any) -> str:
    """``value`` as an error message shows it: a short scalar as written, a mapping or list
    by its size (a top-level error must not print the whole file), never a secret's."""
    if any(secret_name(str(part)) for part in path):
        return "a value (not shown: the key holds a secret)"
    if isinstance(value, dict):
        return f"a mapping with {len(value)} key{'s' if len(value) != 1 else ''}"
    if isinstance(value, list | tuple):
        return f"a list of {len(value)} item{'s' if len(value) != 1 else ''}"
    if isinstance(value, timedelta):
        return spoken_duration(value)
    text = shown_url(value) if isinstance(value, str) else repr(value)
    return text if len(text) <= _SHOWN_CHARS else f"{text[: _SHOWN_CHARS - 3]}..."


def error_message(error: ErrorDetails) -> str:
    """What a validation error says, without pydantic's ``Value error, `` in front of our
    own validators' messages: a user reads what is wrong, not which exception said so."""
    message = error["msg"]
    return message.removeprefix("Value error, ") if error["type"] == "value_error" else message


def _describe(error: ErrorDetails) -> str:
    path = ".".join(str(p) for p in error["loc"]) or "(top level)"
    if error["type"] == "extra_forbidden":
        return f"{path}: unknown key"  # named, never echoed: it may be a misplaced secret
    if error["type"] == "missing":
        return f"{path}: required key is missing"
    found = error.get("input")
    if error["type"] == "value_error" and isinstance(found, dict | list | tuple):
        # Our own check of a whole section: its message says what is wrong, and the
        # section's size would say nothing more.
        return f"{path}: {error_message(error)}"
    return f"{path}: {error_message(error)} (got {shown_value(error['loc'], found)})"


M = TypeVar("M", bound=BaseModel)


def validate_config(
    model: type[M], data: Any, what: str = "configuration", base_dir: Path | None = None
) -> M:
    """Validate ``data`` as ``model``; raise ConfigError naming every bad key and value.

    ``base_dir`` (the configuration file's directory) is what relative paths are resolved
    against; without it they stay as given.
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{what} must be a mapping at the top level, got {_kind_of(data)} "
            "(its content is not shown)"
        )
    try:
        return model.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as exc:
        raise ConfigError(
            scrub(f"invalid {what}:\n  " + "\n  ".join(_describe(e) for e in exc.errors()))
        ) from None


def _kind_of(data: Any) -> str:
    names = {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}
    return names.get(type(data), f"a {type(data).__name__}")


#: ``${NAME}``, ``${NAME:-default}``, or ``$${...}`` (an escaped, literal ``${...}``).
_REFERENCE = re.compile(r"\$(\$?)\{([^}]*)\}")
_VARIABLE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?", re.DOTALL)


def substitute_env(
    data: Any,
    environ: Mapping[str, str] | None = None,
    *,
    origin: str = "configuration",
    used: set[str] | None = None,
) -> Any:
    """``data`` (parsed YAML) with ``${NAME}`` / ``${NAME:-default}`` in its string values
    replaced from ``environ`` (default: the process environment).

    Substitution works on parsed values, never on the file's text, so a secret holding
    quotes, ``#`` or a newline cannot change the document's structure; a value that is
    wholly ``${PORT}`` becomes the string of the variable, which validation then converts
    like any scalar (``"9108"`` to a port number, ``"true"`` to a boolean). As in the shell,
    ``:-`` takes the default when the variable is unset *or empty*. ``$${`` keeps a literal
    ``${``. An unset variable without a default is a ConfigError naming it and the key path
    (a secret must not silently become an empty password). Keys are not substituted.
    ``used`` collects the names of the variables read (to mask their values on display).
    """
    env = os.environ if environ is None else environ

    def value(text: str, path: str) -> str:
        def replace(match: re.Match[str]) -> str:
            escaped, inner = match.groups()
            if escaped:
                return "${" + inner + "}"
            reference = _VARIABLE.fullmatch(inner)
            if reference is None:
                raise ConfigError(
                    f"{origin}: {path}: ${{{inner}}} is not a variable reference "
                    "(use ${NAME} or ${NAME:-default}; $${ keeps a literal ${)"
                )
            name, default = reference.groups()
            if used is not None:
                used.add(name)
            found = env.get(name)
            if found is None or (found == "" and default is not None):
                if default is None:
                    raise ConfigError(
                        f"{origin}: {path}: environment variable {name} is not set "
                        f"(set it, or write ${{{name}:-default}})"
                    )
                return default
            return found

        return _REFERENCE.sub(replace, text)

    def walk(node: Any, path: str) -> Any:
        if isinstance(node, str):
            return value(node, path or "(top level)") if "${" in node else node
        if isinstance(node, dict):
            return {k: walk(v, f"{path}.{k}" if path else str(k)) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, f"{path}[{i}]") for i, v in enumerate(node)]
        return node

    return walk(data, "")


def read_config_data(path: str | Path, *, used: set[str] | None = None) -> Any:
    """The parsed content of a YAML (or JSON, a subset of YAML) configuration file, with
    environment variables substituted (:func:`substitute_env`; ``used`` collects their
    names). Its secrets are remembered (:func:`tidings.redaction.remember`)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read configuration file {str(path)!r}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not a UTF-8 text file (byte {exc.object[exc.start]:#04x} at offset "
            f"{exc.start}): a configuration is YAML or JSON text"
        ) from None
    if "\x00" in text:
        raise ConfigError(f"{path}: not a text file (it holds NUL bytes)")
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = "" if mark is None else f" at line {mark.line + 1}, column {mark.column + 1}"
        what = " ".join(part for part in (exc.context, exc.problem) if part)
        raise ConfigError(f"{path}: not valid YAML{where}: {what}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    variables: set[str] = set()
    data = substitute_env(data, origin=str(path), used=variables)
    remember(secrets_in(data) | secret_values(variables))
    if used is not None:
        used |= variables
    return data


def secret_values(variables: set[str]) -> set[str]:
    """The values of the environment variables among ``variables`` whose names say secret."""
    return {v for name in variables if secret_name(name) and (v := os.environ.get(name))}


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping with the same key twice: PyYAML keeps the last
    silently, so a target defined twice would lose its first definition unseen.

    Merge keys (``<<: *defaults``) are YAML's own way to repeat a mapping: the keys they
    bring in may be given again beside them (the mapping's own value wins, as YAML says),
    and only keys written in the mapping itself are checked against each other."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            merge = key_node.tag == _MERGE_TAG
            key = key_node.value if merge else self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} appears twice in one mapping (lines {seen[key]} and {line}); "
                    "the second would silently replace the first",
                    key_node.start_mark,
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


#: The tag of a ``<<`` key: its value is merged into the mapping (by the loader's
#: ``flatten_mapping``), it is not a key of its own.
_MERGE_TAG = "tag:yaml.org,2002:merge"
