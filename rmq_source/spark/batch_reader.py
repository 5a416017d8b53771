"""Planning of a batch read (``spark.read.format("rmq")``): one range per queue, start to end,
narrowed by the filters Spark pushed (:mod:`.pushdown`)."""
from __future__ import annotations

from dataclasses import replace

from rmq_source.namespace import unwrap
from rmq_source.spark.partition_reader import RmqInputPartition, build_partitions
from rmq_source.spark.pushdown import Pushed, tag_codes_reliable
from rmq_source.spark.planner import QueueRange, plan_tasks
from rmq_source.spark.sizing import task_sizing
from rmq_source.spark.positions import check_data_loss, ending_offsets, starting_offsets
from rmq_source.spark.query import discover_queues, open_backend, open_group_store, strategy_of


def plan_batch(opts, pushed: Pushed | None = None) -> list[RmqInputPartition]:
    """Input partitions of a batch read; queues with nothing between start and end make no task.

    The starting position must not lie below a queue's min offset (``failOnDataLoss``); an end
    below the start reads nothing from that queue. ``pushed`` leaves out queues, clamps ranges and
    reads only the pushed tags.
    """
    from rmq_source.store.backend import StoreBackend
    from rmq_source.subscription import Subscription
    pushed = pushed or Pushed()
    if pushed.tags is not None and not pushed.tags:
        return []                           # tags = 'A' AND tags = 'B'
    backend = open_backend(opts)
    # positions of every queue first: offsets JSON must name them all, and a queue left out by a
    # filter is checked for data loss as without pushdown
    mqs = discover_queues(backend, opts)
    infos = backend.infos(mqs)      # one snapshot for the starts, the ends and the checks
    backend.check_subscription(opts.subscription, mqs)
    starts = starting_offsets(backend, mqs, opts, open_group_store(opts, backend), infos)
    ends = ending_offsets(backend, mqs, opts, infos)
    # the timestamp search answers the first message at or after a time only in the store mode
    # (a 4.9 broker answers the nearest one)
    by_time = isinstance(backend, StoreBackend)
    ranges = []
    for mq in mqs:
        start = check_data_loss(mq, starts[mq], infos[mq], opts.fail_on_data_loss)
        if not pushed.keeps_queue(mq, unwrap(opts.namespace, mq.topic)):
            continue
        end = max(start, min(ends[mq], infos[mq].max_offset))
        if by_time and pushed.ts_lo_ms is not None and pushed.ts_lo_ms > 0 and start < end:
            start = max(start, backend.offset_for_timestamp(mq, pushed.ts_lo_ms))
        if by_time and pushed.ts_hi_ms is not None and start < end:
            end = min(end, backend.offset_for_timestamp(mq, max(0, pushed.ts_hi_ms)))
        ranges.append(QueueRange(mq, *pushed.clamp(start, max(start, end))))
    exact_tags = None
    if pushed.tags is not None:
        if all(tag_codes_reliable(r.mq.topic) for r in ranges):
            opts = replace(opts, subscription=Subscription.parse(" || ".join(sorted(pushed.tags))))
        else:                               # e.g. delay messages: the rows' TAGS are checked
            exact_tags = tuple(sorted(pushed.tags))
    tasks = plan_tasks(ranges, strategy_of(opts), opts.consumer_group or "", opts.num_partitions,
                       opts.orderly, opts.min_partitions, opts.client_id,
                       task_sizing(opts, backend, ranges))
    return build_partitions(tasks, opts, backend, exact_tags=exact_tags)
