"""A fleet, live: replicas that each protect themselves, behind a real load balancer.

    .venv/bin/python bench/fleet_live.py [--fronts haproxy,haproxy-none,proxy] [--duration 45]

Real processes on loopback: ``--replicas`` (4) ``loadshed serve-demo --model origin``
replicas, each with ``--protect little`` (its own adaptive limit, no shared state) and
``--workers`` slots of ``--service-time`` (log-normal, sigma 0.5 by default), behind
one of these fronts:

* ``haproxy``: HAProxy, ``balance leastconn``, a refused request retried once on
  another replica (``retry-on 503``, ``option redispatch``), started by this script
  (installed with apt-get when missing; the row is skipped with a message if that fails);
* ``haproxy-none``: the same HAProxy in front of replicas with ``--protect none``;
* ``proxy``: ``loadshed proxy`` with the replicas as its upstreams (least outstanding
  requests per unit of each upstream's limit).

An open-loop client in this script sends Poisson arrivals (seeded) at ``--load`` x the
healthy fleet's capacity, with ``X-Request-Timeout`` and a client timeout of
``--timeout``. A third into the run one replica's work time becomes ``--slow-factor``
(4) x longer (``PUT /admin/work-time``), and two thirds in it is restored, as in
``loadshed simulate fleet``'s default. Reported per front and phase (before, during,
after the slowdown): successes within the timeout per second, as a share of
min(capacity, offered), p50/p99 of successes, 503s, timeouts. Beside it, the
simulator's prediction for the same set-up (``run_fleet``, least-outstanding balancer,
the same seed): what lets a user trust a 1,000-replica simulation is that it predicts
this live figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from e2_capacity_change import ensure_haproxy, haproxy_head
from loadshed.sim.scenarios import LimiterConfig, run_fleet
from proxy_procs import PYTHON, free_port, started

PHASES = ("before", "during", "after")


@dataclass
class Outcome:
    """One request: when it was due (s from start) and what became of it."""

    due: float
    outcome: str = "not_sent"  # ok | timeout | rejected | error
    latency: float = math.nan


@dataclass
class Settings:
    replicas: int
    workers: int
    service_time: float
    dist: str
    sigma: float
    load: float
    timeout: float
    slow_factor: float
    duration: float
    seed: int

    @property
    def capacity(self) -> float:
        """The healthy fleet's requests per second."""
        return self.replicas * self.workers / self.service_time

    @property
    def rate(self) -> float:
        return self.load * self.capacity

    def phase_capacity(self, phase: str) -> float:
        if phase != "during":
            return self.capacity
        per_replica = self.workers / self.service_time
        return (self.replicas - 1) * per_replica + per_replica / self.slow_factor


@dataclass
class FrontResult:
    front: str
    requests: list[Outcome] = field(default_factory=list)


def replica_command(port: int, protect: str, settings: Settings, index: int) -> list[str]:
    return [
        PYTHON, "-m", "loadshed", "serve-demo", "--model", "origin", "--protect", protect,
        "--workers", str(settings.workers), "--service-time", str(settings.service_time),
        "--service-dist", settings.dist, "--sigma", str(settings.sigma),
        "--seed", str(settings.seed + index), "--port", str(port),
    ]  # fmt: skip


def haproxy_config(port: int, replica_ports: list[int]) -> str:
    servers = "\n".join(
        f"    server r{i} 127.0.0.1:{p} maxconn 1000" for i, p in enumerate(replica_ports)
    )
    head = haproxy_head("retries 1", "option redispatch 1", "retry-on 503 conn-failure")
    return (
        head
        + f"""frontend fleet
    bind 127.0.0.1:{port}
    default_backend replicas
backend replicas
    balance leastconn
{servers}
"""
    )


