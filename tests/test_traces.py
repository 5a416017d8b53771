"""The message traces a query and the sink send (rmq_source/remote/traces.py, the C core's
native/core/traces.c) without servers: the contexts as RocketMQ's TraceDataEncoder writes them,
the chunks, the sender. Read back by mqadmin on real brokers: test_live_traces.py; the options:
test_options.py."""
from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pytest

from rmq_source.errors import RmqOptionError, RmqRemotingError
from rmq_source.remote import requests as rq
from rmq_source.remote import traces
from rmq_source.schema import ARROW_SCHEMA


def _batch(n, msg_ids, uniq, keys, retries):
    cols = {f.name: pa.nulls(n, f.type) for f in ARROW_SCHEMA}
    cols.update(msgId=pa.array(msg_ids), uniqKey=pa.array(uniq, pa.string()),
                keys=pa.array(keys, pa.list_(pa.string())), reconsumeTimes=pa.array(retries, pa.int32()))
    return pa.RecordBatch.from_arrays([cols[f.name] for f in ARROW_SCHEMA], schema=ARROW_SCHEMA)


def _split(ctx: traces.Contexts, i: int) -> list[list[str]]:
    return [field.split("\x01") for field in str(ctx.body(i, i + 1), "utf-8").split("\x02")[:-1]]


def _keys(ctx: traces.Contexts) -> list[str]:
    return [ctx.keys_text(i, i + 1) for i in range(ctx.n)]


@pytest.mark.parametrize("sliced", [False, True])
def test_consumed_contexts_are_the_java_clients_form(sliced):
    batch = _batch(4, ["X", "OFF0", "OFF1", "OFF2"], ["Y", None, "", "U2"],
                   [["z"], ["k1", "k2"], [], None], [9, 0, 2, None])
    ctx = traces.sub_contexts(batch.slice(1) if sliced else batch.slice(0), "G", "REQ", 1700000000123, 7)
    first = 0 if sliced else 1
    assert _split(ctx, first) == [
        ["SubBefore", "1700000000123", "DefaultRegion", "G", "REQ", "OFF0", "0", "k1 k2"],
        ["SubAfter", "REQ", "OFF0", "7", "true", "k1 k2", "0", "1700000000123", "G"]]
    rows = [_split(ctx, i)[0] for i in range(first, ctx.n)]
    assert [r[5] for r in rows] == ["OFF0", "OFF1", "U2"]        # uniqKey first, as clients show
    assert [r[6] for r in rows] == ["0", "2", "0"]
    assert [r[7] for r in rows] == ["k1 k2", "null", "null"]      # (as Java writes a null String)
    assert [_split(ctx, i)[1][5] for i in range(first, ctx.n)] == ["k1 k2", "null", "null"]
    assert _keys(ctx)[first:] == ["OFF0 k1 k2", "OFF1", "U2"]
    assert ctx.body(first, ctx.n) == b"".join(ctx.body(i, i + 1) for i in range(first, ctx.n))


def test_sent_contexts_are_the_java_clients_form():
    body = rq.encode_batch([(b"abc", {"UNIQ_KEY": "U0", "TAGS": "T", "KEYS": "a b", "WAIT": "true"}, 0),
                            (b"", {"UNIQ_KEY": "U1", "DELAY": "3"}, 0)])
    ctx = traces.pub_contexts(body, 2, "O0,O1", group="PG", topic="Top", store_host="127.0.0.1:10911",
                              region="R", sent_ms=1700000000000, cost_ms=5)
    assert _split(ctx, 0) == [["Pub", "1700000000000", "R", "PG", "Top", "U0", "T", "a b",
                               "127.0.0.1:10911", "3", "5", "0", "O0", "true"]]
    assert _split(ctx, 1)[0][5:] == ["U1", "null", "null", "127.0.0.1:10911", "0", "5", "3", "O1", "true"]
    assert _keys(ctx) == ["U0 a b", "U1"]


@pytest.mark.parametrize("body, count, what", [
    (b"\0\0\0\x10" + bytes(18), 1, "has size 16"),                    # size below the header's
    (rq.encode_batch([(b"x", {"UNIQ_KEY": "U"}, 0)])[:-1], 1, "has size"),   # cut short
    (rq.encode_batch([(b"x", {"UNIQ_KEY": "U"}, 0)]), 2, "before message 1"),
    (rq.encode_batch([(b"x", {"UNIQ_KEY": "U"}, 0)]) + b"\0", 1, "1 bytes after"),
])
def test_a_bad_batch_body_is_an_error_naming_the_byte(body, count, what):
    with pytest.raises(RmqOptionError, match=what):
        traces.pub_contexts(body, count, "", group="G", topic="T", store_host="h", region="R",
                            sent_ms=0, cost_ms=0)


