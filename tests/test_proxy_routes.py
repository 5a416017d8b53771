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
