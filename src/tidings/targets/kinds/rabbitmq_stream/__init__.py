"""RabbitMQ streams as a target, through rstream: ``kind: rabbitmq_stream``.

Every event becomes one AMQP 1.0 message in a stream named by a template
(:mod:`tidings.targets.destination`), sent under a named producer (a *reference*) with a
publishing id, so that RabbitMQ stores it once however often it is sent: exactly-once into
the stream across relay crashes. The references and the id of every event are kept in the
outbox log (:mod:`tidings.outbox.stream_ids`); docs/design/rabbitmq-streams.md says why that
is exactly-once.

Bottom up: :mod:`~tidings.targets.kinds.rabbitmq_stream.messages` is what goes in the stream
(messages, stream names, sizes); :mod:`~tidings.targets.kinds.rabbitmq_stream.config` the
kind's configuration; :mod:`~tidings.targets.kinds.rabbitmq_stream.connection` one
stream-protocol connection and its confirms; :mod:`~tidings.targets.kinds.rabbitmq_stream.sender`
one stream's producer (its reference, ids and reconciliation); and
:mod:`~tidings.targets.kinds.rabbitmq_stream.target` the
:class:`~tidings.targets.kinds.rabbitmq_stream.target.RabbitMQStreamTarget`.
"""
