"""An upstream's answer as the client returns it, and the error raised for one >= 400."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from multidict import CIMultiDictProxy

from loadshed.errors import LoadshedError

__all__ = ["Response", "UpstreamError"]


class UpstreamError(LoadshedError):
    """Raised by :meth:`Response.raise_for_status` for an answer >= 400."""

    def __init__(self, response: Response) -> None:
        super().__init__(
            f"upstream answered {response.status} after {response.attempts} attempt(s)"
        )
        self.response = response
        self.status = response.status


@dataclass(frozen=True)
class Response:
    """An upstream's answer, read in full while the call held its slot."""

    status: int
    headers: CIMultiDictProxy[str]
    body: bytes
    attempts: int
    """Attempts made (1 + retries)."""
    queue_wait_s: float
    """Time spent locally: waiting in the limiter's queue and in retry backoff."""
    upstream_s: float
    """Time at the upstream, over all attempts."""

    @property
    def ok(self) -> bool:
        """True for 1xx-3xx."""
        return self.status < 400

    def text(self, encoding: str = "utf-8") -> str:
        """The body decoded as text."""
        return self.body.decode(encoding)

    def json(self, loads: Callable[[bytes], Any] = json.loads) -> Any:
        """The body parsed as JSON."""
        return loads(self.body)

    def raise_for_status(self) -> None:
        """Raise :class:`UpstreamError` if the status is 400 or more."""
        if self.status >= 400:
            raise UpstreamError(self)
