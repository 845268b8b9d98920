"""hat-event 0.8.5 modules for the tests, written as hat's documentation shows a module (a
Python module with ``json_schema_id``, ``json_schema_repo`` and ``async create(conf, engine,
source)`` returning a ``hat.event.server.common.Module``). They import nothing of tidings:
the same files run in a real hat-event 0.8.5 server (``tests/server/test_hat_modules.py``)
and in tidings."""
