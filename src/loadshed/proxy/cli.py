"""``loadshed proxy``: the reverse proxy from the command line.

    loadshed proxy --upstream http://127.0.0.1:8000 --listen 127.0.0.1:9000 \\
        --limit little --deadline 2.5s --metrics-port 9100

Runs uvicorn (uvloop, httptools with bounded request heads, a header timeout and a
bound on open connections: :func:`~loadshed.proxy.security.bounded_protocol`) on
``--listen`` and, with ``--metrics-port``, a Prometheus endpoint (``/metrics``) and
``/health`` on a second port in the same process. Bad flags exit 2 with one line
naming the flag; so do listeners that cannot be bound (:mod:`loadshed.proxy.listen`).

SIGTERM (or Ctrl-C) stops it gracefully (:class:`~loadshed.proxy.shutdown.GracefulServer`):
queued requests get 503 + Retry-After at once, requests in flight get ``--grace`` seconds to
finish, upstream connections are closed, and the process exits 0.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Coroutine
from typing import Any

import click
import uvicorn
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from loadshed.clickutil import OneLineCommand, discipline_option, refusal_rate_option
from loadshed.config import LimitUnit
from loadshed.limits import LIMIT_SPECS
from loadshed.pacing import DEFAULT_REFUSAL_PACING
from loadshed.proxy.app import ProxyApp, create_proxy
from loadshed.proxy.config import ProxyConfig, parse_listen, parse_upstream
from loadshed.proxy.listen import bind_listener
from loadshed.proxy.security import bounded_protocol, client_connections
from loadshed.proxy.shutdown import DEFAULT_GRACE, GracefulServer
from loadshed.units import DURATION
from loadshed.waitbound import DEFAULT_WAIT_CEILING

__all__ = ["proxy", "server_config"]

_BACKLOG = 4096


def server_config(app: Any, config: ProxyConfig, **overrides: Any) -> uvicorn.Config:
    """The uvicorn configuration the CLI serves the proxy with (tests use it too)."""
    options: dict[str, Any] = {
        "host": config.host,
        "port": config.port,
        "http": bounded_protocol(
            config.max_request_line,
            config.max_header_bytes,
            max_headers=config.max_headers,
            header_timeout=config.header_timeout,
            max_connections=config.max_connections,
        ),
        "ws": "none",  # websockets are not proxied
        "loop": "uvloop",
        "lifespan": "on",
        "server_header": False,  # the upstream's Server and Date pass through
        "date_header": False,
        "access_log": False,
        "log_level": "warning",
        "backlog": _BACKLOG,
        # The peer address is what X-Forwarded-For gets; never let a client's own
        # X-Forwarded-For replace it (uvicorn trusts it from 127.0.0.1 by default).
        "proxy_headers": False,
        "timeout_graceful_shutdown": config.grace,
    }
    options.update(overrides)
    return uvicorn.Config(app, **options)


async def _serve_metrics(proxy: ProxyApp, sock: socket.socket) -> web.AppRunner:
    registry = proxy.metrics.registry

    async def metrics(request: web.Request) -> web.Response:
        response = web.Response(body=generate_latest(registry))
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def health(request: web.Request) -> web.Response:
        upstreams = {u.name: {"up": u.up, "limit": u.limiter.limit} for u in proxy.pool.upstreams}
        live = any(u.up for u in proxy.pool.upstreams)
        return web.Response(
            text=json.dumps({"status": "ok" if live else "no_upstream", "upstreams": upstreams}),
            status=200 if live else 503,
            content_type="application/json",
        )

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    return runner


async def _run(
    config: ProxyConfig, sock: socket.socket, metrics_sock: socket.socket | None
) -> None:
    app, proxy = create_proxy(config)
    served = server_config(app, config)
    proxy.proxy_metrics.connections = client_connections(served.http)
    # On SIGTERM: 503 to every queued request at once, then uvicorn's graceful stop.
    server = GracefulServer(served, on_shutdown=app.shutdown)
    metrics_runner: web.AppRunner | None = None
    try:
        if metrics_sock is not None:
            metrics_runner = await _serve_metrics(proxy, metrics_sock)
        serving = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started and not serving.done():  # noqa: ASYNC110 (uvicorn has no event)
            await asyncio.sleep(0.02)
        if serving.done():
            await serving
            raise click.ClickException(f"--listen: could not serve on {config.host}:{config.port}")
        port = sock.getsockname()[1]
        upstreams = ", ".join(str(u) for u in config.upstreams)
        host = f"[{config.host}]" if ":" in config.host else config.host
        line = f"loadshed proxy on http://{host}:{port} -> {upstreams} (limit {config.limit})"
        if metrics_sock is not None:
            metrics_port = metrics_sock.getsockname()[1]
            line += f"; metrics on http://{config.metrics_host}:{metrics_port}/metrics"
        click.echo(line, err=True)
        await serving
    finally:
        if metrics_runner is not None:
            await metrics_runner.cleanup()
        await proxy.aclose()


def _to_config(**values: Any) -> ProxyConfig:
    upstreams = tuple(parse_upstream(u) for u in values.pop("upstream"))
    host, port = parse_listen(values.pop("listen"))
    if values.get("cost_header", "").lower() == "none":
        values["cost_header"] = None
    return ProxyConfig(upstreams=upstreams, host=host, port=port, **values)


@click.command(cls=OneLineCommand)
@click.option(
    "--upstream",
    "-u",
    multiple=True,
    required=True,
    metavar="URL",
    help="Upstream base URL (repeatable): http://host:port[/prefix].",
)
@click.option(
    "--listen",
    "-l",
    default="127.0.0.1:9000",
    show_default=True,
    metavar="HOST:PORT",
    help="Address to serve on (port 0: any free port).",
)
@click.option(
    "--limit",
    default="little",
    show_default=True,
    help=f"Limit per upstream: {LIMIT_SPECS}.",
)
@click.option(
    "--max-queue",
    type=int,
    default=1000,
    show_default=True,
    help="Requests that may wait per upstream; beyond it, 503 at once.",
)
@click.option(
    "--max-queue-wait",
    type=DURATION,
    default=None,
    help="Longest wait in the queue (default: from the learned service time).",
)
@discipline_option(
    "Order of the queue: oldest first; newest first; CoDel; or the shortest "
    "predicted service time first (from --cost-header; oldest first without costs)."
)
@click.option(
    "--wait-ceiling",
    type=DURATION,
    default=DEFAULT_WAIT_CEILING,
    show_default=True,
    help="Without --max-queue-wait: longest response time (queue wait + service) the "
    "adaptive wait bound grows to while clients are patient (0: one service time).",
)
@refusal_rate_option
@click.option(
    "--max-refusal-hold",
    type=DURATION,
    default=DEFAULT_REFUSAL_PACING.max_hold,
    show_default=True,
    help="Longest a refusal is held by --refusal-rate.",
)
@click.option(
    "--deadline",
    type=DURATION,
    default=None,
    help="Deadline for requests without X-Request-Timeout (e.g. 2.5s).",
)
@click.option(
    "--cost-header",
    default="x-request-cost",
    show_default=True,
    metavar="NAME",
    help="Header carrying a request's cost (rows, tokens): admission then predicts each "
    "request's own service time. 'none' reads no cost.",
)
@click.option(
    "--limit-unit",
    type=click.Choice([unit.value for unit in LimitUnit]),
    default=LimitUnit.REQUESTS.value,
    show_default=True,
    help="What the limit counts: requests in flight, or the cost units in flight (the "
    "--cost-header values; needs --limit fixed:N, N in cost units).",
)
@click.option(
    "--upstream-timeout",
    type=DURATION,
    default="30s",
    show_default=True,
    help="Longest wait for an upstream's response headers.",
)
@click.option(
    "--connect-timeout",
    type=DURATION,
    default="2s",
    show_default=True,
    help="Longest wait for a connection to an upstream.",
)
@click.option(
    "--read-timeout",
    type=DURATION,
    default="30s",
    show_default=True,
    help="Longest silence between two body chunks from an upstream.",
)
@click.option(
    "--fail-threshold",
    type=int,
    default=3,
    show_default=True,
    help="Consecutive connection failures that mark an upstream down.",
)
@click.option(
    "--probe-interval",
    type=DURATION,
    default="1s",
    show_default=True,
    help="How often a down upstream is probed (TCP connect).",
)
@click.option(
    "--max-request-line",
    type=int,
    default=8192,
    show_default=True,
    help="Longest request target, bytes (414 beyond).",
)
@click.option(
    "--max-header-bytes",
    type=int,
    default=65536,
    show_default=True,
    help="Largest request header block, bytes (431 beyond).",
)
@click.option(
    "--max-headers",
    type=int,
    default=100,
    show_default=True,
    help="Most request headers (431 beyond).",
)
@click.option(
    "--header-timeout",
    type=DURATION,
    default="10s",
    show_default=True,
    help="Longest time to receive a complete request head (408 and closed beyond).",
)
@click.option(
    "--max-connections",
    type=int,
    default=None,
    help="Most open client connections (default: (ulimit -n - 64) / 2); beyond it the "
    "oldest idle one is closed, or 503 when none is idle.",
)
@click.option(
    "--max-body-bytes",
    type=int,
    default=8 << 20,
    show_default=True,
    help="Largest request body, bytes (413 beyond); queued bodies are buffered.",
)
@click.option(
    "--reject-status",
    type=click.Choice(["503", "429"]),
    default="503",
    show_default=True,
    help="Status of fast rejections.",
)
@click.option(
    "--hold-abandoned/--close-abandoned",
    default=True,
    show_default=True,
    help="When a client leaves or its deadline passes before the upstream answered: keep "
    "waiting and hold its slot in the limit (servers that keep working on abandoned "
    "requests), or close the upstream connection at once (servers that stop on disconnect).",
)
@click.option(
    "--grace",
    type=DURATION,
    default=f"{DEFAULT_GRACE:g}s",
    show_default=True,
    help="On SIGTERM, how long requests in flight get to finish (queued ones get 503 at once).",
)
@click.option(
    "--metrics-port",
    type=int,
    default=None,
    help="Serve Prometheus /metrics and /health on this port.",
)
@click.option(
    "--metrics-host", default="127.0.0.1", show_default=True, help="Address for --metrics-port."
)
def proxy(**values: Any) -> None:  # fmt: skip
    """Reverse proxy with admission control in front of any HTTP model server.

    Each upstream gets its own adaptive limit; requests beyond what it holds are
    queued briefly or refused at once with 503 + Retry-After.
    """
    values["reject_status"] = int(values["reject_status"])
    config = _to_config(**values)
    # Bind every listener before serving: a taken port or a bad address is a
    # ListenError (a ConfigError naming the flag: one line, exit 2).
    sock = bind_listener(
        config.host, config.port, host_flag="--listen", port_flag="--listen", backlog=_BACKLOG
    )
    metrics_sock: socket.socket | None = None
    try:
        if config.metrics_port is not None:
            metrics_sock = bind_listener(
                config.metrics_host,
                config.metrics_port,
                host_flag="--metrics-host",
                port_flag="--metrics-port",
            )
        _run_loop(_run(config, sock, metrics_sock))
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
        if metrics_sock is not None:
            metrics_sock.close()


def _run_loop(main: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvicorn[standard] brings it
        asyncio.run(main)
        return
    uvloop.run(main)
