"""How fast the simulator runs: wall time for a minute of virtual traffic through
1000 replicas (the issue's bar: under a minute of wall time), and events per second.

    .venv/bin/python bench/sim_speed.py                  # 1000 replicas, none and little
    .venv/bin/python bench/sim_speed.py --replicas 100 --limits little,aimd

Same defaults as ``loadshed simulate fleet``: 2 workers and 200 ms (lognormal) per
replica, Poisson arrivals at 80 % of the healthy fleet's capacity (8000 req/s for
1000 replicas), 10 % of replicas 4x slower for the middle third.
"""

from __future__ import annotations

import argparse
import sys
import time

from loadshed.sim.scenarios import LimiterConfig, run_fleet


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=1000)
    parser.add_argument("--duration", type=float, default=60.0, help="virtual seconds")
    parser.add_argument("--limits", default="none,little")
    parser.add_argument("--balancer", default="round-robin")
    args = parser.parse_args(argv)

    print(
        f"| limit | replicas | virtual s | requests | events | wall s | wall / virtual "
        f"| events/s | goodput ratio (during) |\n|{'---|' * 9}"
    )
    for limit in args.limits.split(","):
        started = time.perf_counter()
        cpu_started = time.process_time()
        result = run_fleet(
            limiter=LimiterConfig(limit),
            replicas=args.replicas,
            duration=args.duration,
            balancer=args.balancer,
        )
        wall = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
        sent = sum(step["sent"] for step in result["steps"])
        during = next(s for s in result["steps"] if s["phase"] == "during")
        print(
            f"| {limit} | {args.replicas} | {args.duration:g} | {sent} | {result['events']} "
            f"| {wall:.1f} (cpu {cpu:.1f}) | {wall / args.duration:.2f} "
            f"| {result['events'] / cpu:,.0f} | {during['goodput_ratio']:.3f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
