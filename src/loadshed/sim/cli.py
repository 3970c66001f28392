"""``loadshed simulate paradox|capacity-change|fleet`` and the simulated demo
(``loadshed demo --sim``): argument parsing and output only; the work is in
:mod:`loadshed.sim.scenarios`."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from loadshed.admission import DISCIPLINES
from loadshed.errors import ConfigError
from loadshed.sim.arrivals import ARRIVAL_KINDS
from loadshed.sim.fleet import BALANCERS
from loadshed.sim.scenarios import (
    SIM_LIMITS,
    CapacityChangeScenario,
    FleetScenario,
    LimiterConfig,
    ParadoxScenario,
    ServiceConfig,
    run_paradox,
)
from loadshed.sim.service import DISTRIBUTIONS
from loadshed.units import DURATION, parse_int_list

__all__ = ["demo", "simulate"]

F = TypeVar("F", bound=Callable[..., Any])


class OriginQueue(click.ParamType[int | None, Any]):
    """An origin queue size: an integer >= 0, or ``unbounded``."""

    name = "size"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> int | None:
        if value is None or isinstance(value, int):
            return value
        text = str(value).strip().lower()
        if text in ("unbounded", "none", "inf"):
            return None
        try:
            size = int(text)
        except ValueError:
            size = -1
        if size < 0:
            self.fail(f"{value!r}: use an integer >= 0 or 'unbounded'", param, ctx)
        return size


ORIGIN_QUEUE = OriginQueue()


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def config_errors(command: F) -> F:
    """Turn a :class:`ConfigError` into a usage error naming the flag (exit 2)."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except ConfigError as error:
            message = str(error).split(": ", 1)[-1]
            raise click.BadParameter(message, param_hint=f"'{_flag(error.field)}'") from None

    return wrapper  # type: ignore[return-value]


