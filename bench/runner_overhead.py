"""ModelRunner versus ProcessPoolExecutor, side by side in one run.

Per-call cost (a trivial job, so only the machinery is measured):

- ``sequential``: one caller, one call after the other: round-trip latency p50/p99;
- ``concurrent``: ``--concurrency`` callers (default: 4 x workers) hammering ``--workers``
  processes for ``--calls`` calls: calls per second.

Both executors exist side by side and are measured in ``--rounds`` interleaved rounds; the
table gives medians (the machine may be shared).

Behaviour (the reasons ModelRunner exists, docs/design.md, "Pitfalls designed around"):

- ``cancel``: 2 workers busy with 0.3 s jobs, 8 more callers waiting, all 8 cancelled: how many
  of the cancelled jobs ran anyway (ProcessPoolExecutor's hidden call queue cannot be
  cancelled);
- ``crash``: one job calls ``os._exit`` while another runs: how many jobs failed, and whether
  the next ``--workers`` calls succeed (one of them needs the replacement worker); for
  ModelRunner, how long a replacement takes to be ready (initializer included; trivial here).

    .venv/bin/python bench/runner_overhead.py    # fork, 2 workers, 5,000 calls, 3 rounds
    .venv/bin/python bench/runner_overhead.py --mp-context forkserver --calls 2000

With ``--job-ms MS`` it measures throughput alone, on a job that holds its worker MS
milliseconds (``time.sleep``, so the parent's CPU share is the same for every executor), for
each worker count given to ``--workers``, with the event loop free and (``--busy-loop``) kept
busy by other coroutines: ``--busy-tasks`` tasks each doing ``--busy-us`` microseconds of CPU
between awaits, as a server answering thousands of refusals a second does. It also reports how
long a worker stays idle between the end of a job and the start of its next, from stamps taken
in the workers (so that a sleep overrun on a loaded machine, which lowers calls/s for every
executor, is not counted as a gap), and the job time as the workers saw it.
``--baseline FILE`` adds a runner.py of an earlier version (``fork`` only), measured in the
same rounds::

    git show 885d856:src/loadshed/runner.py > /tmp/runner_old.py   # before hand_ahead
    .venv/bin/python bench/runner_overhead.py --job-ms 5 --workers 1 2 --busy-loop \
        --baseline /tmp/runner_old.py
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib.util
import itertools
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from loadshed.runner import ModelRunner, WorkerCrashed


def echo(x: int) -> int:
    """The trivial job."""
    return x


def hold(milliseconds: float) -> tuple[int, float, float]:
    """The --job-ms job: holds its worker without using the CPU; returns the worker's pid and
    when the job started and ended (``time.monotonic`` is system-wide on Linux)."""
    started = time.monotonic()
    time.sleep(milliseconds / 1000)
    return os.getpid(), started, time.monotonic()


def logged_sleep(label: str, seconds: float, log: str) -> str:
    with open(log, "a") as f:
        f.write(label + "\n")
    time.sleep(seconds)
    return label


def crash_or_sleep(action: str) -> str:
    if action == "crash":
        os._exit(3)
    time.sleep(0.3)
    return action


def dispatch(fn: Callable[..., Any], *args: Any) -> Any:
    """The pools' function: run the job kind it is given (one pool serves every kind)."""
    return fn(*args)


Call = Callable[..., Awaitable[Any]]


def percentile(sorted_values: list[float], q: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(q / 100 * len(sorted_values)) - 1))
    return sorted_values[index]


async def sequential(call: Call, calls: int) -> dict[str, float]:
    latencies = []
    for i in range(calls):
        started = time.perf_counter()
        await call(echo, i)
        latencies.append(time.perf_counter() - started)
    latencies.sort()
    return {"p50_us": percentile(latencies, 50) * 1e6, "p99_us": percentile(latencies, 99) * 1e6}


