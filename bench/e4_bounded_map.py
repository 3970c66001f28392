"""E4: backpressure for bulk async work (docs/design.md, "Reference experiments").

100,000 inputs, concurrency 500, each call awaiting U(0.1, 0.2) s. Compares, in one
run and on the same pre-drawn durations, the four variants of the published write-up
with ``bounded_map``:

- ``batching``: ``gather`` over consecutive batches of ``concurrency`` inputs;
- ``sem-in-task``: one task per input created up front, a semaphore taken inside it;
- ``sem-before+callback``: semaphore acquired before the task is created, released by
  a done callback;
- ``sem-before+release-in-task``: the same, released in the task's ``finally``;
- ``bounded_map`` in completion order and in input order (``ordered=True``).

Wall time and tracemalloc peak are measured together (tracing on), one variant after
the other. The physical limit is sum(durations) / concurrency.

    .venv/bin/python bench/e4_bounded_map.py            # 100,000 inputs (~4 min)
    .venv/bin/python bench/e4_bounded_map.py --quick    # 10,000 inputs (~25 s)
    .venv/bin/python bench/e4_bounded_map.py --repeat 3 # median of 3, round-robin
"""

from __future__ import annotations

import asyncio
import gc
import heapq
import json
import random
import statistics
import time
import tracemalloc
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass
from typing import Any

import click

from loadshed.bounded import bounded_map

DURATIONS: list[float] = []
"""Per-input sleep, drawn once before tracing so every variant does the same work."""


async def work(index: int) -> int:
    """The unit of work: await its pre-drawn duration and return the input."""
    await asyncio.sleep(DURATIONS[index])
    return index


async def batching(inputs: int, concurrency: int) -> int:
    done = 0
    for start in range(0, inputs, concurrency):
        batch = range(start, min(start + concurrency, inputs))
        results = await asyncio.gather(*(work(index) for index in batch))
        done += len(results)
    return done


async def semaphore_in_task(inputs: int, concurrency: int) -> int:
    semaphore = asyncio.Semaphore(concurrency)

    async def guarded(index: int) -> int:
        async with semaphore:
            return await work(index)

    tasks = [asyncio.create_task(guarded(index)) for index in range(inputs)]
    results = await asyncio.gather(*tasks)
    return len(results)


async def semaphore_before_callback(inputs: int, concurrency: int) -> int:
    semaphore = asyncio.Semaphore(concurrency)
    running: set[asyncio.Task[int]] = set()
    done = 0

    def finished(task: asyncio.Task[int]) -> None:
        nonlocal done
        running.discard(task)
        semaphore.release()
        task.result()
        done += 1

    for index in range(inputs):
        await semaphore.acquire()
        task = asyncio.create_task(work(index))
        running.add(task)
        task.add_done_callback(finished)
    await asyncio.gather(*running)
    return done


async def semaphore_before_release_in_task(inputs: int, concurrency: int) -> int:
    semaphore = asyncio.Semaphore(concurrency)
    running: set[asyncio.Task[int]] = set()
    done = 0

    async def guarded(index: int) -> int:
        nonlocal done
        try:
            result = await work(index)
            done += 1
            return result
        finally:
            semaphore.release()

    for index in range(inputs):
        await semaphore.acquire()
        task = asyncio.create_task(guarded(index))
        running.add(task)
        task.add_done_callback(running.discard)
    await asyncio.gather(*running)
    return done


async def bounded_unordered(inputs: int, concurrency: int) -> int:
    done = 0
    async for _ in bounded_map(work, range(inputs), concurrency):
        done += 1
    return done


async def bounded_ordered(inputs: int, concurrency: int) -> int:
    expected = 0
    async for result in bounded_map(work, range(inputs), concurrency, ordered=True):
        if result != expected:
            raise AssertionError(f"ordered: got input {result}, expected {expected}")
        expected += 1
    return expected


VARIANTS: dict[str, Callable[[int, int], Coroutine[Any, Any, int]]] = {
    "batching": batching,
    "sem-in-task": semaphore_in_task,
    "sem-before+callback": semaphore_before_callback,
    "sem-before+release-in-task": semaphore_before_release_in_task,
    "bounded_map": bounded_unordered,
    "bounded_map ordered": bounded_ordered,
}


@dataclass
class Result:
    variant: str
    wall_s: float
    """Median wall time over the repeats."""
    best_wall_s: float
    over_ideal_pct: float
    cpu_s: float
    """Median process CPU time (the event loop's work, tracemalloc included)."""
    peak_mb: float
    walls_s: list[float]


