"""RocketMQ's remoting protocol (the TCP protocol of its Java and Go clients).

:mod:`.frames` encodes and decodes frames, :mod:`.client` holds connections with opaque-matched
answers and per-call timeouts, :mod:`.requests` has typed helpers for the requests rmq_source needs.
"""
from rmq_source.remote.client import Connection, RemotingClient
from rmq_source.remote.frames import RemotingCommand

__all__ = ["Connection", "RemotingClient", "RemotingCommand"]
