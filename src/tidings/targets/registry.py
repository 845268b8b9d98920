"""Target kinds, and building targets from configuration once per process.

A target kind is one module of :mod:`tidings.targets.kinds` (or one sub-package of it, like
JetStream's): it defines the configuration model of the kind (a
:class:`~tidings.config.TargetConfig` subclass whose ``kind: Literal["..."]`` names it) and
a :class:`~tidings.targets.base.Target` subclass that sets ``config_model`` to it. When this
module is first imported it imports every module of ``kinds``, sub-packages included, and
maps each kind to its class, so adding a kind is writing that module: no list, union or
``isinstance`` chain to extend.

Why the registry enters the configuration models into :mod:`tidings.config`: validating
``targets:`` needs every kind's model, yet ``config`` sits below ``targets`` in the layers
and may not import them (importing them by name at validation time would be the same
dependency, hidden, and would load nats-py and the event store with every configuration).
So ``config`` keeps the base model and a kind -> model table that it reads when it
validates, not when it is defined, and this registry fills the table. Entries are checked
against the models of their kind by pydantic as one union tagged by ``kind``, so an unknown
kind or a bad key gives the same message as a union written out by hand. The price is an
order: a configuration that names targets is validated after this module was imported.
The targets, the pipeline's job configuration and the CLI import it before they read one;
anything else that validates one first is told so by the error.

A service can also bring a kind of its own, as an installed package: a plug-in. Its
distribution declares the kind's :class:`~tidings.targets.base.Target` class as an entry
point of the group ``tidings.targets`` (the entry point's name is the kind), and this module
loads it beside the built-in kinds (:func:`_plugin_kinds`), so the configuration validates
it as one of them. A plug-in that cannot be imported, is no target class, names another
kind than its entry point, or takes a kind already taken (built in or by another plug-in)
stops the import of this module with a :class:`~tidings.errors.ConfigError` naming the
package: a kind must never silently mean something else than what was installed for it.

Spark reuses its Python workers across tasks, so a target (a database engine, a NATS
connection) is built on first use in a worker and then shared by every later task there.
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from collections.abc import Callable, Iterable
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any, get_args

from tidings.config import TargetConfig, register_target_config
from tidings.errors import ConfigError
from tidings.targets.base import Target
from tidings.targets.faults import FaultInjectingTarget

#: How a kind's target is made from its name and configuration: the kind's class.
TargetFactory = Callable[[str, Any], Target]

_cache: dict[tuple[str, str], Target] = {}
_lock = threading.Lock()


def build_target(name: str, config: TargetConfig) -> Target:
    """A new target for ``config``, wrapped in fault injection if it names a fault file."""
    target = _KINDS[config.kind](name, config)
    if config.fault_file:
        target = FaultInjectingTarget(target, config.fault_file)
    return target


def shared_target(name: str, config: TargetConfig) -> Target:
    """The process-wide target for this name and configuration."""
    key = (name, config.model_dump_json())
    with _lock:
        target = _cache.get(key)
        if target is None:
            target = _cache[key] = build_target(name, config)
        return target


def _declared_kinds() -> dict[str, TargetFactory]:
    """Every kind the modules of ``kinds`` declare, its model entered into the config."""
    kinds: dict[str, TargetFactory] = {}
    # The folder is found from this module's file: importing ``kinds`` for its ``__path__``
    # would be an import of the sub-package's face, which the modules beside it do not make.
    package = f"{__name__.rpartition('.')[0]}.kinds"
    for found in pkgutil.walk_packages([str(Path(__file__).parent / "kinds")], f"{package}."):
        module = importlib.import_module(found.name)
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, Target)
                and value.__module__ == module.__name__
                and value.config_model is not None
            ):
                kinds[register_target_config(value.config_model)] = value
    return kinds


#: The entry-point group a plug-in declares its target classes in.
PLUGIN_GROUP = "tidings.targets"


def _plugin_kinds(
    taken: dict[str, TargetFactory], found: Iterable[EntryPoint] | None = None
) -> dict[str, TargetFactory]:
    """The kinds the installed plug-ins declare (``found``: the entry points of
    :data:`PLUGIN_GROUP`), their models entered into the config; ConfigError naming the
    package of one that is broken or takes a kind already ``taken``."""
    kinds: dict[str, TargetFactory] = {}
    owners: dict[str, str] = {}
    for point in entry_points(group=PLUGIN_GROUP) if found is None else found:
        package = point.dist.name if point.dist is not None else "an unknown package"
        where = f"target plug-in {point.name!r} of package {package!r} ({point.value})"
        if point.name in taken or point.name in kinds:
            by = owners.get(point.name, "tidings itself")
            raise ConfigError(f"{where}: the kind {point.name!r} is taken already (by {by})")
        try:
            value = point.load()
        except Exception as exc:
            raise ConfigError(f"{where} cannot be loaded: {type(exc).__name__}: {exc}") from None
        model = getattr(value, "config_model", None)
        if not (isinstance(value, type) and issubclass(value, Target)) or model is None:
            raise ConfigError(
                f"{where} is no target kind: it must name a subclass of "
                "tidings.targets.base.Target that sets config_model"
            )
        if not (isinstance(model, type) and issubclass(model, TargetConfig)):
            raise ConfigError(f"{where}: its config_model is no TargetConfig subclass")
        declared = get_args(model.model_fields["kind"].annotation)
        if declared != (point.name,):
            raise ConfigError(
                f"{where}: its config_model must declare kind: Literal[{point.name!r}] "
                f"(the entry point's name), not {model.model_fields['kind'].annotation}"
            )
        register_target_config(model)
        kinds[point.name] = value
        owners[point.name] = f"package {package!r}"
    return kinds


def plugin_kinds() -> list[str]:
    """The kinds installed plug-ins brought (for ``tidings config check`` and the docs)."""
    return sorted(_PLUGIN_KINDS)


#: Kind -> the class that builds its targets: the built-in kinds, then the plug-ins'.
_KINDS = _declared_kinds()
_PLUGIN_KINDS = _plugin_kinds(_KINDS)
_KINDS.update(_PLUGIN_KINDS)
