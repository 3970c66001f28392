"""Ray Serve under overload: its defaults, a hand-tuned deployment, and ``loadshed.ray``,
side by side on one local Ray cluster (issue 15, part 3).

    .venv/bin/python bench/ray_serve.py [--service-time 0.05] [--load 2] [--timeout 1]
        [--duration 20] [--seed 1] [--out bench/results/ray_serve.md]

A local Ray cluster on 127.0.0.1 (started here, shut down at the end) runs Serve's HTTP
proxy on a free port and, one after the other, three applications of the same model:
2 replicas, each serving one request at a time for ``--service-time`` seconds (an
asyncio semaphore around a sleep: a one-worker model of known capacity, 2 /
service time, that leaves the cores to Ray's proxy and the load generator):

* ``defaults``: ``@serve.deployment(num_replicas=2)``, Ray's own defaults
  (``max_ongoing_requests`` 5, ``max_queued_requests`` -1: no bound);
* ``tuned:N``: hand-set from the known model and timeout: ``max_ongoing_requests=N``
  (1: the replica's one worker; 2 and 4: a job or more handed ahead, since Ray's router
  learns that a replica has room only from its answers) and ``max_queued_requests`` =
  capacity x timeout / 2 (a request queued at the proxy then waits at most half the
  client's timeout; ``tuned:N:Q`` sets Q): figures a user finds only by knowing both,
  and the best of them is the hindsight oracle;
* ``loadshed``: ``loadshed.ray`` with nothing set: ``@serve.deployment(num_replicas=2,
  **deployment_options())`` and ``@serve.ingress(protect(app))``.

``loadshed bench`` drives each with open-loop Poisson arrivals (seeded) at ``--load`` x
capacity for ``--duration`` seconds after ``--warmup``, a client timeout of
``--timeout`` sent as ``X-Request-Timeout`` (``--no-deadline``: not sent; Ray's proxy
ignores it either way). Reported per variant: goodput (successes within the timeout)
per second and as a share of capacity, p50/p99 of successes, 503s and their p50,
timeouts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

VARIANTS = ("defaults", "tuned:1", "tuned:2", "tuned:2:2", "tuned:4:4", "loadshed")
"""The default rows; ``tuned:N[:Q]``: ``max_ongoing_requests=N``, ``max_queued_requests=Q``."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def tuned(variant: str) -> tuple[int, int | None] | None:
    """(N, Q) of ``tuned:N[:Q]`` (Q None: the default bound; None for the other
    variants); raises ValueError if malformed."""
    name, _, value = variant.partition(":")
    if name != "tuned":
        return None
    ongoing, _, queued = value.partition(":")
    count, bound = int(ongoing), int(queued) if queued else None
    if count < 1 or (bound is not None and bound < 1):
        raise ValueError(variant)
    return count, bound


def build(variant: str, service_time: float, tuned_queue: int) -> Any:
    """The deployment of ``variant`` (defined here so that Ray pickles it by value)."""
    import asyncio

    from fastapi import FastAPI
    from ray import serve

    from loadshed.ray import deployment_options, protect

    app = FastAPI()
    options: dict[str, Any] = {"num_replicas": 2, "ray_actor_options": {"num_cpus": 0.5}}
    settings = tuned(variant)
    if settings is not None:
        ongoing, queued = settings
        options.update(max_ongoing_requests=ongoing, max_queued_requests=queued or tuned_queue)
    elif variant == "loadshed":
        options.update(deployment_options())
        app = protect(app)

    @serve.deployment(**options)
    @serve.ingress(app)
    class Model:
        def __init__(self) -> None:
            self.worker = asyncio.Semaphore(1)  # one request at a time

        @app.get("/predict")
        async def predict(self) -> dict[str, bool]:
            async with self.worker:
                await asyncio.sleep(service_time)
            return {"ok": True}

        @app.get("/health")
        async def health(self) -> dict[str, bool]:
            return {"ok": True}

    return Model


def wait_healthy(url: str, budget: float = 60.0) -> None:
    deadline = time.monotonic() + budget
    while True:
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"{url}/health", timeout=2.0) as response,
        ):
            if response.status == 200:
                return
        if time.monotonic() > deadline:
            raise SystemExit(f"the app at {url} did not answer /health within {budget:g} s")
        time.sleep(0.5)


