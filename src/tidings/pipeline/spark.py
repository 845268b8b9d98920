"""The SparkSession tidings jobs run on: local by default, any master URL by configuration."""

from __future__ import annotations

import logging
import os
import sys

from pyspark.sql import SparkSession

from tidings.config import RelayConfig
from tidings.pipeline.class_archive import driver_java_options

log = logging.getLogger(__name__)
_CHECKPOINT_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)

#: Data source options whose values Spark never shows: URLs (Spark's default) and the whole
#: configuration the relay passes to its tasks (``config_json``).
_REDACTED_OPTIONS = "(?i)url|config_json|password|secret|token"
#: The credentials of a URL anywhere in a plan string (Java regex).
_REDACTED_STRINGS = "(?<=://)[^/@\\s]+(?=@)"


def spark_session(config: RelayConfig, app_name: str = "tidings") -> SparkSession:
    """Get or create the session and register tidings' data sources on it.

    In local mode everything runs on this interpreter, bound to the loopback. On a cluster
    (any other master URL) the operator's ``SPARK_LOCAL_IP`` and ``PYSPARK_PYTHON`` are
    kept: the driver must be reachable from the executors' hosts, and the executors may
    run tidings from an interpreter of their own (Spark also starts that interpreter on the
    driver, to plan tidings' Python data sources, so it must exist on both). Other Spark
    settings (executor memory and cores, ``spark.executorEnv.*``, ``spark.submit.pyFiles``)
    come from Spark's own ``spark-defaults.conf`` or ``PYSPARK_SUBMIT_ARGS``.
    """
    if is_local(config.spark_master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        os.environ["PYSPARK_PYTHON"] = sys.executable
    else:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master(config.spark_master)
        .appName(app_name)
        .config("spark.driver.memory", config.driver_memory)  # only before the JVM starts
        # With the class archive, if one was made (tidings.pipeline.class_archive).
        .config("spark.driver.extraJavaOptions", driver_java_options(config))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(config.shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.streaming.stopTimeout", "60s")
        # Write-then-rename through the FileSystem API: a third of the per-batch checkpoint
        # time of the FileContext default on a local disk (measured: ~100 ms -> ~30 ms).
        .config("spark.sql.streaming.checkpointFileManagerClass", _CHECKPOINT_MANAGER)
        # The data source options carry the configuration, database URL included: Spark
        # hides option values and plan strings matching these wherever it shows a plan (an
        # error, a log line), as it does for its own secrets.
        .config("spark.sql.redaction.options.regex", _REDACTED_OPTIONS)
        .config("spark.sql.redaction.string.regex", _REDACTED_STRINGS)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    from tidings.pipeline.source.datasource import OutboxDataSource

    spark.dataSource.register(OutboxDataSource)
    return spark


def is_local(master: str) -> bool:
    """Whether ``master`` runs Spark inside this process (``local``, ``local[4]``, ...)."""
    return master == "local" or master.startswith("local[")


def activate(spark: SparkSession) -> None:
    """Make ``spark`` the active session of the calling thread.

    Spark resolves Python data sources through the *active* session, which is per thread;
    a relay started from another thread would otherwise not find ``tidings_outbox``.
    PySpark does the same in ``createDataFrame``.
    """
    SparkSession._activeSession = spark
    jvm_class = SparkSession._get_j_spark_session_class(spark._jvm)
    jvm_class.setActiveSession(spark._jsparkSession)


def spark_location(location: str) -> str:
    """A directory as Spark must be given it (a checkpoint, an archive): a bare path would
    be resolved against Spark's own working directory, so it is made absolute; URIs
    (``hdfs://``, ``s3a://``, ``file:///``) stay as they are."""
    return location if "://" in location else os.path.abspath(location)