async def drive(url: str, replica_urls: list[str], settings: Settings) -> list[Outcome]:
    """Open-loop Poisson load; slow one replica a third in, restore it two thirds in."""
    rng = random.Random(settings.seed)
    outcomes: list[Outcome] = []
    tasks: list[asyncio.Task[None]] = []
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=settings.timeout)
    headers = {"X-Request-Timeout": f"{settings.timeout:g}"}
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        loop = asyncio.get_running_loop()
        start = loop.time()

        async def one(outcome: Outcome) -> None:
            try:
                async with session.get(url + "/work", headers=headers) as response:
                    await response.read()
                    outcome.outcome = "ok" if response.status == 200 else "rejected"
            except asyncio.TimeoutError:
                outcome.outcome = "timeout"
            except aiohttp.ClientError:
                outcome.outcome = "error"
            outcome.latency = loop.time() - start - outcome.due

        async def set_work_time(at: float, seconds: float) -> None:
            await asyncio.sleep(max(0.0, start + at - loop.time()))
            async with session.put(
                replica_urls[0] + "/admin/work-time", json={"seconds": seconds}
            ) as response:
                response.raise_for_status()

        third = settings.duration / 3
        changes = [
            asyncio.ensure_future(
                set_work_time(third, settings.service_time * settings.slow_factor)
            ),
            asyncio.ensure_future(set_work_time(2 * third, settings.service_time)),
        ]
        due = 0.0
        while True:
            due += rng.expovariate(settings.rate)
            if due >= settings.duration:
                break
            delay = start + due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            outcome = Outcome(due=due)
            outcomes.append(outcome)
            tasks.append(asyncio.ensure_future(one(outcome)))
        await asyncio.gather(*tasks, *changes)
    return outcomes


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(outcomes: list[Outcome], settings: Settings, settle: float) -> list[dict[str, Any]]:
    """Per phase; ``settle`` seconds after each change are left out of the during and
    after phases (and the first ``settle`` of the run: start-up)."""
    third = settings.duration / 3
    rows = []
    for index, phase in enumerate(PHASES):
        lo, hi = index * third + settle, (index + 1) * third
        inside = [o for o in outcomes if lo <= o.due < hi]
        ok = [o for o in inside if o.outcome == "ok" and o.latency <= settings.timeout]
        length = hi - lo
        goodput = len(ok) / length
        offered = min(settings.phase_capacity(phase), settings.rate)
        rows.append(
            {
                "phase": phase,
                "capacity_rps": round(settings.phase_capacity(phase), 2),
                "goodput_rps": round(goodput, 2),
                "goodput_ratio": round(goodput / offered, 4),
                "p50_success_s": round(percentile([o.latency for o in ok], 0.5), 4),
                "p99_success_s": round(percentile([o.latency for o in ok], 0.99), 4),
                "rejected": sum(o.outcome == "rejected" for o in inside),
                "timed_out": sum(o.outcome == "timeout" for o in inside),
                "errors": sum(o.outcome == "error" for o in inside),
            }
        )
    return rows


def run_front(front: str, settings: Settings) -> list[Outcome] | None:
    """Start the replicas and the front, drive the load, stop everything."""
    protect = "none" if front == "haproxy-none" else "little"
    ports = [free_port() for _ in range(settings.replicas)]
    replica_urls = [f"http://127.0.0.1:{p}" for p in ports]
    with ExitStack() as stack:
        for index, port in enumerate(ports):
            stack.enter_context(started(replica_command(port, protect, settings, index), port))
        front_port = free_port()
        if front.startswith("haproxy"):
            haproxy = ensure_haproxy()
            if haproxy is None:
                print(f"{front}: skipped (haproxy missing and could not be installed)")
                return None
            config = stack.enter_context(tempfile.TemporaryDirectory())
            path = Path(config) / "haproxy.cfg"
            path.write_text(haproxy_config(front_port, ports))
            stack.enter_context(started([haproxy, "-f", str(path), "-db"], front_port))
        else:
            command = [PYTHON, "-m", "loadshed", "proxy", "--listen", f"127.0.0.1:{front_port}"]
            for url in replica_urls:
                command += ["--upstream", url]
            stack.enter_context(started(command, front_port))
        return asyncio.run(drive(f"http://127.0.0.1:{front_port}", replica_urls, settings))


