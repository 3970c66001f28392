"""bounded_map: bounded tasks and memory, ordering, errors, cancellation, adaptivity."""

from __future__ import annotations

import asyncio
import gc
import random
import tracemalloc
from collections.abc import AsyncIterator, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadshed.bounded import bounded_map
from loadshed.clock import VirtualClock
from loadshed.errors import ConfigError
from loadshed.limits import Vegas
from loadshed.limits.base import LimitAlgorithm, Sample


class Gauge:
    """Counts calls running now, the most ever running, and inputs taken."""

    def __init__(self) -> None:
        self.active = 0
        self.peak = 0
        self.pulled = 0
        self.started: list[asyncio.Task[object]] = []
        self.cancelled = 0

    def source(self, count: int) -> Iterator[int]:
        for index in range(count):
            self.pulled += 1
            yield index

    async def call(self, index: int, seconds: float) -> int:
        task = asyncio.current_task()
        assert task is not None
        self.started.append(task)
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.active -= 1
        return index


async def zero_work(index: int) -> int:
    return index


async def test_memory_stays_bounded_over_a_million_item_generator() -> None:
    items = 1_000_000
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        count = 0
        total = 0
        async for result in bounded_map(zero_work, (i for i in range(items)), concurrency=100):
            count += 1
            total += result
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == items
    assert total == items * (items - 1) // 2
    # Creating every task up front would need ~1.5 GB; a result list ~40 MB.
    assert peak < 1_000_000, f"tracemalloc peak {peak} bytes"


async def test_at_most_concurrency_calls_and_inputs_taken_only_when_a_slot_frees() -> None:
    gauge = Gauge()
    rng = random.Random(3)
    concurrency = 7
    in_flight_at_pull: list[int] = []

    async def call(index: int) -> int:
        return await gauge.call(index, rng.uniform(0.0005, 0.003))

    def source() -> Iterator[int]:
        for index in range(300):
            in_flight_at_pull.append(results.in_flight)
            yield index

    results = bounded_map(call, source(), concurrency)
    out = [result async for result in results]
    assert sorted(out) == list(range(300))
    assert gauge.peak == concurrency
    # every input was taken while a slot was free, and slots were kept full
    assert max(in_flight_at_pull) == concurrency - 1


async def test_slow_consumer_pauses_the_producer() -> None:
    gauge = Gauge()
    results = bounded_map(lambda index: gauge.call(index, 0), gauge.source(1000), 10)
    first = await results.__anext__()
    await asyncio.sleep(0.05)  # every call could have finished many times over
    assert first in range(10)
    # finished calls were replaced at once, up to max_held (2 x 10) held results
    assert results.held == 20
    assert gauge.pulled == 21

    gauge = Gauge()
    results = bounded_map(lambda index: gauge.call(index, 0), gauge.source(1000), 10, max_held=12)
    await results.__anext__()
    await asyncio.sleep(0.05)
    assert results.held == 12
    assert gauge.pulled == 13
    await results.aclose()


async def test_ordered_mode_yields_input_order() -> None:
    rng = random.Random(7)
    durations = [rng.uniform(0, 0.004) for _ in range(200)]

    async def call(index: int) -> int:
        await asyncio.sleep(durations[index])
        return index

    out = [result async for result in bounded_map(call, range(200), 16, ordered=True)]
    assert out == list(range(200))


async def test_ordered_mode_max_held_bounds_what_is_held() -> None:
    gauge = Gauge()
    max_held = 0

    async def call(index: int) -> int:
        # input 0 blocks the head of the line while the others finish at once
        return await gauge.call(index, 0.05 if index == 0 else 0)

    results = bounded_map(call, gauge.source(100), 4, ordered=True, max_held=10)
    out = []
    async for result in results:
        out.append(result)
        max_held = max(max_held, results.held)
    assert out == list(range(100))
    assert max_held <= 10
    assert gauge.peak <= 4

    # while input 0 runs, the producer stops at the window instead of buffering more
    gauge = Gauge()
    results = bounded_map(call, gauge.source(100), 4, ordered=True, max_held=10)
    first = asyncio.ensure_future(results.__anext__())
    await asyncio.sleep(0.02)
    assert not first.done()
    assert gauge.pulled == 10
    assert await first == 0
    await results.aclose()


