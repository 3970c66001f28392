"""Python fallback of target.go (used when Go is missing): same flags, same /count.

python target.py -addr 127.0.0.1:18090 -mode trivial|sleep|stall [-sleep 2ms]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from aiohttp import web

from loadshed.units import parse_duration


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-addr", default="127.0.0.1:18090")
    modes = ["trivial", "sleep", "stall", "workers"]
    parser.add_argument("-mode", choices=modes, default="trivial")
    parser.add_argument("-sleep", default="2ms")
    parser.add_argument("-workers", type=int, default=4)
    parser.add_argument("-stall-every", dest="every", default="5s")
    parser.add_argument("-stall-for", dest="stall", default="1s")
    args = parser.parse_args()
    sleep = parse_duration(args.sleep)
    every, stall = parse_duration(args.every), parse_duration(args.stall)
    start = time.monotonic()
    served = 0
    slots = asyncio.Semaphore(args.workers)

    async def count(request: web.Request) -> web.Response:
        return web.Response(text=str(served))

    async def handle(request: web.Request) -> web.Response:
        nonlocal served
        if args.mode == "sleep":
            await asyncio.sleep(sleep)
        elif args.mode == "workers":
            async with slots:
                await asyncio.sleep(sleep)
        elif args.mode == "stall":
            phase = (time.monotonic() - start) % every
            if phase < stall:
                await asyncio.sleep(stall - phase)
        served += 1
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/count", count)
    app.router.add_get("/{tail:.*}", handle)
    host, port = args.addr.rsplit(":", 1)
    web.run_app(app, host=host, port=int(port), print=None)


if __name__ == "__main__":
    main()
