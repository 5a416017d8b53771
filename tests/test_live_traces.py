"""Message traces of what a query consumed (``enableMsgTrace``), read back with RocketMQ's own
``mqadmin queryMsgTraceById`` on real 4.9 and 5.3 brokers; the encoding without servers:
test_traces.py."""
from __future__ import annotations

import time
import uuid

import pytest

from rmq_source.remote import RemotingClient
from rmq_source.remote import requests as rq

pytestmark = [pytest.mark.broker, pytest.mark.spark]

QUEUES, PER_QUEUE = 2, 30


def test_a_group_query_leaves_traces_that_mqadmin_shows(spark, rocketmq, tmp_path):
    """An AvailableNow group run with enableMsgTrace: ``mqadmin queryMsgTraceById`` shows, for the
    first and the last message read, the group consuming it with "success", from this host; a
    trace topic that does not exist fails a query at its start, naming the option."""
    topic, trace_topic = f"Traced_{uuid.uuid4().hex[:8]}", f"TraceTo_{uuid.uuid4().hex[:8]}"
    group = f"Tracing_{uuid.uuid4().hex[:6]}"
    broker = rocketmq.brokers["broker-a"]
    ids = []
    with RemotingClient(timeout=15) as client:
        rocketmq.create_topic(client, topic, QUEUES)
        rocketmq.create_topic(client, trace_topic, 1)
        for q in range(QUEUES):
            for i in range(PER_QUEUE):
                sent = rq.send_message(client, broker.addr, topic, b"m", queue_id=q,
                                       keys=[f"order-{q}-{i}"])
                ids.append(sent.uniq_keys[0])
        for q in range(QUEUES):
            rq.wait_max_offset(client, broker.addr, topic, q, PER_QUEUE)
    options = dict(namesrvAddr=rocketmq.namesrv_addr, topic=topic, consumerGroup=group,
                   startingOffsets="earliest", groupStatePath=str(tmp_path / "state"),
                   enableMsgTrace="true", customizedTraceTopic=trace_topic)
    q = (spark.readStream.format("rmq").options(**options).load().writeStream.format("noop")
         .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start())
    assert q.awaitTermination(180), "the AvailableNow run did not finish"
    assert q.exception() is None, q.exception()

    deadline = time.monotonic() + 60     # (the broker indexes the trace messages' keys as it stores them)
    for msg_id in (ids[0], ids[-1]):
        while True:
            report = rocketmq.mqadmin("queryMsgTraceById", "-i", msg_id, "-t", trace_topic)
            subs = [line.split() for line in report.splitlines() if line.startswith("Sub ")]
            if subs or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert len(subs) == 1, report
        assert subs[0][1] == group and subs[0][2] == "127.0.0.1", report   # (the trace sender)
        assert subs[0][-1] == "success", report

    with pytest.raises(Exception) as info:
        spark.read.format("rmq").options(namesrvAddr=rocketmq.namesrv_addr, topic=topic,
                                         enableMsgTrace="true",
                                         customizedTraceTopic="NoSuchTrace").load().collect()
    assert "customizedTraceTopic" in str(info.value) and "NoSuchTrace" in str(info.value)
