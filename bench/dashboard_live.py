"""The Grafana dashboard against a real Prometheus: does every panel's query return data?

    .venv/bin/python bench/dashboard_live.py [--duration 20] [--out bench/results/dashboard_live.md]

Real processes on loopback: ``loadshed serve-demo --model origin --protect little``
(its own ``/metrics``) and ``loadshed proxy`` (``--metrics-port``) in front of a second,
unprotected origin; a Prometheus (Debian's ``prometheus`` package, installed with
apt-get when missing; the script exits with a message if that fails) scraping both
every second. ``loadshed bench`` drives each at twice its capacity (Poisson, deadlines
sent) for ``--duration`` seconds, so that requests queue and are refused; a few
requests carry a malformed ``X-Request-Timeout`` (the malformed-headers panel). Then
every target of every panel of ``dashboards/loadshed.json`` is evaluated through
Prometheus' HTTP API (``/api/v1/query_range`` over the run, ``$limiter`` as ``.*`` and
``$__rate_interval`` as 15 s, which Grafana would derive from a 1 s scrape) and
reported: series returned, and whether any holds a number. Exit 1 if a query returns
nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from proxy_procs import PYTHON, free_port, started

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "dashboards" / "loadshed.json"
WORKERS = 4
SERVICE_S = 0.05


def ensure_prometheus() -> str | None:
    """The prometheus binary, installed with apt-get if missing; None if that fails."""
    found = shutil.which("prometheus")
    if found:
        return found
    print("prometheus missing: apt-get install -y prometheus", file=sys.stderr)
    install = subprocess.run(
        ["apt-get", "install", "-y", "--no-install-recommends", "prometheus"],
        capture_output=True,
        text=True,
        check=False,
    )
    if install.returncode != 0:
        print(f"could not install prometheus: {install.stderr.strip()[-300:]}", file=sys.stderr)
        return None
    return shutil.which("prometheus")


def prometheus_config(targets: list[str]) -> str:
    listed = ", ".join(f"'{t}'" for t in targets)
    return f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: loadshed
    static_configs:
      - targets: [{listed}]
"""


def query_range(base: str, expr: str, start: float, end: float) -> list[dict[str, Any]]:
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": "1"})
    with urllib.request.urlopen(f"{base}/api/v1/query_range?{params}", timeout=10) as response:
        payload = json.loads(response.read())
    if payload.get("status") != "success":
        raise RuntimeError(f"query failed: {expr}: {payload}")
    return list(payload["data"]["result"])


def wait_ready(base: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{base}/-/ready", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("prometheus did not become ready")


def bench(url: str, rate: float, duration: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            PYTHON, "-m", "loadshed", "bench", url, "--rate", str(rate), "--arrival", "poisson",
            "--duration", f"{duration:g}s", "--warmup", "0s", "--timeout", "1s",
            "--send-deadline", "--seed", "1", "--quiet", "--max-lag", "1s",
        ],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip


def malformed(url: str, count: int) -> None:
    """Requests with a deadline header that is not a number."""
    for _ in range(count):
        request = urllib.request.Request(url, headers={"X-Request-Timeout": "soon"})
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                response.read()
        except OSError:
            pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of load")
    parser.add_argument("--out", help="markdown file (a .json beside it)")
    args = parser.parse_args()
    prometheus = ensure_prometheus()
    if prometheus is None:
        print("skipped: no prometheus")
        return 0
    dashboard = json.loads(DASHBOARD.read_text())
    capacity = WORKERS / SERVICE_S
    demo_port, origin_port, proxy_port, metrics_port, prom_port = (free_port() for _ in range(5))
    origin = [
        PYTHON, "-m", "loadshed", "serve-demo", "--model", "origin", "--workers", str(WORKERS),
        "--service-time", str(SERVICE_S), "--service-dist", "exponential",
    ]  # fmt: skip
    rows: list[dict[str, Any]] = []
    with ExitStack() as stack:
        stack.enter_context(
            started([*origin, "--protect", "little", "--port", str(demo_port)], demo_port)
        )
        stack.enter_context(
            started([*origin, "--protect", "none", "--port", str(origin_port)], origin_port)
        )
        proxy = [
            PYTHON, "-m", "loadshed", "proxy", "--upstream", f"http://127.0.0.1:{origin_port}",
            "--listen", f"127.0.0.1:{proxy_port}", "--metrics-port", str(metrics_port),
        ]  # fmt: skip
        stack.enter_context(started(proxy, proxy_port))
        data = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        config = data / "prometheus.yml"
        config.write_text(
            prometheus_config([f"127.0.0.1:{demo_port}", f"127.0.0.1:{metrics_port}"])
        )
        command = [
            prometheus, f"--config.file={config}", f"--storage.tsdb.path={data / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn",
        ]  # fmt: skip
        stack.enter_context(started(command, prom_port))
        base = f"http://127.0.0.1:{prom_port}"
        wait_ready(base)
        start = time.time()
        loads = [
            bench(f"http://127.0.0.1:{demo_port}/work", 2 * capacity, args.duration),
            bench(f"http://127.0.0.1:{proxy_port}/work", 2 * capacity, args.duration),
        ]
        malformed(f"http://127.0.0.1:{demo_port}/work", 5)
        malformed(f"http://127.0.0.1:{proxy_port}/work", 5)
        for load in loads:
            load.wait(timeout=args.duration + 60)
        time.sleep(3)  # the last scrapes
        end = time.time()
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                expr = target["expr"].replace("$limiter", ".*").replace("$__rate_interval", "15s")
                result = query_range(base, expr, start, end)
                numbers = [
                    float(value)
                    for series in result
                    for _, value in series["values"]
                    if math.isfinite(float(value))
                ]
                rows.append(
                    {
                        "panel": panel["title"],
                        "expr": target["expr"],
                        "series": len(result),
                        "points": len(numbers),
                        "ok": bool(numbers),
                    }
                )
    lines = [
        "# The Grafana dashboard against a real Prometheus",
        "",
        f"`{' '.join(['python', *sys.argv])}`",
        "",
        f"serve-demo (origin, {WORKERS} slots of {SERVICE_S:g} s exponential, `--protect "
        f"little`) and `loadshed proxy` before an unprotected copy, each driven at "
        f"{2 * capacity:g} req/s (2x capacity) for {args.duration:g} s, scraped every second. "
        "Every panel target of `dashboards/loadshed.json`, evaluated over the run:",
        "",
        "| panel | query | series | points with a number | data |",
        "| --- | --- | ---: | ---: | --- |",
    ]
    for row in rows:
        expr = row["expr"].replace("|", "\\|")
        lines.append(
            f"| {row['panel']} | `{expr}` | {row['series']} | {row['points']} | "
            f"{'yes' if row['ok'] else '**none**'} |"
        )
    empty = [row for row in rows if not row["ok"]]
    lines += ["", f"{len(rows) - len(empty)} of {len(rows)} queries return data."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
        Path(args.out).with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    return 1 if empty else 0


if __name__ == "__main__":
    sys.exit(main())
