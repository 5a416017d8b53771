"""The ``format("rmq")`` sink: DataFrames written to RocketMQ topics over the remoting protocol.

:mod:`.options` parses the write options, :mod:`.columns` checks the DataFrame's columns and turns
Arrow batches into messages, :mod:`.encoder` encodes whole batches in C when the columns allow,
:mod:`.uniq` derives each message's ``UNIQ_KEY``, :mod:`.routing` picks queues as RocketMQ's
producer does, :mod:`.producer` sends batches per queue with retries, :mod:`.task` feeds a task's
rows to its producer.
The Spark writer classes are in :mod:`rmq_source.spark.sink_writer`.
"""