def run_once(
    name: str, inputs: int, concurrency: int, loop: str, trace: bool
) -> tuple[float, float, float]:
    """One run of a variant: (wall s, CPU s, tracemalloc peak MB or NaN)."""
    variant = VARIANTS[name]
    gc.collect()
    if trace:
        tracemalloc.start()
    started = time.perf_counter()
    cpu_started = time.process_time()
    if loop == "uvloop":
        import uvloop

        results = uvloop.run(variant(inputs, concurrency))
    else:
        results = asyncio.run(variant(inputs, concurrency))
    wall_s = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_started
    peak_mb = float("nan")
    if trace:
        peak_mb = tracemalloc.get_traced_memory()[1] / 1e6
        tracemalloc.stop()
    if results != inputs:
        raise AssertionError(f"{name}: {results} results for {inputs} inputs")
    return wall_s, cpu_s, peak_mb


def measure_all(
    names: list[str],
    inputs: int,
    concurrency: int,
    ideal_s: float,
    loop: str,
    separate: bool,
    repeat: int,
) -> list[Result]:
    """Run every variant ``repeat`` times, round-robin with a rotating start, so a
    burst of load from elsewhere does not fall on one variant only. With
    ``separate``, runs are timed without tracemalloc (which slows every
    allocation) and memory is measured in one more traced run per variant."""
    runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in names}
    for round_index in range(repeat):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            runs[name].append(run_once(name, inputs, concurrency, loop, trace=not separate))
            click.echo(f"  {name}: {runs[name][-1][0]:.2f} s", err=True)
    results = []
    for name in names:
        walls = [wall for wall, _, _ in runs[name]]
        peak_mb = max(peak for _, _, peak in runs[name])
        if separate:
            peak_mb = run_once(name, inputs, concurrency, loop, trace=True)[2]
        wall_s = statistics.median(walls)
        results.append(
            Result(
                variant=name,
                wall_s=wall_s,
                best_wall_s=min(walls),
                over_ideal_pct=100 * (wall_s / ideal_s - 1),
                cpu_s=statistics.median(cpu for _, cpu, _ in runs[name]),
                peak_mb=peak_mb,
                walls_s=walls,
            )
        )
    return results


def greedy_makespan(durations: list[float], slots: int) -> float:
    """When the last call ends if each input starts the instant a slot frees."""
    free_at = [0.0] * min(slots, len(durations))
    for duration in durations:
        heapq.heapreplace(free_at, free_at[0] + duration)
    return max(free_at)


@click.command()
@click.option("--inputs", type=click.IntRange(min=1), default=100_000, show_default=True)
@click.option("--concurrency", type=click.IntRange(min=1), default=500, show_default=True)
@click.option("--quick", is_flag=True, help="10,000 inputs instead of --inputs.")
@click.option(
    "--variant",
    "variants",
    type=click.Choice(list(VARIANTS)),
    multiple=True,
    help="Run only these variants (repeatable). Default: all.",
)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option(
    "--repeat",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Runs per variant, round-robin; the table shows the median.",
)
@click.option(
    "--loop", type=click.Choice(["asyncio", "uvloop"]), default="asyncio", show_default=True
)
@click.option(
    "--separate-memory-run/--one-run",
    default=False,
    show_default=True,
    help="Time each variant without tracemalloc and measure memory in a second run "
    "(default: both in one traced run).",
)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Also write JSON.")
def main(
    inputs: int,
    concurrency: int,
    quick: bool,
    variants: tuple[str, ...],
    seed: int,
    repeat: int,
    loop: str,
    separate_memory_run: bool,
    json_path: str | None,
) -> None:
    """E4: bounded_map against the published backpressure variants."""
    if quick:
        inputs = 10_000
    rng = random.Random(seed)
    DURATIONS[:] = [rng.uniform(0.1, 0.2) for _ in range(inputs)]
    ideal_s = sum(DURATIONS) / concurrency
    click.echo(
        f"E4: {inputs:,} inputs, concurrency {concurrency}, U(0.1, 0.2) s each; "
        f"physical limit {ideal_s:.2f} s (sum / concurrency); "
        f"zero-overhead greedy schedule {greedy_makespan(DURATIONS, concurrency):.2f} s; "
        f"{loop}; " + ("timed without tracemalloc" if separate_memory_run else "tracemalloc on")
    )
    names = list(variants or VARIANTS)
    rows = measure_all(names, inputs, concurrency, ideal_s, loop, separate_memory_run, repeat)
    click.echo("")
    click.echo("| variant | wall s (median) | best | over limit | CPU s | tracemalloc peak MB |")
    click.echo("| --- | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        click.echo(
            f"| {row.variant} | {row.wall_s:.2f} | {row.best_wall_s:.2f} "
            f"| {row.over_ideal_pct:+.1f} % | {row.cpu_s:.1f} | {row.peak_mb:.2f} |"
        )
    if json_path:
        payload = {
            "inputs": inputs,
            "concurrency": concurrency,
            "ideal_s": ideal_s,
            "loop": loop,
            "separate_memory_run": separate_memory_run,
            "repeat": repeat,
            "results": [asdict(row) for row in rows],
        }
        with open(json_path, "w", encoding="utf-8") as handle:
            json.dump(payload, handle, indent=2)


if __name__ == "__main__":
    main()