def run_variant(variant: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    from ray import serve

    from loadshed.loadgen.options import BenchOptions
    from loadshed.loadgen.runner import run_bench

    capacity = 2 / args.service_time
    tuned_queue = max(1, int(capacity * args.timeout / 2))
    name = f"bench_{variant.replace(':', '_')}"
    settings = tuned(variant)
    serve.run(build(variant, args.service_time, tuned_queue).bind(), name=name, route_prefix="/")
    try:
        wait_healthy(url)
        options = BenchOptions(
            url=f"{url}/predict",
            rate=args.load * capacity,
            arrival="poisson",
            duration_s=args.duration,
            warmup_s=args.warmup,
            timeout_s=args.timeout,
            send_deadline=not args.no_deadline,
            seed=args.seed,
        )
        result = run_bench(options)
    finally:
        serve.delete(name)
        time.sleep(2.0)  # let the replicas stop before the next variant starts
    success = result.latency("success")
    rejected = result.latency("rejected")
    return {
        "variant": variant,
        "capacity_rps": capacity,
        "offered_rps": args.load * capacity,
        "tuned_max_ongoing_requests": settings[0] if settings else None,
        "tuned_max_queued_requests": (settings[1] or tuned_queue) if settings else None,
        "goodput_rps": result.goodput_rps,
        "goodput_ratio": result.goodput_rps / capacity,
        "successes": result.successes,
        "p50_success_s": float(success["p50"]) if result.successes else None,
        "p99_success_s": float(success["p99"]) if result.successes else None,
        "rejected": result.rejections,
        "p50_rejected_s": float(rejected["p50"]) if result.rejections else None,
        "timeouts": result.errors.get("timeout", 0),
        "other_errors": sum(n for k, n in result.errors.items() if k != "timeout"),
    }


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def render(rows: list[dict[str, Any]], command: str, args: argparse.Namespace, wall: float) -> str:
    capacity = 2 / args.service_time
    lines = [
        "# Ray Serve under overload: defaults, hand-tuned, loadshed.ray (issue 15)",
        "",
        f"`{command}`",
        "",
        f"{os.cpu_count()} CPUs; local Ray cluster on 127.0.0.1; 2 replicas of a one-worker"
        f" model of {args.service_time * 1000:g} ms (capacity {capacity:g} req/s); Poisson"
        f" arrivals at {args.load:g}x capacity ({args.load * capacity:g} req/s, seed"
        f" {args.seed}), client timeout {args.timeout:g} s"
        f" ({'not sent' if args.no_deadline else 'sent as X-Request-Timeout'});"
        f" {args.duration:g} s measured after {args.warmup:g} s; wall {wall:.0f} s.",
        "",
        "| variant | goodput/s | of capacity | p50 / p99 of successes (s) | 503s | 503 p50 (s)"
        " | timeouts | other errors |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        label = row["variant"]
        if row["tuned_max_queued_requests"] is not None:
            label += (
                f" (max_ongoing {row['tuned_max_ongoing_requests']},"
                f" max_queued {row['tuned_max_queued_requests']})"
            )
        lines.append(
            f"| {label} | {row['goodput_rps']:.1f} | {row['goodput_ratio']:.2f} |"
            f" {seconds(row['p50_success_s'])} / {seconds(row['p99_success_s'])} |"
            f" {row['rejected']} | {seconds(row['p50_rejected_s'])} | {row['timeouts']} |"
            f" {row['other_errors']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--service-time", type=float, default=0.05, help="seconds per request")
    parser.add_argument("--load", type=float, default=2.0, help="x capacity")
    parser.add_argument("--timeout", type=float, default=1.0, help="client timeout, seconds")
    parser.add_argument("--duration", type=float, default=20.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=5.0, help="unmeasured seconds first")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-deadline", action="store_true", help="do not send the timeout")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", type=Path, help="markdown file (a .json beside it)")
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    unknown = []
    for variant in variants:
        try:
            if variant not in ("defaults", "loadshed") and tuned(variant) is None:
                unknown.append(variant)
        except ValueError:
            unknown.append(variant)
    if unknown:
        allowed = "defaults, tuned:N[:Q] (N, Q >= 1), loadshed"
        parser.error(f"--variants: unknown {unknown}, allowed: {allowed}")
    for field in ("service_time", "load", "timeout", "duration"):
        if not getattr(args, field) > 0:
            parser.error(f"--{field.replace('_', '-')}: must be > 0")
    try:
        import ray
        from ray import cloudpickle, serve
    except ImportError:
        print("ray[serve] is not installed (the 'ray' extra: uv sync --all-extras)")
        return 2

    command = "python " + " ".join(sys.argv)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    started = time.monotonic()
    port = free_port()
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        _node_ip_address="127.0.0.1",
    )
    rows: list[dict[str, Any]] = []
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        url = f"http://127.0.0.1:{port}"
        for variant in variants:
            row = run_variant(variant, url, args)
            print(
                f"{variant}: goodput {row['goodput_ratio']:.2f} of capacity, "
                f"503s {row['rejected']}, timeouts {row['timeouts']}",
                flush=True,
            )
            rows.append(row)
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()
    text = render(rows, command, args, time.monotonic() - started)
    print(text)
    if args.out:
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(
            json.dumps({"command": command, "rows": rows}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