async def test_ordered_default_window_is_twice_the_limit() -> None:
    gauge = Gauge()

    async def call(index: int) -> int:
        return await gauge.call(index, 0.05 if index == 0 else 0)

    results = bounded_map(call, gauge.source(1000), 5, ordered=True)
    first = asyncio.ensure_future(results.__anext__())
    await asyncio.sleep(0.02)
    assert gauge.pulled == 10
    assert await first == 0
    await results.aclose()


@pytest.mark.parametrize("ordered", [False, True])
async def test_an_exception_cancels_calls_in_flight_and_is_raised_at_once(ordered: bool) -> None:
    gauge = Gauge()

    async def call(index: int) -> int:
        if index == 5:
            await asyncio.sleep(0.01)
            raise ValueError("input 5 is bad")
        return await gauge.call(index, 30)

    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(ValueError, match="input 5 is bad"):
        async for _ in bounded_map(call, gauge.source(10_000), 20, ordered=ordered):
            pass
    assert loop.time() - started < 5
    assert len(gauge.started) == 19
    assert all(task.done() for task in gauge.started)
    assert gauge.cancelled == 19
    assert gauge.pulled == 20  # nothing taken after the failure


async def test_return_exceptions_yields_errors_in_place() -> None:
    async def call(index: int) -> int:
        await asyncio.sleep(0.001 * (index % 3))
        if index % 4 == 0:
            raise KeyError(index)
        return index

    out = [r async for r in bounded_map(call, range(20), 5, True, return_exceptions=True)]
    assert len(out) == 20
    for index, result in enumerate(out):
        if index % 4 == 0:
            assert isinstance(result, KeyError)
            assert result.args == (index,)
        else:
            assert result == index


async def test_fn_that_fails_before_awaiting_is_an_error_of_that_input() -> None:
    def not_async(index: int) -> int:
        if index == 1:
            raise RuntimeError("sync failure")
        return index  # not awaitable

    results = bounded_map(not_async, range(3), 2, True, return_exceptions=True)  # type: ignore[arg-type]
    out = [r async for r in results]
    assert isinstance(out[0], TypeError)
    assert isinstance(out[1], RuntimeError)
    assert isinstance(out[2], TypeError)


async def test_early_break_in_async_with_cancels_everything_in_flight() -> None:
    gauge = Gauge()

    async def call(index: int) -> int:
        return await gauge.call(index, 0 if index < 3 else 30)

    async with bounded_map(call, gauge.source(1000), 10) as results:
        async for result in results:
            if result == 2:
                break
    assert all(task.done() for task in gauge.started)
    assert gauge.cancelled == len(gauge.started) - 3
    assert gauge.pulled <= 13
    assert [r async for r in results] == []  # closed


async def test_cancelling_the_consumer_cancels_everything_in_flight() -> None:
    gauge = Gauge()

    async def consume() -> None:
        async for _ in bounded_map(lambda i: gauge.call(i, 30), gauge.source(100), 8):
            pass

    consumer = asyncio.ensure_future(consume())
    await asyncio.sleep(0.02)
    assert gauge.active == 8
    consumer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await consumer
    assert len(gauge.started) == 8
    assert all(task.done() for task in gauge.started)
    assert gauge.cancelled == 8


