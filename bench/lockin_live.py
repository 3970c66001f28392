"""Does the default limit ever lock in where admitted requests time out? Live E1 at
0.1x time, repeated on fresh servers, reported as a distribution.

    .venv/bin/python bench/lockin_live.py --clients 16 --repeats 30
    .venv/bin/python bench/lockin_live.py --clients 4,8,16,32 --repeats 30 \
        --out bench/results/lockin_live.md

Each run starts a fresh ``loadshed serve-demo --model hashburn --service-time 0.05
--workers 1 --protect little`` (50 ms of CPU per request, capacity 20 req/s) and drives
it with ``loadshed bench``'s closed-loop clients (2 s warm-up, 8 s measured, 0.2 s
client timeout, no deadline header, an immediate retry after a 503), as issue 18's
command does; then stops the server. A locked-in run serves almost nothing: its
goodput is far below capacity while the server answers thousands of fast 503s. The
table gives, per client count, the goodput share of capacity at its minimum, 10th
percentile, median and maximum, and how many runs fell below 0.95.

To run the same against another source tree (the code before a change), put its
``src`` first on ``PYTHONPATH``: the servers are started with this interpreter and
inherit the environment.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from loadshed.demo.live import LiveStep, start_server, wait_idle
from loadshed.errors import ConfigError
from loadshed.loadgen.options import BenchOptions
from loadshed.loadgen.runner import run_bench
from loadshed.units import parse_duration, parse_int_list


def one_run(
    protect: str, clients: int, service: float, timeout: float, args: Any
) -> dict[str, Any]:
    """A fresh server, one measured step, the server stopped; the step's summary."""
    server = start_server(protect, service, workers=args.workers)
    try:
        options = BenchOptions(
            url=f"{server.url}/calculate?input=loadshed",
            clients=clients,
            duration_s=args.duration,
            warmup_s=args.warmup,
            timeout_s=timeout,
        )
        step = LiveStep(protect, clients, run_bench(options))
        summary = step.summary(args.workers / service)
        summary["final_limit"] = final_limit(server.url)
        wait_idle(server, budget_s=2.0)
        return summary
    finally:
        server.stop()


def final_limit(url: str) -> float | None:
    """The limiter's limit now, from the server's Prometheus metrics (None if absent)."""
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=2.0) as response:
            text = response.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("loadshed_limit{") or line.startswith("loadshed_limit "):
            return float(line.rsplit(" ", 1)[1])
    return None


def quantile(values: list[float], q: float) -> float:
    """The q-quantile by the nearest rank (no interpolation between runs)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="16", help="client counts, e.g. 4,8,16,32")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--protect", default="little")
    parser.add_argument("--service-time", default="50ms")
    parser.add_argument(
        "--workers", type=int, default=1, help="model workers (capacity: workers / service)"
    )
    parser.add_argument("--timeout", default="200ms", help="client timeout (not sent)")
    parser.add_argument("--duration", default="8s")
    parser.add_argument("--warmup", default="2s")
    parser.add_argument("--out", help="markdown file (a .json beside it)")
    args = parser.parse_args()
    try:
        counts = parse_int_list(args.clients, "--clients")
        service = parse_duration(args.service_time, "--service-time")
        timeout = parse_duration(args.timeout, "--timeout")
        args.duration = parse_duration(args.duration, "--duration")
        args.warmup = parse_duration(args.warmup, "--warmup")
    except (ValueError, ConfigError) as error:
        parser.error(str(error))
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    started = time.monotonic()
    runs: dict[int, list[dict[str, Any]]] = {}
    for clients in counts:
        for repeat in range(args.repeats):
            summary = one_run(args.protect, clients, service, timeout, args)
            runs.setdefault(clients, []).append(summary)
            print(
                f"clients {clients} run {repeat + 1}: goodput {summary['goodput_ratio']:.2f}, "
                f"timeouts {summary['timeouts']}, 503s {summary['rejected']}, "
                f"limit at the end {summary['final_limit']}",
                file=sys.stderr,
            )
    command = "python bench/lockin_live.py " + " ".join(sys.argv[1:])
    lines = [
        f"# Lock-in check, live (`{command.strip()}`)",
        "",
        f"`serve-demo --model hashburn --service-time {service:g} --workers {args.workers} "
        f"--protect {args.protect}`; closed-loop clients, {timeout:g} s timeout (not sent), "
        f"{args.duration:g} s measured after {args.warmup:g} s. Goodput / capacity per run.",
        "",
        "| clients | runs | min | p10 | median | max | runs < 0.95 | runs < 0.5 |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for clients, summaries in runs.items():
        ratios = [s["goodput_ratio"] for s in summaries]
        lines.append(
            f"| {clients} | {len(ratios)} | {min(ratios):.2f} | {quantile(ratios, 0.1):.2f} | "
            f"{statistics.median(ratios):.2f} | {max(ratios):.2f} | "
            f"{sum(r < 0.95 for r in ratios)} | {sum(r < 0.5 for r in ratios)} |"
        )
    lines += ["", "Every run, in order:", ""]
    for clients, summaries in runs.items():
        lines.append(
            f"- {clients} clients: " + ", ".join(f"{s['goodput_ratio']:.2f}" for s in summaries)
        )
    text = "\n".join(lines) + "\n"
    print(text)
    print(f"wall {time.monotonic() - started:.0f} s", file=sys.stderr)
    if args.out:
        Path(args.out).write_text(text)
        Path(args.out).with_suffix(".json").write_text(
            json.dumps({"command": command, "runs": runs}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
