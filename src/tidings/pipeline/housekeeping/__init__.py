"""The housekeeping job (design doc: House keeping): archive and delete published events.

Only PUBLISHED rows go. PENDING, HELD and FAILED rows still owe a delivery; UNROUTABLE
rows were never delivered anywhere and stay for inspection. Nothing of the current UTC day
is touched ("don't delete current day"), whatever ``older_than`` says, so today's events
are always there for support queries.

:mod:`~tidings.pipeline.housekeeping.selection` decides which rows go and deletes exactly
those; :mod:`~tidings.pipeline.housekeeping.archiving` writes a chunk to the Parquet
archive first (archive mode) so that every deleted event is archived exactly once, crashes
included; :mod:`~tidings.pipeline.housekeeping.run` is one run: the chunks under a lease,
the announcement of what was deleted and the trim of the batch log.
"""
