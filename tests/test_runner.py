"""ModelRunner against real worker processes: parallelism, no hidden queue, cancellation,
crashes, timeouts, exceptions and start methods.

Job functions are module-level so that forkserver and spawn can import them by name.
Timestamps come from inside the workers (``time.monotonic`` is system-wide on Linux).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import faulthandler
import itertools
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from loadshed.errors import ConfigError
from loadshed.limiter import Limiter
from loadshed.runner import (
    MAX_WORKERS_ENV,
    JobTimeout,
    ModelRunner,
    RemoteTraceback,
    RunnerClosed,
    WorkerCrashed,
    WorkerInitError,
    machine_worker_bound,
)

pytestmark = pytest.mark.timeout(60)

# --------------------------------------------------------------------------- worker-side code

MODEL: dict[str, Any] = {}


def load_model(scale: int) -> None:
    """Initializer: stands in for loading a model into a module global."""
    MODEL["scale"] = scale
    MODEL["pid"] = os.getpid()


def failing_initializer() -> None:
    raise RuntimeError("model file missing")


def initializer_failing_while_file_exists(marker: str) -> None:
    if os.path.exists(marker):
        raise RuntimeError("model store unavailable")


def scaled(x: int) -> tuple[int, int]:
    """Uses the model loaded by the initializer."""
    return x * MODEL["scale"], MODEL["pid"]


def timed_sleep(label: str, seconds: float, log: str | None = None) -> dict[str, Any]:
    """Sleep in the worker, reporting when it ran; append the label to ``log`` if given."""
    started = time.monotonic()
    if log is not None:
        with open(log, "a") as f:
            f.write(label + "\n")
    time.sleep(seconds)
    return {"label": label, "pid": os.getpid(), "start": started, "end": time.monotonic()}


def pid_sleep(label: str, seconds: float, directory: str) -> dict[str, Any]:
    """Like :func:`timed_sleep`, recording this worker's pid in ``directory/label`` and the
    label in ``directory/ran`` before sleeping."""
    with open(os.path.join(directory, label), "w") as f:
        f.write(str(os.getpid()))
    return timed_sleep(label, seconds, os.path.join(directory, "ran"))


def whoami() -> int:
    return os.getpid()


def die(how: str) -> None:
    if how == "exit":
        os._exit(7)
    if how == "segfault":
        faulthandler.disable()  # the crash is the point: no traceback dump in the test log
        ctypes.string_at(0)  # a real invalid memory read
    raise AssertionError(f"unknown way to die: {how}")


class ModelInputError(ValueError):
    """A job-specific exception type that must reach the caller as itself."""

    def __init__(self, field: str) -> None:
        super().__init__(f"bad field {field}")
        self.field = field


def raise_model_error(field: str) -> None:
    raise ModelInputError(field)


class Unpicklable(Exception):
    def __init__(self, a: int, b: int) -> None:  # pickling re-calls __init__ with args only
        super().__init__(a)


def raise_unpicklable() -> None:
    raise Unpicklable(1, 2)


def return_unpicklable() -> Any:
    return lambda: None


def job(action: str, *args: Any) -> Any:
    """One entry point for the runner under test, so a test can mix kinds of jobs."""
    actions: dict[str, Callable[..., Any]] = {
        "sleep": timed_sleep,
        "pid_sleep": pid_sleep,
        "die": die,
        "raise": raise_model_error,
        "raise_unpicklable": raise_unpicklable,
        "return_unpicklable": return_unpicklable,
        "scaled": scaled,
        "whoami": whoami,
    }
    return actions[action](*args)


# --------------------------------------------------------------------------- helpers


async def wait_until(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


def block_the_loop(seconds: float) -> None:
    """Hold the event loop (the caller's thread) for ``seconds``: no reply is read and no
    job is sent meanwhile, as in a loop busy with many other requests."""
    time.sleep(seconds)


def read_log(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


# --------------------------------------------------------------------------- tests


async def test_n_workers_run_n_jobs_at_once() -> None:
    async with ModelRunner(job, workers=3, mp_context="fork") as runner:
        results = await asyncio.gather(*(runner.run("sleep", f"j{i}", 0.6) for i in range(3)))
    assert len({r["pid"] for r in results}) == 3
    # All three were running at the same moment: the last start precedes the first end.
    assert max(r["start"] for r in results) < min(r["end"] for r in results)
    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    assert wall < 1.5  # serial would be >= 1.8 s


@pytest.mark.parametrize("free_slot", [True, False])
async def test_a_reply_vacates_the_limiter_slot_that_submitted_the_job(free_slot: bool) -> None:
    """Inside ``async with limiter.acquire()``, the job's reply hands the slot on (the
    next caller is admitted before this one leaves its block); errors from the job too;
    jobs outside any limiter, or with free_slot=False, leave slots alone."""
    limiter = Limiter(1, max_queue_wait=10)
    async with ModelRunner(job, workers=1, mp_context="fork", free_slot=free_slot) as runner:
        await runner.run("whoami")  # outside any limiter: nothing to vacate
        async with limiter.acquire() as token:
            await runner.run("whoami")
            assert token.vacated is free_slot and not token.released
            assert limiter.inflight == (0 if free_slot else 1)
            waiting = asyncio.create_task(limiter.acquire().__aenter__())
            await asyncio.sleep(0.05)
            assert waiting.done() is free_slot
        (await waiting).success()
        async with limiter.acquire() as third:
            with pytest.raises(ModelInputError):
                await runner.run("raise", "bad field")
            assert third.vacated is free_slot  # a job that raised replied too
    assert limiter.inflight == 0 and limiter.snapshot().counts["success"] == 3


async def test_an_abandoned_or_failed_job_frees_no_slot_its_request_still_uses() -> None:
    """A request that gave up on one job (or whose worker died) and goes on keeps its slot:
    neither the abandoned job's reply nor the crash vacates it."""
    limiter = Limiter(1, max_queue_wait=10)
    async with ModelRunner(job, workers=1, mp_context="fork") as runner:
        async with limiter.acquire() as token:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(runner.run("sleep", "slow", 0.3), 0.05)
            await asyncio.sleep(0.5)  # the abandoned job has replied by now
            assert not token.vacated and limiter.inflight == 1
            with pytest.raises(WorkerCrashed):
                await runner.run("die", "exit")
            assert not token.vacated and limiter.inflight == 1
            await runner.run("whoami")  # the fallback's job hands the slot on
            assert token.vacated and limiter.inflight == 0
    assert limiter.snapshot().counts["success"] == 1


