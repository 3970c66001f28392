"""A limit equal to a known parallelism: the number of workers alive now.

When the server's parallelism is known (a :class:`~loadshed.runner.ModelRunner` with N
worker processes), the right concurrency limit is the number of workers that can take
a job: any more and requests wait in the runner, out of the limiter's reach; any fewer
and a worker idles. :class:`WorkerCount` reads that number from a callable, so a
worker that crashed and is being replaced counts as gone until it is back.
"""

from __future__ import annotations

from collections.abc import Callable

from loadshed.checks import check_int
from loadshed.errors import ConfigError
from loadshed.limits.base import LimitAlgorithm, Sample

__all__ = ["WorkerCount"]


class WorkerCount(LimitAlgorithm):
    """The limit is ``count()``, the workers alive now, at most ``max_limit``.

    ``count`` is read at construction and by :meth:`refresh`, never per request: whoever
    knows that the count changed calls ``refresh()`` and then tells the admission core
    (``Limiter.limit_changed()``) so that queued requests are granted when it rose.
    ``Limiter(runner=...)`` and ``LoadShedMiddleware(app, runner=...)`` do both, from
    the runner's workers listener.

    The limit may be 0 (every worker gone, e.g. the only one crashed): requests then
    wait in the limiter's queue, within its wait bound and their deadlines, until a
    worker is back. Samples are ignored: the limit does not adapt to latency.
    """

    name = "workers"
    uses_samples = False

    def __init__(self, count: Callable[[], int], *, max_limit: int) -> None:
        if not callable(count):
            raise ConfigError("count", f"must be callable, got {type(count).__name__}")
        self.max_limit = check_int("max_limit", max_limit, minimum=1)
        self.min_limit = 0
        self._count = count
        self._limit = 0
        self.refresh()

    @property
    def limit(self) -> int:
        return self._limit

    def refresh(self) -> int:
        """Read ``count()`` again; return the new limit (clamped to [0, max_limit])."""
        count = int(self._count())
        self._limit = 0 if count < 0 else (count if count < self.max_limit else self.max_limit)
        return self._limit

    def update(self, sample: Sample) -> int:
        """Ignore the sample: the limit follows the worker count only."""
        return self._limit

    def describe(self) -> str:
        return f"workers({self._limit} of {self.max_limit})"
