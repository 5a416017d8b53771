"""The row schema: the public contract of every reader (store API, Spark, CLI --json).

Timestamps are ``timestamp[us, UTC]`` in Arrow (Spark's TimestampType); the store holds epoch
milliseconds, multiplied by 1000 on the way out.
"""
from __future__ import annotations

import pyarrow as pa

SPARK_DDL = (
    "topic string, brokerName string, queueId int, queueOffset long, commitLogOffset long, "
    "storeSize int, msgId string, uniqKey string, tags string, keys array<string>, body binary, "
    "properties map<string,string>, bornTimestamp timestamp, storeTimestamp timestamp, "
    "bornHost string, storeHost string, sysFlag int, flag int, reconsumeTimes int, bodyCRC int, "
    "preparedTransactionOffset long"
)

TIMESTAMP = pa.timestamp("us", tz="UTC")

ARROW_SCHEMA = pa.schema([
    ("topic", pa.string()),
    ("brokerName", pa.string()),
    ("queueId", pa.int32()),
    ("queueOffset", pa.int64()),
    ("commitLogOffset", pa.int64()),
    ("storeSize", pa.int32()),
    ("msgId", pa.string()),
    ("uniqKey", pa.string()),
    ("tags", pa.string()),
    ("keys", pa.list_(pa.string())),
    ("body", pa.binary()),
    ("properties", pa.map_(pa.string(), pa.string())),
    ("bornTimestamp", TIMESTAMP),
    ("storeTimestamp", TIMESTAMP),
    ("bornHost", pa.string()),
    ("storeHost", pa.string()),
    ("sysFlag", pa.int32()),
    ("flag", pa.int32()),
    ("reconsumeTimes", pa.int32()),
    ("bodyCRC", pa.int32()),
    ("preparedTransactionOffset", pa.int64()),
])

COLUMN_NAMES = tuple(ARROW_SCHEMA.names)
