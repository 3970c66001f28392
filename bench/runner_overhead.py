"""ModelRunner versus ProcessPoolExecutor, side by side in one run.

Per-call cost (a trivial job, so only the machinery is measured):

- ``sequential``: one caller, one call after the other: round-trip latency p50/p99;
- ``concurrent``: ``--concurrency`` callers (default: 4 x workers) hammering ``--workers``
  processes for ``--calls`` calls: calls per second.

Both executors exist side by side and are measured in ``--rounds`` interleaved rounds; the
table gives medians (the machine may be shared).

Behaviour (the reasons ModelRunner exists, DESIGN.md section 8):

- ``cancel``: 2 workers busy with 0.3 s jobs, 8 more callers waiting, all 8 cancelled: how many
  of the cancelled jobs ran anyway (ProcessPoolExecutor's hidden call queue cannot be
  cancelled);
- ``crash``: one job calls ``os._exit`` while another runs: how many jobs failed, and whether
  the next ``--workers`` calls succeed (one of them needs the replacement worker); for
  ModelRunner, how long a replacement takes to be ready (initializer included; trivial here).

    .venv/bin/python bench/runner_overhead.py    # fork, 2 workers, 5,000 calls, 3 rounds
    .venv/bin/python bench/runner_overhead.py --mp-context forkserver --calls 2000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from loadshed.runner import ModelRunner, WorkerCrashed


def echo(x: int) -> int:
    """The trivial job."""
    return x


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


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=0, help="default: 4 x workers")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median)")
    parser.add_argument("--mp-context", default="fork", choices=["fork", "forkserver", "spawn"])
    args = parser.parse_args()
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