async def concurrent(call: Call, calls: int, concurrency: int) -> float:
    remaining = iter(range(calls))

    async def caller() -> None:
        for i in remaining:
            await call(echo, i)

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return calls / (time.perf_counter() - started)


async def cancel_waiting(call: Call, workers: int, log_dir: str) -> int:
    log = Path(log_dir) / f"cancel-{time.monotonic_ns()}.log"
    busy = [
        asyncio.ensure_future(call(logged_sleep, f"busy{i}", 0.3, str(log))) for i in range(workers)
    ]
    await asyncio.sleep(0.1)
    waiting = [asyncio.ensure_future(call(logged_sleep, f"w{i}", 0.0, str(log))) for i in range(8)]
    await asyncio.sleep(0.05)
    for task in waiting:
        task.cancel()
    await asyncio.gather(*busy, *waiting, return_exceptions=True)
    await asyncio.sleep(0.5)  # let anything already queued run
    return sum(1 for line in log.read_text().split() if line.startswith("w"))


async def crash(call: Call, workers: int) -> tuple[int, str]:
    """One job crashes while another runs: failed jobs, then one job per worker (so one of
    them needs the replacement)."""
    results = await asyncio.gather(
        call(crash_or_sleep, "sleep"), call(crash_or_sleep, "crash"), return_exceptions=True
    )
    failed = sum(1 for r in results if isinstance(r, BaseException))
    try:
        after_crash = [call(crash_or_sleep, "after") for _ in range(workers)]
        await asyncio.wait_for(asyncio.gather(*after_crash), 5)
        after = f"all {workers} succeed"
    except Exception as exc:
        after = f"fails: {type(exc).__name__}"
    return failed, after


async def replacement_seconds(runner: ModelRunner[Any]) -> float:
    """From a crash reaching its caller until every worker is ready again."""
    with contextlib.suppress(WorkerCrashed):
        await runner.run(crash_or_sleep, "crash")
    started = time.perf_counter()
    while runner.idle < runner.workers:
        await asyncio.sleep(0.0005)
    return time.perf_counter() - started


async def held_calls(
    call: Call, calls: int, concurrency: int, job_ms: float
) -> tuple[float, float, float]:
    """``concurrency`` callers making ``calls`` calls of :func:`hold` in all: calls/s, the
    mean time a worker spent between the end of a job and the start of its next (stamps
    taken in the workers, so a sleep overrun on a loaded machine is not counted), and the
    mean job time as the workers saw it."""
    remaining = iter(range(calls))
    stamps: list[tuple[int, float, float]] = []

    async def caller() -> None:
        for _ in remaining:
            stamps.append(await call(hold, job_ms))

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    rate = calls / (time.perf_counter() - started)
    stamps.sort()
    gaps = [
        after[1] - before[2]
        for before, after in itertools.pairwise(stamps)
        if before[0] == after[0]
    ]
    return rate, statistics.mean(gaps), statistics.mean(end - start for _, start, end in stamps)


@contextlib.asynccontextmanager
async def busy_loop(tasks: int, busy_us: float) -> AsyncIterator[None]:
    """Keep the event loop busy: ``tasks`` coroutines, each spinning ``busy_us`` microseconds
    of CPU between awaits, so every pass of the loop costs tasks x busy_us."""
    stop = False

    async def spin() -> None:
        while not stop:
            until = time.perf_counter() + busy_us / 1e6
            while time.perf_counter() < until:
                pass
            await asyncio.sleep(0)

    running = [asyncio.create_task(spin()) for _ in range(tasks)]
    try:
        yield
    finally:
        stop = True
        await asyncio.gather(*running)