async def test_steady_jobs_hand_the_slot_on_before_their_end() -> None:
    """One slot, one worker, requests queued for it, each taking 15 ms from admission to
    run() and 100 ms in the worker. Handing the slot on at each reply leaves the worker
    idle for that 15 ms between jobs; once the job times and that gap have been measured,
    the slot goes on about 15 ms before a job's predicted end, and the next job is handed
    ahead, so the worker goes straight on to it."""
    limiter = Limiter(1, max_queue_wait=30)
    async with ModelRunner(job, workers=1, mp_context="fork") as runner:

        async def request(index: int) -> dict[str, Any]:
            async with limiter.acquire():
                await asyncio.sleep(0.015)  # the app's own way to run()
                result: dict[str, Any] = await runner.run("sleep", str(index), 0.1)
                return result

        results = await asyncio.gather(*(request(i) for i in range(28)))
    results.sort(key=lambda r: r["start"])
    gaps = [b["start"] - a["end"] for a, b in itertools.pairwise(results)]
    early, late = sorted(gaps[1:9]), sorted(gaps[-8:])
    assert early[4] > 0.010, gaps  # at the reply: the caller's 15 ms way in every gap
    assert late[4] < 0.5 * early[4], gaps
    assert limiter.inflight == 0 and limiter.snapshot().counts["success"] == 28


async def test_varied_jobs_hand_the_slot_on_at_their_reply_only() -> None:
    """Job times of 50 and 150 ms in turn: no end can be predicted, so no slot goes on
    before a reply and no request waits in a worker's pipe behind a job that overran."""
    limiter = Limiter(1, max_queue_wait=30)
    async with ModelRunner(job, workers=1, mp_context="fork") as runner:

        async def request(index: int) -> dict[str, Any]:
            async with limiter.acquire():
                await asyncio.sleep(0.015)
                seconds = 0.05 if index % 2 else 0.15
                result: dict[str, Any] = await runner.run("sleep", str(index), seconds)
                return result

        results = await asyncio.gather(*(request(i) for i in range(24)))
    results.sort(key=lambda r: r["start"])
    gaps = [b["start"] - a["end"] for a, b in itertools.pairwise(results)]
    assert min(gaps[1:]) > 0.010, gaps  # every job came the caller's 15 ms after a reply