async def test_aclose_from_another_task_ends_the_iteration() -> None:
    gauge = Gauge()
    results = bounded_map(lambda i: gauge.call(i, 30), gauge.source(100), 4)

    async def consume() -> list[int]:
        return [result async for result in results]

    consumer = asyncio.ensure_future(consume())
    await asyncio.sleep(0.01)
    await results.aclose()
    assert await asyncio.wait_for(consumer, 1) == []
    assert gauge.cancelled == 4
    assert all(task.done() for task in gauge.started)


async def test_an_abandoned_iterator_cancels_its_calls_when_collected() -> None:
    gauge = Gauge()
    async for result in bounded_map(lambda i: gauge.call(i, 0 if i == 0 else 30), range(50), 5):
        assert result == 0
        break
    gc.collect()
    await asyncio.sleep(0.01)
    # input 0 finished (and its slot may have been refilled); the rest were cancelled
    assert len(gauge.started) in (5, 6)
    assert all(task.done() for task in gauge.started)
    assert gauge.cancelled == len(gauge.started) - 1


async def test_async_iterable_source() -> None:
    taken = 0

    async def source() -> AsyncIterator[int]:
        nonlocal taken
        for index in range(50):
            await asyncio.sleep(0.0005)
            taken += 1
            yield index

    gauge = Gauge()
    results = bounded_map(lambda i: gauge.call(i, 0.002), source(), 4)
    out = sorted([r async for r in results])
    assert out == list(range(50))
    assert gauge.peak <= 4
    assert taken == 50


async def test_a_slow_async_source_does_not_hold_back_finished_results() -> None:
    release = asyncio.Event()

    async def source() -> AsyncIterator[int]:
        yield 0
        await release.wait()  # e.g. a queue with nothing new for a while
        yield 1

    results = bounded_map(zero_work, source(), 4)
    assert await asyncio.wait_for(results.__anext__(), 1) == 0
    release.set()
    assert await asyncio.wait_for(results.__anext__(), 1) == 1
    with pytest.raises(StopAsyncIteration):
        await results.__anext__()


async def test_a_failing_source_raises_and_cancels_calls_in_flight() -> None:
    gauge = Gauge()

    async def source() -> AsyncIterator[int]:
        yield 0
        yield 1
        await asyncio.sleep(0.01)
        raise OSError("source broke")

    with pytest.raises(OSError, match="source broke"):
        async for _ in bounded_map(lambda i: gauge.call(i, 30), source(), 4):
            pass
    assert len(gauge.started) == 2
    assert all(task.done() for task in gauge.started)


async def test_empty_input() -> None:
    assert [r async for r in bounded_map(zero_work, [], 3)] == []
    assert [r async for r in bounded_map(zero_work, [], 3, ordered=True)] == []


class StepLimit(LimitAlgorithm):
    """Test algorithm: records samples; limit 1 until `raise_after` samples, then 3."""

    name = "step"
    min_limit = 1
    max_limit = 3

    def __init__(self, raise_after: int) -> None:
        self.samples: list[Sample] = []
        self.raise_after = raise_after
        self._limit = 1

    @property
    def limit(self) -> int:
        return self._limit

    def update(self, sample: Sample) -> int:
        self.samples.append(sample)
        if len(self.samples) >= self.raise_after:
            self._limit = 3
        return self._limit


async def test_adaptive_concurrency_samples_each_call_and_follows_the_limit() -> None:
    clock = VirtualClock()
    algorithm = StepLimit(raise_after=3)
    peaks: list[int] = []
    gauge = Gauge()

    async def call(index: int) -> int:
        clock.advance(0.25)  # every call "takes" 0.25 s of virtual time
        if index == 1:
            raise TimeoutError("upstream too slow")
        if index == 2:
            raise ValueError("bad input: says nothing about capacity")
        result = await gauge.call(index, 0.002)
        peaks.append(gauge.peak)
        return result

    results = bounded_map(call, range(12), algorithm, return_exceptions=True, clock=clock)
    out = [r async for r in results]
    assert len(out) == 12
    # one sample per completed call, except the ValueError (ignored)
    assert len(algorithm.samples) == 11
    assert [s.dropped for s in algorithm.samples[:2]] == [False, True]
    assert algorithm.samples[0].rtt == pytest.approx(0.25)
    assert algorithm.samples[0].inflight == 1
    # the limit was 1 for the first calls and read again after each completion
    assert peaks[0] == 1
    assert gauge.peak == 3
    assert results.limit == 3


