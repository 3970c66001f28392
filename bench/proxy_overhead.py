"""What the proxy costs: a trivial upstream measured directly and through ``loadshed proxy``.

    .venv/bin/python bench/proxy_overhead.py [--rate 200] [--duration 5] [--connections 32]

Two measurements, each side by side in the same run:

1. Added latency: ``loadshed bench`` open loop at ``--rate`` req/s against the upstream,
   then through a proxy per ``--limits`` value (default: ``little``, the default limit,
   and ``fixed:1024``, forwarding without any queueing), ``--rounds`` times each,
   interleaved; p50/p99 of each run and the difference of the medians.
2. Throughput on one core: the proxy pinned to CPU ``--proxy-cpu`` (taskset), ``wrk``
   with ``--connections`` connections (pinned to the other CPUs with the upstream).
   The proxy uses ``--throughput-limit`` (default ``fixed:1024``) so that every request is
   forwarded, not shed. Reported: req/s reached and requests per CPU-second the
   proxy process used (psutil): the rate one dedicated core would carry. On a shared
   machine the second figure is the stable one; the first depends on what else runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import psutil

from proxy_procs import HELLO_APP, PYTHON, free_port, pinned, proxy_command, started


def loadshed_bench(
    url: str, rate: float, duration: float, cpus: str | None, max_lag: str
) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [
            PYTHON, "-m", "loadshed.cli", "bench", url, "--rate", str(rate),
            "--duration", f"{duration}s", "--warmup", "1s", "--quiet", "--json", out.name,
            "--max-lag", max_lag,
        ]  # fmt: skip
        subprocess.run(pinned(command, cpus), check=True, stdout=subprocess.DEVNULL)
        result: dict[str, Any] = json.loads(Path(out.name).read_text())
    return result


def wrk(url: str, connections: int, duration: float, cpus: str | None) -> tuple[int, float, str]:
    command = ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(duration))}s", url]
    output = subprocess.run(pinned(command, cpus), check=True, capture_output=True, text=True)
    text = output.stdout
    requests = int(re.search(r"(\d+) requests in", text).group(1))  # type: ignore[union-attr]
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))  # type: ignore[union-attr]
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    return requests - (int(non_2xx.group(1)) if non_2xx else 0), rate, text


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    total = times.user + times.system
    for child in process.children(recursive=True):
        child_times = child.cpu_times()
        total += child_times.user + child_times.system
    return float(total)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=200.0, help="open-loop req/s for latency")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--connections", type=int, default=32, help="wrk connections")
    parser.add_argument("--proxy-cpu", default="0", help="CPU list for the proxy (taskset)")
    parser.add_argument("--other-cpus", default="1", help="CPU list for the upstream and wrk")
    parser.add_argument(
        "--bench-cpus", default="", help="CPU list for loadshed bench (default: not pinned)"
    )
    parser.add_argument(
        "--max-lag", default="250ms", help="loadshed bench --max-lag (a busy machine lags)"
    )
    parser.add_argument(
        "--limits",
        default="little,fixed:1024",
        help="proxy limits for the latency runs, one proxy each (fixed:1024: forwarding alone)",
    )
    parser.add_argument("--rounds", type=int, default=2, help="interleaved latency rounds")
    parser.add_argument("--throughput-limit", default="fixed:1024")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is needed for the throughput part: apt-get install -y wrk")

    upstream_port, max_port = free_port(), free_port()
    upstream = f"http://127.0.0.1:{upstream_port}"
    report: dict[str, Any] = {"args": vars(args) | {"json": str(args.json)}}
    with started([PYTHON, "-c", HELLO_APP, str(upstream_port)], upstream_port, args.other_cpus):
        # 1. latency, interleaved: direct, then through a proxy per --limits value
        limits = [limit.strip() for limit in args.limits.split(",") if limit.strip()]
        ports = [free_port() for _ in limits]
        runs: dict[str, list[dict[str, Any]]] = {"direct": []}
        targets = [("direct", upstream)]
        with contextlib.ExitStack() as stack:
            for limit, port in zip(limits, ports, strict=True):
                command = proxy_command(upstream, port, limit)
                stack.enter_context(started(command, port, args.proxy_cpu))
                runs[f"proxy {limit}"] = []
                targets.append((f"proxy {limit}", f"http://127.0.0.1:{port}"))
            for _ in range(args.rounds):
                for name, url in targets:
                    result = loadshed_bench(
                        url + "/", args.rate, args.duration, args.bench_cpus, args.max_lag
                    )
                    latency = result["latency_s"]["success"]
                    runs[name].append(
                        {
                            "p50_ms": latency["p50"] * 1000,
                            "p99_ms": latency["p99"] * 1000,
                            "successes": result["successes"],
                            "requests": result["requests"],
                        }
                    )
        report["latency"] = runs
        # 2. throughput on one core
        with started(
            proxy_command(upstream, max_port, args.throughput_limit), max_port, args.proxy_cpu
        ) as proxy_process:
            wrk(f"http://127.0.0.1:{max_port}/", args.connections, 1.0, args.other_cpus)  # warm
            process = psutil.Process(proxy_process.pid)
            before = cpu_seconds(process)
            ok, rate, _ = wrk(
                f"http://127.0.0.1:{max_port}/", args.connections, args.duration, args.other_cpus
            )
            used = cpu_seconds(process) - before
        _, direct_rate, _ = wrk(upstream + "/", args.connections, args.duration, args.other_cpus)
        report["throughput"] = {
            "proxy_rps": rate,
            "proxy_2xx": ok,
            "proxy_cpu_seconds": used,
            "proxy_cpu_share": used / args.duration,
            "requests_per_cpu_second": ok / used if used else float("nan"),
            "direct_rps": direct_rate,
        }

    print(f"\nproxy overhead (rate {args.rate:g} req/s, {args.duration:g}s per run)\n")
    print("| path | run | p50 ms | p99 ms | 2xx / sent |")
    print("| --- | --- | ---: | ---: | ---: |")
    direct_p50 = statistics.median(r["p50_ms"] for r in runs["direct"])
    direct_p99 = statistics.median(r["p99_ms"] for r in runs["direct"])
    for name, name_runs in runs.items():
        for index, run in enumerate(name_runs, 1):
            print(
                f"| {name} | {index} | {run['p50_ms']:.2f} | {run['p99_ms']:.2f} "
                f"| {run['successes']} / {run['requests']} |"
            )
    print()
    report["added_ms"] = {}
    for name, name_runs in runs.items():
        if name == "direct":
            continue
        added_p50 = statistics.median(r["p50_ms"] for r in name_runs) - direct_p50
        added_p99 = statistics.median(r["p99_ms"] for r in name_runs) - direct_p99
        report["added_ms"][name] = {"p50": added_p50, "p99": added_p99}
        print(f"added by {name} (medians): p50 {added_p50:+.2f} ms, p99 {added_p99:+.2f} ms")
    t = report["throughput"]
    print(f"\nthroughput, wrk -c{args.connections}, proxy pinned to CPU {args.proxy_cpu}:\n")
    print("| path | req/s reached | proxy CPU share | requests per proxy CPU-second |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| direct | {t['direct_rps']:,.0f} | - | - |")
    print(
        f"| proxy ({args.throughput_limit}) | {t['proxy_rps']:,.0f} | "
        f"{t['proxy_cpu_share']:.0%} | {t['requests_per_cpu_second']:,.0f} |"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
