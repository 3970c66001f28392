"""One simulated request, from the client's send to its outcome."""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["Handler", "Request", "Status"]


class Status:
    """What the client got back (small ints: compared on the hot path)."""

    SUCCESS = 0
    """A 2xx from the model within the client's timeout."""
    REJECTED = 1
    """A 503 from the limiter (fast rejection)."""
    ORIGIN_REJECTED = 2
    """A 503 from the origin itself (its own queue was full)."""


class Handler(Protocol):
    """The server that has a request (a :class:`~loadshed.sim.server.Replica`): told when
    the request gets its token, is evicted from the queue, or its client leaves."""

    def granted(self, request: Request, token: Any) -> None:
        """The request got a token."""

    def evicted(self, request: Request) -> None:
        """The request was evicted from the queue."""

    def client_left(self, request: Request) -> None:
        """The client gave up on the request before its answer."""


class Request:
    """A request's state. Times are virtual seconds on the shared clock.

    ``sent_at`` is when the client sent it (latency is measured from there),
    ``timeout_at`` when the client gives up, ``deadline`` what the server was told
    (absolute, or None when the client sends no deadline).
    """

    __slots__ = (
        "arrived_at",
        "attempt",
        "avoid",
        "client_gone",
        "cost",
        "deadline",
        "done",
        "owner",
        "replica",
        "sent_at",
        "served",
        "size",
        "tag",
        "ticket",
        "timeout_at",
        "token",
    )

    def __init__(self, sent_at: float, timeout_at: float, owner: Any, tag: int) -> None:
        self.sent_at = sent_at
        self.timeout_at = timeout_at
        self.owner = owner
        """The client model that sent it: gets ``on_response`` / ``on_timeout``."""
        self.tag = tag
        """The owner's own number for it (closed-loop: the client's index)."""
        self.deadline: float | None = None
        self.arrived_at = 0.0
        self.replica: Handler | None = None
        """The replica that has the request (None before it arrives and after it leaves)."""
        self.token: Any = None
        self.ticket: Any = None
        self.served = False
        """The server has answered (a disconnect after that goes unnoticed)."""
        self.done = False
        """The client has its outcome (a response or its own timeout)."""
        self.client_gone = False
        self.attempt = 0
        self.avoid: Handler | None = None
        """A retry's previous replica, which a balancer passes over when it has another
        (HAProxy's ``option redispatch``): a replica that refused is likely to refuse
        again, and the fewest outstanding requests are the refusing replica's."""
        self.cost = 1.0
        """What the request costs (rows, tokens); 1 when the run has no costs."""
        self.size = 1.0
        """Its service-time multiplier (:meth:`CostDistribution.size`)."""

    def granted(self, token: Any) -> None:
        """Admission callback: a queued request got a token."""
        replica = self.replica
        assert replica is not None
        replica.granted(self, token)

    def rejected(self, error: Exception) -> None:
        """Admission callback: a queued request was evicted (queue timeout, deadline...)."""
        replica = self.replica
        assert replica is not None
        replica.evicted(self)
