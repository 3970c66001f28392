"""The asyncio Limiter: waiting, cancellation, queue timeouts and outcomes, in real time
with generous bounds."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from loadshed.errors import ConfigError, Outcome, Priority, Rejected, RejectReason
from loadshed.limiter import Limiter
from loadshed.limits.fixed import Fixed
from loadshed.runner import ModelRunner


async def test_context_manager_records_success_and_frees_the_slot() -> None:
    limiter = Limiter(Fixed(1))
    async with limiter.acquire() as token:
        assert limiter.inflight == 1
    assert token.outcome is Outcome.SUCCESS
    assert limiter.inflight == 0 and limiter.snapshot().counts["success"] == 1


async def test_timeout_error_is_dropped_and_other_errors_ignored() -> None:
    limiter = Limiter(Fixed(2))
    with pytest.raises(TimeoutError):
        async with limiter.acquire() as dropped:
            raise TimeoutError
    with pytest.raises(ValueError):
        async with limiter.acquire() as ignored:
            raise ValueError("bug")
    assert dropped.outcome is Outcome.DROPPED
    assert ignored.outcome is Outcome.IGNORED
    assert limiter.inflight == 0


async def test_waiters_are_served_in_order_as_slots_free() -> None:
    limiter = Limiter(Fixed(1), max_queue_wait=5)
    order: list[int] = []

    async def worker(i: int) -> None:
        async with limiter.acquire():
            order.append(i)
            await asyncio.sleep(0.01)

    await asyncio.gather(*(worker(i) for i in range(5)))
    assert order == [0, 1, 2, 3, 4]
    assert limiter.snapshot().counts["queued"] == 4


async def test_cancelled_waiter_leaves_queue_and_frees_nothing() -> None:
    limiter = Limiter(Fixed(1), max_queue_wait=5)
    holder = await limiter.acquire()
    waiter = asyncio.create_task(limiter._acquire(Priority.DEFAULT, None))
    await asyncio.sleep(0.01)
    assert limiter.queue_length == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert limiter.queue_length == 0 and limiter.inflight == 1
    assert limiter.snapshot().counts["rejected:client_gone"] == 1
    holder.success()
    assert limiter.inflight == 0


async def test_queue_timeout_rejects_the_waiter_by_itself() -> None:
    limiter = Limiter(Fixed(1), max_queue_wait=0.05)
    holder = await limiter.acquire()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(Rejected) as info:
        await asyncio.wait_for(limiter.acquire(), timeout=5)
    waited = loop.time() - started
    assert info.value.reason is RejectReason.QUEUE_TIMEOUT
    assert 0.04 <= waited < 2.0
    holder.success()


async def test_try_acquire_never_queues() -> None:
    limiter = Limiter(Fixed(1))
    token = limiter.try_acquire()
    with pytest.raises(Rejected) as info:
        limiter.try_acquire()
    assert info.value.reason is RejectReason.LIMIT
    token.success()


async def test_spec_strings_and_ints_build_the_algorithm() -> None:
    assert Limiter(3).limit == 3
    assert Limiter("fixed:4").limit == 4
    assert Limiter().snapshot().algorithm.startswith("little")


async def test_leave_ends_a_queued_wait_with_the_reason_and_never_releases_a_granted_token() -> (
    None
):
    from loadshed.limiter import Waiting

    limiter = Limiter(Fixed(1), max_queue_wait=5)
    held = limiter.try_acquire()
    first = limiter.enter()
    second = limiter.enter()
    assert isinstance(first, Waiting) and isinstance(second, Waiting)
    assert first.leave(RejectReason.CLIENT_GONE) is True
    with pytest.raises(Rejected) as info:
        await first.future
    assert info.value.reason is RejectReason.CLIENT_GONE
    assert limiter.queue_length == 1
    assert limiter.snapshot().counts["rejected:client_gone"] == 1
    held.release()  # the second waiter gets the slot
    token = await second.future
    assert second.leave(RejectReason.CLIENT_GONE) is False
    assert not token.released and limiter.inflight == 1
    token.release()
    assert limiter.inflight == 0


def test_enter_without_a_running_loop_leaves_nothing_queued() -> None:
    limiter = Limiter(Fixed(1), max_queue_wait=5)
    held = limiter.try_acquire()
    with pytest.raises(RuntimeError):
        limiter.enter()
    assert limiter.queue_length == 0
    held.release()  # nothing left to grant: no error, nothing in flight
    assert limiter.inflight == 0


# --------------------------------------------------------------------------- runner=


def _replacement_is_slow(marker: str) -> None:
    """Runner initializer: slow (0.6 s) while ``marker`` exists, so a replaced worker
    stays gone long enough to be seen."""
    if os.path.exists(marker):
        time.sleep(0.6)


def _sleep(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


async def _until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


async def test_runner_live_worker_count_is_the_limit_through_a_real_crash(
    tmp_path: Path,
) -> None:
    """Kill a worker process: the limit drops at once, a request queues behind the one
    running although a slot was configured for it, and it is granted as soon as the
    replacement is ready, with no token released."""
    marker = tmp_path / "slow"
    async with ModelRunner(
        _sleep,
        workers=2,
        initializer=_replacement_is_slow,
        initargs=(str(marker),),
        mp_context="fork",
    ) as runner:
        limiter = Limiter(runner=runner, max_queue_wait=10.0)
        assert limiter.limit == 2
        assert limiter.snapshot().algorithm == "workers(2 of 2)"
        marker.touch()
        os.kill(runner.pids()[0], signal.SIGKILL)
        await _until(lambda: limiter.limit == 1)
        held = await limiter.acquire()
        waiting = asyncio.create_task(limiter._acquire(Priority.DEFAULT, None))
        await asyncio.sleep(0.1)
        assert not waiting.done() and limiter.queue_length == 1
        granted = await asyncio.wait_for(waiting, 5.0)  # the replacement is ready
        assert limiter.limit == 2 and runner.live_workers == 2
        assert not held.released and limiter.inflight == 2
        # Both granted requests find a worker each: none waits inside the runner.
        pids = await asyncio.gather(runner.run(0.05), runner.run(0.05))
        assert len(set(pids)) == 2 and runner.stats().crashed == 0
        held.release(Outcome.SUCCESS)
        granted.release(Outcome.SUCCESS)
        # Every worker gone: the limit is 0 and a request waits for one in the queue.
        for pid in runner.pids():
            os.kill(pid, signal.SIGKILL)
        await _until(lambda: limiter.limit == 0)
        token = await asyncio.wait_for(limiter.acquire(), 5.0)
        assert runner.live_workers >= 1
        token.release(Outcome.SUCCESS)
    assert limiter.limit == 0  # closed


def test_runner_and_an_explicit_limit_are_a_config_error() -> None:
    runner: ModelRunner[int] = ModelRunner(_sleep, workers=2)
    with pytest.raises(ConfigError, match=r"^runner: .*not both \(got limit='aimd'\)"):
        Limiter("aimd", runner=runner)
    with pytest.raises(ConfigError, match=r"^runner: expected a ModelRunner"):
        Limiter(runner=object())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^limit: 'workers' .* pass runner="):
        Limiter("workers")
    assert Limiter(runner=runner).limit == 2  # not started yet: run() would start it