def _contexts(key_len: int, n: int) -> traces.Contexts:
    ends = np.arange(1, n + 1, dtype=np.int64)
    return traces.Contexts(b"c" * n, ends, b"k" * (key_len * n), ends * key_len)


@pytest.mark.parametrize("key_len, rows, per_chunk", [
    (10, 2500, traces.TRACE_BATCH),                             # rows per trace message
    (4000, 20, traces.KEYS_LIMIT // 4000),                      # key bytes per trace message
    (traces.KEYS_LIMIT + 10, 2, 1),                             # one row at least
])
def test_chunks_bound_rows_and_key_bytes(key_len, rows, per_chunk):
    expected = [(i, min(rows, i + per_chunk)) for i in range(0, rows, per_chunk)]
    assert _contexts(key_len, rows).chunks() == expected


class _Call:
    def __init__(self, fail):
        self.fail, self.cancelled = fail, False

    def cancel(self):
        self.cancelled = True


class _Client:
    def answer(self, call):
        if call.fail:
            raise RmqRemotingError("broker away")


def _sender(sent, fail_at=()):
    def send(broker, queue_id, body, props):
        sent.append((broker, queue_id, body, dict(p.split("\x01") for p in props.decode().split("\x02") if p)["KEYS"]))
        return _Call(len(sent) in fail_at)
    return traces.TraceSender("TRACE", "G", _Client(), lambda: [("b", 0), ("b", 1)], send)


def test_the_sender_fills_trace_messages_across_batches_and_sends_the_rest_at_the_end():
    sent, parts = [], []
    sender = _sender(sent)
    for i in range(7):                   # 7 x 300 contexts: two full trace messages, then the rest
        ids = [f"M{i}-{j}" for j in range(300)]
        batch = _batch(300, ids, [None] * 300, [None] * 300, [0] * 300)
        parts.append(traces.sub_contexts(batch, "G", "R", 1, 1))
        sender.add(parts[-1])
    assert [len(b[3].split()) for b in sent] == [traces.TRACE_BATCH] * 2
    sender.close()
    assert [len(b[3].split()) for b in sent] == [traces.TRACE_BATCH] * 2 + [2100 - 2048]
    assert [(b[0], b[1]) for b in sent] == [("b", 0), ("b", 1), ("b", 0)]
    assert b"".join(b[2] for b in sent) == b"".join(p.data for p in parts)   # each once, in order
    assert " ".join(b[3] for b in sent).split() == [f"M{i}-{j}" for i in range(7) for j in range(300)]


def test_a_trace_that_cannot_be_sent_is_dropped_and_logged_never_raised(caplog):
    sent = []
    sender = _sender(sent, fail_at={1})
    with caplog.at_level(logging.ERROR):
        sender.add(_contexts(10, 1500))
        sender.close()
    assert len(sent) == 2
    assert "dropped" in caplog.text and "1024 message(s)" in caplog.text


def test_pub_traces_follow_the_brokers_switch_and_name_its_region_without_the_namespace():
    from types import SimpleNamespace

    from rmq_source.remote.frames import RemotingCommand
    from rmq_source.sink.options import parse_sink_options
    from rmq_source.sink.traces import PublishTraces
    opts = parse_sink_options({"namesrvAddr": "127.0.0.1:1", "topic": "T", "namespace": "ns",
                               "producerGroup": "PG", "enableMsgTrace": "true"}, streaming=False)
    pub = PublishTraces(opts, None, None)
    added = []
    pub.sender = SimpleNamespace(add=added.append)
    body = rq.encode_batch([(b"x", {"UNIQ_KEY": "U"}, 0)])
    pub.sent(opts.topic, body, 1, RemotingCommand(0, {"msgId": "O", "MSG_REGION": "R"}), "h:1", 5, 2)
    pub.sent(opts.topic, body, 1, RemotingCommand(0, {"msgId": "O", "TRACE_ON": "false"}), "h:1", 5, 2)
    pub.sent(opts.topic, body, 1, RemotingCommand(11, {"msgId": "O"}), "h:1", 5, 2)   # stored, unconfirmed
    assert [_split(c, 0)[0][:6] for c in added] == [["Pub", "5", "R", "PG", "T", "U"],
                                                    ["Pub", "5", "DefaultRegion", "PG", "T", "U"]]
    assert [_split(c, 0)[0][-1] for c in added] == ["true", "false"]
