"""The client's own refusal: a call throttled locally."""

from __future__ import annotations

from loadshed.errors import LoadshedError

__all__ = ["ClientThrottled"]


class ClientThrottled(LoadshedError):
    """Refused locally by adaptive throttling: the upstream is refusing most calls."""

    def __init__(self, probability: float) -> None:
        super().__init__(
            f"throttled locally: the upstream refuses most calls "
            f"(local reject probability {probability:.2f})"
        )
        self.probability = probability
