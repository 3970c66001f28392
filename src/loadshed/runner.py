"""Run a CPU-bound Python function in worker processes from async code.

:class:`ModelRunner` owns its worker processes (no ``ProcessPoolExecutor``). Each worker has
one duplex pipe to the parent; the parent watches the pipe and the process sentinel on the
event loop (``loop.add_reader``), so a result or a death is noticed without threads or polling.

Design points (see docs/design.md, "Pitfalls designed around"):

- A worker holds at most two jobs: the one it runs and one handed ahead, already in its pipe,
  so that it starts its next job the moment it sends a result, without waiting for the event
  loop (which may be busy with thousands of refusals a second). A caller that finds every
  worker holding two waits on the asyncio side in a FIFO, where it can be cancelled (or shed
  by a limiter in front) without leaving a job behind. There is no hidden executor queue.
- A job handed ahead whose caller is cancelled is skipped by its worker if the worker has not
  started it yet (a cancel message follows it down the pipe); else it runs and its result is
  discarded, as for a running job.
- A worker that dies (segfault, ``os._exit``, OOM kill, SIGKILL) fails only the job it was
  running, with :class:`WorkerCrashed` (exit code and signal); the job handed ahead to it never
  started and goes to another worker; a replacement is started at once.
- ``job_timeout`` kills a stuck worker, fails its job with :class:`JobTimeout` and replaces it.
- The model is loaded by ``initializer`` once per worker process; only the job's arguments and
  its result cross the pipe.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import io
import itertools
import logging
import math
import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import os
import pickle
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from multiprocessing.reduction import ForkingPickler
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from loadshed.checks import check_int, check_optional_number
from loadshed.errors import ConfigError, LoadshedError
from loadshed.histogram import LatencyHistogram
from loadshed.slot import current_token

if TYPE_CHECKING:
    from loadshed.admission import Token

__all__ = [
    "MAX_WORKERS_ENV",
    "JobTimeout",
    "ModelRunner",
    "RemoteTraceback",
    "RunnerClosed",
    "RunnerError",
    "RunnerStats",
    "WorkerCrashed",
    "WorkerInitError",
    "machine_worker_bound",
]

R = TypeVar("R")

START_METHODS = ("fork", "forkserver", "spawn")

# Service-time histogram: 2 significant digits (1 % resolution keeps the histogram at
# ~3,300 counters, so percentiles cost well under a millisecond to read).
_HIST_DIGITS = 2
_logger = logging.getLogger(__name__)
# Handing a slot on ahead of a reply (free_slot with hand_ahead): the recent job times and
# leads it is predicted from, how steady the job times must be (10th percentile
# over median), and the share of a job the lead may take at most.
_RECENT_JOBS = 32
_MIN_JOBS = 16
_RECENT_GAPS = 16
_MIN_GAPS = 8
_STEADY = 0.8
_MAX_LEAD_SHARE = 0.2

MAX_WORKERS_ENV = "LOADSHED_MAX_WORKERS"
"""Environment variable that replaces the machine-derived bound on ``workers``."""
_WORKERS_PER_CPU = 8
_MEMORY_PER_WORKER = 32 << 20  # bytes: less than any Python process with a model needs

# Back-off between attempts to replace a worker whose initializer keeps failing.
_RESTART_BACKOFF_FIRST = 0.1
_RESTART_BACKOFF_MAX = 5.0


def _usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where known, e.g. a cpuset)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _available_memory() -> int | None:
    """Bytes of memory available to new processes: MemAvailable, or less when this
    process's cgroup (v2) allows less; None where neither can be read."""
    available: int | None = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        available = None
    limit = _read_int("/sys/fs/cgroup/memory.max")  # "max" (no limit) reads as None
    used = _read_int("/sys/fs/cgroup/memory.current")
    if limit is not None and used is not None:
        room = max(0, limit - used)
        available = room if available is None else min(available, room)
    return available


