"""The target kinds: one module (or sub-package) per place the relay can publish to.

Each declares its configuration model and its :class:`~tidings.targets.base.Target` class
side by side, and :mod:`tidings.targets.registry` finds them here, so adding a kind is
adding a module to this package. The embedded event store
(:mod:`~tidings.targets.kinds.event_store`), a remote tidings event server
(:mod:`~tidings.targets.kinds.event_server`), NATS JetStream
(:mod:`~tidings.targets.kinds.jetstream`), RabbitMQ over AMQP 0-9-1
(:mod:`~tidings.targets.kinds.rabbitmq`), Redis Streams
(:mod:`~tidings.targets.kinds.redis_stream`), MQTT (:mod:`~tidings.targets.kinds.mqtt`) and
HTTP webhooks (:mod:`~tidings.targets.kinds.webhook`). Installed packages bring more
(plug-ins, loaded by the registry). :mod:`~tidings.targets.kinds.server_group` is
no kind: it is how the event-server target finds a server of a redundant group, and
:mod:`~tidings.targets.kinds.resend_window` what it sends again on moving to another one.
"""
