"""A task's rows, Arrow batch after Arrow batch, handed to its :class:`.producer.TaskProducer`.

Rows of the columns the C core encodes (:func:`.encoder.encodable`) go as whole encoded batches;
any other rows message by message (:func:`.columns.messages`). Either way row ``r`` of the task
(0-based, input order over all its batches) carries the UNIQ_KEY of ``(write id, batch id,
partition, r)``.
"""
from __future__ import annotations

from typing import Iterable

import pyarrow as pa

from rmq_source.sink.columns import messages
from rmq_source.sink.encoder import BatchEncoder, encodable
from rmq_source.sink.producer import SendStats, TaskProducer
from rmq_source.sink.uniq import TaskKeys


def send_rows(producer: TaskProducer, batches: Iterable[pa.RecordBatch], keys: TaskKeys) -> SendStats:
    """Sends every row of ``batches`` and waits for every answer; on an error the producer
    stops waiting (what was sent stays sent) and the error propagates."""
    opts, partition = producer.opts, producer.partition
    encoder: BatchEncoder | None = None
    row = 0
    try:
        for batch in batches:
            if row == 0 and encoder is None and opts.topic is not None and encodable(batch.schema):
                encoder = BatchEncoder(opts, keys, partition)
            if encoder is not None:
                for done in encoder.encode(batch, row):
                    producer.add_encoded(opts.topic, done.first_row, done.count, done.data)
            else:
                for msg in messages(batch, first_row=row, partition=partition, keys=keys,
                                    default_topic=opts.topic, max_message_bytes=opts.max_message_bytes,
                                    namespace=opts.namespace):
                    producer.add(msg)
            row += batch.num_rows
        if encoder is not None and (done := encoder.finish()) is not None:
            producer.add_encoded(opts.topic, done.first_row, done.count, done.data)
        return producer.flush()
    except BaseException:
        producer.abandon()
        raise