def machine_worker_bound() -> tuple[int, str]:
    """The most worker processes a :class:`ModelRunner` starts on this machine unless
    told otherwise, and how that number was found (for the error message).

    ``LOADSHED_MAX_WORKERS`` (an integer >= 1) replaces it. Otherwise it is 8 per usable
    CPU, and at most one per 32 MiB of available memory: far above what CPU-bound
    workers can use, far below the thousands of processes a typo (``--workers 100000``)
    would fork until memory ran out.
    """
    env = os.environ.get(MAX_WORKERS_ENV)
    if env is not None and env.strip():
        text = env.strip()
        if not text.isdigit() or int(text) < 1:
            raise ConfigError(MAX_WORKERS_ENV, f"must be an integer >= 1, got {env!r}")
        return int(text), f"{MAX_WORKERS_ENV}={text}"
    cpus = _usable_cpus()
    bound = _WORKERS_PER_CPU * cpus
    reason = f"{_WORKERS_PER_CPU} per CPU x {cpus} CPU{'s' if cpus != 1 else ''}"
    memory = _available_memory()
    if memory is not None and memory // _MEMORY_PER_WORKER < bound:
        bound = max(1, memory // _MEMORY_PER_WORKER)
        reason = f"one per {_MEMORY_PER_WORKER >> 20} MiB of {memory >> 20} MiB available memory"
    return bound, reason


def _signal_name(exitcode: int | None) -> str | None:
    """The signal name for a negative :attr:`multiprocessing.Process.exitcode`, else None."""
    if exitcode is None or exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


def _describe_exit(exitcode: int | None) -> str:
    name = _signal_name(exitcode)
    if name is not None:
        return f"killed by {name}"
    return "exit status unknown" if exitcode is None else f"exit code {exitcode}"


class RunnerError(LoadshedError):
    """Base class of the runner's own errors (not those raised by the job function)."""


class WorkerCrashed(RunnerError):
    """The worker process running this job died (segfault, ``os._exit``, OOM kill, SIGKILL).

    ``exitcode`` is the process exit status (negative for a signal, as in
    :attr:`multiprocessing.Process.exitcode`), ``signal`` the signal name or ``None``.
    """

    def __init__(self, pid: int | None, exitcode: int | None) -> None:
        self.pid = pid
        self.exitcode = exitcode
        self.signal = _signal_name(exitcode)
        super().__init__(
            f"worker process {pid} died while running the job ({_describe_exit(exitcode)})"
        )


class JobTimeout(RunnerError):
    """The job ran longer than ``job_timeout``; its worker was killed and replaced."""

    def __init__(self, timeout: float, pid: int | None) -> None:
        self.timeout = timeout
        self.pid = pid
        super().__init__(f"job exceeded job_timeout={timeout:g}s; worker process {pid} was killed")


class RunnerClosed(RunnerError):
    """The runner was closed before or while the job ran."""


class WorkerInitError(RunnerError):
    """A worker's initializer raised or the worker died before it was ready."""


class RemoteTraceback(Exception):
    """Carries the worker-side traceback text; attached as ``__cause__`` of a job's exception."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


class _UnpicklableJobError(Exception):
    """Stands in for an exception raised by the job that could not be pickled back."""


@dataclass(frozen=True)
class RunnerStats:
    """A snapshot of a :class:`ModelRunner`.

    Service times are measured in the parent, from sending a job to receiving its result
    (so they include the pipe round trip), over every job that returned or raised.
    """

    workers: int
    """Configured number of worker processes."""
    busy: int
    """Workers running a job now."""
    idle: int
    """Workers ready and waiting for a job."""
    starting: int
    """Workers being started or replaced (initializer not finished)."""
    waiting: int
    """Callers waiting for an idle worker."""
    completed: int
    """Jobs that returned a value."""
    failed: int
    """Jobs whose function raised (the exception went to the caller)."""
    crashed: int
    """Jobs lost to a worker process dying."""
    timed_out: int
    """Jobs killed by ``job_timeout``."""
    cancelled: int
    """Jobs whose caller was cancelled while they ran (the result was discarded)."""
    skipped: int
    """Jobs handed ahead whose caller was cancelled before their worker started them (they
    never ran)."""
    retried: int
    """Jobs handed ahead to a worker that died or was killed before starting them, sent to
    another worker."""
    restarts: int
    """Worker processes started to replace dead or killed ones."""
    service_count: int
    """Jobs in the service-time histogram."""
    service_mean: float
    """Mean service time, seconds (0 when no job finished)."""
    service_p50: float
    """Median service time, seconds."""
    service_p90: float
    """90th percentile service time, seconds."""
    service_p99: float
    """99th percentile service time, seconds."""
    service_max: float
    """Longest service time, seconds."""

    def as_dict(self) -> dict[str, int | float]:
        """The snapshot as a plain dict (for JSON)."""
        return asdict(self)


# --------------------------------------------------------------------------- worker side

# Messages parent -> worker (send_bytes): an 8-byte signed little-endian number n, then
#   n > 0: job n, followed by the pickled (args, kwargs);
#   n < 0: cancel job -n (handed ahead: skip it if not started yet);
#   n == 0: stop.
# Messages worker -> parent (send): ("ready",), ("init_error", exc, tb_text),
#   (job_id, True, result), (job_id, False, (exc, tb_text)), or (job_id, None, None) for a job
#   skipped because it was cancelled before it started.
# A worker replies to its jobs in the order it received them.
_HEADER = 8
_STOP = bytes(_HEADER)
# A job message larger than this is sent only to an idle worker (blocked reading its pipe). A
# busy worker does not read until its job ends, and a message that does not fit the socket's
# buffer (~200 KiB on Linux) would block the event loop until then.
_AHEAD_MAX_BYTES = 64 << 10


def _header(number: int) -> bytes:
    return number.to_bytes(_HEADER, "little", signed=True)


def _pickleable_exception(exc: BaseException) -> BaseException:
    """Return ``exc`` if it survives pickling, else a stand-in carrying its type and message."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return _UnpicklableJobError(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}")
    return exc


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _set_parent_death_signal() -> bool:
    """Linux: have the kernel SIGKILL this process when its parent (the thread that
    started it) dies. False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _watch_parent_sentinel() -> None:
    """End this process as soon as multiprocessing's parent sentinel reports the runner's
    process gone (a daemon thread that waits on it)."""
    import threading

    parent = multiprocessing.parent_process()
    sentinel = parent.sentinel if parent is not None else None
    if sentinel is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="loadshed-runner-watch", daemon=True).start()


def _end_with_runner(runner_pid: int) -> bool:
    """Make sure this worker never outlives the runner's process (killed, or stopped by
    SIGTERM while initializers ran), even in the middle of an initializer or a job.

    Where the runner's process is the parent (``fork``, ``spawn``) on Linux, the kernel
    SIGKILLs the worker when it dies. Otherwise (``forkserver``: the parent is the fork
    server, which itself waits for its children; other systems) a thread waits on
    multiprocessing's parent sentinel and ends the process. Returns False if the runner's
    process is already gone.
    """
    if os.getppid() == runner_pid and _set_parent_death_signal():
        # The runner may have died before the request took effect.
        return os.getppid() == runner_pid
    _watch_parent_sentinel()  # fires at once if the runner is already gone
    return True


def _worker_main(
    conn: multiprocessing.connection.Connection,
    fn: Callable[..., Any],
    initializer: Callable[..., object] | None,
    initargs: tuple[Any, ...],
    runner_pid: int,
) -> None:
    """Worker process body: run the initializer once, then run jobs one at a time in the
    order received, skipping a job handed ahead whose cancel arrived before it started."""
    if not _end_with_runner(runner_pid):
        return
    # Ctrl-C in a terminal goes to the whole process group; the parent decides when we stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A forked worker inherits the parent's Python signal handlers (a server's graceful-exit
    # handler would make it ignore terminate()) and the event loop's signal wake-up fd (a
    # signal to the worker would wake the parent's loop as if the parent got it).
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    try:
        if initializer is not None:
            initializer(*initargs)
    except BaseException as exc:
        conn.send(("init_error", _pickleable_exception(exc), traceback.format_exc()))
        conn.close()
        return
    conn.send(("ready",))
    pending: collections.deque[tuple[int, bytes]] = collections.deque()
    cancelled: set[int] = set()

    def take(data: bytes) -> bool:
        """File one message from the parent; False for stop."""
        number = int.from_bytes(data[:_HEADER], "little", signed=True)
        if number > 0:
            pending.append((number, data))
        elif number < 0:
            # The parent sends a job before any cancel for it: a cancel for a job no longer
            # pending came after the job started here; it runs on (the parent discards it).
            if any(job_id == -number for job_id, _ in pending):
                cancelled.add(-number)
        else:
            return False
        return True

    while True:
        try:
            if not pending and not take(conn.recv_bytes()):
                return
            # Take in everything already sent (the job handed ahead, a cancel for it) before
            # starting the next job.
            while conn.poll():
                if not take(conn.recv_bytes()):
                    return
        except (EOFError, OSError):
            return  # parent gone
        if not pending:
            continue  # only a late cancel arrived
        job_id, data = pending.popleft()
        if job_id in cancelled:
            cancelled.discard(job_id)
            conn.send((job_id, None, None))
            continue
        try:
            args, kwargs = pickle.loads(memoryview(data)[_HEADER:])
            result = fn(*args, **kwargs)
        except Exception as exc:  # raised by fn, or the job did not unpickle here
            reply: tuple[Any, ...] = (
                job_id,
                False,
                (_pickleable_exception(exc), traceback.format_exc()),
            )
        else:
            reply = (job_id, True, result)
        del data
        try:
            conn.send(reply)
        except Exception as exc:  # the result did not pickle
            error = _UnpicklableJobError(f"job result could not be sent to the parent: {exc!r}")
            conn.send((job_id, False, (error, traceback.format_exc())))


# --------------------------------------------------------------------------- parent side


class _Job:
    """One call of :meth:`ModelRunner.run`: in the FIFO, handed ahead to a worker, or
    running (the first of its worker's jobs)."""

    __slots__ = (
        "cancel_sent", "data", "future", "hand_on", "job_id", "started", "timer", "token",
        "worker",
    )  # fmt: skip

    def __init__(
        self, job_id: int, data: memoryview, future: asyncio.Future[Any], token: Token | None
    ) -> None:
        self.job_id = job_id
        # The admission token of the request that submitted it (free_slot): vacated when
        # the worker replies, or shortly before (see _begin).
        self.token = token
        # The message for the worker; kept until the job runs, so that a job handed ahead to
        # a worker that dies can go to another one.
        self.data: memoryview | None = data
        self.future = future
        self.started = 0.0  # when it became its worker's current job (perf_counter)
        self.timer: asyncio.TimerHandle | None = None
        # Vacates token shortly before the job is predicted to end (see _begin).
        self.hand_on: asyncio.TimerHandle | None = None
        self.worker: _Worker | None = None  # None while in the FIFO
        self.cancel_sent = False  # its caller was cancelled while it was handed ahead


class _Worker:
    """Parent-side record of one worker process."""

    __slots__ = (
        "conn", "exited", "jobs", "killed", "pid", "process", "ready", "sentinel", "slot",
        "vacated_at",
    )  # fmt: skip

    def __init__(self, slot: int, process: multiprocessing.process.BaseProcess, conn: Any) -> None:
        self.slot = slot
        self.process = process
        self.conn: multiprocessing.connection.Connection = conn
        self.pid = process.pid
        self.sentinel: int = process.sentinel
        self.ready = False
        # Jobs sent and not yet answered, in the order sent: the first is running (or about to),
        # the second, if any, is handed ahead.
        self.jobs: list[_Job] = []
        # Set when the parent killed it (timeout, cancel, close): its death is not a crash.
        self.killed = False
        self.exited = False
        # When its running job last handed its request's slot on, until the next job came.
        self.vacated_at = -math.inf


def _resolve_context(
    mp_context: str | multiprocessing.context.BaseContext | None,
) -> multiprocessing.context.BaseContext:
    if isinstance(mp_context, multiprocessing.context.BaseContext):
        return mp_context
    if mp_context is None:
        # fork is unsafe in a process that runs threads (servers, thread pools); forkserver is
        # the safe and fast choice where it exists, spawn elsewhere.
        available = multiprocessing.get_all_start_methods()
        mp_context = "forkserver" if "forkserver" in available else "spawn"
    if mp_context not in START_METHODS:
        raise ConfigError(
            "mp_context", f"got {mp_context!r}, allowed: {'|'.join(START_METHODS)} or None"
        )
    try:
        return multiprocessing.get_context(mp_context)
    except ValueError as exc:
        raise ConfigError(
            "mp_context", f"start method {mp_context!r} is not available on {sys.platform}"
        ) from exc


class ModelRunner(Generic[R]):
    """Run ``fn(*args, **kwargs)`` in ``workers`` processes: ``await runner.run(x)``.

    ``initializer(*initargs)`` runs once in each worker before its first job (load the model
    there, into a module global that ``fn`` reads). ``fn`` and ``initializer`` must be
    module-level functions for the ``forkserver`` and ``spawn`` start methods; with ``fork``
    anything works. ``mp_context`` is a start method name, a multiprocessing context, or
    ``None`` for ``forkserver`` where available (safe in threaded servers), else ``spawn``.

    ``job_timeout`` (seconds, or ``None``) kills a worker whose job runs longer and fails the
    job with :class:`JobTimeout`. ``kill_on_cancel`` kills and replaces the worker when the
    caller of a running job is cancelled (frees the CPU at once, costs a model reload);
    by default the job runs to completion and its result is discarded.

    ``hand_ahead`` (default True) sends a busy worker its next job while it runs the current
    one, so that it never waits for the event loop between jobs; a worker holds at most that
    one job beyond the one it runs, and further callers wait in the runner's FIFO, cancellable.
    With False a job is sent only to an idle worker (strict FIFO to whichever worker frees up
    first: for jobs whose durations vary by seconds, where a job handed ahead could wait behind
    a long one while another worker is free).

    ``free_slot`` (default True): a job submitted while serving a request admitted by
    :class:`~loadshed.asgi.LoadShedMiddleware` frees that request's admission slot the
    moment its worker replies (:meth:`~loadshed.admission.Token.vacate`), so the next
    queued request is admitted while this response is still being written; the request's
    outcome and latency are still recorded when it ends. With ``hand_ahead`` and steady job
    times (the 10th percentile of the last 32 within 80 % of their median), the slot goes
    on shortly before the job's predicted end instead, by the measured time a request takes
    from admission to ``run()`` (at most a fifth of a job), so that the next job is handed
    ahead and the worker goes straight on to it. A request that calls the runner more than
    once frees its slot with its first job; later calls hold none. A job whose caller was
    cancelled, or that failed with the runner's own error, frees nothing (the request may
    go on). False keeps the slot until the response ends.

    ``workers`` may not exceed ``max_workers``; by default (None) that bound comes from the
    machine (:func:`machine_worker_bound`: 8 per CPU, one per 32 MiB of available memory,
    or the ``LOADSHED_MAX_WORKERS`` environment variable), so that a typo cannot fork
    processes until memory runs out. Pass ``max_workers`` to allow more on purpose.

    Start it with ``async with ModelRunner(...) as runner`` or ``await runner.start()``
    (``run`` also starts it on first use); stop it with ``await runner.close()``.
    Invalid settings raise :class:`~loadshed.errors.ConfigError` here, at construction.
    """

    def __init__(
        self,
        fn: Callable[..., R],
        *,
        workers: int = 1,
        initializer: Callable[..., object] | None = None,
        initargs: Sequence[Any] = (),
        mp_context: str | multiprocessing.context.BaseContext | None = None,
        job_timeout: float | None = None,
        kill_on_cancel: bool = False,
        max_workers: int | None = None,
        hand_ahead: bool = True,
        free_slot: bool = True,
    ) -> None:
        if not callable(fn):
            raise ConfigError("fn", f"must be callable, got {type(fn).__name__}")
        workers = check_int("workers", workers, minimum=1)
        if max_workers is None:
            bound, reason = machine_worker_bound()
            if workers > bound:
                raise ConfigError(
                    "workers",
                    f"must be at most {bound} on this machine ({reason}), got {workers}; "
                    f"to allow more on purpose, set {MAX_WORKERS_ENV} (or pass max_workers=)",
                )
        else:
            max_workers = check_int("max_workers", max_workers, minimum=1)
            if workers > max_workers:
                raise ConfigError(
                    "workers", f"must be at most max_workers ({max_workers}), got {workers}"
                )
        if initializer is not None and not callable(initializer):
            raise ConfigError(
                "initializer", f"must be callable or None, got {type(initializer).__name__}"
            )
        job_timeout = check_optional_number(
            "job_timeout", job_timeout, minimum=0, min_open=True, unit="seconds"
        )
        self._fn = fn
        self._workers_wanted = workers
        self._initializer = initializer
        self._initargs = tuple(initargs)
        self._context = _resolve_context(mp_context)
        self._job_timeout = job_timeout
        self._kill_on_cancel = bool(kill_on_cancel)
        # Jobs a worker holds at once: the running one, plus one handed ahead.
        self._per_worker = 2 if hand_ahead else 1
        self._free_slot = bool(free_slot)
        # Recent job times, and leads: from a worker's job handing its slot on to the next
        # job sent to that worker, when that job's request had waited for admission (its
        # way from the queue through the app to run()); see _predict_hand_on.
        self._recent_jobs: collections.deque[float] = collections.deque(maxlen=_RECENT_JOBS)
        self._recent_gaps: collections.deque[float] = collections.deque(maxlen=_RECENT_GAPS)
        self._hand_on_after: float | None = None  # seconds into a job; None: at its reply
        # Workers ready for a job; before start() the configured count (see live_workers).
        self._live = workers
        self._workers_listeners: list[Callable[[int], None]] = []

        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = False
        self._closed = False
        self._start_lock: asyncio.Lock | None = None
        self._slots: list[_Worker | None] = [None] * workers
        # Ready workers holding no job, and (hand_ahead) those holding only a running one:
        # where the next job goes, idle first. A worker is in at most one of them.
        self._idle: collections.deque[_Worker] = collections.deque()
        self._open: collections.deque[_Worker] = collections.deque()
        # Callers waiting for room in a worker (FIFO), no job sent yet.
        self._queue: collections.deque[_Job] = collections.deque()
        self._all_dead: asyncio.Event | None = None
        # Futures of workers in their first start; resolved on ready or failure.
        self._startup: dict[int, asyncio.Future[None]] = {}
        self._restart_failures = [0] * workers
        self._restart_timers: dict[int, asyncio.TimerHandle] = {}
        self._job_ids = itertools.count(1)

        self._completed = 0
        self._failed = 0
        self._crashed = 0
        self._timed_out = 0
        self._cancelled = 0
        self._skipped = 0
        self._retried = 0
        self._restarts = 0
        self._service_hist = LatencyHistogram(significant_figures=_HIST_DIGITS)
        # Kept alongside, exact: the histogram's mean is of bucket midpoints, its max a
        # bucket's upper edge.
        self._service_total = 0.0
        self._service_max = 0.0

    # ------------------------------------------------------------------ public API

    @property
    def workers(self) -> int:
        """Configured number of worker processes (the runner's concurrency)."""
        return self._workers_wanted

    @property
    def live_workers(self) -> int:
        """Worker processes ready for a job now, idle or busy.

        A worker that died, or was killed (``job_timeout``, ``kill_on_cancel``), counts as
        gone until its replacement's initializer has finished; a worker still starting
        does not count yet. Before :meth:`start` this is the configured count (``run()``
        starts the runner on first use, so a limit read from it must let that first call
        through); after :meth:`close`, 0. Cheap: a counter kept up to date.
        """
        return self._live

    def add_workers_listener(self, callback: Callable[[int], None]) -> None:
        """Call ``callback(live_workers)`` each time :attr:`live_workers` changes.

        Called on the runner's event loop, from inside the runner's own callbacks: keep it
        short and do not await. An exception it raises goes to the loop's exception handler.
        """
        self._workers_listeners.append(callback)

    def remove_workers_listener(self, callback: Callable[[int], None]) -> None:
        """Stop calling ``callback`` (a no-op if it was not registered)."""
        with contextlib.suppress(ValueError):
            self._workers_listeners.remove(callback)

    def _update_live(self) -> None:
        """Recount the ready workers and tell the listeners if the count changed."""
        if self._closed:
            live = 0
        else:
            live = sum(1 for w in self._slots if w is not None and w.ready and not w.killed)
        if live == self._live:
            return
        self._live = live
        for callback in list(self._workers_listeners):
            try:
                callback(live)
            except Exception as exc:
                if self._loop is None:
                    raise
                self._loop.call_exception_handler(
                    {"message": "ModelRunner workers listener failed", "exception": exc}
                )

    @property
    def start_method(self) -> str:
        """The multiprocessing start method in use."""
        return str(self._context.get_start_method())

    def pids(self) -> list[int]:
        """Process ids of the current worker processes (for monitoring, e.g. RSS with psutil)."""
        return [w.pid for w in self._slots if w is not None and w.pid is not None and not w.killed]

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    async def __aenter__(self) -> ModelRunner[R]:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(self) -> None:
        """Start every worker and wait until each initializer finished.

        Raises :class:`WorkerInitError` (and stops the others) if an initializer raised or a
        worker died while starting. Calling it again is a no-op.
        """
        if self._closed:
            raise RunnerClosed("runner is closed")
        loop = asyncio.get_running_loop()
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._started:
                return
            if self._closed:
                raise RunnerClosed("runner is closed")
            self._loop = loop
            self._all_dead = asyncio.Event()
            self._update_live()  # none is ready yet
            startups: list[asyncio.Future[None]] = []
            try:
                for slot in range(self._workers_wanted):
                    future: asyncio.Future[None] = loop.create_future()
                    self._startup[slot] = future
                    startups.append(future)
                    try:
                        self._spawn(slot)
                    except Exception as exc:
                        self._startup.pop(slot, None)
                        hint = (
                            ""
                            if self.start_method == "fork"
                            else f"; with the {self.start_method} start method fn, initializer "
                            "and initargs must pickle (use module-level functions)"
                        )
                        raise WorkerInitError(
                            f"could not start a worker process: {exc!r}{hint}"
                        ) from exc
                await asyncio.gather(*startups)
            except BaseException:
                # A failed initializer, a cancelled start-up (e.g. SIGTERM handled by the
                # server) or an exception from a signal handler: every worker started so far
                # is stopped at once (those still in their initializer are killed).
                for future in startups:
                    future.cancel()
                await self._shutdown_workers()
                raise
            self._started = True

    async def run(self, *args: Any, **kwargs: Any) -> R:
        """Run ``fn(*args, **kwargs)`` in a worker and return its result.

        Goes to an idle worker, else (``hand_ahead``) is handed ahead to a busy worker that
        holds no other, else waits (cancellably, in FIFO order). Exceptions raised by ``fn``
        propagate with their type, with the worker's traceback as ``__cause__``. Raises
        :class:`WorkerCrashed`, :class:`JobTimeout` or :class:`RunnerClosed` for failures
        of the runner itself.
        """
        if not self._started:
            await self.start()
        self._check_loop()
        if self._closed:
            raise RunnerClosed("runner is closed")
        loop = self._loop
        assert loop is not None
        job_id = next(self._job_ids)
        # Pickle before queueing: an unpicklable argument fails here, costing nothing.
        buffer = io.BytesIO()
        buffer.write(_header(job_id))
        ForkingPickler(buffer).dump((args, kwargs))
        token = current_token.get() if self._free_slot else None
        if token is not None and token.vacated:
            token = None  # a task that outlived its request, or a second call: no slot held
        job = _Job(job_id, buffer.getbuffer(), loop.create_future(), token)
        self._queue.append(job)
        self._fill()
        try:
            return await job.future  # type: ignore[no-any-return]
        except asyncio.CancelledError:
            # Cancelling our task cancels job.future too (unless the result won the race).
            if job.future.cancelled() or not job.future.done():
                job.future.cancel()
                self._abandon(job)
            raise

    def _abandon(self, job: _Job) -> None:
        """The caller of ``job`` is gone: forget it, skip it, or let it run for nothing."""
        self._drop_slot(job)  # the request may go on without it: its slot stays its own
        worker = job.worker
        if worker is None:
            with contextlib.suppress(ValueError):
                self._queue.remove(job)  # no job sent
            return
        if worker.jobs and worker.jobs[0] is job:
            # Running: it keeps its worker busy until it returns (its result is then
            # discarded), unless asked to kill it.
            self._cancelled += 1
            if self._kill_on_cancel:
                self._kill(worker)
            return
        # Handed ahead: tell the worker to skip it. If the worker started it already (it
        # finished the job before and the loop has not read that reply yet), it runs on and
        # its result is discarded.
        job.cancel_sent = True
        with contextlib.suppress(OSError, ValueError):
            worker.conn.send_bytes(_header(-job.job_id))

    @property
    def busy(self) -> int:
        """Workers running a job now (cheap; :meth:`stats` for everything)."""
        return sum(1 for w in self._slots if w is not None and w.ready and not w.killed and w.jobs)

    @property
    def idle(self) -> int:
        """Workers ready for a job now and holding none."""
        return sum(
            1 for w in self._slots if w is not None and w.ready and not w.killed and not w.jobs
        )

    @property
    def waiting(self) -> int:
        """Callers whose job has not started: waiting for room in a worker, or handed ahead
        to a busy one."""
        ahead = sum(
            1 for w in self._slots if w is not None for job in w.jobs[1:] if not job.future.done()
        )
        return ahead + sum(1 for job in self._queue if not job.future.done())

    def stats(self) -> RunnerStats:
        """A snapshot of worker states, job counts and service-time percentiles.

        Not thread-safe: call it from the runner's event loop.
        """
        busy = self.busy
        idle = self.idle
        hist = self._service_hist
        count = hist.count
        percentiles = hist.percentiles([50.0, 90.0, 99.0]) if count else {}

        def seconds(percentile: float) -> float:
            # HDR reports a bucket's upper edge; no percentile exceeds the exact maximum.
            return min(percentiles[percentile], self._service_max) if count else 0.0

        return RunnerStats(
            workers=self._workers_wanted,
            busy=busy,
            idle=idle,
            starting=self._workers_wanted - busy - idle,
            waiting=self.waiting,
            completed=self._completed,
            failed=self._failed,
            crashed=self._crashed,
            timed_out=self._timed_out,
            cancelled=self._cancelled,
            skipped=self._skipped,
            retried=self._retried,
            restarts=self._restarts,
            service_count=count,
            service_mean=self._service_total / count if count else 0.0,
            service_p50=seconds(50.0),
            service_p90=seconds(90.0),
            service_p99=seconds(99.0),
            service_max=self._service_max,
        )

    async def close(self, timeout: float = 5.0) -> None:
        """Stop the runner: waiting callers and running jobs fail with :class:`RunnerClosed`,
        idle workers are asked to exit, and any worker still alive after ``timeout`` seconds
        (or running a job) is killed. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for future in self._startup.values():
            if not future.done():
                future.set_exception(RunnerClosed("runner closed while starting"))
        await self._shutdown_workers(timeout)

    # ------------------------------------------------------------------ dispatch

    def _check_loop(self) -> None:
        if asyncio.get_running_loop() is not self._loop:
            raise RuntimeError("ModelRunner is bound to the event loop that started it")

    def _fill(self) -> None:
        """Send jobs from the FIFO to workers with room, idle workers first."""
        queue = self._queue
        while queue:
            job = queue[0]
            if job.future.done():  # cancelled or failed while queued
                queue.popleft()
                continue
            assert job.data is not None
            worker = self._next_worker(idle_only=len(job.data) > _AHEAD_MAX_BYTES)
            if worker is None:
                return  # FIFO order holds: no later job passes this one
            queue.popleft()
            if self._dispatch(worker, job):
                self._park(worker)
            else:
                queue.appendleft(job)  # that worker is dying; its sentinel replaces it

    def _next_worker(self, idle_only: bool = False) -> _Worker | None:
        for parked in (self._idle,) if idle_only else (self._idle, self._open):
            while parked:
                worker = parked.popleft()
                if not worker.killed and not worker.exited:
                    return worker
        return None

    def _park(self, worker: _Worker) -> None:
        """Make a worker that has room findable (it is in neither deque when called)."""
        if self._closed or worker.killed or worker.exited or not worker.ready:
            return
        held = len(worker.jobs)
        if held == 0:
            self._idle.append(worker)
        elif held < self._per_worker:
            self._open.append(worker)

    def _dispatch(self, worker: _Worker, job: _Job) -> bool:
        """Send ``job`` to ``worker``; False if its pipe is broken (it is dying)."""
        assert job.data is not None
        try:
            worker.conn.send_bytes(job.data)
        except (OSError, ValueError):
            return False
        job.worker = worker
        worker.jobs.append(job)
        now = time.perf_counter()
        token = job.token
        if token is not None and token.queue_wait > 0 and worker.vacated_at > -math.inf:
            # A request admitted from the queue reached run() this long after the slot went
            # on: the lead a hand-on needs.
            self._recent_gaps.append(now - worker.vacated_at)
            worker.vacated_at = -math.inf
        if len(worker.jobs) == 1:
            self._begin(worker, job, now)
        return True

    def _begin(self, worker: _Worker, job: _Job, now: float) -> None:
        """``job`` became ``worker``'s current job: sent to it idle, or the reply to the job
        before it arrived (the worker started it then, without waiting for us)."""
        job.started = now
        job.data = None  # it may have started: never sent elsewhere
        loop = self._loop
        assert loop is not None
        if self._job_timeout is not None and not worker.killed:
            job.timer = loop.call_later(self._job_timeout, self._on_job_timeout, worker, job)
        after = self._hand_on_after
        if (
            after is not None
            and job.token is not None
            and self._per_worker > 1
            and not (worker.killed or worker.exited)
        ):
            # The next request heads for run() now, and its job is handed ahead to this
            # worker about when this one ends, instead of a dispatch gap after it.
            job.hand_on = loop.call_later(after, self._hand_on, worker, job)

    def _hand_on(self, worker: _Worker, job: _Job) -> None:
        """Vacate the slot of ``job``'s request (its reply came, or is predicted soon)."""
        job.hand_on = None
        token = job.token
        if token is None or token.vacated:
            return
        worker.vacated_at = time.perf_counter()
        try:
            token.vacate()
        except Exception:  # a listener's failure must not cost this reply its caller
            _logger.exception("vacating a request's admission slot failed")

    def _drop_slot(self, job: _Job) -> None:
        """``job`` no longer speaks for its request's slot (failed, abandoned, closed): the
        request may go on, and its slot is released with it, never vacated from here."""
        self._cancel_hand_on(job)
        job.token = None

    @staticmethod
    def _cancel_hand_on(job: _Job) -> None:
        if job.hand_on is not None:
            job.hand_on.cancel()
            job.hand_on = None

    def _unpark(self, worker: _Worker) -> None:
        for parked in (self._idle, self._open):
            with contextlib.suppress(ValueError):
                parked.remove(worker)

    # ------------------------------------------------------------------ processes

    def _spawn(self, slot: int) -> None:
        loop = self._loop
        assert loop is not None
        parent_conn, child_conn = self._context.Pipe(duplex=True)
        process = self._context.Process(  # type: ignore[attr-defined]
            target=_worker_main,
            args=(child_conn, self._fn, self._initializer, self._initargs, os.getpid()),
            name=f"loadshed-runner-{slot}",
            daemon=True,
        )
        try:
            process.start()
            worker = _Worker(slot, process, parent_conn)
            self._slots[slot] = worker
        except BaseException:
            # Failed, or interrupted (a signal handler's exception) after the fork: leave no
            # process behind.
            if process.pid is not None:
                with contextlib.suppress(Exception):
                    process.kill()
            parent_conn.close()
            raise
        finally:
            child_conn.close()
        loop.add_reader(parent_conn.fileno(), self._on_readable, worker)
        # uvloop (libuv) puts a watched descriptor in non-blocking mode. The pipe's
        # Connection writes a message in a loop of blocking writes: non-blocking, a job
        # larger than the free socket buffer was written in part before BlockingIOError,
        # and the worker waited forever for the rest. Blocking again: a send waits for
        # the worker to read (a job handed ahead is small enough to fit the buffer; a
        # larger one goes to an idle worker, which is reading).
        os.set_blocking(parent_conn.fileno(), True)
        loop.add_reader(worker.sentinel, self._on_exit, worker)

    def _on_readable(self, worker: _Worker) -> None:
        # One message per callback: the fd is readable, so recv() does not wait for the worker
        # to start writing; a second queued message makes the fd fire again.
        try:
            self._on_message(worker, worker.conn.recv())
        except (EOFError, OSError):
            # The worker is exiting; its sentinel reports the death.
            self._stop_reading(worker)

    def _on_message(self, worker: _Worker, message: tuple[Any, ...]) -> None:
        if message[0] == "ready":
            worker.ready = True
            self._restart_failures[worker.slot] = 0
            startup = self._startup.pop(worker.slot, None)
            if startup is not None and not startup.done():
                startup.set_result(None)
            self._park(worker)
            self._update_live()
            self._fill()
            return
        if message[0] == "init_error":
            _, exc, tb_text = message
            self._on_init_failure(worker, exc, tb_text)
            return
        job_id, ok, payload = message
        jobs = worker.jobs
        if not jobs or jobs[0].job_id != job_id:
            return  # not a job this worker holds (cannot happen: replies come in order)
        job = jobs.pop(0)
        if job.timer is not None:
            job.timer.cancel()
        self._cancel_hand_on(job)
        now = time.perf_counter()
        if jobs:
            # The job handed ahead: the worker went on to it as soon as it sent this reply.
            self._begin(worker, jobs[0], now)
        if job.token is not None:
            # The worker is free: the next queued request is admitted before this one's
            # caller resumes, and reaches a worker the sooner.
            self._hand_on(worker, job)
        if ok is None:
            self._skipped += 1  # handed ahead, cancelled before it started: never ran
        else:
            service_seconds = now - job.started
            self._service_hist.record(service_seconds)
            self._service_total += service_seconds
            self._service_max = max(self._service_max, service_seconds)
            if job.token is not None:  # only jobs of admitted requests hand slots on
                self._recent_jobs.append(service_seconds)
                self._predict_hand_on()
            if job.cancel_sent:
                self._cancelled += 1  # the cancel came after it started: it ran for nothing
            if not job.future.done():  # else its caller was cancelled: discard the result
                if ok:
                    self._completed += 1
                    job.future.set_result(payload)
                else:
                    self._failed += 1
                    exc, tb_text = payload
                    exc.__cause__ = RemoteTraceback(tb_text)
                    job.future.set_exception(exc)
        if len(jobs) == 0 and self._per_worker > 1:
            with contextlib.suppress(ValueError):
                self._open.remove(worker)  # parked there while it held one job
        self._park(worker)
        self._fill()

    def _predict_hand_on(self) -> None:
        """When job times are steady, hand a slot on at their recent 10th percentile less
        the median measured lead (at most a fifth of it); else at the reply."""
        self._hand_on_after = None
        jobs = self._recent_jobs
        if len(jobs) < _MIN_JOBS:
            return
        ordered = sorted(jobs)
        low, median = ordered[len(ordered) // 10], ordered[len(ordered) // 2]
        if low < _STEADY * median:
            return
        bound = _MAX_LEAD_SHARE * low
        # A longer gap cannot be a lead (the request waited for something else).
        leads = sorted(gap for gap in self._recent_gaps if gap <= bound)
        if len(leads) >= _MIN_GAPS:
            self._hand_on_after = low - leads[len(leads) // 2]

    def _on_init_failure(self, worker: _Worker, exc: BaseException, tb_text: str) -> None:
        worker.killed = True  # its exit is expected, not a crash
        error = WorkerInitError(f"initializer failed in worker process {worker.pid}: {exc!r}")
        error.__cause__ = RemoteTraceback(tb_text)
        startup = self._startup.pop(worker.slot, None)
        if startup is not None and not startup.done():
            startup.set_exception(error)
        # A replacement's failure is counted, and retried with back-off, when its process exits.

    def _on_exit(self, worker: _Worker) -> None:
        worker.exited = True  # no new job goes to it, even from the replies drained below
        self._unpark(worker)
        # Drain replies (or ready/init_error) written before the process exited.
        if not worker.conn.closed:
            with contextlib.suppress(EOFError, OSError):
                while worker.conn.poll():
                    self._on_message(worker, worker.conn.recv())
        loop = self._loop
        assert loop is not None
        loop.remove_reader(worker.sentinel)
        self._stop_reading(worker)
        worker.process.join(timeout=1.0)  # the sentinel closes just before the exit is reapable
        exitcode = worker.process.exitcode
        self._unpark(worker)
        if self._slots[worker.slot] is worker:
            self._slots[worker.slot] = None
        self._update_live()
        jobs, worker.jobs = worker.jobs, []
        if jobs:
            # Every reply it wrote has been read: it was running the first job held (or was
            # about to); the one handed ahead never started.
            running = jobs[0]
            if running.timer is not None:
                running.timer.cancel()
            self._drop_slot(running)
            if not running.future.done():
                self._crashed += 1
                running.future.set_exception(WorkerCrashed(worker.pid, exitcode))
            for job in reversed(jobs[1:]):
                if job.future.done():
                    continue
                if self._closed:
                    job.future.set_exception(RunnerClosed("runner closed while the job waited"))
                    continue
                self._retried += 1
                job.worker = None
                self._queue.appendleft(job)  # ahead of later callers: it came first
            self._fill()
        startup = self._startup.pop(worker.slot, None)
        if startup is not None and not startup.done():
            startup.set_exception(
                WorkerInitError(
                    f"worker process {worker.pid} died before it was ready "
                    f"({_describe_exit(exitcode)})"
                )
            )
            return
        if self._closed or not self._started:
            self._check_all_dead()
            return
        if not worker.ready:
            self._restart_failures[worker.slot] += 1
        self._schedule_restart(worker.slot)

    def _schedule_restart(self, slot: int) -> None:
        failures = self._restart_failures[slot]
        if failures == 0:
            self._restart(slot)
            return
        delay = min(_RESTART_BACKOFF_MAX, _RESTART_BACKOFF_FIRST * 2 ** (failures - 1))
        loop = self._loop
        assert loop is not None
        self._restart_timers[slot] = loop.call_later(delay, self._restart, slot)

    def _restart(self, slot: int) -> None:
        self._restart_timers.pop(slot, None)
        if self._closed or self._slots[slot] is not None:
            return
        self._restarts += 1
        try:
            self._spawn(slot)
        except Exception:
            self._restart_failures[slot] += 1
            self._schedule_restart(slot)

    def _stop_reading(self, worker: _Worker) -> None:
        loop = self._loop
        if worker.conn.closed:
            return
        if loop is not None:
            loop.remove_reader(worker.conn.fileno())
        worker.conn.close()

    def _kill(self, worker: _Worker) -> None:
        """Kill a worker on purpose; its sentinel then triggers the replacement (and sends
        the job handed ahead to it, if any, elsewhere)."""
        worker.killed = True
        self._unpark(worker)
        with contextlib.suppress(ProcessLookupError, OSError, ValueError):
            worker.process.kill()
        self._update_live()

    def _on_job_timeout(self, worker: _Worker, job: _Job) -> None:
        if not worker.jobs or worker.jobs[0] is not job:
            return
        self._timed_out += 1
        job.timer = None
        self._drop_slot(job)
        if not job.future.done():
            job.future.set_exception(JobTimeout(self._job_timeout or 0.0, worker.pid))
        self._kill(worker)

    def _check_all_dead(self) -> None:
        if self._all_dead is not None and all(w is None for w in self._slots):
            self._all_dead.set()

    async def _shutdown_workers(self, timeout: float = 5.0) -> None:
        self._closed = True
        for handle in self._restart_timers.values():
            handle.cancel()
        self._restart_timers.clear()
        while self._queue:
            job = self._queue.popleft()
            if not job.future.done():
                job.future.set_exception(RunnerClosed("runner closed while waiting for a worker"))
        self._idle.clear()
        self._open.clear()
        self._update_live()
        for worker in self._slots:
            if worker is None:
                continue
            if not worker.ready:
                # Still in its initializer (which may take minutes): nothing to lose.
                self._kill(worker)
                continue
            if worker.jobs:
                for index, job in enumerate(worker.jobs):
                    if job.timer is not None:
                        job.timer.cancel()
                    self._drop_slot(job)
                    if not job.future.done():
                        job.future.set_exception(
                            RunnerClosed(
                                "runner closed while the job " + ("ran" if index == 0 else "waited")
                            )
                        )
                self._kill(worker)
                continue
            worker.killed = True
            try:
                worker.conn.send_bytes(_STOP)
            except (OSError, ValueError):
                self._kill(worker)
        self._check_all_dead()
        if self._all_dead is None:
            return
        try:
            await asyncio.wait_for(self._all_dead.wait(), timeout)
        except asyncio.TimeoutError:
            for worker in self._slots:
                if worker is not None:
                    self._kill(worker)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._all_dead.wait(), 2.0)

    def __repr__(self) -> str:
        s = self.stats()
        state = "closed" if self._closed else ("running" if self._started else "new")
        return (
            f"<ModelRunner {state} {self.start_method} workers={s.workers} busy={s.busy} "
            f"idle={s.idle} waiting={s.waiting}>"
        )
