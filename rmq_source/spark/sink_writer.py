"""The Spark side of the sink: ``df.write.format("rmq")`` and ``df.writeStream.format("rmq")``.

Query start (driver): the options (:mod:`rmq_source.sink.options`) and the columns
(:func:`rmq_source.sink.columns.check_schema`) are checked, and the route of the ``topic`` option
is asked, so a missing topic fails before any task runs. Tasks: each Arrow batch's rows become
messages sent by a :class:`rmq_source.sink.producer.TaskProducer`; a task returns when all its
messages were acknowledged. Commit has nothing to publish (the messages are visible once sent:
at least once, as Spark's Kafka sink); abort cannot take messages back.

UNIQ_KEY of a row: (write id, batch id, task partition, row index in the task). Batch writes use
the ``writeId`` option (default: a new id per write) and batch id 0; streaming queries their
query id and the micro-batch id, both stable when Spark re-runs a batch after a restart.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from rmq_source.spark.compat import StreamArrowWriterBase
from rmq_source.spark.gc_pause import freeze_long_lived_objects

from rmq_source.errors import RmqOptionError, RmqSourceError
from rmq_source.sink.columns import check_schema
from rmq_source.sink.options import SinkOptions, parse_sink_options
from rmq_source.sink.producer import TaskProducer, fetch_route, shared_client
from rmq_source.sink.task import send_rows
from rmq_source.sink.uniq import TaskKeys

log = logging.getLogger(__name__)

#: local properties Spark's micro-batch execution sets for the tasks of a batch
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
SPARK_CHECKPOINT_OPTION = "checkpointlocation"


@dataclass
class SinkCommit(WriterCommitMessage):
    partition: int
    messages: int
    requests: int
    retries: int
    unconfirmed: int


def prepare(options, schema, overwrite: bool, *, streaming: bool) -> SinkOptions:
    """Options and columns checked, the option topic's route asked (query start)."""
    if overwrite:
        raise RmqOptionError("the rmq sink only appends: a RocketMQ topic cannot be overwritten "
                             "(use mode('append'))")
    if streaming:   # Spark's own option (it hands it to every stream writer), not the sink's
        options = {k: v for k, v in options.items() if k.lower() != SPARK_CHECKPOINT_OPTION}
    opts = parse_sink_options(options, streaming=streaming)
    check_schema(schema, default_topic=opts.topic)
    if opts.topic is not None:
        fetch_route(shared_client(opts), opts, opts.topic)
    if opts.trace_topic is not None:
        from rmq_source.sink.traces import check_trace_topic
        check_trace_topic(lambda topic: fetch_route(shared_client(opts), opts, topic), opts)
    return opts


def write_task(opts: SinkOptions, batches: Iterator[pa.RecordBatch], write_id: str, batch_id: int
               ) -> SinkCommit:
    """Send every row of the task; the commit message counts them."""
    freeze_long_lived_objects()
    partition = TaskContext.get().partitionId()
    stats = send_rows(TaskProducer(opts, partition), batches, TaskKeys(write_id, batch_id, partition))
    return SinkCommit(partition, stats.messages, stats.requests, stats.retries, stats.unconfirmed)


def _summary(commits) -> str:
    done = [c for c in commits if isinstance(c, SinkCommit)]
    return (f"{sum(c.messages for c in done)} messages from {len(done)} tasks in "
            f"{sum(c.requests for c in done)} requests ({sum(c.retries for c in done)} retried, "
            f"{sum(c.unconfirmed for c in done)} accepted unconfirmed)")


class RmqSinkWriter(DataSourceArrowWriter):
    """``df.write.format("rmq")``."""

    def __init__(self, opts: SinkOptions):
        self.opts = opts

    def write(self, iterator):
        return write_task(self.opts, iterator, self.opts.write_id, 0)

    def commit(self, messages):
        log.info("rmq sink, write %s: sent %s", self.opts.write_id, _summary(messages))

    def abort(self, messages):
        log.warning("rmq sink, write %s failed; sent before the failure (they stay in the topics): %s",
                    self.opts.write_id, _summary(messages))


class RmqSinkStreamWriter(StreamArrowWriterBase):
    """``df.writeStream.format("rmq")``."""

    def __init__(self, opts: SinkOptions):
        self.opts = opts

    def write(self, iterator):
        ctx = TaskContext.get()
        query, batch = ctx.getLocalProperty(QUERY_ID_PROPERTY), ctx.getLocalProperty(BATCH_ID_PROPERTY)
        if not query or batch is None:
            raise RmqSourceError("the rmq stream sink found no streaming query id / batch id in its "
                                 f"task (local properties {QUERY_ID_PROPERTY}, {BATCH_ID_PROPERTY}); "
                                 "it runs only inside a micro-batch streaming query")
        return write_task(self.opts, iterator, query, int(batch))

    def commit(self, messages, batchId):
        log.info("rmq sink, batch %d: sent %s", batchId, _summary(messages))

    def abort(self, messages, batchId):
        log.warning("rmq sink, batch %d failed; sent before the failure (they stay in the topics; "
                    "the batch's re-run sends the same UNIQ_KEYs): %s", batchId, _summary(messages))
