"""Compare every limit algorithm on E1 (throughput paradox) and E2 (capacity change)
in the simulator, with and without client deadlines, and on a fleet whose replicas
partly slow down; print markdown tables.

    .venv/bin/python bench/sim_compare.py                 # full E1 (30 s per step), E2 120 s
    .venv/bin/python bench/sim_compare.py --out docs/sim_compare.md --jobs 2

Every number comes from ``loadshed.sim`` in virtual time with a fixed seed, so the
table is reproducible; ``--e1-duration`` trades precision for wall time (goodput is
counted in whole requests: at 2 req/s a 30 s step resolves 1/60 of capacity).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from loadshed.sim.scenarios import LimiterConfig, run_capacity_change, run_fleet, run_paradox

E1_CLIENTS = (1, 2, 3, 4, 5, 8, 16, 32, 64)

# (label, limit, limit_value): fixed limits at the natural value (the worker count),
# and E2's published in-flight quota of 5
E1_LIMITS = [
    ("none", "none", None),
    ("fixed:1 (workers)", "fixed", 1),
    ("aimd", "aimd", None),
    ("vegas", "vegas", None),
    ("gradient2", "gradient2", None),
    ("gradient", "gradient", None),
    ("little", "little", None),
]
E2_LIMITS = [
    ("none", "none", None),
    ("fixed:5 (published quota)", "fixed", 5),
    ("fixed:7 (workers)", "fixed", 7),
    ("aimd", "aimd", None),
    ("vegas", "vegas", None),
    ("gradient2", "gradient2", None),
    ("gradient", "gradient", None),
    ("little", "little", None),
]


def _e1(job: tuple[str, str, int | None, bool, float, int]) -> dict[str, Any]:
    label, limit, value, deadlines, duration, seed = job
    started = time.perf_counter()
    result = run_paradox(
        limiter=LimiterConfig(limit, limit_value=value),
        clients=E1_CLIENTS,
        send_deadline=deadlines,
        duration=duration,
        seed=seed,
    )
    result["label"] = label
    result["wall_s"] = time.perf_counter() - started
    return result


def _e2(job: tuple[str, str, int | None, bool, float, int, str, str, float]) -> dict[str, Any]:
    label, limit, value, deadlines, duration, seed, dist, arrivals, sigma = job
    started = time.perf_counter()
    result = run_capacity_change(
        limiter=LimiterConfig(limit, limit_value=value),
        send_deadline=deadlines,
        duration=duration,
        seed=seed,
        dist=dist,
        sigma=sigma,
        arrivals=arrivals,
    )
    result["label"] = label
    result["wall_s"] = time.perf_counter() - started
    return result


FLEET_LIMITS = [
    ("none", "none", None),
    ("fixed:2 (workers)", "fixed", 2),
    ("aimd", "aimd", None),
    ("vegas", "vegas", None),
    ("gradient2", "gradient2", None),
    ("gradient", "gradient", None),
    ("little", "little", None),
]
FLEET_BALANCERS = ("round-robin", "least-outstanding")


def _fleet(job: tuple[str, str, int | None, str, int, float, int]) -> dict[str, Any]:
    label, limit, value, balancer, replicas, duration, seed = job
    started = time.perf_counter()
    result = run_fleet(
        limiter=LimiterConfig(limit, limit_value=value),
        replicas=replicas,
        balancer=balancer,
        duration=duration,
        seed=seed,
    )
    result["label"] = label
    result["wall_s"] = time.perf_counter() - started
    return result


def fleet_table(results: list[dict[str, Any]]) -> str:
    """Markdown: goodput ratio per phase, and detail of the slowdown."""
    header = [
        "limit",
        "balancer",
        "before ratio",
        "during ratio",
        "during p99 s",
        "during timed out",
        "during 503s",
        "limit healthy / slowed",
        "after ratio",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for result in results:
        before, during, after = result["steps"]
        limits = "-"
        if during["mean_limit"] is not None:
            limits = f"{during['mean_limit']:.1f} / {during.get('mean_limit_slowed', 0):.1f}"
        row = [
            result["label"],
            result["settings"]["balancer"],
            _f(before["goodput_ratio"]),
            f"**{_f(during['goodput_ratio'])}**",
            _f(during["p99_success_s"]),
            str(during["timed_out"]),
            str(during["rejected"]),
            limits,
            _f(after["goodput_ratio"]),
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def e1_table(results: list[dict[str, Any]]) -> str:
    """Markdown: goodput ratio per client count, worst ratio, worst p99 of successes."""
    header = ["limit", "deadline"] + [f"{c} cl" for c in E1_CLIENTS]
    header += ["min", "max p99 ok s", "max p99 503 ms"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for result in results:
        ratios = [step["goodput_ratio"] for step in result["steps"]]
        p99s = [step["p99_success_s"] for step in result["steps"] if step["p99_success_s"]]
        row = [result["label"], "yes" if result["deadlines"] else "no"]
        row += [_f(r) for r in ratios]
        rejected = [s["p99_rejected_s"] for s in result["steps"] if s["p99_rejected_s"]]
        row += [f"**{_f(min(ratios))}**", _f(max(p99s) if p99s else None)]
        row += [_f(1000 * max(rejected), 1) if rejected else "-"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def e2_table(results: list[dict[str, Any]]) -> str:
    """Markdown: goodput before/after the change, p99 after, convergence."""
    header = [
        "limit",
        "deadline",
        "before ratio",
        "after goodput/s",
        "after / capacity",
        "after p99 s",
        "after timed out",
        "after 503s",
        "mean limit after",
        "converge_s",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for result in results:
        before, after = result["steps"]
        row = [
            result["label"],
            "yes" if result["deadlines"] else "no",
            _f(before["goodput_ratio"]),
            _f(after["goodput_rps"]),
            f"**{_f(after['goodput_ratio'])}**",
            _f(after["p99_success_s"]),
            str(after["timed_out"]),
            str(after["rejected"]),
            _f(after["mean_limit"], 1),
            _f(result["converge_s"], 1),
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--e1-duration", type=float, default=30.0, help="seconds per E1 step")
    parser.add_argument("--e2-duration", type=float, default=120.0, help="seconds of E2")
    parser.add_argument(
        "--e2-dist",
        choices=["constant", "exponential", "lognormal"],
        default="constant",
        help="E2 service-time distribution (published: constant)",
    )
    parser.add_argument(
        "--e2-sigma",
        type=float,
        default=0.5,
        help="log-normal sigma of E2's service time with --e2-dist lognormal "
        "(0.02 to 0.1: a nearly constant service with a real machine's jitter)",
    )
    parser.add_argument(
        "--e2-arrivals",
        choices=["constant", "poisson"],
        default="constant",
        help="E2 arrival process (published: constant, 5 req/s)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    parser.add_argument("--replicas", type=int, default=100, help="fleet size")
    parser.add_argument("--fleet-duration", type=float, default=60.0, help="seconds of fleet")
    parser.add_argument("--only", choices=["e1", "e2", "fleet"], default=None)
    parser.add_argument("--out", default=None, help="also write the markdown here")
    args = parser.parse_args(argv)
    if not (math.isfinite(args.e2_sigma) and args.e2_sigma > 0):
        parser.error(f"--e2-sigma: must be a finite number > 0, got {args.e2_sigma:g}")

    started = time.perf_counter()
    e1_jobs = [
        (label, limit, value, deadlines, args.e1_duration, args.seed)
        for label, limit, value in E1_LIMITS
        for deadlines in (True, False)
    ]
    e2_jobs = [
        (
            label,
            limit,
            value,
            deadlines,
            args.e2_duration,
            args.seed,
            args.e2_dist,
            args.e2_arrivals,
            args.e2_sigma,
        )
        for label, limit, value in E2_LIMITS
        for deadlines in (True, False)
    ]
    fleet_jobs = [
        (label, limit, value, balancer, args.replicas, args.fleet_duration, args.seed)
        for label, limit, value in FLEET_LIMITS
        for balancer in FLEET_BALANCERS
    ]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        e1 = list(pool.map(_e1, e1_jobs)) if args.only in (None, "e1") else []
        e2 = list(pool.map(_e2, e2_jobs)) if args.only in (None, "e2") else []
        fleet = list(pool.map(_fleet, fleet_jobs)) if args.only in (None, "fleet") else []
    wall = time.perf_counter() - started

    parts = [f"Command: `.venv/bin/python bench/sim_compare.py {' '.join(argv or sys.argv[1:])}`"]
    if e1:
        parts += [
            "",
            f"**E1 throughput paradox** (1 worker, 0.5 s, closed loop, timeout 2 s, "
            f"{args.e1_duration:g} s per step, RTT 1 ms): goodput / capacity (2 req/s)",
            "",
            e1_table(e1),
        ]
    e2_shape = f"lognormal sigma {args.e2_sigma:g}" if args.e2_dist == "lognormal" else args.e2_dist
    if e2:
        parts += [
            "",
            f"**E2 capacity change** (7 workers, {e2_shape} service time, "
            f"mean 1 s -> 2 s at {args.e2_duration / 2:g} s, "
            f"5 req/s ({args.e2_arrivals} arrivals) from 10 client workers, timeout 2.5 s, "
            "origin queue 100, "
            f"{args.e2_duration:g} s): after-change capacity 3.5 req/s",
            "",
            e2_table(e2),
        ]
    if fleet:
        parts += [
            "",
            f"**Fleet** ({args.replicas} replicas x 2 workers x 200 ms lognormal, Poisson at 80 % "
            f"of capacity, timeout 1 s, one retry of a 503, 10 % of replicas 4x slower for the "
            f"middle third of {args.fleet_duration:g} s): goodput / min(capacity, rate)",
            "",
            fleet_table(fleet),
        ]
    parts += ["", f"Wall time {wall:.0f} s with {args.jobs} processes, seed {args.seed}."]
    text = "\n".join(parts) + "\n"
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
