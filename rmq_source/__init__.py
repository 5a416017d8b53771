"""rmq_source: read Apache RocketMQ topics straight from broker store directories.

``Store`` reads a store, ``StoreWriter`` appends to one as a 4.9.3 broker does, and
``RocketMQDataSource`` is the PySpark data source ``format("rmq")`` (imported lazily so that the
store API works without pyspark installed).
"""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["Store", "StoreWriter", "RocketMQDataSource", "Subscription", "__version__"]

_LAZY = {
    "Store": ("rmq_source.store.reader", "Store"),
    "StoreWriter": ("rmq_source.store.writer", "StoreWriter"),
    "RocketMQDataSource": ("rmq_source.spark.datasource", "RocketMQDataSource"),
    "Subscription": ("rmq_source.subscription", "Subscription"),
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'rmq_source' has no attribute {name!r}")
