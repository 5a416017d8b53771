"""Pieces shared by the batch and streaming readers: the query's backend, queues, strategy and
group store."""
from __future__ import annotations

from rmq_source.backend import Backend
from rmq_source.group.allocation import MessageQueue, create_strategy


def open_backend(opts) -> Backend:
    """The backend the options name: the live cluster of ``namesrvAddr``, else the store folders
    of ``storePath``/``brokers``. The only place on the Spark side that knows the kinds."""
    if opts.namesrv_addrs:
        from rmq_source.remote.backend import ClusterBackendSpec
        from rmq_source.remote.backend import PULL_GROUP
        from rmq_source.namespace import wrap
        backend = ClusterBackendSpec(opts.namesrv_addrs, opts.request_timeout_ms / 1000.0,
                                     credentials=opts.credentials, tls=opts.tls,
                                     pull_group=opts.consumer_group or wrap(opts.namespace, PULL_GROUP),
                                     retries=opts.request_retries,
                                     retry_backoff_s=opts.retry_backoff_ms / 1000.0,
                                     outage_s=opts.broker_outage_ms / 1000.0,
                                     pull_batch=opts.pull_batch).open()
        if opts.trace_topic is not None:
            _check_trace_topic(backend, opts.trace_topic)
        return backend
    from rmq_source.store.backend import StoreBackend
    return StoreBackend(opts.brokers, opts.offset_store_path)


def _check_trace_topic(backend, topic: str) -> None:
    """enableMsgTrace: the trace topic must have a route (checked once, when the query starts)."""
    from rmq_source.errors import RmqOptionError, RmqUnknownTopicError
    try:
        route = backend.route(topic)
    except RmqUnknownTopicError as exc:
        raise RmqOptionError(
            f"option enableMsgTrace=true: the trace topic {topic!r} (option customizedTraceTopic) "
            f"does not exist in {backend.where()}; create it, or start the brokers with "
            "traceTopicEnable=true (which creates RMQ_SYS_TRACE_TOPIC)") from exc
    if not route.write_queues():
        raise RmqOptionError(f"option enableMsgTrace=true: the trace topic {topic!r} has no "
                             "writable queue")


def discover_queues(backend: Backend, opts) -> list[MessageQueue]:
    """The queues the query reads now, from exactly one of topic / topicPattern / assign."""
    if opts.assign is not None:
        return backend.queues_for_assign(opts.assign)
    if opts.topic_pattern is not None:
        return backend.queues_for_pattern(opts.topic_pattern)
    return backend.queues_for_topics(opts.topics)


def strategy_of(opts):
    """The allocation strategy named by ``allocateStrategy`` with its parameter options. A
    built-in strategy (a pure function of these options) is the same object for the same
    options, so the planner's memoized allocations (keyed by strategy) serve every batch plan."""
    if ":" in opts.allocate_strategy or ":" in (opts.nearby_inner_strategy or ""):
        return _new_strategy(opts)      # a user's class: a new instance every time, as before
    key = (opts.allocate_strategy, opts.allocate_queues, opts.consume_rooms,
           opts.nearby_inner_strategy, opts.virtual_node_count)
    strategy = _BUILT_IN_STRATEGIES.get(key)
    if strategy is None:
        strategy = _new_strategy(opts)
        if len(_BUILT_IN_STRATEGIES) >= 64:
            _BUILT_IN_STRATEGIES.clear()
        _BUILT_IN_STRATEGIES[key] = strategy
    return strategy


_BUILT_IN_STRATEGIES: dict[tuple, object] = {}


def _new_strategy(opts):
    params = {}
    if opts.allocate_queues is not None:
        params["message_queues"] = list(opts.allocate_queues)
    if opts.consume_rooms is not None:
        params["consume_rooms"] = set(opts.consume_rooms)
    if opts.nearby_inner_strategy is not None:
        inner_params = {}
        if opts.virtual_node_count is not None and opts.nearby_inner_strategy.upper() == "CONSISTENT_HASH":
            inner_params["virtual_node_count"] = opts.virtual_node_count
        params["inner"] = create_strategy(opts.nearby_inner_strategy, **inner_params)
    elif opts.virtual_node_count is not None:
        params["virtual_node_count"] = opts.virtual_node_count
    return create_strategy(opts.allocate_strategy, **params)


def open_group_store(opts, backend: Backend):
    """The consumer group's offset store, or None when no ``consumerGroup`` is given."""
    if not opts.consumer_group:
        return None
    return backend.offset_store(opts.consumer_group)