async def test_no_job_dispatched_past_worker_count(tmp_path: Path) -> None:
    log = tmp_path / "started.log"
    async with ModelRunner(job, workers=2, mp_context="fork") as runner:
        tasks = [asyncio.create_task(runner.run("sleep", f"j{i}", 0.8, str(log))) for i in range(3)]
        await wait_until(lambda: len(read_log(log)) == 2)
        await asyncio.sleep(0.2)  # the third must still not have reached a worker
        assert len(read_log(log)) == 2
        stats = runner.stats()
        assert (stats.busy, stats.idle, stats.waiting) == (2, 0, 1)
        results = await asyncio.gather(*tasks)
    first_end = min(r["end"] for r in results[:2])
    assert results[2]["start"] >= first_end - 0.01
    assert results[2]["pid"] in {results[0]["pid"], results[1]["pid"]}


@pytest.mark.parametrize("hand_ahead", [True, False])
async def test_next_job_starts_while_the_event_loop_is_blocked(hand_ahead: bool) -> None:
    """One job is handed ahead: the worker starts it as soon as it finishes the one before,
    while the event loop is blocked (a synchronous sleep stands in for a loop busy with other
    requests); the job after it waits for the loop, in the runner's FIFO."""
    async with ModelRunner(job, workers=1, mp_context="fork", hand_ahead=hand_ahead) as runner:
        await runner.run("whoami")
        tasks = [
            asyncio.create_task(runner.run("sleep", label, seconds))
            for label, seconds in (("first", 0.2), ("second", 0.0), ("third", 0.0))
        ]
        await wait_until(lambda: runner.busy == 1 and runner.waiting == 2)
        blocked = time.monotonic()
        block_the_loop(1.0)
        unblocked = time.monotonic()
        first, second, third = await asyncio.gather(*tasks)
    assert first["end"] < blocked + 0.5
    if hand_ahead:
        assert first["end"] - 0.001 <= second["start"] < unblocked - 0.3
    else:
        assert second["start"] >= unblocked
    # Never more than one job handed ahead: the third reached the worker after the block.
    assert third["start"] >= unblocked
    assert [r["label"] for r in (first, second, third)] == ["first", "second", "third"]


async def test_a_large_job_is_not_handed_ahead_and_does_not_block_the_loop() -> None:
    """A busy worker does not read its pipe: a job too large for the socket's buffer waits
    for the worker to be idle instead of blocking the event loop in send."""
    async with ModelRunner(job, workers=1, mp_context="fork") as runner:
        first = asyncio.create_task(runner.run("sleep", "first", 0.6))
        await wait_until(lambda: runner.busy == 1)
        label = "x" * (4 << 20)
        submitted = time.monotonic()
        large = asyncio.create_task(runner.run("sleep", label, 0.0))
        await asyncio.sleep(0.05)
        assert time.monotonic() - submitted < 0.3
        assert runner.waiting == 1
        result = await large
        assert result["label"] == label
        assert result["start"] >= (await first)["end"] - 0.001


async def test_cancelled_callers_leave_no_job_behind(tmp_path: Path) -> None:
    """Cancelled while handed ahead (the worker skips it) or while in the FIFO (never sent):
    neither job runs, and the next caller gets its own result."""
    log = tmp_path / "started.log"
    async with ModelRunner(job, workers=1, mp_context="fork") as runner:
        busy = asyncio.create_task(runner.run("sleep", "busy", 0.4, str(log)))
        ahead = asyncio.create_task(runner.run("sleep", "ahead", 0.0, str(log)))
        queued = asyncio.create_task(runner.run("sleep", "queued", 0.0, str(log)))
        await wait_until(lambda: runner.stats().waiting == 2)
        ahead.cancel()
        queued.cancel()
        for task in (ahead, queued):
            with pytest.raises(asyncio.CancelledError):
                await task
        assert runner.stats().waiting == 0
        await busy
        after = await runner.run("sleep", "after", 0.0, str(log))
        stats = runner.stats()
    assert after["label"] == "after"
    assert read_log(log) == ["busy", "after"]
    assert (stats.skipped, stats.cancelled, stats.completed) == (1, 0, 2)


