"""Targets: the places the relay publishes to, each confirming or refusing every event.

Bottom up: :mod:`~tidings.targets.base` is the interface every target implements;
:mod:`~tidings.targets.destination` fills a target's destination (subject, event type)
from each event's fields; :mod:`~tidings.targets.loop_thread` is the asyncio loop that the
kinds with asyncio clients run their calls on; :mod:`~tidings.targets.faults` wraps any
target in fault injection for demos and tests; :mod:`~tidings.targets.kinds` holds one
module (or sub-package) per kind, each declaring its configuration model beside its
:class:`~tidings.targets.base.Target` class; :mod:`~tidings.targets.registry` maps kinds to
classes and builds targets once per process; and :mod:`~tidings.targets.routed` gives the
producer the routed targets' view at emit time. Targets sit below the pipeline, which calls
them from its Spark tasks, and above the server and the client, which some of them write
through.
"""
