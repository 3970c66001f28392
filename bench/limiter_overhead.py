"""Cost of an uncontended acquire + release, beside asyncio.Semaphore in the same run.

    .venv/bin/python bench/limiter_overhead.py [--iterations 200000] [--repeat 5]

Reports the best of ``--repeat`` runs (microseconds per acquire+release) for:
the admission core (try_acquire + success), the asyncio Limiter (``async with``),
and ``asyncio.Semaphore`` (``async with``) as the reference floor.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable

from loadshed.limiter import Limiter


def bench_core(limiter: Limiter, iterations: int) -> float:
    start = time.perf_counter()
    for _ in range(iterations):
        limiter.try_acquire().success()
    return time.perf_counter() - start


async def bench_limiter(limiter: Limiter, iterations: int) -> float:
    start = time.perf_counter()
    for _ in range(iterations):
        async with limiter.acquire():
            pass
    return time.perf_counter() - start


async def bench_semaphore(semaphore: asyncio.Semaphore, iterations: int) -> float:
    start = time.perf_counter()
    for _ in range(iterations):
        async with semaphore:
            pass
    return time.perf_counter() - start


def best_of(repeat: int, run: Callable[[], float]) -> float:
    return min(run() for _ in range(repeat))


async def best_of_async(repeat: int, run: Callable[[], Awaitable[float]]) -> float:
    return min([await run() for _ in range(repeat)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iterations", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    n = args.iterations
    rows: list[tuple[str, float]] = []
    for spec in ("fixed:64", "little"):
        limiter = Limiter(spec)
        rows.append(
            (
                f"core try_acquire+success ({spec})",
                best_of(args.repeat, lambda limiter=limiter: bench_core(limiter, n)),
            )
        )

        async def run_limiter(limiter: Limiter = limiter) -> float:
            return await best_of_async(args.repeat, lambda: bench_limiter(limiter, n))

        rows.append((f"Limiter async with ({spec})", asyncio.run(run_limiter())))

    async def run_semaphore() -> float:
        semaphore = asyncio.Semaphore(64)
        return await best_of_async(args.repeat, lambda: bench_semaphore(semaphore, n))

    rows.append(("asyncio.Semaphore async with (reference)", asyncio.run(run_semaphore())))
    print(f"| path | us per acquire+release (best of {args.repeat} x {n}) |")
    print("| --- | --- |")
    for label, seconds in rows:
        print(f"| {label} | {seconds / n * 1e6:.2f} |")


if __name__ == "__main__":
    main()