async def test_job_handed_ahead_and_cancelled_once_started_runs_for_nothing(
    tmp_path: Path,
) -> None:
    """The caller of a job handed ahead is cancelled after its worker started it, before the
    loop read the reply to the job before: the job runs to its end, its result is
    discarded, and the worker's next caller gets its own result."""
    log = tmp_path / "started.log"
    async with ModelRunner(job, workers=1, mp_context="fork") as runner:
        first = asyncio.create_task(runner.run("sleep", "first", 0.1, str(log)))
        ahead = asyncio.create_task(runner.run("sleep", "ahead", 0.3, str(log)))
        await wait_until(lambda: runner.stats().waiting == 1)
        block_the_loop(0.25)  # "first" ends and "ahead" starts meanwhile
        assert read_log(log) == ["first", "ahead"]
        ahead.cancel()
        with pytest.raises(asyncio.CancelledError):
            await ahead
        assert (await first)["label"] == "first"
        nxt = await asyncio.wait_for(runner.run("sleep", "next", 0.0, str(log)), 2.0)
        stats = runner.stats()
    assert nxt["label"] == "next"
    assert read_log(log) == ["first", "ahead", "next"]
    assert (stats.cancelled, stats.skipped, stats.completed) == (1, 0, 2)
    assert (stats.busy, stats.idle, stats.waiting) == (0, 1, 0)


async def test_cancelling_a_running_job_does_not_poison_the_worker() -> None:
    async with ModelRunner(job, workers=1, mp_context="fork") as runner:
        running = asyncio.create_task(runner.run("sleep", "abandoned", 0.5))
        await wait_until(lambda: runner.stats().busy == 1)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        # The worker is still busy with the abandoned job: the next job waits, then gets
        # its own result (not the abandoned one's).
        nxt = await runner.run("sleep", "next", 0.0)
        stats = runner.stats()
    assert nxt["label"] == "next"
    assert stats.cancelled == 1
    assert stats.completed == 1
    assert stats.restarts == 0


async def test_kill_on_cancel_frees_the_worker_at_once() -> None:
    """The killed worker's job handed ahead never started: it runs on the replacement."""
    async with ModelRunner(job, workers=1, mp_context="fork", kill_on_cancel=True) as r:
        running = asyncio.create_task(r.run("sleep", "abandoned", 30.0))
        ahead = asyncio.create_task(r.run("sleep", "ahead", 0.0))
        await wait_until(lambda: r.stats().busy == 1 and r.stats().waiting == 1)
        started = time.monotonic()
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        assert (await asyncio.wait_for(ahead, 2.0))["label"] == "ahead"
        nxt = await r.run("sleep", "next", 0.0)
        elapsed = time.monotonic() - started
        stats = r.stats()
    assert nxt["label"] == "next"
    assert elapsed < 2.0
    assert (stats.cancelled, stats.crashed, stats.restarts, stats.retried) == (1, 0, 1, 1)


@pytest.mark.parametrize(
    "how, exitcode, signal_name", [("exit", 7, None), ("segfault", -11, "SIGSEGV")]
)
async def test_crash_fails_only_its_job(how: str, exitcode: int, signal_name: str | None) -> None:
    async with ModelRunner(job, workers=2, mp_context="fork") as runner:
        bystander = asyncio.create_task(runner.run("sleep", "bystander", 0.5))
        await wait_until(lambda: runner.stats().busy == 1)
        with pytest.raises(WorkerCrashed) as info:
            await runner.run("die", how)
        assert info.value.exitcode == exitcode
        assert info.value.signal == signal_name
        crashed_at = time.monotonic()
        nxt = await runner.run("sleep", "next", 0.0)
        assert time.monotonic() - crashed_at < 2.0
        assert (await bystander)["label"] == "bystander"
        assert nxt["label"] == "next"
        stats = runner.stats()
    assert (stats.crashed, stats.completed, stats.restarts) == (1, 2, 1)


