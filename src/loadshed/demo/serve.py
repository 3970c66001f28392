"""``loadshed serve-demo``: run one demo service under uvicorn, bare or behind loadshed.

    loadshed serve-demo --model hashburn --protect little --port 8000
    loadshed serve-demo --model origin --workers 7 --service-time 1 --protect aimd
    loadshed serve-demo --model origin --workers 32 --service-time 0.2 --service-dist exponential
    loadshed serve-demo --model hashburn --protect none --port 0   # prints the bound port

``--protect`` chooses what stands in front of the service (``W`` is the service's worker
count, ``--workers``: 1 for hashburn and digits unless given, 7 for origin):

- ``none``: nothing; the bare app (no ``/metrics``).
- ``queue``: the throughput paradox's first published scheme (docs/design.md), a
  semaphore-bounded queue: ``fixed:W`` in flight plus at most ``W`` waiting
  (``max_queue=W``), waiting as long as it takes (no queue timeout, no learned patience); any
  request beyond that gets 503 at once. For the paradox's one worker (W = 1) that is the
  published "limit 2": one running, one waiting.
- ``deadline``: the paradox's second scheme, a response-time limiter: ``fixed:W`` in flight, a queue
  without a count bound, and every request given a deadline of ``--deadline-target`` seconds
  (default 1.8, for 2 s clients) through ``LoadShedMiddleware(default_timeout=...)``. A request
  is admitted to the queue only while its estimated response time (queued ahead / W x the
  moving-average service time, plus the high service-time estimate) stays under the target,
  and is evicted from the queue as soon as it can no longer make it; a client's own
  ``X-Request-Timeout`` overrides the target. The in-flight cap stays at ``W`` because a
  larger one would hand every request straight to the app, where nothing can shed it.
- a limit name (``little`` (default), ``aimd``, ``vegas``, ``gradient2``, ``gradient``,
  ``fixed:N``): ``LoadShedMiddleware(limit=name)`` with its defaults; ``--discipline``
  orders its queue (``shortest``: the shortest predicted service time first, from the
  requests' ``X-Request-Cost``).

Protected services export Prometheus metrics at ``/metrics``; ``/health`` and ``/metrics`` are
never limited. Request heads are bounded as ``loadshed proxy`` bounds them: a target over 8 KiB
gets 414, a header block over 64 KiB or more than 100 headers 431. A taken port or an address
that is not this machine's is one line naming ``--port`` or ``--host`` (exit 2).

SIGTERM (or Ctrl-C) stops it gracefully: queued requests get 503 + ``Retry-After`` at once,
requests running get ``--grace`` seconds (default 10) to finish, the worker processes are
reaped, and the process exits 0 (:class:`~loadshed.proxy.shutdown.GracefulServer`).
"""

from __future__ import annotations

import math
import socket
import sys
from typing import Any, cast

import click

from loadshed.clickutil import discipline_option, refusal_rate_option
from loadshed.config import Discipline
from loadshed.demo import DEMO_MODELS
from loadshed.errors import ConfigError
from loadshed.limits import LIMIT_SPECS
from loadshed.pacing import DEFAULT_REFUSAL_PACING, RefusalPacing
from loadshed.proxy.shutdown import DEFAULT_GRACE, GracefulServer, check_grace
from loadshed.units import DURATION

__all__ = [
    "DEFAULT_DEADLINE_TARGET",
    "PROTECT_SCHEMES",
    "build_app",
    "hashburn_pool_app",
    "protect_app",
    "serve_demo",
    "validate_protect",
]

PROTECT_SCHEMES: tuple[str, ...] = ("none", "queue", "deadline")
"""``--protect`` values that are not limit names."""
PROTECT_ALLOWED = f"none|queue|deadline|{LIMIT_SPECS}"
DEFAULT_DEADLINE_TARGET = 1.8
"""The throughput paradox's response-time target, seconds (its clients gave up after 2 s)."""
# The paradox's published schemes wait as long as it takes once queued (a semaphore has no timeout).
_NO_QUEUE_TIMEOUT = 3600.0
_UNBOUNDED_QUEUE = 100_000
# Health checks, metrics and the origin's admin routes (PUT /admin/work-time) are never
# limited: a capacity change ordered while the server sheds must not be shed itself.
_NEVER_LIMITED = ("/health", "/metrics", "/admin/")


def validate_protect(protect: str) -> str:
    """Return ``protect`` normalised, or raise :class:`ConfigError` (field ``--protect``)."""
    text = protect.strip().lower()
    if text in PROTECT_SCHEMES:
        return text
    from loadshed.limits import make_limit

    try:
        make_limit(text)
    except ConfigError:
        raise ConfigError("--protect", f"got {protect!r}, allowed: {PROTECT_ALLOWED}") from None
    return text


