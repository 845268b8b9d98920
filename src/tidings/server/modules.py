"""Loading ``engine.modules``: tidings' modules and hat-event 0.8.5's, by Python module path.

Each entry names a Python module by its ``module`` key, as in hat-event's configuration;
the whole entry is that module's configuration. Which interface the module is written for is
told by the module itself (:func:`~tidings.server.hat_modules.is_hat_module`):

- a **hat module** (``json_schema_id``/``json_schema_repo``, ``async create(conf, engine,
  source)``) has its configuration validated by its own schema, as hat's server does, and is
  created on the hat modules' loop (:mod:`tidings.server.hat_modules`);
- a **tidings module** defines ``create(config, engine) -> Module`` (synchronous; the engine
  is tidings' :class:`~tidings.server.engine.Engine`).

Either way the module's source is ``Source(MODULE, index)``, its index in ``engine.modules``
(from 0, as hat numbers them), named by its path; one engine loop runs both kinds.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from tidings.errors import ModuleLoadError
from tidings.events.sources import Source, module_source
from tidings.server.engine import Engine, Module


def load_modules(engine: Engine, configs: Sequence[dict[str, Any]]) -> None:
    """Load the modules of ``engine.modules`` (each a dict with a ``module`` path) into
    ``engine``, in order, after any it has. If one fails, the engine is closed (the modules
    loaded so far with it) and :class:`ModuleLoadError` names the module and why."""
    runtime: _HatRuntime | None = None
    try:
        for config in configs:
            path = config["module"]
            python_module = import_module(path)
            source = module_source(engine.module_count, path)
            if _is_hat(python_module):
                if runtime is None:
                    runtime = _HatRuntime(engine)
                    engine.on_close(runtime.close)
                module = _load_hat_module(path, python_module, config, runtime, source, engine)
            else:
                module = create_module(path, python_module, config, engine)
            engine.add_module(module, source)
    except BaseException:
        engine.close()
        raise


def module_problems(where: str, configs: Sequence[dict[str, Any]]) -> list[str]:
    """What would stop ``configs`` (``engine.modules`` entries at ``where``) from loading,
    found without creating any module: a module that cannot be imported, a tidings module
    without ``create``, a hat module's entry its own schema refuses. For ``tidings config
    check``; the start finds the rest (``create`` failing)."""
    problems: list[str] = []
    for index, config in enumerate(configs):
        path = config["module"]
        try:
            python_module = import_module(path)
            if _is_hat(python_module):
                from tidings.server.hat_modules import validate_conf

                validate_conf(path, python_module, config)
            elif not callable(getattr(python_module, "create", None)):
                raise ModuleLoadError(f"module {path!r}: has no create(config, engine) function")
        except ModuleLoadError as exc:
            problems.append(f"{where}.{index}: {exc}")
    return problems


def import_module(path: str) -> ModuleType:
    """The Python module ``path`` of an ``engine.modules`` entry."""
    try:
        return importlib.import_module(path)
    except (ImportError, ValueError, TypeError) as exc:
        raise ModuleLoadError(f"module {path!r}: cannot import it: {exc}") from exc


def load_module(path: str, config: dict[str, Any], engine: Engine) -> Module:
    """Import the tidings module ``path`` and return ``create(config, engine)`` of it."""
    return create_module(path, import_module(path), config, engine)


def create_module(
    path: str, python_module: ModuleType, config: dict[str, Any], engine: Engine
) -> Module:
    """``create(config, engine)`` of a tidings module, checked to be a module."""
    create = getattr(python_module, "create", None)
    if not callable(create):
        raise ModuleLoadError(f"module {path!r}: has no create(config, engine) function")
    try:
        module = create(config, engine)
    except Exception as exc:
        raise ModuleLoadError(f"module {path!r}: create() failed: {exc!r}") from exc
    if not isinstance(module, Module):
        raise ModuleLoadError(
            f"module {path!r}: create() returned {type(module).__name__}, which lacks "
            "subscription, on_session_start, process or on_session_stop"
        )
    return module


def _is_hat(python_module: ModuleType) -> bool:
    from tidings.server.hat_modules import is_hat_module

    return is_hat_module(python_module)


def _load_hat_module(
    path: str,
    python_module: ModuleType,
    config: dict[str, Any],
    runtime: _HatRuntime,
    source: Source,
    engine: Engine,
) -> Module:
    """Validate the hat module's configuration by its schema, then create it on the
    engine's hat loop (started with the first hat module, stopped when the engine closes)."""
    from tidings.server import hat_modules

    hat_modules.validate_conf(path, python_module, config)
    try:
        created = runtime.loop.call(
            hat_modules.create_hat_module(python_module, config, runtime.engine, source)
        )
    except ModuleLoadError:
        raise
    except Exception as exc:
        raise ModuleLoadError(f"module {path!r}: create() failed: {exc!r}") from exc
    return hat_modules.HatModule(
        path, created, runtime.loop, runtime.server_id, engine.report_fault
    )


class _HatRuntime:
    """One engine's hat loop and the hat ``Engine`` its hat modules share."""

    def __init__(self, engine: Engine) -> None:
        from tidings.server import hat_modules

        self.server_id = engine.store.server_id
        self.loop = hat_modules.HatLoop()
        self.engine = self.loop.call(_make_hat_engine(engine, self.loop))

    def close(self) -> None:
        try:
            self.loop.call(self.engine.aclose())
        finally:
            self.loop.close()


async def _make_hat_engine(engine: Engine, loop: Any) -> Any:
    from tidings.server.hat_modules import HatEngine

    return HatEngine(engine, loop)
