"""The package's exceptions.

Every error raised on purpose by rmq_source derives from :class:`RmqSourceError` and also from the
builtin exception that matches its nature, so callers can catch either.
"""
from __future__ import annotations


class RmqSourceError(Exception):
    """Base class of every error rmq_source raises on purpose."""


class RmqOptionError(RmqSourceError, ValueError):
    """An option (data source option, CLI flag or API argument) has a missing or invalid value."""


class RmqStoreLayoutError(RmqSourceError, FileNotFoundError):
    """A store directory, topic or queue folder is missing or not laid out as a broker lays it out."""


class RmqStoreIOError(RmqSourceError, OSError):
    """A store file exists but cannot be opened, inspected or mapped (permissions, I/O error)."""


class RmqUnknownTopicError(RmqSourceError, LookupError):
    """A topic or queue that the caller named does not exist in the store."""


class RmqCorruptStoreError(RmqSourceError, ValueError):
    """A record or ConsumeQueue unit that cannot be what the broker wrote.

    ``path`` is the file, ``position`` the byte position inside that file, ``code`` the C core's
    error code name (for example ``"BAD_MAGIC"``).
    """

    def __init__(self, message: str, *, path: str | None = None, position: int | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.path = path
        self.position = position
        self.code = code


class RmqDataLossError(RmqSourceError, RuntimeError):
    """Messages still needed were deleted by retention (raised when failOnDataLoss=true)."""


class RmqMissingDependencyError(RmqSourceError, ImportError):
    """An optional Python package (lz4, zstandard, pyspark) is needed for this operation."""


class RmqSparkVersionError(RmqMissingDependencyError):
    """The installed PySpark cannot run the data source (none, or older than 4.0); the message
    names the version found and the one needed."""


class RmqConfigFileError(RmqSourceError, ValueError):
    """A JSON config file (consumerOffset.json, topics.json, ...) cannot be parsed, nor its .bak."""


class RmqOffsetStoreError(RmqSourceError, OSError):
    """The consumer-group offset store could not be read or written."""


class RmqAllocationError(RmqSourceError, RuntimeError):
    """A queue-allocation strategy failed or returned something that is not an allocation."""


class RmqLockError(RmqSourceError, RuntimeError):
    """A queue lock needed for ordered consumption is not held (or was lost)."""


class RmqRemotingError(RmqSourceError, OSError):
    """A request over RocketMQ's remoting protocol failed.

    ``peer`` is the server address (``host:port``), ``request`` a short description of the request
    (its code name and main fields), both also in the message; ``reason`` is the message without
    them (for an error that names them once, around it).
    """

    def __init__(self, message: str, *, peer: str | None = None, request: str | None = None):
        self.reason = message
        self.peer = peer
        self.request = request
        #: who ``peer`` is, when the caller knows (a broker's name and role: ``broker-a master``)
        self.peer_role: str | None = None
        super().__init__(self._text())

    def _text(self) -> str:
        parts = [self.reason]
        if self.request:
            parts.append(f"request: {self.request}")
        if self.peer:
            parts.append(f"peer: {self.peer}" + (f" ({self.peer_role})" if self.peer_role else ""))
        return "; ".join(parts)

    def name_peer(self, role: str | None) -> None:
        """Say who the peer is (``broker-a master``, ``broker-a slave 1``) in the message."""
        if role and self.peer:
            self.peer_role = role
            self.args = (self._text(),) + self.args[1:]


class RmqRemotingTimeoutError(RmqRemotingError, TimeoutError):
    """No answer (or no connection) within the call's timeout."""


class RmqRemotingConnectionError(RmqRemotingError, ConnectionError):
    """The connection could not be made, was closed, or ended in the middle of a frame."""


class RmqBrokerUnavailableError(RmqRemotingConnectionError):
    """A broker serving queues of the query stayed unreachable (or without a master) after the
    request retries; the message names it, its queues and what ``failOnDataLoss`` would do."""


class RmqMasterAwayError(RmqBrokerUnavailableError):
    """A broker's master is away and its slave answered what only the master may decide (that
    messages are not there, where a queue ends: RocketMQ's slaves do not check offsets), or
    refused what a master would take: not an answer yet. The message names the slave."""


class RmqRemotingProtocolError(RmqRemotingError):
    """The peer sent bytes that are not a valid remoting frame (size limit, header, serialize type)."""


class RmqBrokerError(RmqRemotingError):
    """The server answered with an error code; ``code`` is the number, ``remark`` the server's text."""

    def __init__(self, message: str, *, code: int, remark: str | None = None, peer: str | None = None,
                 request: str | None = None):
        super().__init__(message, peer=peer, request=request)
        self.code = code
        self.remark = remark


class RmqAuthError(RmqBrokerError, PermissionError):
    """The server refused the request's ACL credentials (unknown access key, wrong signature) or
    the account has no permission for the topic, group or request."""


class RmqReadSchemaError(RmqSourceError, ValueError):
    """The schema given to a read (``.schema(...)``, ``CREATE TABLE ... USING rmq (cols)``) names
    a column the source does not have, gives a documented column another type, or names one
    twice (named in the message, with the valid columns). Raised at query start."""


class RmqSinkSchemaError(RmqSourceError, ValueError):
    """The DataFrame written with ``format("rmq")`` has a column the sink does not know, lacks
    ``body``, or has a column whose type does not fit (named in the message). Raised at query
    start, before anything is sent."""


class RmqSinkRowError(RmqSourceError, ValueError):
    """A row cannot become a RocketMQ message (null body, bad property name, too large, a queue
    the topic does not have ...). The message names the row by task partition and row index;
    nothing of the failing send was acknowledged."""


class RmqSendError(RmqSourceError, RuntimeError):
    """A send was refused or not confirmed after every retry. ``code`` is the broker's answer
    code (None when no broker answered), ``broker`` the broker name; the message names the rows,
    the queue and what to do."""

    def __init__(self, message: str, *, code: int | None = None, broker: str | None = None):
        super().__init__(message)
        self.code = code
        self.broker = broker
