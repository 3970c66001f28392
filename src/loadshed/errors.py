"""Exceptions and the small vocabularies (reasons, outcomes, priorities) shared by
every layer."""

from __future__ import annotations

import enum

__all__ = [
    "REFUSAL_STATUSES",
    "ConfigError",
    "LoadshedError",
    "Outcome",
    "Priority",
    "RejectReason",
    "Rejected",
]


REFUSAL_STATUSES = frozenset({429, 503})
"""The HTTP statuses of a refusal by load shedding (503 by default, or 429): the server
refused the request without doing it. The middleware and the proxy answer with one; the
client, the proxy and the load generator read one as "refused", safe to retry."""


class LoadshedError(Exception):
    """Base class of loadshed's exceptions."""


class ConfigError(LoadshedError, ValueError):
    """Invalid configuration. The message names the field and the allowed values."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class RejectReason(str, enum.Enum):
    """Why the limiter refused or evicted a request."""

    LIMIT = "limit"
    """The queue was full."""
    DEADLINE = "deadline"
    """The estimated wait plus service time exceeds the request's deadline."""
    QUEUE_TIMEOUT = "queue_timeout"
    """The request waited in the queue longer than allowed."""
    PRIORITY = "priority"
    """Shed to make room for more important work."""
    CLIENT_GONE = "client_gone"
    """The client disconnected or gave up while the request was queued."""
    SHUTDOWN = "shutdown"
    """The server is shutting down: queued and new requests are answered at once."""

    def __str__(self) -> str:
        return self.value


class Rejected(LoadshedError):
    """Admission refused. ``retry_after`` (seconds) is a hint for the client."""

    def __init__(self, reason: RejectReason, retry_after: float = 1.0) -> None:
        # The message is formatted only when shown: under overload one of these is
        # raised per refused request, and most are answered, never printed.
        super().__init__(reason, retry_after)
        self.reason = reason
        self.retry_after = retry_after

    def __str__(self) -> str:
        return f"rejected: {self.reason.value} (retry after {self.retry_after:.3f}s)"


class Outcome(str, enum.Enum):
    """What an admitted request tells the limit algorithm when it ends."""

    SUCCESS = "success"
    """Served normally: its latency is a capacity sample."""
    DROPPED = "dropped"
    """Timed out, shed upstream (503/429), deadline exceeded: a sign of overload."""
    IGNORED = "ignored"
    """Client error or cancelled before start: says nothing about capacity."""

    def __str__(self) -> str:
        return self.value


class Priority(enum.IntEnum):
    """Request criticality; a lower value is more important and shed last."""

    CRITICAL = 0
    DEFAULT = 1
    SHEDDABLE = 2

    @classmethod
    def parse(cls, value: str | int | Priority) -> Priority:
        """Parse ``critical|default|sheddable`` (case-insensitive) or 0..2.

        Raises :class:`ConfigError` naming the allowed values.
        """
        if isinstance(value, Priority):
            return value
        if isinstance(value, int):
            try:
                return cls(value)
            except ValueError:
                pass
        else:
            try:
                return cls[value.strip().upper()]
            except KeyError:
                pass
        allowed = "|".join(p.name.lower() for p in cls)
        raise ConfigError("priority", f"got {value!r}, allowed: {allowed}")

    def __str__(self) -> str:
        return self.name.lower()