def limiter_options(command: F) -> F:
    """The flags every scenario shares: the limiter, deadlines, network, seed, output."""
    options = [
        click.option(
            "--limit",
            default="little",
            show_default=True,
            help=f"Limit algorithm of each replica's limiter: {'|'.join(SIM_LIMITS)}:N "
            "(or fixed with --limit-value); none: no limiter at all.",
        ),
        click.option(
            "--limit-value",
            type=click.IntRange(min=1),
            default=None,
            help="The limit for --limit fixed (same as --limit fixed:N).",
        ),
        click.option(
            "--max-queue",
            type=click.IntRange(min=0),
            default=1000,
            show_default=True,
            help="Limiter queue length.",
        ),
        click.option(
            "--max-queue-wait",
            type=DURATION,
            default=None,
            help="Longest wait in the limiter queue [default: one estimated service time].",
        ),
        click.option(
            "--discipline",
            type=click.Choice(DISCIPLINES),
            default="fifo",
            show_default=True,
            help="Limiter queue discipline.",
        ),
        click.option(
            "--no-deadline",
            is_flag=True,
            help="Clients send no deadline (by default they send their timeout).",
        ),
        click.option(
            "--rtt",
            type=DURATION,
            default="1ms",
            show_default=True,
            help="Network round trip between client and server.",
        ),
        click.option("--seed", type=int, default=1, show_default=True, help="Random seed."),
        click.option("--json", "as_json", is_flag=True, help="Print the result as JSON."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def service_options(workers: int, service_time: str, dist: str) -> Callable[[F], F]:
    """Origin flags with scenario-specific defaults."""

    def decorate(command: F) -> F:
        options = [
            click.option(
                "--workers",
                type=int,
                default=workers,
                show_default=True,
                help="Origin workers (parallel model slots) per replica.",
            ),
            click.option(
                "--service-time",
                type=DURATION,
                default=service_time,
                show_default=True,
                help="Mean service time of one request.",
            ),
            click.option(
                "--service-dist",
                type=click.Choice(DISTRIBUTIONS),
                default=dist,
                show_default=True,
                help="Service-time distribution.",
            ),
            click.option(
                "--sigma",
                type=float,
                default=0.5,
                show_default=True,
                help="Log-space spread of the lognormal distribution.",
            ),
            click.option(
                "--dispatch-delay",
                type=DURATION,
                default="0",
                show_default=True,
                help="Server time between admitting a request and a worker receiving it "
                "(parsing, the pipe to a worker process); a worker with no job waiting "
                "idles this long between jobs.",
            ),
        ]
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def _limiter(options: dict[str, Any]) -> LimiterConfig:
    return LimiterConfig(
        limit=options.pop("limit"),
        limit_value=options.pop("limit_value"),
        max_queue=options.pop("max_queue"),
        max_queue_wait=options.pop("max_queue_wait"),
        discipline=options.pop("discipline"),
    )


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _table(result: dict[str, Any], key: str) -> Table:
    deadline = "deadlines sent" if result["deadlines"] else "no deadline sent"
    converge = result.get("converge_s")
    title = (
        f"{result['scenario']} · limit {result['limit']} · {deadline} · "
        f"capacity {result['capacity_rps']:g} req/s · converge_s {_fmt(converge, 1)}"
    )
    table = Table(title=title)
    for column in (key, "goodput", "ratio", "resp/s", "p50 ok", "p99 ok", "503s", "t/o", "limit"):
        table.add_column(column, justify="right")
    for step in result["steps"]:
        table.add_row(
            str(step[key]),
            _fmt(step["goodput_rps"], 2),
            _fmt(step["goodput_ratio"]),
            _fmt(step["throughput_rps"], 1),
            _fmt(step["p50_success_s"]),
            _fmt(step["p99_success_s"]),
            str(step["rejected"]),
            str(step["timed_out"]),
            _fmt(step["mean_limit"], 1),
        )
    return table


def _emit(result: dict[str, Any], as_json: bool, key: str) -> None:
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        Console().print(_table(result, key))


@click.group()
def simulate() -> None:
    """Simulate a limiter in virtual time: reference experiments and fleets."""


@simulate.command()
@limiter_options
@service_options(workers=1, service_time="500ms", dist="constant")
@click.option(
    "--clients",
    default="1,2,3,4,5,8,16,32,64",
    show_default=True,
    help="Closed-loop client counts, one run each (1,2,4 or start:stop[:step]).",
)
@click.option("--timeout", type=DURATION, default="2s", show_default=True, help="Client timeout.")
@click.option("--think", type=DURATION, default="0", show_default=True, help="Client think time.")
@click.option(
    "--origin-queue",
    type=ORIGIN_QUEUE,
    default="unbounded",
    show_default=True,
    help="Origin's own queue (a 503 past it).",
)
@click.option("--duration", type=DURATION, default="30s", show_default=True, help="Per step.")
@config_errors
def paradox(**options: Any) -> None:
    """The throughput paradox: closed-loop clients against one worker.

    Unprotected, goodput collapses once the queue outgrows the client timeout;
    a limiter holds it at capacity.
    """
    as_json = options.pop("as_json")
    limiter = _limiter(options)
    clients = parse_int_list(options.pop("clients"), "clients")
    service = ServiceConfig(
        options.pop("service_time"), options.pop("service_dist"), options.pop("sigma")
    )
    # Every other flag is the ParadoxScenario field of the same name.
    scenario = ParadoxScenario(
        limiter=limiter,
        clients=clients,
        service=service,
        send_deadline=not options.pop("no_deadline"),
        **options,
    )
    _emit(scenario.run(), as_json, "clients")


@simulate.command("capacity-change")
@limiter_options
@service_options(workers=7, service_time="1s", dist="constant")
@click.option(
    "--change-to",
    type=DURATION,
    default=None,
    help="New mean service time [default: 2s; --service-time with --workers-to].",
)
@click.option("--change-at", type=DURATION, default=None, help="When [default: mid-run].")
@click.option(
    "--workers-to",
    type=int,
    default=None,
    help="New worker count at the change (workers lost or added) [default: unchanged].",
)
@click.option("--rate", type=float, default=5.0, show_default=True, help="Requests per second.")
@click.option("--arrivals", type=click.Choice(ARRIVAL_KINDS), default="constant", show_default=True)
@click.option(
    "--burst-size",
    type=int,
    default=10,
    show_default=True,
    help="Requests per burst with --arrivals bursts.",
)
@click.option(
    "--client-workers",
    type=int,
    default=10,
    show_default=True,
    help="Most outstanding requests (client worker pool); 0: pure open loop.",
)
@click.option("--timeout", type=DURATION, default="2.5s", show_default=True, help="Client timeout.")
@click.option(
    "--origin-queue",
    type=ORIGIN_QUEUE,
    default="100",
    show_default=True,
    help="Origin's own queue (a 503 past it); 'unbounded' for none.",
)
@click.option("--duration", type=DURATION, default="120s", show_default=True)
@click.option(
    "--cost-dist",
    default=None,
    help="Request costs: constant:C, uniform:LO:HI or loguniform:LO:HI (service time "
    "~= a + b x cost, the mean unchanged); the limiter is told each cost.",
)
@click.option(
    "--cost-fixed",
    type=float,
    default=0.1,
    show_default=True,
    help="Share of the mean service time every request takes whatever its cost (a).",
)
@click.option(
    "--cost-blind",
    is_flag=True,
    help="With --cost-dist: the same traffic, the limiter not told the costs.",
)
@config_errors
def capacity_change(**options: Any) -> None:
    """A capacity change: a steady rate while the model slows down mid-run (capacity 7 ->
    3.5 req/s)."""
    as_json = options.pop("as_json")
    if options["cost_dist"] is None:
        # Cost flags without costs would be silently ignored.
        context = click.get_current_context()
        for name in ("cost_fixed", "cost_blind"):
            if context.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT:
                flag = "--" + name.replace("_", "-")
                raise click.UsageError(f"{flag}: needs --cost-dist (the request costs)")
    limiter = _limiter(options)
    if options["change_to"] is None:
        options["change_to"] = options["service_time"] if options["workers_to"] is not None else 2.0
    # Every other flag is the CapacityChangeScenario field of the same name.
    scenario = CapacityChangeScenario(
        limiter=limiter,
        dist=options.pop("service_dist"),
        send_deadline=not options.pop("no_deadline"),
        **options,
    )
    _emit(scenario.run(), as_json, "phase")


@simulate.command()
@limiter_options
@service_options(workers=2, service_time="200ms", dist="lognormal")
@click.option("--replicas", type=int, default=10, show_default=True)
@click.option("--rate", type=float, default=None, help="Requests per second [default: --load].")
@click.option(
    "--load",
    type=float,
    default=0.8,
    show_default=True,
    help="Offered load as a fraction of the healthy fleet's capacity.",
)
@click.option("--arrivals", type=click.Choice(ARRIVAL_KINDS), default="poisson", show_default=True)
@click.option(
    "--burst-size",
    type=int,
    default=10,
    show_default=True,
    help="Requests per burst with --arrivals bursts.",
)
@click.option("--balancer", type=click.Choice(BALANCERS), default="round-robin", show_default=True)
@click.option(
    "--slow-fraction",
    type=float,
    default=0.1,
    show_default=True,
    help="Share of replicas that slow down.",
)
@click.option("--slow-factor", type=float, default=4.0, show_default=True)
@click.option("--slow-at", type=DURATION, default=None, help="[default: a third in]")
@click.option("--slow-for", type=DURATION, default=None, help="[default: a third of the run]")
@click.option("--timeout", type=DURATION, default="1s", show_default=True, help="Client timeout.")
@click.option(
    "--retries",
    type=int,
    default=1,
    show_default=True,
    help="Retries of a 503 through the balancer, within the timeout.",
)
@click.option("--origin-queue", type=ORIGIN_QUEUE, default="unbounded", show_default=True)
@click.option("--duration", type=DURATION, default="60s", show_default=True)
@config_errors
def fleet(**options: Any) -> None:
    """Replicas behind a balancer, each with its own limiter; some slow down for a while."""
    as_json = options.pop("as_json")
    # Every other flag is the FleetScenario field of the same name.
    scenario = FleetScenario(
        limiter=_limiter(options),
        dist=options.pop("service_dist"),
        send_deadline=not options.pop("no_deadline"),
        **options,
    )
    _emit(scenario.run(), as_json, "phase")


DEMO_SCALE = 0.1
"""The demo runs the throughput paradox ten times faster: service time, timeout and
duration x 0.1."""


@click.command()
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print both results as JSON.")
def demo(seed: int, as_json: bool) -> None:
    """The throughput paradox and its cure in virtual time, side by side: no limiter
    vs loadshed's default ``little`` limit (``loadshed demo --sim``)."""
    results = {
        limit: run_paradox(
            limiter=LimiterConfig(limit),
            service=ServiceConfig(0.5 * DEMO_SCALE),
            timeout=2.0 * DEMO_SCALE,
            duration=30.0 * DEMO_SCALE,
            seed=seed,
        )
        for limit in ("none", "little")
    }
    if as_json:
        click.echo(json.dumps(results, indent=2))
        return
    none, little = results["none"], results["little"]
    table = Table(
        title=(
            "Throughput paradox (docs/design.md, simulated at 1/10 time scale): 1 worker, "
            f"{0.5 * DEMO_SCALE * 1000:g} ms per request, client timeout "
            f"{2.0 * DEMO_SCALE * 1000:g} ms, capacity {none['capacity_rps']:g} req/s"
        )
    )
    table.add_column("clients", justify="right")
    for name in ("none", "little"):
        table.add_column(f"{name}\ngood/s", justify="right")
        table.add_column(f"{name}\nratio", justify="right")
        table.add_column(f"{name}\np99 ok", justify="right")
    table.add_column("little\n503s", justify="right")
    for a, b in zip(none["steps"], little["steps"], strict=True):
        table.add_row(
            str(a["clients"]),
            _fmt(a["goodput_rps"], 1),
            _fmt(a["goodput_ratio"]),
            _fmt(a["p99_success_s"]),
            _fmt(b["goodput_rps"], 1),
            _fmt(b["goodput_ratio"]),
            _fmt(b["p99_success_s"]),
            str(b["rejected"]),
        )
    console = Console()
    console.print(table)
    console.print(
        "ratio = goodput / capacity. Without a limiter the queue outgrows the timeout and "
        "the worker serves requests nobody waits for; with one, extra clients get a fast 503."
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(simulate())
