"""The message traces a query sends (rmq_source/remote/traces.py) without servers: the contexts
as RocketMQ's TraceDataEncoder writes them, the chunks, the options. Read back by mqadmin on real
brokers: test_live_traces.py; the options: test_options.py."""
from __future__ import annotations

import pyarrow as pa
import pytest

from rmq_source.remote import traces
from rmq_source.schema import ARROW_SCHEMA


def _batch(n, msg_ids, uniq, keys, retries):
    cols = {f.name: pa.nulls(n, f.type) for f in ARROW_SCHEMA}
    cols.update(msgId=pa.array(msg_ids), uniqKey=pa.array(uniq, pa.string()),
                keys=pa.array(keys, pa.list_(pa.string())), reconsumeTimes=pa.array(retries, pa.int32()))
    return pa.RecordBatch.from_arrays([cols[f.name] for f in ARROW_SCHEMA], schema=ARROW_SCHEMA)


def test_contexts_are_the_java_clients_form():
    batch = _batch(3, ["OFF0", "OFF1", "OFF2"], [None, "", "U2"], [["k1", "k2"], [], None], [0, 2, None])
    contexts, keys = traces.encode(batch, "G", "REQ", 1700000000123, 7)
    split = [[field.split("\x01") for field in text.split("\x02")[:-1]] for text in contexts.to_pylist()]
    assert split[0] == [
        ["SubBefore", "1700000000123", "DefaultRegion", "G", "REQ", "OFF0", "0", "k1 k2"],
        ["SubAfter", "REQ", "OFF0", "7", "true", "k1 k2", "0", "1700000000123", "G"]]
    assert [rows[0][5] for rows in split] == ["OFF0", "OFF1", "U2"]   # uniqKey first, as clients show
    assert [rows[0][6] for rows in split] == ["0", "2", "0"]
    assert keys.to_pylist() == ["OFF0 k1 k2 ", "OFF1  ", "U2  "]    # (brokers skip empty keys)
    assert traces._joined(contexts, 1, 3) == "".join(contexts.to_pylist()[1:3]).encode()


@pytest.mark.parametrize("key_len, rows, per_chunk", [
    (10, 2500, traces.TRACE_BATCH),                             # rows per trace message
    (4000, 20, traces.KEYS_LIMIT // 4000),                      # key bytes per trace message
    (traces.KEYS_LIMIT + 10, 2, 1),                             # one row at least
])
def test_chunks_bound_rows_and_key_bytes(key_len, rows, per_chunk):
    expected = [(i, min(rows, i + per_chunk)) for i in range(0, rows, per_chunk)]
    assert traces.chunks(pa.array(["k" * key_len] * rows)) == expected
