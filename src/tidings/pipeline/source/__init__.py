"""The event log as a Spark data source (``tidings_outbox``) whose tasks publish.

Spark plans the batches over the log's sequence (:mod:`~tidings.pipeline.source.datasource`,
up to the safe :mod:`~tidings.pipeline.source.watermark`) and hands each task a slice
(:mod:`~tidings.pipeline.source.slices`); the task reads its slice
(:mod:`~tidings.pipeline.source.queries`) and publishes it where it runs
(:mod:`~tidings.pipeline.source.task`), then yields its summary, which the job's driver
records in the batch log. The workers that only plan a batch load PySpark's data source
API and nothing else: the queries and the publishing load only where they run.
"""