async def test_worker_killed_from_outside_mid_job() -> None:
    """SIGKILL (what the OOM killer sends) to a worker running a job."""
    async with ModelRunner(job, workers=1, mp_context="fork") as runner:
        pid = await runner.run("whoami")
        victim = asyncio.create_task(runner.run("sleep", "victim", 30.0))
        await wait_until(lambda: runner.stats().busy == 1)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerCrashed) as info:
            await victim
        assert info.value.signal == "SIGKILL"
        assert info.value.pid == pid
        killed_at = time.monotonic()
        new_pid = await runner.run("whoami")
        assert time.monotonic() - killed_at < 2.0
    assert new_pid != pid
    assert not psutil.pid_exists(pid)


@pytest.mark.parametrize("workers", [1, 2])
async def test_crash_with_a_job_handed_ahead_retries_that_job(tmp_path: Path, workers: int) -> None:
    """SIGKILL to a worker running a job with another handed ahead: the running job fails
    with WorkerCrashed; the one handed ahead never started there, and runs once elsewhere
    (behind the other worker's job with 2 workers, on the replacement with 1)."""
    async with ModelRunner(job, workers=workers, mp_context="fork") as runner:
        victim = asyncio.create_task(runner.run("pid_sleep", "victim", 30.0, str(tmp_path)))
        await wait_until(lambda: runner.busy == 1)
        other = (
            asyncio.create_task(runner.run("pid_sleep", "other", 0.5, str(tmp_path)))
            if workers == 2
            else None
        )
        # Handed ahead to the worker busy the longest: the victim's.
        ahead = asyncio.create_task(runner.run("pid_sleep", "ahead", 0.0, str(tmp_path)))
        await wait_until(lambda: runner.busy == workers and runner.waiting == 1)
        await wait_until(lambda: len(read_log(tmp_path / "ran")) == workers)
        victim_pid = int((tmp_path / "victim").read_text())
        os.kill(victim_pid, signal.SIGKILL)
        with pytest.raises(WorkerCrashed) as info:
            await victim
        assert (info.value.pid, info.value.signal) == (victim_pid, "SIGKILL")
        result = await asyncio.wait_for(ahead, 5.0)
        assert result["pid"] != victim_pid
        if other is not None:
            other_result = await other
            assert result["pid"] == other_result["pid"]
            assert result["start"] >= other_result["end"] - 0.001
        stats = runner.stats()
    assert read_log(tmp_path / "ran").count("ahead") == 1
    assert (stats.crashed, stats.retried, stats.restarts) == (1, 1, 1)
    assert stats.completed == workers


async def test_job_timeout_kills_and_replaces_the_worker() -> None:
    """The job handed ahead to the stuck worker runs on its replacement, with a timeout of
    its own counted from when it starts there."""
    async with ModelRunner(job, workers=1, mp_context="fork", job_timeout=0.3) as runner:
        pid = await runner.run("whoami")
        started = time.monotonic()
        stuck = asyncio.create_task(runner.run("sleep", "stuck", 30.0))
        ahead = asyncio.create_task(runner.run("sleep", "ahead", 0.2))
        with pytest.raises(JobTimeout) as info:
            await stuck
        assert 0.25 < time.monotonic() - started < 2.0
        assert info.value.timeout == pytest.approx(0.3)
        result = await asyncio.wait_for(ahead, 2.0)
        new_pid = await runner.run("whoami")
        stats = runner.stats()
    assert new_pid != pid and result["pid"] == new_pid
    assert (stats.timed_out, stats.crashed, stats.restarts, stats.retried) == (1, 0, 1, 1)


async def test_exceptions_from_fn_keep_their_type_and_traceback() -> None:
    async with ModelRunner(job, workers=1, mp_context="fork") as runner:
        with pytest.raises(ModelInputError) as info:
            await runner.run("raise", "pixels")
        assert info.value.field == "pixels"
        assert isinstance(info.value.__cause__, RemoteTraceback)
        assert "raise_model_error" in str(info.value.__cause__)
        # An exception that cannot be pickled back still reaches the caller, named.
        with pytest.raises(Exception, match="Unpicklable"):
            await runner.run("raise_unpicklable")
        with pytest.raises(Exception, match="result could not be sent"):
            await runner.run("return_unpicklable")
        # An argument that cannot be pickled fails in the caller; the worker is untouched.
        with pytest.raises((AttributeError, TypeError, ValueError)):
            await runner.run("sleep", lambda: None, 0.0)
        assert runner.stats().idle == 1
        assert (await runner.run("sleep", "ok", 0.0))["label"] == "ok"
        stats = runner.stats()
    assert (stats.failed, stats.completed, stats.crashed) == (3, 1, 0)


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
async def test_start_methods_load_the_model_once_per_worker(method: str) -> None:
    async with ModelRunner(
        job, workers=2, initializer=load_model, initargs=(3,), mp_context=method
    ) as runner:
        assert runner.start_method == method
        results = await asyncio.gather(*(runner.run("scaled", i) for i in range(6)))
        with pytest.raises(WorkerCrashed):
            await runner.run("die", "exit")
        after = await asyncio.wait_for(runner.run("scaled", 5), 2.0)
    assert [value for value, _ in results] == [0, 3, 6, 9, 12, 15]
    assert os.getpid() not in {pid for _, pid in results}
    assert len({pid for _, pid in results}) == 2
    assert after[0] == 15


