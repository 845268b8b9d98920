"""MQTT as a target, through paho-mqtt 2 (the Eclipse project's client), at QoS 1.

Every event is one PUBLISH at QoS 1 to the topic its ``topic`` template names; the broker's
PUBACK is the confirmation. With MQTT 5 (the default) the event's fields and custom headers
travel as user properties, the event id among them, by which subscribers drop a
re-published event (MQTT cannot: QoS 1 is at-least-once).

Bottom up: :mod:`~tidings.targets.kinds.mqtt.messages` is what goes on the wire (topics,
user properties, packet sizes, PUBACK reason codes); :mod:`~tidings.targets.kinds.mqtt.config`
is the kind's configuration; :mod:`~tidings.targets.kinds.mqtt.link` is one connection to
the broker and the PUBACKs it waits for; :mod:`~tidings.targets.kinds.mqtt.target` is the
:class:`~tidings.targets.kinds.mqtt.target.MqttTarget` and its calls.
"""
