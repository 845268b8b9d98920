"""Targets: the places the relay publishes to, each confirming or refusing every event.

A kind is one module: the embedded event store, NATS JetStream (its message format in
:mod:`~tidings.targets.jetstream_messages`, what it needs of its stream in
:mod:`~tidings.targets.jetstream_stream`), a remote event server. A target's destination
(subject, event type) may be a template filled per event
(:mod:`~tidings.targets.destination`). Each declares its kind and configuration model
beside its :class:`~tidings.targets.base.Target` class; the registry maps kinds to classes
and builds targets once per process, fault injection wraps any of them for demos and tests,
and :mod:`~tidings.targets.routed` gives the producer the routed targets' view at emit time.
Targets sit below the pipeline, which calls them from its Spark tasks, and above the server
and the client, which some of them write through.
"""
