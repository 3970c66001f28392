"""Slowloris at the descriptor limit: ``loadshed proxy`` in a child process with
``ulimit -n 1024`` (the issue's probe), 1,100 connections that send one header line
every 5 s and never finish their request head, for ``--seconds``; meanwhile a normal
client sends a request every 0.25 s.

Holds when every normal request is answered 200 within 2 s and the healthy upstream
is never marked down nor blamed for a fault. Uses the child proxy and the slowloris of
tests/proxy/test_proxy_limits.py.

    .venv/bin/python bench/faults/slowloris.py --seconds 30
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import requests
from probes import Row, render

from proxy_servers import Recorder, echo_app, serve_asgi
from test_proxy_limits import _child_proxy, _Slowloris, _upstream_metrics

NOFILE = 1024
ATTACKERS = 1100
TRICKLE = 5.0


def run(seconds: float) -> list[Row]:
    """The slowloris; its rows for the fault table."""
    recorder = Recorder()
    latencies: list[float] = []
    failures: list[str] = []
    with (
        serve_asgi(echo_app(recorder)) as upstream,
        _child_proxy(upstream, NOFILE) as (url, metrics_url, _),
    ):
        with _Slowloris(url, count=ATTACKERS, interval=TRICKLE) as attack:
            time.sleep(min(5.0, seconds / 3))  # let the attack fill the proxy
            end = time.monotonic() + seconds
            index = 0
            while time.monotonic() < end:
                began = time.monotonic()
                try:
                    response = requests.get(f"{url}/normal/{index}", timeout=5)
                    if response.status_code != 200:
                        failures.append(str(response.status_code))
                except requests.RequestException as error:
                    failures.append(type(error).__name__)
                latencies.append(time.monotonic() - began)
                index += 1
                time.sleep(0.25)
        metrics = _upstream_metrics(metrics_url)
    label = f'upstream="{upstream}"'
    up = metrics.get(f"loadshed_proxy_upstream_up{{{label}}}") == 1.0
    blamed = sorted(name for name, value in metrics.items() if "faults_total" in name and value)
    slow = [t for t in latencies if t >= 2.0]
    return [
        Row(
            f"slowloris: {ATTACKERS} slow connections, ulimit -n {NOFILE}, {seconds:g} s",
            "every normal request 200 within 2 s",
            f"{len(latencies) - len(failures)}/{len(latencies)} 200, slowest "
            f"{max(latencies, default=0):.2f}s, {attack.closed_by_proxy} attackers closed",
            bool(latencies) and not failures and not slow,
        ),
        Row(
            "slowloris: the healthy upstream",
            "never marked down, no fault blamed on it",
            f"up={up}, faults {blamed or 'none'}",
            up and not blamed,
        ),
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    options = parser.parse_args()
    rows = run(options.seconds)
    print(render(rows))
    sys.exit(1 if any(not row.holds for row in rows) else 0)
