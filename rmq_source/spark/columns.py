"""The columns a read produces: all documented ones (rmq_source/schema.py), or those of a schema
the user gives (``spark.read.format("rmq").schema("queueOffset long, body binary")``, the SQL
API's ``CREATE TEMPORARY VIEW v (cols) USING rmq``): any subset of the documented columns, in any order,
each with its documented type (nullability aside). PySpark's Python sources cannot prune columns
by themselves; a user schema is how a query says which it needs, and the columns nobody asked for
are never handed to Spark (their transport costs most for small messages), and the C core
leaves the string columns nobody uses out of its rows (rmq_source.store.native.skip_bits).

What the columns do not change: which messages are read, offsets, group progress, ordering,
filters (tags, SQL92 and pushed filters see every column) and data-loss accounting.
"""
from __future__ import annotations

import difflib
import functools

from pyspark.sql.types import StructType

from rmq_source.errors import RmqReadSchemaError
from rmq_source.schema import ARROW_SCHEMA, COLUMN_NAMES

#: the columns a row may have null in (a message without UNIQ_KEY, TAGS or KEYS); a schema may
#: declare the others NOT NULL, never these (Spark would trust it and drop its null checks)
NULLABLE = ("uniqKey", "tags", "keys")


@functools.cache
def _documented() -> dict[str, str]:
    from pyspark.sql.pandas.types import from_arrow_schema     # (no JVM: runs in Python workers)
    return {f.name: f.dataType.simpleString() for f in from_arrow_schema(ARROW_SCHEMA)}


def selected_columns(schema: StructType | None) -> tuple[str, ...] | None:
    """The columns ``schema`` asks for, in its order; None when it asks for every documented
    column in the documented order (or there is no schema): the batches go as read."""
    if schema is None:
        return None
    names = tuple(schema.fieldNames())
    if not names:
        raise RmqReadSchemaError(f"the schema given to the rmq source has no column; name some of "
                                 f"{', '.join(COLUMN_NAMES)}")
    documented = _documented()
    seen = set()
    for field in schema.fields:
        name, have = field.name, field.dataType.simpleString()
        if name not in documented:
            close = difflib.get_close_matches(name, COLUMN_NAMES, n=1) or [
                c for c in COLUMN_NAMES if c.lower() == name.lower()]
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise RmqReadSchemaError(
                f"the schema given to the rmq source has column {name!r}, which it does not "
                f"produce{hint}; its columns: {_listing(documented)}")
        if have != documented[name]:
            raise RmqReadSchemaError(
                f"the schema given to the rmq source has column {name!r} of type {have}; the "
                f"source produces it as {documented[name]} (its columns: {_listing(documented)})")
        if name in seen:
            raise RmqReadSchemaError(f"the schema given to the rmq source names column {name!r} "
                                     "twice")
        if not field.nullable and name in NULLABLE:
            raise RmqReadSchemaError(
                f"the schema given to the rmq source declares column {name!r} NOT NULL, but a "
                f"message without it has null there (columns that may be null: "
                f"{', '.join(NULLABLE)}); drop NOT NULL")
        seen.add(name)
    return None if names == COLUMN_NAMES else names


def _listing(documented: dict[str, str]) -> str:
    return ", ".join(f"{name} {kind}" for name, kind in documented.items())