def protect_app(
    app: Any,
    protect: str,
    workers: int,
    deadline_target: float = DEFAULT_DEADLINE_TARGET,
    *,
    refusal_rate: float = DEFAULT_REFUSAL_PACING.rate,
    discipline: str = "fifo",
) -> Any:
    """Wrap the ASGI ``app`` as ``--protect`` says (see the module docstring).

    ``refusal_rate``: refusals per second answered at once before further ones are
    held (:mod:`loadshed.pacing`); 0 answers every refusal at once. ``discipline``: the
    order of a limit's queue (``--protect`` naming a limit: fifo, lifo, codel or
    shortest; the queue and deadline schemes are first come, first served).
    """
    from loadshed.asgi import LoadShedMiddleware

    if not (math.isfinite(refusal_rate) and refusal_rate >= 0):
        raise ConfigError("--refusal-rate", f"must be a number >= 0, got {refusal_rate!r}")
    pacing = RefusalPacing.at_rate(refusal_rate)
    order = Discipline.parse(discipline, "--discipline")

    protect = validate_protect(protect)
    if protect == "none":
        return app
    if protect == "queue":
        return LoadShedMiddleware(
            app,
            limit=f"fixed:{workers}",
            limiter_options={
                "max_queue": workers,
                "max_queue_wait": _NO_QUEUE_TIMEOUT,
                "learn_patience": False,
            },
            metrics_path="/metrics",
            refusal_pacing=pacing,
            exclude=_NEVER_LIMITED,
        )
    if protect == "deadline":
        return LoadShedMiddleware(
            app,
            limit=f"fixed:{workers}",
            default_timeout=deadline_target,
            limiter_options={
                "max_queue": _UNBOUNDED_QUEUE,
                "max_queue_wait": _NO_QUEUE_TIMEOUT,
                "learn_patience": False,
            },
            metrics_path="/metrics",
            refusal_pacing=pacing,
            exclude=_NEVER_LIMITED,
        )
    return LoadShedMiddleware(
        app,
        limit=protect,
        limiter_options={"discipline": order},
        metrics_path="/metrics",
        refusal_pacing=pacing,
        exclude=_NEVER_LIMITED,
    )


def build_app(
    model: str,
    protect: str = "little",
    *,
    service_time: float | None = None,
    workers: int | None = None,
    deadline_target: float = DEFAULT_DEADLINE_TARGET,
    service_dist: str | None = None,
    sigma: float | None = None,
    seed: int | None = None,
    refusal_rate: float = DEFAULT_REFUSAL_PACING.rate,
    discipline: str = "fifo",
) -> Any:
    """Build demo service ``model`` with its settings, wrapped as ``protect`` says.

    ``service_time`` applies to hashburn and origin, ``workers`` to digits and origin
    (hashburn is one worker per process), ``service_dist``, ``sigma`` (lognormal only) and
    ``seed`` to origin. Raises :class:`ConfigError` naming the flag.
    """
    from loadshed.demo import create_demo_app

    if model not in DEMO_MODELS:
        raise ConfigError("--model", f"got {model!r}, allowed: {'|'.join(DEMO_MODELS)}")
    protect = validate_protect(protect)
    if not deadline_target > 0:
        raise ConfigError("--deadline-target", f"must be > 0 seconds, got {deadline_target}")
    settings: dict[str, Any] = {}
    if service_time is not None:
        if model == "digits":
            raise ConfigError("--service-time", "applies to hashburn and origin only")
        settings["service_time"] = service_time
    if workers is not None and model != "hashburn":
        settings["workers"] = workers
    origin_only = {"service_dist": service_dist, "sigma": sigma, "seed": seed}
    for name, value in origin_only.items():
        if value is not None:
            if model != "origin":
                raise ConfigError("--" + name.replace("_", "-"), "applies to origin only")
            settings[name] = value.strip().lower() if isinstance(value, str) else value
    if sigma is not None and settings.get("service_dist") != "lognormal":
        raise ConfigError("--sigma", "applies to --service-dist lognormal only")
    try:
        if model == "hashburn":
            app = hashburn_pool_app(
                settings.get("service_time", 0.5), 1 if workers is None else workers
            )
        else:
            app = create_demo_app(model, **settings)
    except ConfigError as error:
        if error.field.isupper():  # an environment variable (LOADSHED_MAX_WORKERS)
            raise
        # The service names its setting (service_time); the user typed the flag.
        flag = "--" + error.field.replace("_", "-")
        raise ConfigError(flag, str(error).split(": ", 1)[1]) from None
    return protect_app(
        app,
        protect,
        int(app.state.workers),
        deadline_target,
        refusal_rate=refusal_rate,
        discipline=discipline,
    )


def hashburn_pool_app(service_time: float = 0.5, workers: int = 1) -> Any:
    """hashburn with its burn in worker processes (see
    :func:`loadshed.demo.hashburn.create_pool_app`): what ``serve-demo`` serves."""
    from loadshed.demo.hashburn import create_pool_app

    return create_pool_app(service_time, workers=workers)


