"""Clients that retry at once, against servers whose service times vary: the default limit
beside no protection and a hand-set limit at the worker count, over a matrix of worker
counts, service-time distributions and client counts.

    .venv/bin/python bench/retry_storm_origin.py [--workers 8,32] [--service-time 20ms]
        [--dists exponential,lognormal] [--sigma 1.0] [--clients 16,64,256]
        [--protect little,none,fixed:W] [--duration 8s] [--warmup 2s] [--timeout 2]
        [--out FILE.md] [--json FILE]

Each step starts ``loadshed serve-demo --model origin`` (``--workers`` slots of an asyncio
sleep drawn from ``--service-dist``, mean ``--service-time``, a FIFO of 100 waiting
requests and 503 beyond it: that is what *none* means here, the origin's own queue bound)
on a free loopback port, in its own session, behind ``--protect`` (``fixed:W`` is a limit
of the step's worker count), and stops it after. hey drives it closed loop (``-c
CLIENTS -t TIMEOUT``: each client sends again at once after any answer, 503 included) for
a discarded ``--warmup`` run and then the measured ``--duration`` run. Reported per step:
200s per second (over hey's own Total) as a share of the origin's capacity (workers /
mean service time), 503s per second, client timeouts and the p50 / p99 of all answers;
and per cell the default's successes over the best of the others'.

The work is a sleep, so the server's event loop, not a model process, shares the CPU with
the refusals: the other side of ``bench/retry_storm.py``, whose model burns a core.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from loadshed.units import parse_duration, parse_int_list
from retry_storm import HEY, is_timeout, parse_hey
from servers import free_port, wait_for_port


def serve(
    port: int, workers: int, service_s: float, dist: str, sigma: float, protect: str
) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "loadshed", "serve-demo", "--model", "origin",
        "--workers", str(workers), "--service-time", f"{service_s:g}",
        "--service-dist", dist, "--seed", "1", "--protect", protect, "--port", str(port),
    ]  # fmt: skip
    if dist == "lognormal":
        command += ["--sigma", f"{sigma:g}"]
    return subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def drive(url: str, clients: int, duration: float, warmup: float, timeout: int) -> dict[str, Any]:
    def hey(seconds: float) -> list[str]:
        return [HEY, "-c", str(clients), "-z", f"{seconds:g}s", "-t", str(timeout), url]

    if warmup > 0:
        subprocess.run(hey(warmup), capture_output=True, check=False)
    done = subprocess.run(hey(duration), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"hey failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    parsed = parse_hey(done.stdout)
    window = parsed["total_s"] or duration
    status: dict[int, int] = parsed["status"]
    ok = sum(n for code, n in status.items() if 200 <= code < 300)
    refused = status.get(503, 0)
    timeouts = sum(n for message, n in parsed["errors"].items() if is_timeout(message))
    percentiles = parsed["percentiles_s"]
    return {
        "ok_rps": ok / window,
        "refused_rps": refused / window,
        "timeouts": timeouts,
        "other": sum(status.values()) - ok - refused + sum(parsed["errors"].values()) - timeouts,
        "p50_ms": 1000 * percentiles["50"] if "50" in percentiles else None,
        "p99_ms": 1000 * percentiles["99"] if "99" in percentiles else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", default="8,32", help="origin slots, comma-separated")
    parser.add_argument("--service-time", default="20ms", help="mean work time")
    parser.add_argument("--dists", default="exponential,lognormal")
    parser.add_argument("--sigma", type=float, default=1.0, help="log-space spread (lognormal)")
    parser.add_argument("--clients", default="16,64,256")
    parser.add_argument("--protect", default="little,none,fixed:W", help="W: the worker count")
    parser.add_argument("--duration", default="8s")
    parser.add_argument("--warmup", default="2s")
    parser.add_argument("--timeout", type=int, default=2, help="client timeout, whole seconds")
    parser.add_argument("--out", default=None, help="markdown file")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if not Path(HEY).exists():
        print(f"needs hey at {HEY} (apt-get install hey)", file=sys.stderr)
        return 2
    service_s = parse_duration(args.service_time, "service-time")
    duration = parse_duration(args.duration, "duration")
    warmup = parse_duration(args.warmup, "warmup")
    workers_list = parse_int_list(args.workers, "workers")
    clients_list = parse_int_list(args.clients, "clients")
    dists = [d for d in args.dists.split(",") if d]
    protects = [p for p in args.protect.split(",") if p]
    rows: list[dict[str, Any]] = []
    for workers in workers_list:
        for dist in dists:
            for clients in clients_list:
                for protect_spec in protects:
                    protect = protect_spec.replace(":W", f":{workers}")
                    port = free_port()
                    server = serve(port, workers, service_s, dist, args.sigma, protect)
                    try:
                        wait_for_port(port, 60, "serve-demo")
                        time.sleep(0.3)
                        result = drive(
                            f"http://127.0.0.1:{port}/work", clients, duration, warmup, args.timeout
                        )
                    finally:
                        stop(server)
                    capacity = workers / service_s
                    row = {
                        "workers": workers, "dist": dist, "clients": clients,
                        "protect": protect_spec, "capacity_rps": capacity,
                        "share": result["ok_rps"] / capacity, **result,
                    }  # fmt: skip
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr)
                    if args.json:  # kept step by step: a run cut short keeps its rows
                        Path(args.json).write_text(json.dumps({"rows": rows}, indent=1))

    dist_label = {d: (f"lognormal {args.sigma:g}" if d == "lognormal" else d) for d in dists}
    command = "python bench/retry_storm_origin.py " + " ".join(sys.argv[1:])
    lines = [
        "# Clients that retry at once, varied service times (origin demo, hey)",
        "",
        f"`{command.strip()}`",
        "",
        f"{os.cpu_count()} CPUs. Mean work time {service_s * 1000:g} ms; hey closed loop, "
        f"{args.timeout} s client timeout, {warmup:g} s discarded then {duration:g} s measured "
        "per step, a fresh server per step. Share: 200s per second over the origin's "
        "capacity (workers / mean work time). *none*: the origin's own FIFO of 100, 503 "
        "beyond.",
        "",
        "| workers | service | clients | protect | share of capacity | 503/s | timeouts "
        "| p50 / p99 ms |",
        "| ---: | --- | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        p50, p99 = row["p50_ms"], row["p99_ms"]
        latency = f"{p50:.1f} / {p99:.1f}" if p50 is not None and p99 is not None else "-"
        lines.append(
            f"| {row['workers']} | {dist_label[row['dist']]} | {row['clients']} | "
            f"{row['protect']} | {row['share']:.2f} | {row['refused_rps']:.0f} | "
            f"{row['timeouts']} | {latency} |"
        )
    default = protects[0]
    others = protects[1:]
    if others:
        lines += [
            "",
            f"`{default}` over the best of {', '.join(f'`{p}`' for p in others)} (successes), "
            "per cell:",
            "",
        ]
        ratios = []
        for workers in workers_list:
            for dist in dists:
                cells = []
                for clients in clients_list:
                    step = {
                        r["protect"]: r["ok_rps"]
                        for r in rows
                        if (r["workers"], r["dist"], r["clients"]) == (workers, dist, clients)
                    }
                    best = max(step[p] for p in others)
                    ratio = step[default] / best if best > 0 else float("inf")
                    ratios.append(ratio)
                    cells.append(f"{clients} clients {ratio:.2f}")
                lines.append(f"- {workers} workers, {dist_label[dist]}: " + ", ".join(cells))
        lines += ["", f"min {min(ratios):.2f} over {len(ratios)} cells."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"command": command, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