async def test_concurrency_by_limit_name() -> None:
    results = bounded_map(zero_work, range(50), "vegas")
    assert results.limit == Vegas().limit  # the initial limit of a new Vegas
    assert sorted([r async for r in results]) == list(range(50))
    with pytest.raises(ConfigError, match=r"^concurrency: unknown limit 'fastest'"):
        bounded_map(zero_work, range(3), "fastest")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": "many"}, "concurrency"),
        ({"concurrency": 2.5}, "concurrency"),
        ({"concurrency": True}, "concurrency"),
        ({"max_held": 0}, "max_held"),
    ],
)
def test_invalid_configuration_names_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{field}: "):
        bounded_map(zero_work, range(3), **kwargs)  # type: ignore[call-overload]


def test_non_iterable_input_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^iterable: "):
        bounded_map(zero_work, 42)  # type: ignore[call-overload]


Spec = list[tuple[int, bool]]  # per input: event-loop steps to take, whether it fails

specs = st.lists(st.tuples(st.integers(0, 4), st.booleans()), max_size=40)


async def run_spec(
    spec: Spec,
    concurrency: int,
    ordered: bool,
    max_held: int | None,
    async_source: bool,
    return_exceptions: bool,
) -> None:
    gauge = Gauge()
    held_seen: list[int] = []

    async def call(index: int) -> int:
        steps, fails = spec[index]
        task = asyncio.current_task()
        assert task is not None
        gauge.started.append(task)
        gauge.active += 1
        gauge.peak = max(gauge.peak, gauge.active)
        try:
            for _ in range(steps):
                await asyncio.sleep(0)
        finally:
            gauge.active -= 1
        if fails:
            raise ValueError(index)
        return index

    async def asource() -> AsyncIterator[int]:
        for index in range(len(spec)):
            await asyncio.sleep(0)
            yield index

    source = asource() if async_source else iter(range(len(spec)))
    if not return_exceptions:
        plain = bounded_map(call, source, concurrency, ordered, max_held=max_held)
        try:
            out_plain = [r async for r in plain]
        except ValueError as error:
            assert spec[error.args[0]][1]  # raised the error of an input that fails
        else:
            assert not any(fails for _, fails in spec)
            assert sorted(out_plain) == list(range(len(spec)))
        assert all(task.done() for task in gauge.started)
        return
    results = bounded_map(
        call, source, concurrency, ordered, return_exceptions=True, max_held=max_held
    )
    out: list[int | BaseException] = []
    async for result in results:
        out.append(result)
        held_seen.append(results.held)
    assert all(task.done() for task in gauge.started)
    assert gauge.peak <= concurrency
    bound = 2 * concurrency if max_held is None else max_held
    assert all(held <= bound for held in held_seen)
    values = [r.args[0] if isinstance(r, ValueError) else r for r in out]
    if ordered:
        assert values == list(range(len(spec)))
    else:
        assert sorted(values) == list(range(len(spec)))  # type: ignore[type-var]
    for index, result in zip(values, out, strict=True):
        assert isinstance(result, ValueError) == spec[index][1]  # type: ignore[index]


@settings(max_examples=80, deadline=None)
@given(
    spec=specs,
    concurrency=st.integers(1, 6),
    ordered=st.booleans(),
    max_held=st.one_of(st.none(), st.integers(1, 12)),
    async_source=st.booleans(),
    return_exceptions=st.booleans(),
)
def test_properties_hold_for_any_interleaving(
    spec: Spec,
    concurrency: int,
    ordered: bool,
    max_held: int | None,
    async_source: bool,
    return_exceptions: bool,
) -> None:
    asyncio.run(run_spec(spec, concurrency, ordered, max_held, async_source, return_exceptions))


