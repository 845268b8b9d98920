"""An intermediary served to its subscribers over WebSocket.

:mod:`.page` is the web pages a server serves beside the socket (the moving map of one
subscriber's view, and the live page of events and views; files in ``static/``);
:mod:`.envelope` the binary envelope of a frame and the close codes; :mod:`.ring` the one
ring of events every connection reads with a cursor; :mod:`.connection` one subscriber's
connection, where the latest frames wait and leave; :mod:`.transport` the server: requests
in, frames and messages out, one tick at a time; :mod:`.service` the intermediary run as a
service against an event server (``tidings intermediary serve``). Around them:
:mod:`.credentials` and :mod:`.access` who may connect, :mod:`.addresses` the limits per
client address, :mod:`.limits` the server's bounds, :mod:`.requests` a request read and
refused, :mod:`.counters` what the server counts and :mod:`.metrics` its Prometheus
endpoint.
"""