def simulate(settings: Settings, retries: int) -> list[dict[str, Any]]:
    result = run_fleet(
        limiter=LimiterConfig("little"),
        replicas=settings.replicas,
        workers=settings.workers,
        service_time=settings.service_time,
        dist=settings.dist,
        sigma=settings.sigma,
        load=settings.load,
        balancer="least-outstanding",
        slow_fraction=1 / settings.replicas,
        slow_factor=settings.slow_factor,
        timeout=settings.timeout,
        retries=retries,
        duration=settings.duration,
        seed=settings.seed,
    )
    return list(result["steps"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fronts", default="haproxy,haproxy-none,proxy")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--workers", type=int, default=4, help="slots per replica")
    parser.add_argument("--service-time", type=float, default=0.1, help="seconds (mean)")
    parser.add_argument("--dist", default="lognormal", help="constant|exponential|lognormal")
    parser.add_argument("--sigma", type=float, default=0.5)
    parser.add_argument("--load", type=float, default=1.0, help="x the healthy capacity")
    parser.add_argument("--timeout", type=float, default=0.5, help="client timeout, seconds")
    parser.add_argument("--slow-factor", type=float, default=4.0)
    parser.add_argument("--duration", type=float, default=45.0, help="seconds")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds left out per phase")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", help="markdown file (a .json beside it)")
    args = parser.parse_args()
    fronts = [f.strip() for f in args.fronts.split(",") if f.strip()]
    unknown = [f for f in fronts if f not in ("haproxy", "haproxy-none", "proxy")]
    if unknown:
        parser.error(f"--fronts: unknown {unknown}; allowed: haproxy, haproxy-none, proxy")
    settings = Settings(
        replicas=args.replicas,
        workers=args.workers,
        service_time=args.service_time,
        dist=args.dist,
        sigma=args.sigma,
        load=args.load,
        timeout=args.timeout,
        slow_factor=args.slow_factor,
        duration=args.duration,
        seed=args.seed,
    )
    started_at = time.perf_counter()
    results: dict[str, list[dict[str, Any]]] = {}
    for front in fronts:
        outcomes = run_front(front, settings)
        if outcomes is not None:
            results[front] = summarize(outcomes, settings, args.settle)
            print(f"{front}: " + ", ".join(
                f"{row['phase']} {row['goodput_ratio']:.3f}" for row in results[front]
            ), file=sys.stderr)  # fmt: skip
    predicted = {f"sim, {r} retr{'y' if r == 1 else 'ies'}": simulate(settings, r) for r in (0, 1)}
    lines = [
        "# A fleet behind a real load balancer, live, and the simulator's prediction",
        "",
        f"`{' '.join(['python', *sys.argv])}`",
        "",
        f"{settings.replicas} replicas x {settings.workers} slots of {settings.service_time:g} s "
        f"({settings.dist}, sigma {settings.sigma:g}), each `--protect little` (but "
        f"`haproxy-none`); Poisson at {settings.load:g}x the healthy capacity "
        f"({settings.rate:g} req/s), client timeout {settings.timeout:g} s sent as "
        f"`X-Request-Timeout`; one replica {settings.slow_factor:g}x slower for the middle "
        f"third of {settings.duration:g} s (capacity {settings.capacity:g} -> "
        f"{settings.phase_capacity('during'):g} req/s). Goodput / min(capacity, offered); "
        f"live phases leave out their first {args.settle:g} s, the simulator's do not.",
        "",
        "| front | phase | goodput / capacity | ok/s | p50 / p99 of successes (s) | 503s "
        "| timeouts |",
        "| --- | --- | ---: | ---: | --- | ---: | ---: |",
    ]
    for front, rows in [*results.items(), *predicted.items()]:
        for row in rows:
            lines.append(
                f"| {front} | {row['phase']} | {row['goodput_ratio']:.3f} | "
                f"{row['goodput_rps']:.1f} | {row['p50_success_s']:.3f} / "
                f"{row['p99_success_s']:.3f} | {row['rejected']} | {row['timed_out']} |"
            )
    lines += ["", f"wall {time.perf_counter() - started_at:.0f} s"]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
        payload = {"settings": vars(args), "live": results, "predicted": predicted}
        Path(args.out).with_suffix(".json").write_text(json.dumps(payload, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
