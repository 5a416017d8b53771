"""When a route names a RocketMQ 5 Proxy (rmq_source.remote.proxy): a Proxy's routes name itself,
the address the client was given as its NameServer, for every broker."""
from __future__ import annotations

import pytest

from rmq_source.remote.proxy import routes_through_proxy

NS = ("127.0.0.1:9876",)


@pytest.mark.parametrize("masters, proxied", [
    ({"broker-a": "127.0.0.1:10911", "broker-b": "127.0.0.1:10921"}, False),   # brokers
    ({"broker-a": "127.0.0.1:10911"}, False),
    ({"broker-a": NS[0]}, True),                                   # the NameServer address itself
    ({"broker-a": NS[0], "broker-b": NS[0]}, True),
    # an access address other than the one named (a load balancer): several brokers at one
    ({"broker-a": "10.0.0.5:8080", "broker-b": "10.0.0.5:8080"}, True),
    ({}, False),
])
def test_routes_through_proxy(masters, proxied):
    assert routes_through_proxy(NS, masters) is proxied


def test_pulls_go_one_at_a_time_to_a_proxy_or_an_address_that_dropped_an_answer():
    """Known Proxies get one pull at a time; an address that left a pipelined pull unanswered
    too, for UNPIPED_S (a broker that stalled gets its pipelining back); a refused connection
    teaches nothing."""
    from rmq_source.errors import RmqRemotingConnectionError, RmqRemotingTimeoutError
    from rmq_source.remote.backend import PULLS_IN_FLIGHT as AHEAD, ClusterBackendSpec
    backend = ClusterBackendSpec(NS, 1.0).open()
    broker, proxy = "127.0.0.1:10911", NS[0]
    backend._masters.update({"broker-a": broker, "broker-b": "127.0.0.1:10921"})
    assert AHEAD > 1 and backend._in_flight_to(broker) == AHEAD and backend._in_flight_to(proxy) == 1
    backend._unanswered(broker, AHEAD, RmqRemotingConnectionError("refused", peer=broker))
    backend._unanswered(broker, 1, RmqRemotingTimeoutError("no answer", peer=broker))
    assert backend._in_flight_to(broker) == AHEAD
    backend._unanswered(broker, AHEAD, RmqRemotingTimeoutError("no answer", peer=broker))
    assert backend._in_flight_to(broker) == 1
    backend._unpiped[broker] -= 301          # (UNPIPED_S later)
    assert backend._in_flight_to(broker) == AHEAD
