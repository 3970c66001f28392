"""Limits on a model whose service times vary widely, in the simulator (virtual time).

    .venv/bin/python bench/little_variable.py [--limits little,fixed:8,gradient2] [--seeds 1,2,3]

E1's closed loop against 8 workers with a 100 ms mean service time (exponential,
log-normal sigma 0.5, log-normal sigma 1), client timeout 0.5 s, 30 s per client count
(4, 8, 16, 64). Prints goodput / capacity per client count, the mean over ``--seeds``,
and the mean limit. A second table: one worker at E1's 0.5 s, log-normal sigma 0.5, 2 s
timeout, 4 and 16 clients. Deterministic per seed.
"""

from __future__ import annotations

import argparse
import statistics

from loadshed.sim.scenarios import LimiterConfig, ServiceConfig, run_paradox

DISTRIBUTIONS = (("exponential", 0.5), ("lognormal", 0.5), ("lognormal", 1.0))
CLIENTS = (4, 8, 16, 64)


def mean_over_seeds(limit: str, seeds: list[int], **scenario: object) -> list[tuple[float, float]]:
    """(mean goodput ratio, mean limit) per client count, averaged over seeds."""
    runs = [run_paradox(limiter=LimiterConfig(limit), seed=seed, **scenario) for seed in seeds]  # type: ignore[arg-type]
    per_count = zip(*(run["steps"] for run in runs), strict=True)
    return [
        (
            statistics.mean(step["goodput_ratio"] for step in steps),
            statistics.mean(step["mean_limit"] or 0.0 for step in steps),
        )
        for steps in per_count
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limits", default="little,fixed:8,gradient2")
    parser.add_argument("--seeds", default="1,2,3")
    args = parser.parse_args()
    limits = [name.strip() for name in args.limits.split(",") if name.strip()]
    seeds = [int(seed) for seed in args.seeds.split(",")]

    print(f"8 workers, 100 ms mean, timeout 0.5 s, 30 s per count, mean of seeds {seeds}")
    print("goodput / capacity (mean limit) at " + ", ".join(f"{c} clients" for c in CLIENTS))
    print()
    print("| service | limit | " + " | ".join(f"{c} cl" for c in CLIENTS) + " |")
    print("| --- | --- |" + " ---: |" * len(CLIENTS))
    for dist, sigma in DISTRIBUTIONS:
        label = dist if dist == "exponential" else f"{dist} sigma {sigma:g}"
        for limit in limits:
            cells = mean_over_seeds(
                limit,
                seeds,
                clients=CLIENTS,
                workers=8,
                service=ServiceConfig(0.1, dist=dist, sigma=sigma),
                timeout=0.5,
            )
            row = " | ".join(f"{ratio:.2f} ({mean_limit:.1f})" for ratio, mean_limit in cells)
            print(f"| {label} | {limit} | {row} |")

    print()
    print("1 worker, 0.5 s mean, log-normal sigma 0.5, timeout 2 s, 30 s per count")
    print()
    print("| limit | 4 cl | 16 cl |")
    print("| --- | ---: | ---: |")
    for limit in [*limits[:1], "fixed:1"]:
        cells = mean_over_seeds(
            limit,
            seeds,
            clients=(4, 16),
            workers=1,
            service=ServiceConfig(0.5, dist="lognormal", sigma=0.5),
        )
        print(f"| {limit} | " + " | ".join(f"{r:.2f} ({m:.1f})" for r, m in cells) + " |")


if __name__ == "__main__":
    main()