async def test_failing_initializer_fails_start_and_leaves_no_process() -> None:
    children_before = {child.pid for child in psutil.Process().children()}
    runner = ModelRunner(job, workers=2, initializer=failing_initializer, mp_context="fork")
    with pytest.raises(WorkerInitError, match="model file missing") as info:
        await runner.start()
    assert "failing_initializer" in str(info.value.__cause__)
    assert runner.closed
    await wait_until(
        lambda: not {child.pid for child in psutil.Process().children()} - children_before
    )


async def test_close_fails_waiting_and_running_jobs_and_stops_workers() -> None:
    runner = ModelRunner(job, workers=1, mp_context="fork")
    await runner.start()
    pid = await runner.run("whoami")
    running = asyncio.create_task(runner.run("sleep", "running", 30.0))
    waiting = asyncio.create_task(runner.run("sleep", "waiting", 0.0))
    await wait_until(lambda: runner.stats().waiting == 1)
    await runner.close()
    with pytest.raises(RunnerClosed):
        await running
    with pytest.raises(RunnerClosed):
        await waiting
    with pytest.raises(RunnerClosed):
        await runner.run("whoami")
    assert not psutil.pid_exists(pid)
    await runner.close()  # idempotent


async def test_stats_report_service_time_percentiles() -> None:
    async with ModelRunner(job, workers=2, mp_context="fork") as runner:
        assert runner.stats().service_count == 0
        await asyncio.gather(*(runner.run("sleep", "s", 0.1) for _ in range(4)))
        stats = runner.stats()
    assert stats.service_count == 4
    assert 0.09 < stats.service_p50 < 1.0
    assert stats.service_p50 <= stats.service_p99 <= stats.service_max
    assert stats.as_dict()["completed"] == 4


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"workers": 0}, "workers"),
        ({"workers": 1.5}, "workers"),
        ({"mp_context": "threads"}, "mp_context"),
        ({"job_timeout": 0}, "job_timeout"),
        ({"job_timeout": float("nan")}, "job_timeout"),
        ({"initializer": 42}, "initializer"),
    ],
)
def test_invalid_configuration_names_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        ModelRunner(job, **kwargs)
    assert info.value.field == field
    assert str(info.value).startswith(field)


async def test_closures_need_fork_and_say_so_otherwise() -> None:
    offset = 10
    async with ModelRunner(lambda x: x + offset, workers=1, mp_context="fork") as runner:
        assert await runner.run(1) == 11
    runner = ModelRunner(lambda x: x + offset, workers=1, mp_context="spawn")
    with pytest.raises(WorkerInitError, match="module-level"):
        await runner.start()


async def test_replacement_whose_initializer_fails_is_retried(tmp_path: Path) -> None:
    marker = tmp_path / "store-down"
    async with ModelRunner(
        job,
        workers=1,
        initializer=initializer_failing_while_file_exists,
        initargs=(str(marker),),
        mp_context="fork",
    ) as runner:
        marker.touch()
        with pytest.raises(WorkerCrashed):
            await runner.run("die", "exit")
        waiting = asyncio.create_task(runner.run("whoami"))
        await asyncio.sleep(0.5)  # replacements keep failing (with back-off) meanwhile
        assert not waiting.done()
        assert runner.stats().restarts >= 2
        marker.unlink()
        pid = await asyncio.wait_for(waiting, 5.0)
        assert pid in runner.pids()