async def test_with_a_cost_the_limit_bounds_the_cost_in_flight() -> None:
    running: list[int] = []
    snapshots: list[list[int]] = []

    async def work(size: int) -> int:
        running.append(size)
        snapshots.append(list(running))
        await asyncio.sleep(0.002 * (size % 3 + 1))
        running.remove(size)
        return size

    sizes = [5, 1, 8, 3, 30, 2, 7, 4, 6, 1] * 5  # 30 alone exceeds the limit of 10
    async with bounded_map(work, sizes, concurrency=10, cost=float) as results:
        done = sorted([size async for size in results])
    assert done == sorted(sizes)
    for snapshot in snapshots:
        assert sum(snapshot) <= 10 or snapshot == [30]  # the big one runs alone
    assert [30] in snapshots
    assert max(sum(s) for s in snapshots if s != [30]) >= 8  # the budget is used


async def test_a_bad_cost_is_raised_like_a_source_error() -> None:
    async def work(x: int) -> int:
        return x

    with pytest.raises(ConfigError, match="cost"):
        async with bounded_map(work, [1, 2, -3], concurrency=10, cost=float) as results:
            [x async for x in results]
    with pytest.raises(ConfigError, match="cost"):
        bounded_map(work, [1], cost=3)  # type: ignore[arg-type]
    # An adaptive limit counts calls; with costs the limit is a budget of cost.
    with pytest.raises(ConfigError, match=r"^concurrency: with cost= must be an int"):
        bounded_map(work, [1], concurrency="aimd", cost=float)


async def test_with_a_cost_the_default_max_held_counts_calls_not_cost_units() -> None:
    # The default was twice the limit: 2,000 results held for a budget of 1,000 tokens
    # in inputs of 100 (10 in flight). It is twice the most calls in flight at once.
    gauge = Gauge()
    head = asyncio.Event()
    held: list[int] = []

    async def call(index: int) -> int:
        gauge.active += 1
        gauge.peak = max(gauge.peak, gauge.active)
        if index == 0:
            await head.wait()  # the head of the line blocks; the others end at once
        else:
            await asyncio.sleep(0)
        gauge.active -= 1
        held.append(results.held)
        return index

    results = bounded_map(
        call, gauge.source(500), concurrency=1000, ordered=True, cost=lambda _: 100.0
    )
    first = asyncio.ensure_future(results.__anext__())
    for _ in range(200):  # far more loop turns than the calls need to end
        await asyncio.sleep(0)
    assert not first.done()
    assert gauge.peak == 10  # the cost budget: 10 inputs of 100
    assert results.held == 20 and gauge.pulled == 20  # the head and 19 results behind it
    head.set()
    out = [await first] + [index async for index in results]
    assert out == list(range(500))
    assert max(held) <= 20
    # An explicit max_held is still honoured as given.
    gauge = Gauge()
    results = bounded_map(
        lambda index: gauge.call(index, 0), gauge.source(100), 1000, max_held=5, cost=lambda _: 1.0
    )
    async with results:
        out = []
        async for index in results:
            out.append(index)
            assert results.held <= 5
    assert sorted(out) == list(range(100))


@pytest.mark.parametrize("bad", ["source", "cost"])
async def test_a_failure_on_the_first_input_is_raised_not_waited_on(bad: str) -> None:
    # Taken by the consumer's own fill with nothing running: nothing woke its wait.
    def source() -> Iterator[int]:
        if bad == "source":
            raise ValueError("boom")
        yield 0

    with pytest.raises(ValueError if bad == "source" else ConfigError):
        async with bounded_map(zero_work, source(), 10, cost=float) as results:
            [index async for index in results]
