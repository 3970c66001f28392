"""What LoadShedMiddleware costs on a trivial endpoint, side by side in one run.

    .venv/bin/python bench/middleware_overhead.py [--clients 8] [--duration 5] [--rounds 3]

Three uvicorn servers (one process each, pinned to CPU 0 when taskset is there) serve
the same trivial Starlette endpoint: bare, behind the middleware with ``fixed:1024``
(the admission mechanism only: it never queues), and behind the middleware with its
default limit (``little``). ``loadshed bench`` drives each in turn, closed loop with
``--clients`` connections (pinned to the other CPU), ``--rounds`` times, interleaved.
Reported: median throughput and p50/p99 per variant, and against bare: the
throughput ratio and the added p50.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PYTHON = sys.executable
VARIANTS = ("bare", "fixed", "little")


def pinned(command: list[str], cpu: str) -> list[str]:
    if shutil.which("taskset") and (os.cpu_count() or 1) > 1:
        return ["taskset", "-c", cpu, *command]
    return command


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def server(variant: str) -> Iterator[str]:
    port = free_port()
    command = [
        PYTHON, "-m", "uvicorn", f"middleware_targets:{variant}", "--app-dir", str(HERE),
        "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
        "--no-access-log", "--lifespan", "off",
    ]  # fmt: skip
    process = subprocess.Popen(pinned(command, "0"))
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            time.sleep(0.05)
        else:
            raise RuntimeError(f"{variant} server did not start")
        yield f"http://127.0.0.1:{port}/"
    finally:
        process.terminate()
        process.wait(timeout=10)


def bench(url: str, clients: int, duration: float) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [
            PYTHON, "-m", "loadshed.cli", "bench", url, "--clients", str(clients),
            "--duration", f"{duration}s", "--warmup", "1s", "--quiet", "--json", out.name,
        ]  # fmt: skip
        subprocess.run(pinned(command, "1"), check=True, stdout=subprocess.DEVNULL)
        result: dict[str, Any] = json.loads(Path(out.name).read_text())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the raw runs here")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {variant: [] for variant in VARIANTS}
    with contextlib.ExitStack() as stack:
        urls = {variant: stack.enter_context(server(variant)) for variant in VARIANTS}
        for _ in range(args.rounds):
            for variant in VARIANTS:
                result = bench(urls[variant], args.clients, args.duration)
                runs[variant].append(
                    {
                        "throughput_rps": result["throughput_rps"],
                        "ok": result["status_counts"].get("200", 0),
                        "requests": result["requests"],
                        "p50_s": result["latency_s"]["all"]["p50"],
                        "p99_s": result["latency_s"]["all"]["p99"],
                    }
                )
    median = {
        variant: {
            key: statistics.median(run[key] for run in runs[variant])
            for key in ("throughput_rps", "p50_s", "p99_s")
        }
        for variant in VARIANTS
    }
    bare = median["bare"]
    print(f"| variant | req/s (median of {args.rounds}) | p50 ms | p99 ms | "
          "throughput vs bare | added p50 us |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for variant in VARIANTS:
        m = median[variant]
        ratio = m["throughput_rps"] / bare["throughput_rps"]
        added = (m["p50_s"] - bare["p50_s"]) * 1e6
        print(
            f"| {variant} | {m['throughput_rps']:,.0f} | {m['p50_s'] * 1e3:.3f} | "
            f"{m['p99_s'] * 1e3:.3f} | {ratio:.3f} | {added:+.0f} |"
        )
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "median": median}, indent=2))


if __name__ == "__main__":
    main()
