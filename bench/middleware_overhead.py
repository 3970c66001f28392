"""What LoadShedMiddleware costs on a trivial endpoint, side by side in one run.

    .venv/bin/python bench/middleware_overhead.py [--clients 8 | --rate R] [--duration 5]
        [--rounds 3] [--variants bare,fixed,little,fixed+compiled,little+compiled]

Uvicorn servers (one process each, pinned to CPU 0 when taskset is there) serve
the same trivial Starlette endpoint: bare, behind the middleware with ``fixed:1024``
(the admission mechanism only: it never queues), and behind the middleware with its
default limit (``little``); ``+compiled`` variants serve the same from the mypyc
build (``make compiled``, see ``bench/compiled_build.py``). ``loadshed bench`` drives
each in turn, closed loop with ``--clients`` connections (pinned to the other CPU),
``--rounds`` times, interleaved (each round starts one variant later). With
``--rate R`` the load is open loop at R requests/s instead, the same for every variant:
below saturation, the added p50 is the latency the middleware itself adds, where under a
saturating closed loop it also holds the queue that forms behind the lower throughput
(Little's law: p50 ~ clients / throughput).
Other variants in ``bench/middleware_targets.py`` work too (``forward``, ``timing_header``,
``fixed_untimed``, ...).
Reported: median throughput and p50/p99 per variant, and against bare: the
throughput ratio and the added p50; also the server's CPU time per request (user +
system, read from the process before and after each run, divided by the requests it
answered), which holds on a shared machine where throughput moves with the neighbours.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from compiled_build import DEFAULT_DIR, SUFFIX, app_name, check, environment
from servers import free_port, uvicorn_command, wait_for_port

HERE = Path(__file__).resolve().parent
PYTHON = sys.executable
VARIANTS = "bare,fixed,little,fixed+compiled,little+compiled"


def pinned(command: list[str], cpu: str) -> list[str]:
    if shutil.which("taskset") and (os.cpu_count() or 1) > 1:
        return ["taskset", "-c", cpu, *command]
    return command


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def server(variant: str, compiled_dir: Path) -> Iterator[tuple[str, int]]:
    port = free_port()
    command = uvicorn_command(app_name(variant), port)
    process = subprocess.Popen(pinned(command, "0"), env=environment(variant, compiled_dir))
    try:
        wait_for_port(port, 20, f"{variant} server")
        yield f"http://127.0.0.1:{port}/", process.pid
    finally:
        process.terminate()
        process.wait(timeout=10)


def bench(url: str, load: list[str], duration: float) -> dict[str, Any]:
    """One run of ``loadshed bench`` with ``load`` (``--clients C`` or ``--rate R``)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [
            PYTHON, "-m", "loadshed.cli", "bench", url, *load,
            # No warm-up: every request the server answers is counted (CPU per request).
            "--duration", f"{duration}s", "--warmup", "0s", "--quiet", "--json", out.name,
        ]  # fmt: skip
        subprocess.run(pinned(command, "1"), check=True, stdout=subprocess.DEVNULL)
        result: dict[str, Any] = json.loads(Path(out.name).read_text())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, default=8, help="closed loop: saturating load")
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="open loop at this many requests/s instead (one load every variant holds: the "
        "added p50 is then the middleware's own latency, not a queue behind less throughput)",
    )
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", default=VARIANTS, help="comma-separated; bare first")
    parser.add_argument("--compiled-dir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--json", type=Path, help="also write the raw runs here")
    args = parser.parse_args()
    variants = args.variants.split(",")
    if variants[0] != "bare":
        sys.exit("error: --variants must start with bare (the reference)")
    if any(variant.endswith(SUFFIX) for variant in variants):
        check(args.compiled_dir)
    if args.rate is not None and not args.rate > 0:
        sys.exit(f"error: --rate must be > 0 requests/s, got {args.rate}")
    load = ["--clients", str(args.clients)] if args.rate is None else ["--rate", str(args.rate)]
    runs: dict[str, list[dict[str, Any]]] = {variant: [] for variant in variants}
    with contextlib.ExitStack() as stack:
        servers = {
            variant: stack.enter_context(server(variant, args.compiled_dir)) for variant in variants
        }
        for variant in variants:  # warm each server up once, outside the figures
            bench(servers[variant][0], load, 1.0)
        for round_index in range(args.rounds):
            # Each round starts one variant later, so none is always measured first
            # (or always right after the same neighbour).
            shift = round_index % len(variants)
            for variant in variants[shift:] + variants[:shift]:
                url, pid = servers[variant]
                cpu_before = cpu_seconds(pid)
                result = bench(url, load, args.duration)
                cpu_used = cpu_seconds(pid) - cpu_before
                runs[variant].append(
                    {
                        "throughput_rps": result["throughput_rps"],
                        "ok": result["status_counts"].get("200", 0),
                        "requests": result["requests"],
                        "p50_s": result["latency_s"]["all"]["p50"],
                        "p99_s": result["latency_s"]["all"]["p99"],
                        "server_cpu_us_per_request": cpu_used / max(1, result["requests"]) * 1e6,
                    }
                )
    median = {
        variant: {
            key: statistics.median(run[key] for run in runs[variant])
            for key in ("throughput_rps", "p50_s", "p99_s", "server_cpu_us_per_request")
        }
        for variant in variants
    }
    bare = median["bare"]
    print(f"Load: {' '.join(load)}, {args.duration:g} s per run, {args.rounds} rounds.\n")
    print(f"| variant | req/s (median of {args.rounds}) | p50 ms | p99 ms | "
          "throughput vs bare | added p50 us | server CPU us/request | added CPU us |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for variant in variants:
        m = median[variant]
        ratio = m["throughput_rps"] / bare["throughput_rps"]
        added = (m["p50_s"] - bare["p50_s"]) * 1e6
        print(
            f"| {variant} | {m['throughput_rps']:,.0f} | {m['p50_s'] * 1e3:.3f} | "
            f"{m['p99_s'] * 1e3:.3f} | {ratio:.3f} | {added:+.0f} | "
            f"{m['server_cpu_us_per_request']:.1f} | "
            f"{m['server_cpu_us_per_request'] - bare['server_cpu_us_per_request']:+.1f} |"
        )
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "median": median}, indent=2))


if __name__ == "__main__":
    main()
