"""In-process cost of a rejection by ``LoadShedMiddleware``, beside an admitted request.

    .venv/bin/python bench/rejection_cost.py [--iterations 50000] [--repeat 5]

No server and no sockets: the ASGI app is called directly with a fake ``receive``/``send``,
so what is timed is the middleware alone (header parsing, admission, the 503 and its body),
the figure behind the issue's "a rejection must cost well under a millisecond in-process".

Three cases, in the same run, best of ``--repeat`` (microseconds per request):

- ``bare``: the trivial app called without the middleware (the floor);
- ``admitted``: through the middleware with room (fixed limit 1000): admit, run, release;
- ``rejected``: through the middleware with the limit (``fixed:1``) held and no queue
  (``max_queue=0``): refused at once with 503 and ``Retry-After``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from loadshed.asgi import LoadShedMiddleware
from loadshed.asgitypes import Message
from loadshed.limiter import Limiter

SCOPE: dict[str, Any] = {
    "type": "http",
    "asgi": {"version": "3.0"},
    "http_version": "1.1",
    "method": "GET",
    "scheme": "http",
    "path": "/calculate",
    "raw_path": b"/calculate",
    "query_string": b"input=x",
    "root_path": "",
    "headers": [(b"host", b"127.0.0.1"), (b"user-agent", b"bench"), (b"accept", b"*/*")],
    "client": ("127.0.0.1", 50000),
    "server": ("127.0.0.1", 8000),
}


async def trivial_app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def receive() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


class StatusSink:
    """The fake ``send``: keeps the last status so the run can check what happened."""

    def __init__(self) -> None:
        self.status = 0

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]


async def time_calls(app: Any, iterations: int, expected_status: int) -> float:
    """Seconds per call of ``app`` (each call with a fresh scope copy, as a server does)."""
    sink = StatusSink()
    start = time.perf_counter()
    for _ in range(iterations):
        await app(dict(SCOPE), receive, sink)
    elapsed = time.perf_counter() - start
    assert sink.status == expected_status, f"expected {expected_status}, got {sink.status}"
    return elapsed / iterations


async def run(iterations: int, repeat: int) -> dict[str, float]:
    admitting = LoadShedMiddleware(trivial_app, limit="fixed:1000")
    held = Limiter("fixed:1", max_queue=0, learn_patience=False)
    rejecting = LoadShedMiddleware(trivial_app, limiter=held)
    token = held.try_acquire()  # the one slot stays busy: every request is refused
    best = {"bare": float("inf"), "admitted": float("inf"), "rejected": float("inf")}
    for _ in range(repeat):
        best["bare"] = min(best["bare"], await time_calls(trivial_app, iterations, 200))
        best["admitted"] = min(best["admitted"], await time_calls(admitting, iterations, 200))
        best["rejected"] = min(best["rejected"], await time_calls(rejecting, iterations, 503))
    token.success()
    counts = held.snapshot().counts
    assert counts["rejected:limit"] == iterations * repeat, counts
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if args.iterations < 1 or args.repeat < 1:
        parser.error("--iterations and --repeat must be >= 1")
    best = asyncio.run(run(args.iterations, args.repeat))
    print(f"LoadShedMiddleware in-process, best of {args.repeat} x {args.iterations:,} calls")
    print("| case | us per request | over bare |")
    print("| --- | --- | --- |")
    for name, seconds in best.items():
        over = "" if name == "bare" else f"+{(seconds - best['bare']) * 1e6:.2f} us"
        print(f"| {name} | {seconds * 1e6:.2f} | {over} |")


if __name__ == "__main__":
    main()
