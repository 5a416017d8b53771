"""What a client must know of RocketMQ 5 Proxies (their remoting port named as ``namesrvAddr``).

A Proxy writes a forwarded answer only while the client's connection is writable: with more
than Netty's high-water mark (64 KiB by default) of answers not yet taken by the client, it
drops the answer silently and the request is never answered (docs/remoting.md, "Through a
RocketMQ 5 Proxy"). So what goes ahead on one connection to a Proxy is bounded by what its
answers may weigh: pulls one at a time, sends at most :data:`SENDS_IN_FLIGHT`, per-queue offset
questions in windows (:data:`rmq_source.remote.requests.OFFSETS_WINDOW`).
"""
from __future__ import annotations

from typing import Iterable, Mapping

#: sends in flight on a connection to a Proxy: their answers (about 350 bytes each) stay
#: well under the 64 KiB it leaves unsent
SENDS_IN_FLIGHT = 64


def is_proxy_addr(addr: str, namesrv_addrs: Iterable[str], masters: Mapping[str, str]) -> bool:
    """Whether ``addr``, routed as the master of brokers in ``masters`` (broker name ->
    address), is a Proxy: a NameServer address routed as a broker (a Proxy's routes name
    itself), or the one address of several brokers (no two brokers share one)."""
    return addr in set(namesrv_addrs) or sum(a == addr for a in masters.values()) > 1


def routes_through_proxy(namesrv_addrs: Iterable[str], masters: Mapping[str, str]) -> bool:
    """Whether a route's ``masters`` (broker name -> address) are a Proxy
    (:func:`is_proxy_addr` of any of them)."""
    namesrv_addrs = tuple(namesrv_addrs)
    return any(is_proxy_addr(a, namesrv_addrs, masters) for a in set(masters.values()))
