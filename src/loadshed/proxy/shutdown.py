"""Graceful shutdown for the servers loadshed runs (``loadshed proxy``, ``serve-demo``).

On SIGTERM (or SIGINT) :class:`GracefulServer` first calls its ``on_shutdown``
callback (the middleware's :meth:`~loadshed.asgi.LoadShedMiddleware.shutdown`: every
queued request is answered 503 + Retry-After at once, every later one too), then does
what uvicorn does: stop accepting, let requests in flight finish within the grace
period (``timeout_graceful_shutdown``; past it they are cancelled), run the lifespan
shutdown (runners reap their workers, the proxy closes its upstream connections) and
return. Unlike plain uvicorn it does not re-raise the signal afterwards, so a stop
that went as planned exits 0.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Generator
from types import FrameType
from typing import Any

import uvicorn

from loadshed.errors import ConfigError

__all__ = ["DEFAULT_GRACE", "GracefulServer", "check_grace"]

DEFAULT_GRACE = 10.0
"""Seconds requests in flight get to finish after SIGTERM (``--grace``)."""
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def check_grace(value: float, flag: str = "--grace") -> float:
    """``value`` if it is a finite number of seconds >= 0, else :class:`ConfigError`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(flag, f"must be a number of seconds, got {value!r}")
    if not 0 <= value < float("inf"):
        raise ConfigError(flag, f"must be >= 0 seconds and finite, got {value}")
    return float(value)


class GracefulServer(uvicorn.Server):
    """A uvicorn server whose shutdown answers queued requests at once and exits 0.

    ``on_shutdown`` is called once, first thing when the shutdown begins (in the
    event loop). The grace period is the config's ``timeout_graceful_shutdown``.
    """

    def __init__(
        self, config: uvicorn.Config, on_shutdown: Callable[[], Any] | None = None
    ) -> None:
        super().__init__(config)
        self._on_shutdown = on_shutdown
        self.signalled: int | None = None
        """The signal that stopped the server (None: stopped otherwise, or running)."""

    async def shutdown(self, sockets: Any = None) -> None:
        """Answer what waits (``on_shutdown``), then uvicorn's graceful shutdown."""
        callback, self._on_shutdown = self._on_shutdown, None
        if callback is not None:
            callback()
        await super().shutdown(sockets=sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        """uvicorn's, without raising the signal again once the server stopped: the
        shutdown it asked for is done, and the process exits normally."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in _SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Note the signal and begin the shutdown (a second SIGINT forces it)."""
        self.signalled = sig
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        else:
            self.should_exit = True
