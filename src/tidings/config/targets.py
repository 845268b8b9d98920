"""The ``targets:`` section of ``tidings.yaml``: what every target's configuration holds, and
the table of target kinds its entries are validated against.

Each target kind's model is defined by its module in :mod:`tidings.targets`, which this layer
sits below: the target registry enters each model here (:func:`register_target_config`), and
a ``targets:`` entry is validated as the model of the kind it names.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Union, get_args

from pydantic import Field, PlainValidator, SerializeAsAny, TypeAdapter, ValidationInfo

from tidings.config.model import LocalPath, StrictModel
from tidings.errors import ConfigError


class TargetConfig(StrictModel):
    """What the configuration of every target kind holds; each kind's model extends it.

    A target module declares its kind and its model (a subclass naming the kind as
    ``kind: Literal["<kind>"]``); the target registry enters the model here with
    :func:`register_target_config`. The models live with their targets, above this layer,
    so ``targets:`` entries are validated against the models entered by the time a
    configuration is validated (see :mod:`tidings.targets.registry` for why).
    """

    kind: str = Field(
        description=(
            "The target's kind: the module that delivers to it (``event_store``, ``jetstream``...)."
        )
    )
    fault_file: LocalPath | None = Field(
        default=None,
        description=(
            "Fault injection, for the demo and failure tests: while this file holds ``down`` every"
            " publish to the target fails; while it holds a number N, the next N publishes fail."
        ),
    )


#: Target kind -> its configuration model, as the target registry entered them.
_TARGET_CONFIGS: dict[str, type[TargetConfig]] = {}


def register_target_config(model: type[TargetConfig]) -> str:
    """Validate ``targets:`` entries of the kind ``model`` names with ``model``; the kind."""
    kinds = get_args(model.model_fields["kind"].annotation)
    if len(kinds) != 1:
        raise ConfigError(f"{model.__qualname__} must name its kind as kind: Literal['<kind>']")
    (kind,) = kinds
    known = _TARGET_CONFIGS.setdefault(kind, model)
    if known is not model:
        raise ConfigError(
            f"target kind {kind!r} is declared twice: by {known.__module__} and {model.__module__}"
        )
    return str(kind)


@functools.cache
def _kinds_adapter(models: tuple[type[TargetConfig], ...]) -> TypeAdapter[TargetConfig]:
    """The entered models as one union tagged by ``kind``, built once per set of kinds."""
    union: Any = Union[models]  # noqa: UP007 - X | Y cannot spread a tuple built at run time
    return TypeAdapter(Annotated[union, Field(discriminator="kind")])


def _of_its_kind(value: Any, info: ValidationInfo) -> TargetConfig:
    """A ``targets:`` entry validated as the model of its kind (errors name the kind, as
    ``targets.<name>.<kind>.<key>``, and an unknown kind lists the known ones)."""
    if not _TARGET_CONFIGS:
        raise ValueError(
            "no target kinds are loaded: import tidings.targets.registry before validating "
            "a configuration that has targets"
        )
    if isinstance(value, dict) and "kind" not in value:
        raise ValueError(f"kind is required: one of {', '.join(sorted(_TARGET_CONFIGS))}")
    adapter = _kinds_adapter(tuple(_TARGET_CONFIGS.values()))
    return adapter.validate_python(value, context=info.context)


#: A ``targets:`` entry: validated as its kind's model, dumped with all of that model's keys.
KindTargetConfig = Annotated[SerializeAsAny[TargetConfig], PlainValidator(_of_its_kind)]


def target_kinds_json_schema() -> dict[str, Any] | None:
    """The JSON Schema of a ``targets:`` entry: the union of the kinds entered by now (None
    if none is)."""
    if not _TARGET_CONFIGS:
        return None
    return _kinds_adapter(tuple(_TARGET_CONFIGS.values())).json_schema()