def load_baseline(path: str) -> Any:
    """Import an earlier runner.py as a module of its own."""
    spec = importlib.util.spec_from_file_location("loadshed_runner_baseline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


async def job_throughput(args: argparse.Namespace) -> None:
    """calls/s on a job of --job-ms, per worker count and event-loop state."""
    context = multiprocessing.get_context(args.mp_context)
    loop = asyncio.get_running_loop()
    baseline = load_baseline(args.baseline) if args.baseline else None
    loop_states = ["free", "busy"] if args.busy_loop else ["free"]
    print(
        f"job {args.job_ms:g} ms (sleep) start method={args.mp_context} rounds={args.rounds} "
        f"(medians of interleaved rounds, {args.seconds:g} s each) cpus={os.cpu_count()} "
        f"busy loop: {args.busy_tasks} tasks x {args.busy_us:g} us of CPU between awaits\n"
    )
    print(
        "| workers | event loop | executor | calls/s | vs ProcessPoolExecutor "
        "| worker idle between jobs | job as run |\n"
        "| --- | --- | --- | ---: | ---: | ---: | ---: |"
    )
    for workers in args.workers:
        concurrency = args.concurrency or 4 * workers
        calls = max(20, round(args.seconds * workers * 1000 / args.job_ms))
        async with contextlib.AsyncExitStack() as stack:
            callers: dict[str, Call] = {}
            runner: ModelRunner[Any] = ModelRunner(dispatch, workers=workers, mp_context=context)
            callers["ModelRunner"] = runner.run
            no_ahead: ModelRunner[Any] = ModelRunner(
                dispatch, workers=workers, mp_context=context, hand_ahead=False
            )
            callers["ModelRunner hand_ahead=False"] = no_ahead.run
            if baseline is not None:
                old = baseline.ModelRunner(dispatch, workers=workers, mp_context=context)
                callers["ModelRunner (baseline)"] = old.run
                await stack.enter_async_context(old)
            await stack.enter_async_context(runner)
            await stack.enter_async_context(no_ahead)
            pool = stack.enter_context(ProcessPoolExecutor(workers, mp_context=context))
            callers["ProcessPoolExecutor"] = functools.partial(loop.run_in_executor, pool)
            measure = functools.partial(
                held_calls, calls=calls, concurrency=concurrency, job_ms=args.job_ms
            )
            for call in callers.values():
                await held_calls(call, 4 * workers, concurrency, args.job_ms)  # warm-up
            for state in loop_states:
                samples: dict[str, list[tuple[float, float, float]]] = {
                    name: [] for name in callers
                }
                for _ in range(args.rounds):
                    for name, call in callers.items():
                        if state == "busy":
                            async with busy_loop(args.busy_tasks, args.busy_us):
                                samples[name].append(await measure(call))
                        else:
                            samples[name].append(await measure(call))
                pool_rate = statistics.median(r for r, _, _ in samples["ProcessPoolExecutor"])
                for name, values in samples.items():
                    rate = statistics.median(r for r, _, _ in values)
                    gap = statistics.median(g for _, g, _ in values)
                    held = statistics.median(h for _, _, h in values)
                    print(
                        f"| {workers} | {state} | {name} | {rate:.0f} | {rate / pool_rate:.2f} "
                        f"| {gap * 1e6:.0f} us | {held * 1e3:.2f} ms |"
                    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--workers", type=int, nargs="+", default=[2], help="several counts with --job-ms"
    )
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=0, help="default: 4 x workers")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median)")
    parser.add_argument("--mp-context", default="fork", choices=["fork", "forkserver", "spawn"])
    parser.add_argument(
        "--job-ms", type=float, default=0.0, help="throughput on a job this long, alone"
    )
    parser.add_argument(
        "--seconds", type=float, default=0.5, help="with --job-ms: length of each measurement"
    )
    parser.add_argument("--busy-loop", action="store_true", help="with --job-ms: also busy")
    parser.add_argument("--busy-tasks", type=int, default=8)
    parser.add_argument("--busy-us", type=float, default=100.0)
    parser.add_argument("--baseline", help="with --job-ms: an earlier runner.py (fork only)")
    args = parser.parse_args()
    if args.baseline and args.mp_context != "fork":
        parser.error("--baseline needs --mp-context fork (its module is not importable by name)")
    if args.job_ms > 0:
        await job_throughput(args)
        return
    args.workers = args.workers[0]
    concurrency = args.concurrency or 4 * args.workers
    context = multiprocessing.get_context(args.mp_context)
    loop = asyncio.get_running_loop()
    rows: dict[str, dict[str, Any]] = {"ModelRunner": {}, "ProcessPoolExecutor": {}}

    # Per-call cost. Both pools live side by side and are measured in alternating rounds (the
    # machine is shared: medians of interleaved rounds, not one long run each).
    runner: ModelRunner[Any] = ModelRunner(dispatch, workers=args.workers, mp_context=context)
    samples: dict[str, dict[str, list[float]]] = {
        name: {"p50_us": [], "p99_us": [], "calls_per_s": []} for name in rows
    }
    async with runner:
        with ProcessPoolExecutor(args.workers, mp_context=context) as pool:

            def via_runner(fn: Callable[..., Any], *a: Any) -> Awaitable[Any]:
                return runner.run(fn, *a)

            def via_pool(fn: Callable[..., Any], *a: Any) -> Awaitable[Any]:
                return loop.run_in_executor(pool, fn, *a)

            callers = {"ModelRunner": via_runner, "ProcessPoolExecutor": via_pool}
            for call in callers.values():
                await concurrent(call, 200, concurrency)  # warm-up
            for _ in range(args.rounds):
                for name, call in callers.items():
                    seq = await sequential(call, args.calls // 5)
                    samples[name]["p50_us"].append(seq["p50_us"])
                    samples[name]["p99_us"].append(seq["p99_us"])
                    samples[name]["calls_per_s"].append(
                        await concurrent(call, args.calls, concurrency)
                    )
    for name in rows:
        for key, values in samples[name].items():
            rows[name][key] = statistics.median(values)

    # Behaviour.
    with TemporaryDirectory() as log_dir:
        async with ModelRunner(dispatch, workers=args.workers, mp_context=context) as runner:

            def via_runner2(fn: Callable[..., Any], *a: Any) -> Awaitable[Any]:
                return runner.run(fn, *a)

            rows["ModelRunner"]["cancelled_ran"] = await cancel_waiting(
                via_runner2, args.workers, log_dir
            )
            rows["ModelRunner"]["crash"] = await crash(via_runner2, args.workers)
            replaced = statistics.median([await replacement_seconds(runner) for _ in range(5)])
        with ProcessPoolExecutor(args.workers, mp_context=context) as pool:

            def via_pool2(fn: Callable[..., Any], *a: Any) -> Awaitable[Any]:
                return loop.run_in_executor(pool, fn, *a)

            rows["ProcessPoolExecutor"]["cancelled_ran"] = await cancel_waiting(
                via_pool2, args.workers, log_dir
            )
        with ProcessPoolExecutor(args.workers, mp_context=context) as pool:
            rows["ProcessPoolExecutor"]["crash"] = await crash(via_pool2, args.workers)

    print(
        f"workers={args.workers} start method={args.mp_context} calls={args.calls} "
        f"concurrency={concurrency} rounds={args.rounds} (medians) cpus={os.cpu_count()}\n"
    )
    print(
        "| executor | sequential p50 | sequential p99 | calls/s at concurrency "
        "| cancelled waiters that ran (of 8) | one job crashes: failed jobs | next call |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, row in rows.items():
        failed, after = row["crash"]
        print(
            f"| {name} | {row['p50_us']:.0f} us | {row['p99_us']:.0f} us | "
            f"{row['calls_per_s']:.0f} | {row['cancelled_ran']} | {failed} of 2 | {after} |"
        )
    print(
        f"\nModelRunner: a crashed worker is replaced and ready {replaced * 1000:.1f} ms after "
        "the crash reached its caller (median of 5; trivial initializer)"
    )
    ratio = rows["ModelRunner"]["calls_per_s"] / rows["ProcessPoolExecutor"]["calls_per_s"]
    print(f"\nthroughput ratio ModelRunner / ProcessPoolExecutor: {ratio:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
