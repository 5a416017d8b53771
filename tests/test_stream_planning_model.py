"""Model-based test of the streaming reader's planning (issue 8), driven directly (no Spark) on
real stores written by our writer.

Hypothesis draws a topic (queues, backlogs, idle queues), a limit option set and a trigger, and a
run of actions: appends, retention cuts, time passing, and planned batches. Every batch is planned
with ``latestOffset`` and turned into tasks with ``partitions``, whose rows are read. A model
accounts, per queue, for each offset from the start: read by one batch, or reported lost once.

Each planned batch must
* read each offset at most once, and report each lost offset exactly once, in offset order
  (reads and losses tile each queue without gap or overlap);
* make progress (read or skip something) or plan nothing for a stated reason: nothing to read,
  or fewer than ``minMessagesPerTrigger`` before ``maxTriggerDelay`` (never under AvailableNow);
* keep within ``maxMessagesPerTrigger`` and ``maxBytesPerTrigger`` (one message over a byte
  budget only when that single message is larger than it).
At the end, a drain reads up to the queues' max offsets (the AvailableNow target).
"""
from __future__ import annotations

import logging
import random
import tempfile
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, event, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from rmq_source.spark.offsets import from_json_dict  # noqa: E402
from rmq_source.spark.options import parse_options  # noqa: E402
from rmq_source.store.reader import Store  # noqa: E402
from rmq_source.spark.stream_reader import RmqStreamReader  # noqa: E402
from rmq_source.store.writer import StoreWriter  # noqa: E402

TOPIC = "M"
DELAY_S = 3600

LIMITS = st.sampled_from([
    {},
    {"maxMessagesPerTrigger": "1"},
    {"maxMessagesPerTrigger": "7"},
    {"maxBytesPerTrigger": "300"},      # below most messages: one message at a time
    {"maxBytesPerTrigger": "1500"},
    {"maxMessagesPerTrigger": "5", "maxBytesPerTrigger": "2000"},
    {"minMessagesPerTrigger": "6", "maxTriggerDelay": "1h"},
    {"minMessagesPerTrigger": "4", "maxTriggerDelay": "1h", "maxBytesPerTrigger": "1200"},
])

ACTIONS = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(0, 3), st.integers(1, 25)),
    st.tuples(st.just("retention"), st.integers(1, 3)),
    st.tuples(st.just("tick")),
    st.tuples(st.just("plan")),
), max_size=14)


