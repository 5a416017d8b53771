"""Which columns a read produces (rmq_source/spark/columns.py), without Spark's JVM; with real
stores and brokers: test_backends.py."""
from __future__ import annotations

import pytest
from pyspark.sql import types as T
from pyspark.sql.types import StructType

from rmq_source.errors import RmqReadSchemaError
from rmq_source.schema import COLUMN_NAMES, SPARK_DDL
from rmq_source.spark.columns import selected_columns


TYPES = {"string": T.StringType(), "int": T.IntegerType(), "long": T.LongType(),
         "binary": T.BinaryType(), "timestamp": T.TimestampType(),
         "timestamp_ntz": T.TimestampNTZType(), "array<string>": T.ArrayType(T.StringType()),
         "array<binary>": T.ArrayType(T.BinaryType()),
         "map<string,string>": T.MapType(T.StringType(), T.StringType())}


def _schema(ddl: str) -> StructType:
    """(Spark's DDL parser needs a JVM; these tests do without one, as the Python workers do.)"""
    return StructType([T.StructField(name, TYPES[kind])
                       for name, kind in (col.split(" ", 1) for col in ddl.split(", "))])


@pytest.mark.parametrize("ddl, expected", [
    (SPARK_DDL, None),                                            # everything, as documented
    ("queueOffset long, body binary", ("queueOffset", "body")),
    ("body binary, topic string", ("body", "topic")),             # any order
    ("keys array<string>, properties map<string,string>, bornTimestamp timestamp",
     ("keys", "properties", "bornTimestamp")),
])
def test_a_schema_selects_columns(ddl, expected):
    assert selected_columns(_schema(ddl)) == expected
    assert selected_columns(None) is None


@pytest.mark.parametrize("ddl, match", [
    ("queueOffset long, value binary", "column 'value', which it does not produce"),
    ("queueoffset long", "did you mean queueOffset"),
    ("queueOffset int", "column 'queueOffset' of type int; the source produces it as bigint"),
    ("keys array<binary>", "produces it as array<string>"),
    ("storeTimestamp timestamp_ntz", "produces it as timestamp"),
    ("body binary, body binary", "names column 'body' twice"),
])
def test_a_wrong_schema_names_the_column_and_the_valid_ones(ddl, match):
    with pytest.raises(RmqReadSchemaError, match=match) as info:
        selected_columns(_schema(ddl))
    if "twice" not in match:
        assert all(name in str(info.value) for name in COLUMN_NAMES)


def test_an_empty_schema_is_refused():
    with pytest.raises(RmqReadSchemaError, match="has no column"):
        selected_columns(StructType([]))


@pytest.mark.parametrize("name, kind, ok", [
    ("queueOffset", "long", True), ("msgId", "string", True), ("properties", "map<string,string>", True),
    ("tags", "string", False), ("uniqKey", "string", False), ("keys", "array<string>", False),
])
def test_not_null_only_where_no_row_has_null(name, kind, ok):
    schema = StructType([T.StructField(name, TYPES[kind], nullable=False)])
    if ok:
        assert selected_columns(schema) == (name,)
    else:
        with pytest.raises(RmqReadSchemaError, match=f"declares column '{name}' NOT NULL"):
            selected_columns(schema)
