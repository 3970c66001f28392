"""Clients that retry at once against one worker with a dispatch trip, in the simulator:
``little``, ``little+headroom``, the hand-set limits 1 and 2 and no protection, over
service times, client patience and client counts; print a markdown table.

    .venv/bin/python bench/headroom_paradox.py                     # ~4 min on 2 cores
    .venv/bin/python bench/headroom_paradox.py --out bench/results/headroom_paradox.md

Issue 13's live set-up (a fast model behind ``ModelRunner``, clients that come straight
back after a 503) in virtual time: ``--dispatch-delay`` is the server's trip between
admitting a request and its worker receiving it, during which a worker with no job
handed ahead idles. Clients send no deadline; the goodput ratio is successes within the
client timeout over capacity. Every figure is deterministic (seed 1).
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from loadshed.sim.scenarios import LimiterConfig, ServiceConfig, run_paradox

LIMITS = ("little", "little+headroom", "fixed:1", "fixed:2", "none")


def _parse_list(text: str, name: str, parse: type[float] | type[int]) -> list[float]:
    try:
        values = [float(parse(part)) for part in text.split(",") if part.strip()]
    except ValueError:
        raise SystemExit(f"--{name}: expected comma-separated numbers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise SystemExit(f"--{name}: every value must be > 0, got {text!r}")
    return values


def _row(job: tuple[str, float, float, tuple[int, ...], float, float]) -> list[float]:
    limit, service, timeout, clients, dispatch, duration = job
    result = run_paradox(
        limiter=LimiterConfig(limit),
        clients=clients,
        workers=1,
        service=ServiceConfig(service),
        timeout=timeout,
        send_deadline=False,
        duration=duration,
        dispatch_delay=dispatch,
    )
    return [float(step["goodput_ratio"]) for step in result["steps"]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--service", default="0.025,0.05", help="service times, seconds")
    parser.add_argument("--timeouts", default="0.1,0.2,0.5,2", help="client timeouts, seconds")
    parser.add_argument("--clients", default="1,2,4,16,64", help="closed-loop client counts")
    parser.add_argument("--dispatch-delay", type=float, default=0.001, help="seconds")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds per step")
    parser.add_argument("--jobs", type=int, default=2, help="processes")
    parser.add_argument("--out", help="also write the table to this markdown file")
    args = parser.parse_args(argv)
    services = _parse_list(args.service, "service", float)
    timeouts = _parse_list(args.timeouts, "timeouts", float)
    clients = tuple(int(c) for c in _parse_list(args.clients, "clients", int))
    if args.dispatch_delay < 0:
        raise SystemExit("--dispatch-delay: must be >= 0")
    if args.duration <= 0 or args.jobs < 1:
        raise SystemExit("--duration must be > 0 and --jobs >= 1")

    jobs = [
        (limit, service, timeout, clients, args.dispatch_delay, args.duration)
        for service in services
        for timeout in timeouts
        for limit in LIMITS
    ]
    started = time.monotonic()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(_row, jobs))

    command = "python bench/headroom_paradox.py " + " ".join(sys.argv[1:] if argv is None else argv)
    lines = [
        f"`{command.strip()}`",
        "",
        f"One worker, dispatch trip {args.dispatch_delay * 1000:g} ms, closed-loop clients "
        f"that retry at once, no deadline sent, {args.duration:g} s per step, seed 1. "
        "Goodput within the client timeout over capacity.",
        "",
        "| service | timeout | limit | " + " | ".join(f"{c} clients" for c in clients) + " |",
        "| ---: | ---: | --- | " + " | ".join("---:" for _ in clients) + " |",
    ]
    for (limit, service, timeout, *_), ratios in zip(jobs, rows, strict=True):
        cells = " | ".join(f"{r:.3f}" for r in ratios)
        lines.append(f"| {service * 1000:g} ms | {timeout * 1000:g} ms | {limit} | {cells} |")
    lines += ["", f"wall {time.monotonic() - started:.0f} s"]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