@pytest.mark.parametrize("hand_ahead", [True, False])
async def test_random_cancellations_leak_no_job_and_no_worker(
    tmp_path: Path, hand_ahead: bool
) -> None:
    """Callers cancelled while running and while waiting, in a random order: every job that
    reached a worker is accounted for (ran for nothing, or skipped), every other caller gets
    its own result, a waiting caller's job runs only if its worker took it up before the
    cancel reached it, and the workers end idle."""
    import random

    rng = random.Random(7)
    log = tmp_path / "started.log"
    async with ModelRunner(job, workers=2, mp_context="fork", hand_ahead=hand_ahead) as runner:
        labels = [f"c{i}" for i in range(40)]
        tasks = {
            label: asyncio.create_task(
                runner.run("sleep", label, rng.uniform(0.02, 0.04), str(log))
            )
            for label in labels
        }
        cancelled_running: set[str] = set()
        cancelled_waiting: set[str] = set()
        for label in rng.sample(labels, 16):
            if tasks[label].done():
                continue
            if rng.random() < 0.4:  # wait until it runs, then cancel it mid-job
                task = tasks[label]
                await wait_until(lambda t=task, lb=label: lb in read_log(log) or t.done())
                if tasks[label].done():
                    continue
                cancelled_running.add(label)
            elif label in read_log(log):
                continue
            else:
                cancelled_waiting.add(label)
            tasks[label].cancel()
            await asyncio.sleep(rng.uniform(0, 0.01))
        outcomes = await asyncio.gather(*tasks.values(), return_exceptions=True)
        await wait_until(lambda: runner.busy == 0)
        stats = runner.stats()
    assert cancelled_running and cancelled_waiting  # both paths were exercised
    for label, outcome in zip(labels, outcomes, strict=True):
        if label in cancelled_running | cancelled_waiting:
            assert isinstance(outcome, asyncio.CancelledError)
        else:
            assert isinstance(outcome, dict)
            assert outcome["label"] == label
    ran = read_log(log)
    assert len(ran) == len(set(ran))
    # Not yet started when its caller was cancelled, but already in a worker's pipe: the
    # worker got to it before the cancel (the log check and the cancel are not atomic).
    ran_anyway = cancelled_waiting & set(ran)
    assert len(ran_anyway) <= 2
    assert cancelled_running <= set(ran)
    assert stats.cancelled == len(cancelled_running) + len(ran_anyway)
    assert len(ran) == stats.completed + stats.cancelled
    assert stats.skipped <= len(cancelled_waiting) - len(ran_anyway)
    assert (stats.idle, stats.waiting, stats.crashed, stats.restarts) == (2, 0, 0, 0)


# --------------------------------------------------------------------------- worker bound


def test_absurd_worker_count_is_refused_before_any_process_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(MAX_WORKERS_ENV, raising=False)
    children_before = {child.pid for child in psutil.Process().children()}
    bound, reason = machine_worker_bound()
    assert 1 <= bound <= 8 * (os.cpu_count() or 1)
    with pytest.raises(ConfigError) as info:
        ModelRunner(job, workers=100_000)
    message = str(info.value)
    assert info.value.field == "workers"
    assert f"at most {bound} on this machine ({reason})" in message
    assert "max_workers=" in message and MAX_WORKERS_ENV in message
    assert "\n" not in message
    assert {child.pid for child in psutil.Process().children()} == children_before
    ModelRunner(job, workers=bound)  # the bound itself is allowed (nothing starts yet)


def test_worker_bound_is_overridable_on_purpose(monkeypatch: pytest.MonkeyPatch) -> None:
    bound, _ = machine_worker_bound()
    assert ModelRunner(job, workers=bound + 1, max_workers=bound + 1).workers == bound + 1
    with pytest.raises(ConfigError, match=r"^workers: must be at most max_workers \(3\)"):
        ModelRunner(job, workers=4, max_workers=3)
    monkeypatch.setenv(MAX_WORKERS_ENV, "2")
    assert machine_worker_bound() == (2, f"{MAX_WORKERS_ENV}=2")
    with pytest.raises(ConfigError, match=f"at most 2 on this machine \\({MAX_WORKERS_ENV}=2\\)"):
        ModelRunner(job, workers=3)
    monkeypatch.setenv(MAX_WORKERS_ENV, "lots")
    with pytest.raises(ConfigError) as info:
        ModelRunner(job, workers=1)
    assert info.value.field == MAX_WORKERS_ENV


