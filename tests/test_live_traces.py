"""Message traces of what the sink sent and a query consumed (``enableMsgTrace``), read back with
RocketMQ's own ``mqadmin queryMsgTraceById`` on real 4.9 and 5.3 brokers; the encoding without
servers: test_traces.py."""
from __future__ import annotations

import time
import uuid

import pytest

from rmq_source.remote import RemotingClient
from rmq_source.remote import requests as rq

pytestmark = [pytest.mark.broker, pytest.mark.spark]

QUEUES, PER_QUEUE = 2, 30


def _lines(report: str, kind: str) -> list[list[str]]:
    return [line.split() for line in report.splitlines() if line.startswith(kind + " ")]


def test_the_sink_and_a_group_query_leave_traces_that_mqadmin_shows(spark, rocketmq, tmp_path):
    """The sink with enableMsgTrace sends 60 messages in batches (the C core's encoder) and one
    delayed message alone (row by row); an AvailableNow group run with enableMsgTrace reads them.
    ``mqadmin queryMsgTraceById`` shows, for the delayed message, the first and the last of the
    batch, the producer group sending it and the consumer group consuming it, each with
    "success", from this host. A trace topic that does not exist fails a read and a write at
    their start, naming the option."""
    topic, trace_topic = f"Traced_{uuid.uuid4().hex[:8]}", f"TraceTo_{uuid.uuid4().hex[:8]}"
    group, producer = f"Tracing_{uuid.uuid4().hex[:6]}", f"TracingP_{uuid.uuid4().hex[:6]}"
    broker = rocketmq.brokers["broker-a"]
    with RemotingClient(timeout=15) as client:
        rocketmq.create_topic(client, topic, QUEUES)
        rocketmq.create_topic(client, trace_topic, 1)
    traced = dict(namesrvAddr=rocketmq.namesrv_addr, enableMsgTrace="true",
                  customizedTraceTopic=trace_topic)
    write = dict(traced, topic=topic, producerGroup=producer)
    spark.createDataFrame([("late", 1)], "body string, delayTimeLevel int").write.format("rmq") \
        .options(**write).mode("append").save()
    spark.createDataFrame([(f"m{i}", [f"order-{i}"]) for i in range(QUEUES * PER_QUEUE)],
                          "body string, keys array<string>").coalesce(1).write.format("rmq") \
        .options(**write).mode("append").save()
    with RemotingClient(timeout=15) as client:       # (the delayed one comes after a second)
        deadline = time.monotonic() + 60
        while sum(rq.max_offset(client, broker.addr, topic, q) for q in range(QUEUES)) < 61:
            assert time.monotonic() < deadline, "the 61 messages never reached the topic"
            time.sleep(0.5)
    rows = (spark.read.format("rmq").options(namesrvAddr=rocketmq.namesrv_addr, topic=topic,
                                             startingOffsets="earliest").load()
            .select("uniqKey", "body").collect())
    ids = {bytes(r.body).decode(): r.uniqKey for r in rows}
    assert len(ids) == 61, ids
    options = dict(traced, topic=topic, consumerGroup=group, startingOffsets="earliest",
                   groupStatePath=str(tmp_path / "state"))
    q = (spark.readStream.format("rmq").options(**options).load().writeStream.format("noop")
         .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start())
    assert q.awaitTermination(180), "the AvailableNow run did not finish"
    assert q.exception() is None, q.exception()

    deadline = time.monotonic() + 60     # (the broker indexes the trace messages' keys as it stores them)
    for body in ("late", "m0", f"m{QUEUES * PER_QUEUE - 1}"):
        while True:
            report = rocketmq.mqadmin("queryMsgTraceById", "-i", ids[body], "-t", trace_topic)
            pubs, subs = _lines(report, "Pub"), _lines(report, "Sub")
            if (pubs and subs) or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert len(pubs) == 1 and len(subs) == 1, report
        for line, who in ((pubs[0], producer), (subs[0], group)):
            assert line[1] == who and line[2] == "127.0.0.1", report   # (the trace sender)
            assert line[-1] == "success", report

    for attempt in (lambda: spark.read.format("rmq")
                    .options(**dict(traced, topic=topic, customizedTraceTopic="NoSuchTrace"))
                    .load().collect(),
                    lambda: spark.createDataFrame([("x",)], "body string").write.format("rmq")
                    .options(**dict(write, customizedTraceTopic="NoSuchTrace")).mode("append").save()):
        with pytest.raises(Exception) as info:
            attempt()
        assert "customizedTraceTopic" in str(info.value) and "NoSuchTrace" in str(info.value)
