"""E1, the throughput paradox, live: every protection in the same run, real servers, real HTTP.

    .venv/bin/python bench/e1_live.py [--scale 1] [--duration 30s] [--warmup 5s]
        [--clients 1,2,3,4,5,8,16] [--protect none,queue,deadline,little,aimd,gradient2]
        [--json results.json]

E1 in docs/design.md: one worker, 500 ms of CPU per request (hashburn, its burn in one
worker process as E1's process pool), closed-loop clients, client timeout 2 s, ``--duration``
per step. ``--scale`` multiplies service time, client timeout and the deadline scheme's 1.8 s
target (``--scale 0.2``: 100 ms work, 400 ms timeout, capacity 10 req/s), so the shape holds on
a shorter run. Each protection runs as its own ``loadshed serve-demo`` subprocess on 127.0.0.1
(see ``loadshed.demo.serve`` for what ``queue`` and ``deadline`` are), driven one at a time at
every client count by loadshed's load generator (``loadshed.demo.live.run_live``).

Prints markdown tables: goodput (and its share of capacity) per client count, p50 of
successes, p50 / p99 of the 503s, and clients / responses per second: by Little's law
the mean response time that closed-loop clients retrying at once must see at the
throughput reached (the floor under the 503s' latency), one column per protection.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loadshed.demo.live import LiveConfig, LiveStep, results_json, run_live
from loadshed.errors import ConfigError
from loadshed.units import parse_duration, parse_int_list

DEFAULT_PROTECT = "none,queue,deadline,little,aimd,gradient2"
DEFAULT_CLIENTS = "1,2,3,4,5,8,16"


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e3:.0f}" if seconds >= 0.1 else f"{seconds * 1e3:.1f}"


def table(
    config: LiveConfig,
    figures: dict[tuple[str, int], dict[str, Any]],
    title: str,
    cell: Callable[[dict[str, Any]], str],
) -> str:
    lines = [f"**{title}**", ""]
    lines.append("| clients | " + " | ".join(config.protect) + " |")
    lines.append("| ---: |" + " ---: |" * len(config.protect))
    for clients in config.clients:
        cells = [cell(figures[protect, clients]) for protect in config.protect]
        lines.append(f"| {clients} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--duration", default="30s", help="measured time per step")
    parser.add_argument("--warmup", default="5s", help="unmeasured lead-in per step")
    parser.add_argument("--clients", default=DEFAULT_CLIENTS)
    parser.add_argument("--protect", default=DEFAULT_PROTECT)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument(
        "--honor-retry-after",
        action="store_true",
        help="clients wait out a 503's Retry-After (E1's, like bombardier's, retry at once)",
    )
    parser.add_argument(
        "--retry-jitter",
        type=float,
        default=0.0,
        help="with --honor-retry-after: wait Retry-After x a uniform factor in [1-J, 1+J]",
    )
    args = parser.parse_args()
    try:
        config = LiveConfig(
            protect=tuple(p.strip() for p in args.protect.split(",") if p.strip()),
            clients=tuple(parse_int_list(args.clients, "--clients")),
            scale=args.scale,
            duration_s=parse_duration(args.duration, "--duration"),
            warmup_s=parse_duration(args.warmup, "--warmup"),
            honor_retry_after=args.honor_retry_after,
            retry_jitter=args.retry_jitter,
        )
    except ConfigError as error:
        parser.error(str(error))

    def on_step(step: LiveStep) -> None:
        s = step.summary(config.capacity_rps)
        print(
            f"  {step.protect:>9} {step.clients:>3} clients: goodput {s['goodput_rps']:.2f}/s "
            f"({s['goodput_ratio']:.0%}), {s['rejected']} 503s, {s['timeouts']} timeouts",
            file=sys.stderr,
            flush=True,
        )

    steps = run_live(config, on_step=on_step)
    data = results_json(config, steps)
    if args.json is not None:
        args.json.write_text(json.dumps(data, indent=2) + "\n")
    figures = {(s["protect"], s["clients"]): s for s in data["steps"]}
    command = "python bench/e1_live.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    print(f"`{command.strip()}`\n")
    print(
        f"E1 live at {config.scale:g}x time: 1 worker, {config.service_time_s * 1e3:g} ms of CPU "
        f"per request, client timeout {config.timeout_s * 1e3:g} ms, capacity "
        f"{config.capacity_rps:g} req/s, {config.duration_s:g} s per step after "
        f"{config.warmup_s:g} s of warm-up; deadline target {config.deadline_target_s * 1e3:g} ms."
        "\n"
    )
    print(
        table(
            config,
            figures,
            "Goodput, req/s (share of capacity)",
            lambda f: f"{f['goodput_rps']:.2f} ({f['goodput_ratio']:.0%})",
        )
    )
    print()
    print(table(config, figures, "p50 of successes, ms", lambda f: _ms(f["p50_success_s"])))
    print()
    print(
        table(
            config,
            figures,
            "503s: count, p50 / p99 ms",
            lambda f: (
                f"{f['rejected']}: {_ms(f['p50_rejected_s'])} / {_ms(f['p99_rejected_s'])}"
                if f["rejected"]
                else "0"
            ),
        )
    )
    print()
    print(
        table(
            config,
            figures,
            "Clients / responses per second, ms (Little's law: the mean response time of "
            "clients that send again at once, at the throughput reached)",
            lambda f: _ms(f["closed_loop_mean_s"]),
        )
    )
    print()
    print(table(config, figures, "Client timeouts", lambda f: str(f["timeouts"])))


if __name__ == "__main__":
    main()
