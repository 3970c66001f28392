"""The README's example driven again and again, as a user does: one server, one run after another.

    .venv/bin/python bench/rerun.py [--clients 4,64,4,16] [--duration 8s] [--warmup 1s]
        [--pause 2s] [--timeout 2s] [--drivers loadshed,hey] [--src [LABEL=]PATH ...]
        [--model-ms 25 | --trees N] [--out FILE.md] [--json FILE]

``bench/retry_storm.py`` starts a fresh server for every step; a user who runs ``hey`` or
``loadshed bench`` against a running server runs each load test after the last one ended,
and a load test that ends closes its connections with requests still queued or running:
to the server, those clients gave up after waiting a few milliseconds. This bench keeps
one server (the same app, model and defaults as ``retry_storm.py``: a FastAPI app with a
random forest through ``ModelRunner(predict, workers=1)`` behind ``LoadShedMiddleware`` at
its defaults, and the same app unprotected) for the whole sequence of ``--clients`` runs,
closed loop, clients that retry at once after a 503, ``--pause`` between runs, and
reports each run's 200s per second, 503s and time-outs, with the limiter's learned
patience, wait bound and limit read from ``/metrics`` after the run.

``--src LABEL=PATH`` (repeatable) also runs the sequence with another checkout's ``src``
(``git worktree add /tmp/old HEAD~1``, then ``--src before=/tmp/old/src``), so old and new
code are measured in one run. Protected and unprotected servers of every tree alternate
run by run, so all see the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loadshed.errors import ConfigError
from loadshed.units import parse_duration, parse_int_list
from retry_storm import (
    Server,
    Tree,
    add_shared_arguments,
    calibrate,
    check_drivers,
    drive_hey,
    drive_loadshed,
    parse_src,
)


def run_sequence(
    calibration: dict[str, Any],
    work_dir: Path,
    trees: list[Tree],
    counts: list[int],
    drivers: list[str],
    times: tuple[float, float, float, float],
) -> list[dict[str, Any]]:
    duration, warmup, pause, timeout = times
    rows: list[dict[str, Any]] = []
    for driver in drivers:
        model = calibration["model_path"]
        servers = [
            (tree, variant, Server(tree, variant == "protected", model, work_dir))
            for tree in trees
            for variant in ("protected", "unprotected")
        ]
        try:
            for index, clients in enumerate(counts):
                order = servers if index % 2 == 0 else servers[::-1]
                for tree, variant, server in order:
                    url = f"{server.url}/predict"
                    if driver == "hey":
                        run = drive_hey(
                            url,
                            calibration["body_path"],
                            clients,
                            duration,
                            warmup,
                            max(1, round(timeout)),
                        )
                    else:
                        run = drive_loadshed(
                            url,
                            calibration["body_path"],
                            clients=clients,
                            duration=duration,
                            warmup=warmup,
                            timeout=timeout,
                        )
                    time.sleep(pause)  # the server sees the last run's clients leave
                    metrics = server.metrics()
                    row = {
                        "driver": driver,
                        "run": index + 1,
                        "clients": clients,
                        "tree": tree.label,
                        "variant": variant,
                        "ok_rps": run["ok_rps"],
                        "rejected": run["rejected"],
                        "timeouts": run["timeouts"],
                        "command": run["command"],
                        "metrics": metrics,
                    }
                    rows.append(row)
                    print(
                        f"  {driver} run {index + 1} ({clients} clients) {tree.label} "
                        f"{variant}: 200/s {run['ok_rps']:.1f}, 503s {run['rejected']:,}, "
                        f"timeouts {run['timeouts']:,}, patience after "
                        f"{_s(metrics.get('patience_seconds'))}",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            for _, _, server in servers:
                server.stop()
    return rows


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.1f} ms"


def render(
    command: str,
    calibration: dict[str, Any],
    rows: list[dict[str, Any]],
    notes: list[str],
    wall: float,
) -> str:
    lines = [
        "# The README's example driven again and again (one server, one run after another)",
        "",
        f"`{command}`",
        "",
        f"{os.cpu_count()} CPUs; wall {wall:.0f} s. Model: random forest on digits, "
        f"{calibration['trees']} trees, {calibration['per_call_ms']:.1f} ms per call here; "
        "`ModelRunner(predict, workers=1)`; protected = `LoadShedMiddleware` at its defaults, "
        "no deadline header; closed loop, clients retry at once after a 503. One server per "
        "tree and variant for the whole sequence; patience, wait bound and limit are the "
        "limiter's after each run (the run's own clients left when it ended).",
        "",
        *(f"- {note}" for note in notes),
        "",
        "| driver | run | clients | tree | protected: 200/s | 503s | timeouts | patience after "
        "| wait bound after | limit after | unprotected: 200/s | timeouts |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    keyed = {(r["driver"], r["run"], r["tree"], r["variant"]): r for r in rows}
    for row in rows:
        if row["variant"] != "protected":
            continue
        other = keyed.get((row["driver"], row["run"], row["tree"], "unprotected"))
        metrics = row["metrics"]
        limit = metrics.get("limit")
        bound = metrics.get("queue_wait_bound_seconds")
        other_ok = "-" if other is None else f"{other['ok_rps']:.1f}"
        other_timeouts = "-" if other is None else f"{other['timeouts']:,}"
        lines.append(
            f"| {row['driver']} | {row['run']} | {row['clients']} | {row['tree']} | "
            f"{row['ok_rps']:.1f} | {row['rejected']:,} | {row['timeouts']:,} | "
            f"{_s(metrics.get('patience_seconds'))} | {_s(bound)} | "
            f"{'-' if limit is None else f'{limit:g}'} | "
            f"{other_ok} | {other_timeouts} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="4,64,4,16", help="the runs' client counts, in order")
    parser.add_argument("--duration", default="8s", help="measured time per run")
    parser.add_argument("--warmup", default="1s", help="unmeasured lead-in per run")
    parser.add_argument("--pause", default="2s", help="time between runs")
    parser.add_argument("--timeout", default="2s", help="client timeout (hey: whole seconds)")
    parser.add_argument("--drivers", default="loadshed", help="loadshed, hey, or both")
    add_shared_arguments(parser)
    args = parser.parse_args()
    try:
        counts = parse_int_list(args.clients, "--clients")
        duration = parse_duration(args.duration, "--duration")
        warmup = parse_duration(args.warmup, "--warmup")
        pause = parse_duration(args.pause, "--pause")
        timeout = parse_duration(args.timeout, "--timeout")
        trees = parse_src(args.src)
    except (ValueError, ConfigError) as error:
        parser.error(str(error))
    drivers, notes = check_drivers(parser, args)
    if not drivers:
        parser.error("--drivers: hey is not installed, and no other driver was given")
    command = "python bench/rerun.py " + shlex.join(sys.argv[1:])
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rerun-") as work:
        work_dir = Path(work)
        calibration = calibrate(args.model_ms, args.trees, work_dir)
        print(
            f"model: {calibration['trees']} trees, {calibration['per_call_ms']:.1f} ms per call",
            file=sys.stderr,
            flush=True,
        )
        rows = run_sequence(
            calibration, work_dir, trees, counts, drivers, (duration, warmup, pause, timeout)
        )
    text = render(command, calibration, rows, notes, time.monotonic() - started)
    print(text)
    if args.out:
        args.out.write_text(text)
    if args.json:
        args.json.write_text(
            json.dumps({"command": command, "calibration": calibration, "rows": rows}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
