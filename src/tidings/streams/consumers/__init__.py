"""A stream's registered consumers: their acknowledged positions (kept in the store's
database, and shared with the other servers of a redundant group through the log, whose
consumer events are compacted), the retention those positions allow, and where each stream
and consumer stands (``tidings streams status``, ``unregister``, the Prometheus metrics).

Blocking code on the event store, called from worker threads by the running service and
directly by the command line.
"""
