"""The PySpark data source ``format("rmq")``: wiring only.

Options are parsed once by :mod:`rmq_source.spark.options`; queues, offsets, messages and group
state come from a :class:`rmq_source.backend.Backend` (:func:`rmq_source.spark.query.open_backend`);
start/end positions from :mod:`rmq_source.spark.positions`, tasks from :mod:`rmq_source.spark.planner`,
rows from :mod:`rmq_source.spark.partition_reader`.
"""
from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceReader
from pyspark.sql.types import StructType

from rmq_source.errors import RmqOptionError
from rmq_source.spark.options import default_client_id, parse_options
from rmq_source.spark.partition_reader import read_partition
from rmq_source.schema import COLUMN_NAMES, SPARK_DDL
from rmq_source.spark.stream_reader import RmqStreamReader
from rmq_source.spark.batch_reader import plan_batch


def _check_schema(schema: StructType) -> None:
    if schema is not None and tuple(schema.fieldNames()) != COLUMN_NAMES:
        raise RmqOptionError(
            "the rmq source has a fixed schema; do not pass .schema(...) (expected columns: "
            f"{', '.join(COLUMN_NAMES)})")


class RmqBatchReader(DataSourceReader):
    """``spark.read.format("rmq")``: plans queue ranges once, reads them in tasks."""

    def __init__(self, options):
        self.opts = parse_options(options, streaming=False)

    def partitions(self):
        return plan_batch(self.opts)

    def read(self, partition):
        return read_partition(partition)


class RocketMQDataSource(DataSource):
    """Reads Apache RocketMQ topics straight from broker store directories.

    Register with ``spark.dataSource.register(RocketMQDataSource)`` and use
    ``spark.read.format("rmq")`` or ``spark.readStream.format("rmq")``; see docs/options.md.
    """

    def __init__(self, options):
        super().__init__(options)
        # One client id per query run, shared by every process that plans or reads it (the data
        # source object is pickled to them); parsing options in each process would mint several.
        if not any(k.lower() == "clientid" for k in self.options):
            options = dict(self.options)
            options["clientId"] = default_client_id()
            self.options = options

    @classmethod
    def name(cls) -> str:
        return "rmq"

    def schema(self) -> str:
        return SPARK_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        _check_schema(schema)
        return RmqBatchReader(self.options)

    def streamReader(self, schema: StructType) -> RmqStreamReader:
        _check_schema(schema)
        return RmqStreamReader(parse_options(self.options, streaming=True))
