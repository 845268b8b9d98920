"""The hat-event 0.8.5 wire: SBS message schemas, their codec, and chatter connections.

Shared by the event server (:mod:`tidings.server`), its Python client (:mod:`tidings.client`)
and the relay's remote-server target, so that one implementation of the protocol serves
both ends. Bottom up: the pre-scan that bounds decoding before it starts, the codec to the
event model (:mod:`tidings.events`), the frame envelope, frames read off a socket, the
bounded receive queue and the rule for a peer that lags, then chatter connections and the
server that accepts them (the client side of opening one apart).
"""
