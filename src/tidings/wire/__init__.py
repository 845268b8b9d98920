"""The hat-event 0.8.5 wire: SBS message schemas, their codec, and chatter connections.

Shared by the event server (:mod:`tidings.server`), its Python client (:mod:`tidings.client`)
and the relay's remote-server target, so that one implementation of the protocol serves
both ends.
"""
