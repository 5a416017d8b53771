"""The writer's topics: ``config/topics.json`` read and written as the broker keeps it, topics
created or adopted from queue folders, and the per-topic state append's fast path uses."""
from __future__ import annotations

from dataclasses import dataclass, field

from rmq_source.errors import RmqOptionError, RmqStoreLayoutError
from rmq_source.store import record_codec as rc
from rmq_source.store.config_files import dump_fastjson, load_config_json, write_config_atomic
from rmq_source.store.write_args import int_arg, validate_topic

MAX_QUEUES = 65535
PERM_WRITE = 2


@dataclass
class TopicState:
    name: str
    raw: bytes
    read_queues: int
    write_queues: int
    perm: int
    order: bool
    extra: dict          # fields of an existing topics.json entry we do not manage
    round_robin: int = 0
    sized_from_folders: bool = False   # no topics.json entry: queue count taken from the folders
    queue_list: list = field(default_factory=list)   # queue id -> QueueState (or None), for speed

    def __post_init__(self) -> None:
        v2 = len(self.raw) > rc.V1_MAX_TOPIC_LENGTH
        self.magic = rc.MAGIC_V2 if v2 else rc.MAGIC_V1
        self.magic_bytes = self.magic.to_bytes(4, "big", signed=True)
        self.len_bytes = len(self.raw).to_bytes(2 if v2 else 1, "big")
        self.topic_part = self.len_bytes + self.raw              # TOPICLENGTH field + topic
        self.len_part = len(self.topic_part)



class TopicTable:
    """Part of :class:`~rmq_source.store.writer.StoreWriter`: its topics and topics.json."""

    # ------------------------------------------------------------------------------------ topics

    def _load_topics(self) -> None:
        data = load_config_json(self.root / "config" / "topics.json")
        if data is None:
            self._data_version = {"counter": 0, "timestamp": rc.now_ms()}
            if set(self.broker_name) <= rc.TOPIC_CHARS:
                # the broker creates a topic named after itself (1 queue, perm 7); a hint for readers
                self._adopt_topic(self.broker_name, {"readQueueNums": 1, "writeQueueNums": 1,
                                                     "perm": 7})
            return
        if not isinstance(data, dict) or not isinstance(data.get("topicConfigTable", {}), dict):
            raise RmqStoreLayoutError(f"{self.root}/config/topics.json: no topicConfigTable object")
        dv = data.get("dataVersion")
        self._data_version = dict(dv) if isinstance(dv, dict) else {"counter": 0}
        for name, cfg in data.get("topicConfigTable", {}).items():
            if not isinstance(cfg, dict):
                raise RmqStoreLayoutError(f"{self.root}/config/topics.json: entry {name!r} is not an "
                                          "object")
            if isinstance(name, str) and name and set(name) <= rc.TOPIC_CHARS:
                self._adopt_topic(name, cfg)
            else:
                self._other_topics[name] = cfg

    def _adopt_topic(self, name: str, cfg: dict) -> TopicState:
        def num(key: str, default: int) -> int:
            value = cfg.get(key, default)
            return value if isinstance(value, int) and not isinstance(value, bool) else default
        managed = {"topicName", "readQueueNums", "writeQueueNums", "perm", "order"}
        topic = TopicState(name, name.encode("ascii"), num("readQueueNums", 16), num("writeQueueNums", 16),
                       num("perm", 6), bool(cfg.get("order", False)),
                       {k: v for k, v in cfg.items() if k not in managed})
        self._topics[name] = topic
        self._other_topics.pop(name, None)
        self._refresh_fast_topics()
        return topic

    def _topic_json(self, name: str, read: int, write: int, perm: int, order: bool,
                    extra: dict) -> dict:
        cfg = {"order": order, "perm": perm, "readQueueNums": read,
               "topicFilterType": extra.get("topicFilterType", "SINGLE_TAG"), "topicName": name,
               "topicSysFlag": extra.get("topicSysFlag", 0), "writeQueueNums": write}
        if self.properties_style == "5.3.3" or "attributes" in extra:
            cfg["attributes"] = extra.get("attributes", {})
        for key, value in extra.items():
            cfg.setdefault(key, value)
        return dict(sorted(cfg.items()))

    def _write_topics(self) -> None:
        table = dict(self._other_topics)
        for t in self._topics.values():
            table[t.name] = self._topic_json(t.name, t.read_queues, t.write_queues, t.perm, t.order,
                                             t.extra)
        dv = dict(self._data_version)
        dv["counter"] = int(dv.get("counter", 0)) + 1 if isinstance(dv.get("counter", 0), int) else 1
        dv["timestamp"] = rc.now_ms()
        if self.properties_style == "5.3.3":
            dv.setdefault("stateVersion", 0)
        self._data_version = dv
        write_config_atomic(self.root / "config" / "topics.json",
                            dump_fastjson({"dataVersion": dv, "topicConfigTable": table}))
        self._topics_dirty = False

    def create_topic(self, topic: str, queues: int, *, order: bool = False, perm: int = 6,
                     read_queues: int | None = None) -> None:
        """Create or update a topic with ``queues`` write queues (read queues default to the same).

        ``perm`` is the broker's permission bits (``PERM_READ`` 4, ``PERM_WRITE`` 2, ...). The topic
        is saved to ``config/topics.json`` at once (atomically). Queue folders appear with the first
        message of each queue, as with the broker.
        """
        raw = validate_topic(topic)
        int_arg("queues", queues, 1, MAX_QUEUES)
        read = queues if read_queues is None else int_arg("read_queues", read_queues, 1, MAX_QUEUES)
        int_arg("perm", perm, 0, 15)
        if not isinstance(order, bool):
            raise RmqOptionError(f"order must be a bool, got {order!r}")
        self._check_open()
        existing = self._topics.get(topic)
        if existing is None:
            extra = self._other_topics.pop(topic, {})
            extra = {k: v for k, v in extra.items()
                     if k not in ("topicName", "readQueueNums", "writeQueueNums", "perm", "order")}
            self._topics[topic] = TopicState(topic, raw, read, queues, perm, order, extra)
        else:
            existing.read_queues, existing.write_queues = read, queues
            existing.perm, existing.order = perm, order
        self._refresh_fast_topics()
        self._write_topics()

    def _refresh_fast_topics(self) -> None:
        """Topics append's fast path may write to: writable (PERM_WRITE) with write queues."""
        self._fast_topics = {name: t for name, t in self._topics.items()
                             if t.perm & PERM_WRITE and t.write_queues > 0}

    def topics(self) -> dict[str, int]:
        """Topics this writer can append to, with their number of write queues."""
        return {name: t.write_queues for name, t in self._topics.items()}
