"""RabbitMQ as a target, over AMQP 0-9-1 through aiormq: ``kind: rabbitmq``.

Every event becomes one persistent message published to one exchange with a routing key
from a template (:mod:`tidings.targets.destination`), with ``mandatory`` set and publisher
confirms on: an event is confirmed only once the broker acknowledged it, and a message no
queue takes comes back (``basic.return``) and is that event's failure, naming the exchange
and the routing key. ``message_id`` is the event id; the event's fields and custom headers
travel as AMQP headers. Delivery is at-least-once: AMQP has no producer-side
de-duplication, so a call interrupted by a crash or an outage is published again and a
consumer de-duplicates by ``message_id``.

Bottom up: :mod:`~tidings.targets.kinds.rabbitmq.messages` is what goes on the wire (routing
keys, properties, headers, sizes, what a refusal says);
:mod:`~tidings.targets.kinds.rabbitmq.config` is the kind's configuration;
:mod:`~tidings.targets.kinds.rabbitmq.target` is the
:class:`~tidings.targets.kinds.rabbitmq.target.RabbitMQTarget`, its connection and its calls.
"""
