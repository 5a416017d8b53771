"""How long requests wait for a broker that is away (``brokerOutageTimeoutMs``), without a broker:
each try of the request fails at once until it is told to answer."""
from __future__ import annotations

import pytest

from rmq_source.errors import RmqRemotingConnectionError
from rmq_source.remote.backend import ClusterBackend, ClusterBackendSpec


def _backend(outage_s: float) -> ClusterBackend:
    spec = ClusterBackendSpec(("127.0.0.1:1",), 1.0, retries=2, retry_backoff_s=0.01,
                              outage_s=outage_s)
    backend = ClusterBackend(spec)
    backend.broker_addr = lambda name: "127.0.0.1:2"    # (no NameServer asked)
    return backend


def _failing(times: int):
    calls = []

    def fn(addr):
        calls.append(addr)
        if len(calls) <= times:
            raise RmqRemotingConnectionError("refused")
        return "answer"
    return fn, calls


@pytest.mark.parametrize("ride_out, outage_s, fails, tries, error", [
    # planning: the retries only, then the broker is away and tried once a call
    (False, 30.0, 99, None, "gave up after 3 tries in"),
    # a task rides out a broker restart: tries beyond the retries while the outage lasts
    (True, 30.0, 6, 7, None),
    # and gives up once the broker has been away brokerOutageTimeoutMs
    (True, 0.3, 99, None, "brokerOutageTimeoutMs"),
    # 0: nothing beyond the retries
    (True, 0.0, 99, None, "gave up after 3 tries in"),
])
def test_a_task_waits_for_its_broker_up_to_the_outage_timeout(ride_out, outage_s, fails, tries, error):
    backend = _backend(outage_s)
    fn, calls = _failing(fails)
    if error is None:
        assert backend._call("broker-b", fn, ride_out=ride_out) == "answer"
        assert len(calls) == tries and backend.away_for("broker-b") is None
        return
    with pytest.raises(RmqRemotingConnectionError, match=error):
        backend._call("broker-b", fn, ride_out=ride_out)
    assert backend.away_for("broker-b") is not None
    if not ride_out:       # known away: the next call tries once, at once
        with pytest.raises(RmqRemotingConnectionError, match="gave up after 1 try"):
            backend._call("broker-b", fn)
