"""A quiet end for Spark's streaming source runner when its query stops.

The relay's source runs in a Python process Spark starts for it (PySpark's
``python_streaming_source_runner``), which reads calls from the JVM over a socket until the
JVM closes it. When the query stops, the JVM closes that socket and ends the process; on a
busy machine the process sometimes reads the end of the socket first. PySpark's runner then
tries to report the ``EOFError`` back over the socket that is gone, and Python prints both
tracebacks on the relay's stderr: two screens of noise on every such stop, for no failure,
which an operator cannot tell from a real one.

:func:`quiet_when_the_jvm_closes` makes that one case end without a traceback (the exit
status is still not zero, as PySpark intends). Every other uncaught error of the runner is
printed as before.
"""

from __future__ import annotations

import sys
from types import TracebackType

#: The file name of PySpark's streaming source runner, the ``__main__`` of its process.
RUNNER = "python_streaming_source_runner.py"


def closed_by_the_jvm(error: BaseException | None) -> bool:
    """True for an end of the JVM's socket (``EOFError``), possibly followed by socket
    errors (``OSError``) while reporting it: nothing else."""
    while isinstance(error, OSError):
        error = error.__context__
    return isinstance(error, EOFError)


def quiet_when_the_jvm_closes() -> None:
    """In PySpark's streaming source runner process (and nowhere else), leave out the
    traceback of an end of the JVM's socket (see the module's docstring)."""
    main = sys.modules.get("__main__")
    if not str(getattr(main, "__file__", "")).endswith(RUNNER):
        return
    if getattr(sys.excepthook, "tidings_quiet", False):
        return  # installed already: one reader per query, one runner per process
    previous = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
        if not closed_by_the_jvm(error):
            previous(kind, error, trace)

    hook.tidings_quiet = True  # type: ignore[attr-defined]
    sys.excepthook = hook