class _Losses(logging.Handler):
    """Collects the lost ranges the reader reports (``record.rmq_lost``)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.reports = []

    def emit(self, record):
        if hasattr(record, "rmq_lost"):
            self.reports.append(record.rmq_lost)

    def take(self):
        out, self.reports = self.reports, []
        return out


class Model:
    def __init__(self, root: Path, queues: int, options: dict, available_now: bool, seed: int):
        self.root, self.queues, self.options = root, queues, options
        self.rng = random.Random(seed)
        opts = parse_options({"storePath": str(root), "topic": TOPIC, "startingOffsets": "earliest",
                              "failOnDataLoss": "false", **options}, streaming=True)
        self.reader = RmqStreamReader(opts)
        self.available_now = available_now
        self.delay_passed = False
        self.start = None
        self.accounted: dict = {}    # queue -> every offset below is read or reported lost
        self.losses = _Losses()

    # -- the world -------------------------------------------------------------------------------
    def append(self, queue: int, count: int) -> None:
        with StoreWriter(self.root) as w:
            for _ in range(count):
                body = self.rng.randbytes(self.rng.randrange(0, 300))
                w.append(TOPIC, body, queue_id=queue % self.queues)

    def retention(self, files: int) -> None:
        with StoreWriter(self.root) as w:
            w.delete_oldest_commitlog_files(files)

    def infos(self):
        with Store(self.root) as s:
            return {q.queue_id: q for q in s.queue_infos(TOPIC, range(self.queues))}

    # -- the reader ------------------------------------------------------------------------------
    def begin(self) -> None:
        self.start = self.reader.initialOffset()
        self.accounted = {mq: o for mq, o in from_json_dict(self.start).items()}
        if self.available_now:
            self.reader.prepareForTriggerAvailableNow()
            self.target = dict(self.reader._target)

    def plan(self) -> None:
        """Plan, check and run one batch."""
        r = self.reader
        infos = self.infos()
        limit = r.getDefaultReadLimit()
        end = r.latestOffset(self.start, limit)
        starts, ends = from_json_dict(self.start), from_json_dict(end)
        read = {}
        if end != self.start:
            for part in r.partitions(self.start, end):
                got: dict[int, list[int]] = {}
                for batch in r.read(part):  # the task's rows: exactly its ranges' offsets
                    for q, o in zip(batch.column("queueId").to_pylist(),
                                    batch.column("queueOffset").to_pylist()):
                        got.setdefault(q, []).append(o)
                for rg in part.ranges:
                    mq = next(m for m in ends if m.queue_id == rg.queue_id)
                    assert mq not in read, f"{mq} in two tasks"
                    read[mq] = (rg.start, rg.end)
                    assert got.pop(rg.queue_id, []) == list(range(rg.start, rg.end)), rg
                assert not got
        for mq, lo, hi in self.losses.take():
            assert lo == self.accounted[mq], \
                f"{mq}: loss [{lo}, {hi}) reported, accounted to {self.accounted[mq]}"
            assert hi > lo
            self.accounted[mq] = hi
            event("a lost range was skipped")
        for mq, (lo, hi) in read.items():
            assert lo == self.accounted[mq], \
                f"{mq}: reads [{lo}, {hi}), accounted to {self.accounted[mq]}"
            self.accounted[mq] = hi
        assert all(self.accounted[mq] == ends[mq] for mq in ends), (self.accounted, ends)
        n_read = sum(hi - lo for lo, hi in read.values())
        if end == self.start:
            self._check_wait(infos, starts)
        else:
            assert n_read > 0 or any(ends[mq] != starts[mq] for mq in ends)
            self._check_limits(read, n_read)
            if n_read:
                self.delay_passed = False
        self.start = end

    def _backlog(self, infos, starts) -> int:
        total = 0
        for mq, o in starts.items():
            info = infos[mq.queue_id]
            latest = info.max_offset
            if self.available_now:
                latest = min(latest, self.target.get(mq, 0))
            total += max(0, latest - max(o, info.min_offset))
        return total

    def _check_wait(self, infos, starts) -> None:
        backlog = self._backlog(infos, starts)
        if backlog == 0:
            event("waits: nothing to read")
            return
        minimum = int(self.options.get("minMessagesPerTrigger", 0))
        assert minimum and not self.available_now and not self.delay_passed and backlog < minimum, \
            (f"planned nothing with {backlog} messages to read ({self.options}, "
             f"AvailableNow={self.available_now})")
        event("waits: fewer than minMessagesPerTrigger")

    def _check_limits(self, read, n_read) -> None:
        o = self.options
        if "maxMessagesPerTrigger" in o:
            assert n_read <= int(o["maxMessagesPerTrigger"])
        if "maxBytesPerTrigger" in o:
            with Store(self.root) as s:
                used = sum(s.range_bytes(TOPIC, mq.queue_id, lo, hi)
                           for mq, (lo, hi) in read.items())
            assert used <= int(o["maxBytesPerTrigger"]) or n_read == 1, (used, n_read)
        if "minMessagesPerTrigger" in o and not self.available_now and not self.delay_passed:
            # the minimum decides whether a batch runs; the max limits still cap what it reads
            floor = int(o["minMessagesPerTrigger"])
            if "maxMessagesPerTrigger" in o:
                floor = min(floor, int(o["maxMessagesPerTrigger"]))
            if "maxBytesPerTrigger" in o:
                floor = 1
            assert n_read == 0 or n_read >= floor, (n_read, floor)

    def tick(self) -> None:
        self.reader._last_batch_at -= DELAY_S + 1
        self.delay_passed = True

    def drain(self) -> None:
        for _ in range(2000):
            self.tick()
            start = self.start
            self.plan()
            if self.start == start:
                break
        else:
            raise AssertionError("the drain does not end")
        infos = self.infos()
        for mq, o in self.accounted.items():
            info = infos[mq.queue_id]
            want = min(info.max_offset, self.target[mq]) if self.available_now else info.max_offset
            assert o == max(want, info.min_offset), (mq, o, info, self.options)


MIN6 = {"minMessagesPerTrigger": "6", "maxTriggerDelay": "1h"}


@example(queues=1, backlogs=[3, 0, 0], options=MIN6, available_now=False,   # waits, then the delay
         actions=[("plan",), ("append", 0, 2), ("plan",), ("tick",), ("plan",)], seed=1)
# AvailableNow never waits
@example(queues=1, backlogs=[3, 0, 0], options=MIN6, available_now=True,
         actions=[("plan",)], seed=2)
@example(queues=2, backlogs=[30, 5, 0], options={"maxMessagesPerTrigger": "5"}, available_now=False,
         actions=[("plan",), ("append", 0, 60), ("retention", 2), ("plan",), ("plan",)], seed=3)
@example(queues=3, backlogs=[20, 0, 0], options={"maxBytesPerTrigger": "1500"}, available_now=True,
         actions=[("append", 1, 40), ("retention", 3), ("plan",)], seed=4)
# the minimum is reached, the byte limit caps the batch below it (found by hypothesis)
@example(queues=1, backlogs=[4, 0, 0], options={"minMessagesPerTrigger": "4", "maxTriggerDelay": "1h",
                                                "maxBytesPerTrigger": "1200"},
         available_now=False, actions=[("plan",)], seed=0)
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(queues=st.integers(1, 3), backlogs=st.lists(st.integers(0, 30), min_size=3, max_size=3),
       options=LIMITS, available_now=st.booleans(), actions=ACTIONS, seed=st.integers(0, 2**16))
def test_planning_model(queues, backlogs, options, available_now, actions, seed):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "store"
        with StoreWriter(root, commitlog_file_size=4096, cq_units_per_file=8) as w:
            w.create_topic(TOPIC, queues)
        model = Model(root, queues, options, available_now, seed)
        for q in range(queues):
            if backlogs[q]:
                model.append(q, backlogs[q])
        log = logging.getLogger("rmq_source")
        log.addHandler(model.losses)
        try:
            model.begin()
            for action in actions:
                if action[0] == "append":
                    model.append(action[1], action[2])
                elif action[0] == "retention":
                    model.retention(action[1])
                elif action[0] == "tick":
                    model.tick()
                else:
                    model.plan()
            model.drain()
        finally:
            log.removeHandler(model.losses)
