"""Does loadshed measure what the reference tools measure on the same loopback target?

Scenarios (each tool, same connections/rate and measured duration, run one after another):

1. closed loop, 8 connections, target answering after 10 ms, then 2 ms (--service): wrk, hey,
   ``loadshed bench -c 8``;
2. open loop, constant rate, same target: vegeta (and oha with --oha), ``loadshed bench -r``;
3. stalled target (pauses 1 s every 5 s), 10 s: open loop (vegeta, loadshed -r) must show the
   stall in p99; closed loop (wrk, hey, loadshed -c) hides it, as coordinated omission does.

Targets: throughput within 5 %, p50/p99 within 10 % (or 1 ms) of the reference.

    .venv/bin/python bench/loadgen/agree.py [--duration 5] [--rate 1000] [--repeat 3] [--oha]
                                            [--only closed,open,stall]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    Measured,
    environment,
    ms,
    run_hey,
    run_loadshed,
    run_oha,
    run_vegeta,
    run_wrk,
    table,
    target,
)

PORT = 18091


def _close(value: float, reference: float, rel: float, abs_s: float = 0.0) -> bool:
    return abs(value - reference) <= max(rel * reference, abs_s)


def _verdict(ours: Measured, reference: Measured) -> str:
    if not ours.throughput_rps:
        return f"FAIL ({ours.note})"
    checks = [
        _close(ours.throughput_rps, reference.throughput_rps, 0.05),
        _close(ours.p50_s, reference.p50_s, 0.10, 0.001),
        _close(ours.p99_s, reference.p99_s, 0.10, 0.001),
    ]
    return "PASS" if all(checks) else "FAIL"


def _rows(results: list[Measured], reference: Measured | None) -> list[list[object]]:
    rows: list[list[object]] = []
    for m in results:
        rows.append([
            m.tool, f"{m.throughput_rps:,.0f}", ms(m.p50_s), ms(m.p90_s), ms(m.p99_s),
            ms(m.max_s),
            "" if reference is None or m is reference or not m.tool.startswith("loadshed")
            else _verdict(m, reference),
        ])  # fmt: skip
    return rows


HEADER = ["tool", "responses/s", "p50 ms", "p90 ms", "p99 ms", "max ms", "vs reference"]


def median(runs: list[Measured]) -> Measured:
    """Per-figure median of repeated runs of one tool (the machine is shared and noisy)."""

    def mid(values: list[float | None]) -> float | None:
        present = sorted(v for v in values if v is not None)
        return statistics.median(present) if present else None

    if any(not r.throughput_rps for r in runs):
        return next(r for r in runs if not r.throughput_rps)
    return Measured(
        runs[0].tool,
        statistics.median(r.throughput_rps for r in runs),
        statistics.median(r.p50_s for r in runs),
        statistics.median(r.p99_s for r in runs),
        mid([r.p90_s for r in runs]),
        mid([r.max_s for r in runs]),
    )


def closed(
    duration: float, connections: int, service: str, repeat: int
) -> tuple[str, list[Measured]]:
    runs: dict[str, list[Measured]] = {"wrk": [], "hey": [], "loadshed": [], "aiohttp": []}
    with target("sleep", PORT, "-sleep", service) as url:
        for _ in range(repeat):  # interleaved, so drifting background load hits every tool
            runs["wrk"].append(run_wrk(url, connections, duration))
            runs["hey"].append(run_hey(url, connections, duration))
            args = ["-c", str(connections), "-d", f"{duration}s", "-w", "1s"]
            runs["loadshed"].append(run_loadshed(url, args))
            label = "loadshed --client aiohttp"
            runs["aiohttp"].append(run_loadshed(url, [*args, "--client", "aiohttp"], label))
    wrk, hey, ours, ours_aiohttp = (median(r) for r in runs.values())
    results = [wrk, hey, ours, ours_aiohttp]
    text = (
        f"Closed loop, {connections} connections, {duration:g} s, target answers after {service} "
        f"(median of {repeat}; reference: wrk)\n\n{table(_rows(results, wrk), HEADER)}\n\n"
        f"loadshed vs hey: {_verdict(ours, hey)}"
    )
    return text, results


def open_loop(
    duration: float, rate: float, with_oha: bool, service: str, repeat: int
) -> tuple[str, list[Measured]]:
    runs: dict[str, list[Measured]] = {}
    with target("sleep", PORT, "-sleep", service) as url:
        for _ in range(repeat):
            vegeta = run_vegeta(url, rate, duration)
            if vegeta is not None:
                runs.setdefault("vegeta", []).append(vegeta)
            if with_oha:
                runs.setdefault("oha", []).append(run_oha(url, rate, duration))
            args = ["-r", f"{rate:g}", "-d", f"{duration}s", "-w", "1s"]
            runs.setdefault("loadshed", []).append(run_loadshed(url, args))
            label = "loadshed --client aiohttp"
            aiohttp_run = run_loadshed(url, [*args, "--client", "aiohttp"], label)
            runs.setdefault("aiohttp", []).append(aiohttp_run)
    results = [median(r) for r in runs.values()]
    reference = results[0] if len(results) > 1 else None
    name = reference.tool if reference else "none (vegeta needs Go)"
    text = (
        f"Open loop, {rate:g} req/s constant, {duration:g} s, target answers after {service} "
        f"(median of {repeat}; reference: {name})\n\n{table(_rows(results, reference), HEADER)}"
    )
    return text, results


def stall(connections: int, rate: float) -> tuple[str, list[Measured]]:
    duration = 10.0
    results: list[Measured] = []
    with target("stall", PORT) as url:
        # The target pauses for the first second of every 5 s of its life.
        vegeta = run_vegeta(url, rate, duration)
        if vegeta is not None:
            vegeta.tool = "vegeta (open)"
            results.append(vegeta)
        open_args = ["-r", f"{rate:g}", "-d", f"{duration}s", "-w", "0s", "--timeout", "5s"]
        ours_open = run_loadshed(url, open_args, label="loadshed -r (open)")
        results.append(ours_open)
        wrk = run_wrk(url, connections, duration)
        wrk.tool = "wrk (closed)"
        hey = run_hey(url, connections, duration)
        hey.tool = "hey (closed)"
        closed_args = ["-c", str(connections), "-d", f"{duration}s", "-w", "0s", "--timeout", "5s"]
        ours_closed = run_loadshed(url, closed_args, label="loadshed -c (closed)")
        results += [wrk, hey, ours_closed]
    header = ["tool", "responses/s", "p50 ms", "p90 ms", "p99 ms", "max ms"]
    rows = [r[:-1] for r in _rows(results, None)]
    text = (
        f"Stalled target (pauses 1 s every 5 s), {duration:g} s; open loop {rate:g} req/s, "
        f"closed loop {connections} connections\n\n{table(rows, header)}"
    )
    return text, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--stall-rate", type=float, default=200.0)
    parser.add_argument("--repeat", type=int, default=3, help="runs per tool (median)")
    parser.add_argument("--oha", action="store_true", help="also run oha (built with cargo)")
    parser.add_argument("--only", default="closed,open,stall")
    parser.add_argument(
        "--service", default="10ms,2ms", help="target service times for closed/open scenarios"
    )
    parser.add_argument("--json", type=Path, default=None, help="write raw figures here")
    args = parser.parse_args()
    print(f"<!-- {environment()} -->\n")
    raw: dict[str, list[dict[str, object]]] = {}
    runs: list[tuple[str, str]] = []
    for scenario in args.only.split(","):
        if scenario not in ("closed", "open", "stall"):
            raise SystemExit(f"--only: unknown scenario {scenario!r} (closed, open, stall)")
        services = args.service.split(",") if scenario != "stall" else [""]
        runs += [(scenario, service) for service in services]
    for scenario, service in runs:
        if scenario == "closed":
            text, results = closed(args.duration, args.connections, service, args.repeat)
        elif scenario == "open":
            text, results = open_loop(args.duration, args.rate, args.oha, service, args.repeat)
        else:
            text, results = stall(args.connections, args.stall_rate)
        print(text + "\n", flush=True)
        raw[f"{scenario} {service}".strip()] = [vars(r) for r in results]
    if args.json is not None:
        args.json.write_text(json.dumps(raw, indent=2) + "\n")


if __name__ == "__main__":
    main()
