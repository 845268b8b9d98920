"""FTN18 event streams: reliable and live consumers of the events the event server holds.

The third part of the flow (outbox -> relay -> event server -> **streams**): each stream is
an HTTP and WebSocket endpoint of ``tidings server`` speaking FutoIn FTN18 v1.1 over FTN3
JSON messages, so the FutoIn client and any program that speaks FTN3 can register as a
consumer and poll, or have events pushed, with its position kept across crashes; or follow
the newest events live. Event ids are the store's positions. The package sits on the event
model and the server's public interface (the store, the engine's listener): it adds no
second copy of the log.

Bottom up:

- :mod:`.protocol`: FTN3 messages, the FTN18 interfaces, events on the wire, the channel;
- :mod:`.typemap`: which server event types a stream carries, under which FTN18 names;
- :mod:`.consumers`: registered consumers' positions, retention, status and metrics;
- :mod:`.service`: a running stream (its functions, push sessions, app and runner);
- :mod:`.client`: tidings' own asyncio consumer;
- :mod:`.spark_source`, :mod:`.jobs`: a stream as a Spark source, and the archive and
  aggregation jobs built on it.

The configuration models are in :mod:`tidings.config.streams` (also importable as
:mod:`.config`).
"""
