"""The floor under E1's rejection latency: how fast can a Python server on this machine
answer 503s at all? Side by side with loadshed's protected server, in one run.

    .venv/bin/python bench/rejection_floor.py [--clients 4,8,16,32] [--duration 10s]
        [--warmup 2s] [--rounds 2] [--json out.json]

Three servers on 127.0.0.1, driven in turn by loadshed's load generator exactly as E1 drives
them (bench/e1_live.py): closed loop, clients that send again as soon as they are answered,
a 2 s client timeout.
- ``floor``: uvicorn (uvloop and httptools, as ``serve-demo`` runs) serving an ASGI app that
  answers every request with 503 at once (``always_503`` in bench/middleware_targets.py):
  no admission, no model, no framework. A CPU-bound process runs beside it, in the same
  session, as E1's model worker runs beside ``serve-demo``: with Linux's autogroup scheduling
  a session shares the CPU as one group, so each server gets the same CPU to share with its
  busy neighbour, whatever the load generator takes.
- ``refuse_all``: the same uvicorn serving LoadShedMiddleware with its one slot held for
  good and no queue: every request refused by the middleware alone (no model, no metrics),
  with the same CPU-bound neighbour.
- ``little``: ``serve-demo --model hashburn --protect little`` (E1 at 1x: one worker, 0.5 s
  of CPU per request), whose worker stays busy while nearly every request is refused.
At each client count the three run one after the other, ``--rounds`` times, interleaved
(``floor`` and ``refuse_all`` start afresh for each run, so that only one neighbour burns).

Reported per server and client count (median over rounds): responses per second (X),
clients / X (by Little's law the mean response time of clients that retry at once: no
percentile of theirs can be lower), and the p50 / p99 of the 503s. When even ``floor``'s p99
is over a target, no admission control in this stack can meet it on this machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from loadshed.demo.live import E1_SERVICE_TIME, start_server
from loadshed.errors import ConfigError
from loadshed.loadgen.options import BenchOptions
from loadshed.loadgen.runner import run_bench
from loadshed.units import parse_duration, parse_int_list
from servers import free_port, uvicorn_command, wait_for_port

SERVERS = ("floor", "refuse_all", "little")
FIGURES = ("throughput_rps", "closed_loop_mean_s", "p50_rejected_s", "p99_rejected_s")
_BURN = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass"


@contextlib.contextmanager
def burning_server(app: str, burn_s: float) -> Iterator[str]:
    """uvicorn serving ``middleware_targets:<app>`` on a free loopback port, with a process
    that keeps one CPU busy for ``burn_s`` beside it, both in a session of their own (as
    ``serve-demo`` and its model worker run in the live E1 harness: with Linux's autogroup
    scheduling a session shares the CPU as one group). Yields the URL."""
    port = free_port()
    burn = shlex.quote(_BURN.format(seconds=burn_s))
    server = " ".join(shlex.quote(part) for part in uvicorn_command(app, port))
    # sh starts the burner, then becomes uvicorn: one process group to stop.
    launcher = f"{shlex.quote(sys.executable)} -c {burn} & exec {server}"
    process = subprocess.Popen(["sh", "-c", launcher], start_new_session=True)
    try:
        wait_for_port(port, 20, f"the {app} server")
        yield f"http://127.0.0.1:{port}/"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def drive(url: str, clients: int, duration_s: float, warmup_s: float) -> dict[str, Any]:
    """One closed-loop run, E1's way; the figures this bench reports."""
    result = run_bench(
        BenchOptions(
            url=url, clients=clients, duration_s=duration_s, warmup_s=warmup_s, timeout_s=2.0
        )
    )
    data = result.to_json()
    rejected = data["latency_s"]["rejected"]
    throughput = float(data["throughput_rps"])
    return {
        "throughput_rps": throughput,
        "closed_loop_mean_s": clients / throughput if throughput > 0 else None,
        "rejections": int(data["rejections"]),
        "successes": int(data["successes"]),
        "p50_rejected_s": rejected.get("p50") if data["rejections"] else None,
        "p99_rejected_s": rejected.get("p99") if data["rejections"] else None,
    }


def median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [run[key] for run in runs if run[key] is not None]
    return statistics.median(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="4,8,16,32")
    parser.add_argument("--duration", default="10s", help="measured time per run")
    parser.add_argument("--warmup", default="2s", help="unmeasured lead-in per run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    try:
        clients_list = parse_int_list(args.clients, "--clients")
        duration_s = parse_duration(args.duration, "--duration")
        warmup_s = parse_duration(args.warmup, "--warmup")
        if args.rounds < 1:
            raise ConfigError("--rounds", f"must be >= 1, got {args.rounds}")
    except ConfigError as error:
        parser.error(str(error))

    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    little = start_server("little", E1_SERVICE_TIME)
    try:
        for clients in clients_list:
            for round_index in range(args.rounds):
                for name in SERVERS:
                    if name == "little":
                        url = f"{little.url}/calculate?input=loadshed"
                        run = drive(url, clients, duration_s, warmup_s)
                    else:
                        app = "always_503" if name == "floor" else "refuse_all"
                        with burning_server(app, duration_s + warmup_s + 30) as url:
                            run = drive(url, clients, duration_s, warmup_s)
                    runs.setdefault((name, clients), []).append(run)
                    p99 = run["p99_rejected_s"]
                    print(
                        f"  round {round_index + 1} {name:>10} {clients:>3} clients: "
                        f"{run['throughput_rps']:,.0f}/s, p99 503 "
                        f"{'-' if p99 is None else f'{p99 * 1e3:.2f} ms'}",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        little.stop()

    summary = [
        {
            "server": name,
            "clients": clients,
            "rounds": len(runs[name, clients]),
            **{key: median(runs[name, clients], key) for key in FIGURES},
            "runs": runs[name, clients],
        }
        for clients in clients_list
        for name in SERVERS
    ]
    if args.json is not None:
        args.json.write_text(json.dumps({"steps": summary}, indent=2) + "\n")

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1e3:.2f}"

    command = "python bench/rejection_floor.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    print(f"`{command.strip()}`\n")
    print(
        f"Medians of {args.rounds} round(s); {duration_s:g} s measured per run after "
        f"{warmup_s:g} s of warm-up. floor: uvicorn answering 503 at once beside a busy CPU "
        "(same session); "
        "refuse_all: the same with LoadShedMiddleware refusing every request (its one slot "
        "held); little: serve-demo hashburn --protect little (E1 at 1x). Times in ms.\n"
    )
    print("| clients | server | responses/s | clients / X | 503 p50 | 503 p99 |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for step in summary:
        print(
            f"| {step['clients']} | {step['server']} | {step['throughput_rps']:,.0f} | "
            f"{ms(step['closed_loop_mean_s'])} | {ms(step['p50_rejected_s'])} | "
            f"{ms(step['p99_rejected_s'])} |"
        )


if __name__ == "__main__":
    main()