def _bind(host: str, port: int) -> socket.socket:
    """Bind and listen now: a taken port or a bad address is one line naming ``--port`` or
    ``--host`` (exit 2), and a client that connects as soon as the URL is printed waits in
    the backlog instead of being refused while uvicorn starts."""
    from loadshed.proxy.listen import bind_listener

    return bind_listener(host, port, host_flag="--host", port_flag="--port")


def _bounded_heads() -> type[Any]:
    """uvicorn's httptools protocol with the proxy's bounds on request heads: target
    8 KiB (414), header block 64 KiB and 100 headers (431). No header timeout and no
    connection bound here: benchmarks drive this server with as many connections as
    they choose."""
    from loadshed.proxy.security import bounded_protocol

    return bounded_protocol(header_timeout=None, max_connections=sys.maxsize)


@click.command("serve-demo")
@click.option(
    "--model",
    type=click.Choice(DEMO_MODELS),
    default="hashburn",
    show_default=True,
    help="Demo service to run.",
)
@click.option(
    "--protect",
    default="little",
    show_default=True,
    help=f"What stands in front of it: {PROTECT_ALLOWED}.",
)
@click.option(
    "--service-time",
    type=float,
    default=None,
    help="Seconds of work per request (hashburn, origin; default: the service's own).",
)
@click.option(
    "--workers",
    type=int,
    default=None,
    help="Worker processes (hashburn, digits) or slots (origin); default: the service's own. "
    "Processes: at most 8 per CPU (and one per 32 MiB of available memory) unless the "
    "environment variable LOADSHED_MAX_WORKERS sets another bound.",
)
@click.option(
    "--service-dist",
    default=None,
    help="Work-time distribution of origin, mean --service-time: constant (default), "
    "exponential, lognormal.",
)
@click.option(
    "--sigma",
    type=float,
    default=None,
    help="Log-space spread of --service-dist lognormal (default 0.5).",
)
@click.option("--seed", type=int, default=None, help="Seed of origin's work times (default 0).")
@click.option(
    "--deadline-target",
    type=float,
    default=DEFAULT_DEADLINE_TARGET,
    show_default=True,
    help="Response-time target of --protect deadline, seconds.",
)
@refusal_rate_option
@click.option(
    "--grace",
    type=DURATION,
    default=f"{DEFAULT_GRACE:g}s",
    show_default=True,
    help="On SIGTERM, seconds requests in flight get to finish (queued ones get 503 at once).",
)
@discipline_option(
    "Order of the limit's queue (--protect naming a limit); shortest: the shortest "
    "predicted service time first, from X-Request-Cost."
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8000,
    show_default=True,
    help="Port to bind; 0 picks a free one (the URL printed says which).",
)
def serve_demo(
    model: str,
    protect: str,
    service_time: float | None,
    workers: int | None,
    service_dist: str | None,
    sigma: float | None,
    seed: int | None,
    deadline_target: float,
    refusal_rate: float,
    grace: float,
    discipline: str,
    host: str,
    port: int,
) -> None:
    """Run a demo service (hashburn, digits, origin) under uvicorn, bare or protected.

    --protect queue is the throughput paradox's bounded queue (fixed:W plus W waiting),
    deadline its response-time limiter (admit while the estimated response time is under
    --deadline-target), any other value a loadshed limit. Metrics at /metrics when protected.
    """
    try:
        grace = check_grace(grace)
        app = build_app(
            model,
            protect,
            service_time=service_time,
            workers=workers,
            deadline_target=deadline_target,
            service_dist=service_dist,
            sigma=sigma,
            seed=seed,
            refusal_rate=refusal_rate,
            discipline=discipline,
        )
    except ConfigError as error:
        raise click.UsageError(str(error)) from None
    import uvicorn

    try:
        sock = _bind(host, port)
    except ConfigError as error:
        raise click.UsageError(str(error)) from None
    bound_host, bound_port = sock.getsockname()[:2]
    shown_host = f"[{bound_host}]" if ":" in bound_host else bound_host
    paths = {"hashburn": "/calculate?input=hello", "digits": "/predict", "origin": "/work"}
    extra = ", /metrics" if protect.strip().lower() != "none" else ""
    click.echo(
        f"serving {model} (protect: {protect.strip().lower()}) at "
        f"http://{shown_host}:{bound_port}  ({paths[model]}, /health{extra})"
    )
    sys.stdout.flush()
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        # Typed int by uvicorn, used as asyncio.wait_for's timeout: seconds, fractions too.
        timeout_graceful_shutdown=cast(int, grace),
        http=_bounded_heads(),
    )
    from loadshed.asgi import LoadShedMiddleware

    # A protected service answers its queue 503 at once on SIGTERM (--protect none has none).
    shutdown = app.shutdown if isinstance(app, LoadShedMiddleware) else None
    server = GracefulServer(config, on_shutdown=shutdown)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
