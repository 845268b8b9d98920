"""Targets: the places the relay publishes to, each confirming or refusing every event.

One module per kind (the embedded event store, NATS JetStream, a remote event server), all
implementing :class:`~tidings.targets.base.Target`; the registry builds them from the
configuration once per process, fault injection wraps any of them for demos and tests, and
:mod:`~tidings.targets.routed` gives the producer the routed targets' view at emit time.
Targets sit below the pipeline, which calls them from its Spark tasks, and above the server
and the client, which some of them write through.
"""
