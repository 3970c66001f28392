"""How cheap is the generator? Requests per generator CPU-second against a trivial loopback
target, closed loop, 8 connections, beside Locust (FastHttpUser, one process) and wrk.

Every tool is measured the same way, from outside: once traffic flows and has settled, the
target's own request counter and the generator's process-tree CPU time (user + system, workers
included) are read at the start and the end of a window.
requests/CPU-s = requests served / CPU spent.

    .venv/bin/python bench/loadgen/efficiency.py [--window 5] [--settle 2] [--locust PATH]

Locust is not a loadshed dependency: without --locust the script installs it into a
throwaway venv under the system temp directory.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    BUILD_DIR,
    LOADSHED,
    ensure_apt,
    environment,
    served,
    table,
    target,
    tree_cpu_seconds,
)

PORT = 18092
CONNECTIONS = 8
LOCUSTFILE = """
from locust import FastHttpUser, constant, task


class Hammer(FastHttpUser):
    wait_time = constant(0)

    @task
    def get(self):
        self.client.get("/")
"""


def ensure_locust(path: str | None) -> str:
    """A locust executable: ``path``, or one installed into a throwaway venv."""
    if path:
        return path
    venv = BUILD_DIR / "locust-venv"
    binary = venv / "bin" / "locust"
    if not binary.exists():
        print("installing locust into a throwaway venv (once)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "locust"], check=True)
    return str(binary)


def measure(name: str, command: list[str], url: str, settle: float, window: float) -> list[object]:
    """Run ``command``; count requests and generator CPU over the window after ``settle``."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        # Start-up (imports, spawning workers) is not the steady state: wait for traffic.
        before = served(url)
        deadline = time.monotonic() + 30
        while served(url) == before and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(settle)
        served_0, cpu_0, t0 = served(url), tree_cpu_seconds(process.pid), time.monotonic()
        time.sleep(window)
        served_1, cpu_1, t1 = served(url), tree_cpu_seconds(process.pid), time.monotonic()
    finally:
        process.terminate()
        _, err = process.communicate(timeout=30)
    requests = served_1 - served_0
    cpu = cpu_1 - cpu_0
    if requests <= 0 or cpu <= 0:
        raise SystemExit(f"{name}: nothing measured ({err.decode()[-300:]})")
    return [name, f"{requests / (t1 - t0):,.0f}", f"{cpu / (t1 - t0):.2f}",
            f"{requests / cpu:,.0f}"]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument("--settle", type=float, default=2.0)
    parser.add_argument("--locust", default=None, help="path of a locust executable")
    parser.add_argument("--skip", default="", help="comma-separated tools to skip")
    args = parser.parse_args()
    skip = set(args.skip.split(","))
    total = args.settle + args.window + 15  # start-up time; each run is stopped after its window
    locust = ensure_locust(args.locust) if "locust" not in skip else ""
    rows = []
    with tempfile.TemporaryDirectory() as tmp, target("trivial", PORT) as url:
        locustfile = Path(tmp) / "locustfile.py"
        locustfile.write_text(LOCUSTFILE)
        tools = {
            "loadshed bench -c 8 (1 process)":
                [*LOADSHED, "bench", url, "-c", str(CONNECTIONS), "-d", f"{total}s", "-w", "0s",
                 "-q"],
            "loadshed bench -c 8 --client aiohttp (1 process)":
                [*LOADSHED, "bench", url, "-c", str(CONNECTIONS), "-d", f"{total}s", "-w", "0s",
                 "-q", "--client", "aiohttp"],
            "loadshed bench -c 8 -p 2 (2 processes)":
                [*LOADSHED, "bench", url, "-c", str(CONNECTIONS), "-p", "2", "-d", f"{total}s",
                 "-w", "0s", "-q"],
            "locust FastHttpUser (1 process, 8 users)":
                [locust, "-f", str(locustfile), "--headless", "-u", str(CONNECTIONS), "-r", "100",
                 "-t", f"{int(total)}s", "--host", url.rstrip("/"), "--only-summary",
                 "--loglevel", "WARNING"],
            "wrk -t1 -c8":
                [ensure_apt("wrk"), "-t1", f"-c{CONNECTIONS}", f"-d{int(total)}s", url],
        }  # fmt: skip
        for name, command in tools.items():
            if name.split()[0] in skip:
                continue
            rows.append(measure(name, command, url, args.settle, args.window))
            print(f"{rows[-1]}", file=sys.stderr)
    print(f"<!-- {environment()}; pid {os.getpid()} -->\n")
    print(
        f"Closed loop, {CONNECTIONS} connections, trivial Go target, {args.window:g} s window "
        f"after {args.settle:g} s\n"
    )
    print(table(rows, ["generator", "requests/s", "generator CPU (cores)", "requests/CPU-s"]))


if __name__ == "__main__":
    main()