_STARTUP_SCRIPT = """
import asyncio, os, signal, sys, time
from loadshed.runner import ModelRunner

def slow_initializer(directory):
    with open(os.path.join(directory, str(os.getpid())), "w"):
        pass
    time.sleep(60)

def job():
    return os.getpid()

async def main(directory, method, mode):
    runner = ModelRunner(job, workers=4, initializer=slow_initializer,
                         initargs=(directory,), mp_context=method)
    if mode == "handled":  # as a server does: SIGTERM cancels the start-up
        asyncio.get_running_loop().add_signal_handler(
            signal.SIGTERM, asyncio.current_task().cancel)
    await runner.start()

if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
"""


@pytest.mark.parametrize(
    "method, mode",
    [("fork", "default"), ("forkserver", "default"), ("spawn", "default"), ("fork", "handled")],
)
def test_sigterm_during_startup_stops_everything_at_once(
    tmp_path: Path, method: str, mode: str
) -> None:
    """A runner of 4 workers whose initializer takes a minute, SIGTERMed while they start:
    the process exits within seconds and none of its children (workers, fork server)
    remains, whether SIGTERM kills the process (default) or a handler cancels the start."""
    import subprocess
    import sys

    script = tmp_path / "start_runner.py"  # a file: spawn and forkserver import it by name
    script.write_text(_STARTUP_SCRIPT)
    pids = tmp_path / "pids"
    pids.mkdir()
    process = subprocess.Popen(
        [sys.executable, str(script), str(pids), method, mode],
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while len(list(pids.iterdir())) < 4:  # every initializer is running
            if process.poll() is not None:
                assert process.stderr is not None
                raise AssertionError(f"the runner's process exited: {process.stderr.read()!r}")
            assert time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.02)
        parent = psutil.Process(process.pid)
        children = parent.children(recursive=True)
        workers = {int(path.name) for path in pids.iterdir()}
        assert workers <= {child.pid for child in children}
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=10)
        assert time.monotonic() - sent < 3.0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

    def gone(child: psutil.Process) -> bool:
        try:
            return child.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    deadline = time.monotonic() + 3.0
    try:
        while not all(gone(child) for child in children):
            left = [child.pid for child in children if not gone(child)]
            assert time.monotonic() < deadline, f"processes left behind: {left}"
            time.sleep(0.02)
    finally:  # on failure, do not leave them to the next test
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()


# --------------------------------------------------------------------------- live workers


async def test_live_workers_follow_crashes_and_replacements(tmp_path: Path) -> None:
    runner = ModelRunner(job, workers=2, mp_context="fork")
    seen: list[int] = []
    runner.add_workers_listener(seen.append)
    assert runner.live_workers == 2  # not started: run() would start it
    await runner.start()
    assert runner.live_workers == 2
    assert seen[0] == 0 and seen[-1] == 2  # none ready at first, then both
    seen.clear()
    with pytest.raises(WorkerCrashed):
        await runner.run("die", "exit")
    assert seen[0] == 1  # counted as gone at once
    await wait_until(lambda: runner.live_workers == 2)
    assert seen == [1, 2]
    runner.remove_workers_listener(seen.append)
    await runner.close()
    assert runner.live_workers == 0
    assert seen == [1, 2]


def payload_size(data: bytes, seconds: float) -> int:
    time.sleep(seconds)
    return len(data)


def test_large_jobs_under_uvloop_never_corrupt_the_pipe() -> None:
    """uvloop's add_reader puts the pipe in non-blocking mode; a job larger than the
    socket buffer was then written in part (BlockingIOError after a partial write), the
    worker waited forever for the rest, and every later job with it. Jobs of 1 MiB, sent
    while the worker is busy and while it reads, must all come back."""
    uvloop = pytest.importorskip("uvloop")
    sizes = [(1 << 20) + i for i in range(12)]

    async def main() -> list[int]:
        async with ModelRunner(payload_size, workers=1, mp_context="fork") as runner:
            calls = [runner.run(b"x" * size, 0.005) for size in sizes]
            return await asyncio.wait_for(asyncio.gather(*calls), timeout=30)

    assert uvloop.run(main()) == sizes
