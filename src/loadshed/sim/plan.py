"""``loadshed plan``: what limits to set, from Little's law.

Given c workers, a service time S and a client timeout T:

* capacity = c / S requests per second;
* in flight at a rate r = r x S (Little's law: L = lambda x W);
* the queue the timeout allows: a request that waits w and then runs S must finish
  within T, and the queue drains at the capacity, so at most (T - S) x c / S
  requests may wait;
* recommended fixed limit = c (every worker busy, no queue at the model) and queue =
  that many, with a maximum queue wait of T - S;
* for r below capacity, the expected queue wait with Poisson arrivals and exponential
  service (M/M/c, Erlang C), a pessimistic guide for real model servers.

``--profile package.module:function --sizes ...`` first measures the function's
service time at each input size (``function(size)``), with warm-up calls, repeated
timed calls, their mean and a 95 % confidence interval (Student's t), and plans from
each measured mean. With two sizes or more it also fits service time = a + b x size
over the means (:func:`loadshed.costmodel.fit_cost_line`): the starting cost model for
admission by predicted service time (``AdmissionConfig(initial_cost_model=(a, b))``,
requests sending their size as their cost).
"""

from __future__ import annotations

import importlib
import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from loadshed.costmodel import fit_cost_line
from loadshed.errors import ConfigError
from loadshed.units import DURATION, parse_int_list

__all__ = ["Measurement", "Plan", "load_callable", "make_plan", "plan", "profile"]

# two-sided 95 % Student t quantiles by degrees of freedom (1..30); 1.96 beyond
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t95(degrees_of_freedom: int) -> float:
    """Two-sided 95 % quantile of Student's t (normal approximation past 120)."""
    if degrees_of_freedom < 1:
        raise ValueError("degrees_of_freedom must be >= 1")
    if degrees_of_freedom <= 30:
        return _T95[degrees_of_freedom - 1]
    if degrees_of_freedom <= 60:
        return 2.042 - (degrees_of_freedom - 30) * (2.042 - 2.000) / 30
    if degrees_of_freedom <= 120:
        return 2.000 - (degrees_of_freedom - 60) * (2.000 - 1.980) / 60
    return 1.960


@dataclass(frozen=True)
class Plan:
    """Little's-law plan for one service time."""

    workers: int
    service_time_s: float
    timeout_s: float
    rate: float | None
    capacity_rps: float
    inflight_at_rate: float | None
    utilisation: float | None
    queue_allowed: int
    recommended_limit: int
    recommended_queue: int
    recommended_max_queue_wait_s: float
    overloaded: bool | None
    shed_rps: float | None
    expected_queue_wait_s: float | None


def erlang_c_wait(workers: int, service_time: float, rate: float) -> float | None:
    """Mean queue wait of an M/M/c queue; None at or past capacity."""
    offered = rate * service_time  # in erlangs
    if offered >= workers:
        return None
    if rate <= 0:
        return 0.0
    # sum_{k<c} a^k / k! and a^c / c!, built up term by term (no overflow)
    term = 1.0
    below = 0.0
    for k in range(workers):
        below += term
        term *= offered / (k + 1)
    at_c = term / (1 - offered / workers)
    waiting_probability = at_c / (below + at_c)
    return waiting_probability * service_time / (workers - offered)


def make_plan(workers: int, service_time: float, timeout: float, rate: float | None = None) -> Plan:
    """Plan limits for ``workers`` at ``service_time`` s, clients waiting ``timeout`` s.

    Raises :class:`ConfigError` naming the field for nonsense input.
    """
    if workers < 1:
        raise ConfigError("workers", f"must be >= 1, got {workers}")
    if not service_time > 0:
        raise ConfigError("service_time", f"must be > 0 seconds, got {service_time:g}")
    if not timeout > 0:
        raise ConfigError("timeout", f"must be > 0 seconds, got {timeout:g}")
    if timeout <= service_time:
        raise ConfigError(
            "timeout",
            f"{timeout:g}s is not above the service time ({service_time:g}s): "
            "every request would time out",
        )
    if rate is not None and not (rate > 0 and math.isfinite(rate)):
        raise ConfigError("rate", f"must be > 0 requests per second, got {rate:g}")
    capacity = workers / service_time
    slack = timeout - service_time
    queue_allowed = math.floor(slack * capacity + 1e-9)
    return Plan(
        workers=workers,
        service_time_s=service_time,
        timeout_s=timeout,
        rate=rate,
        capacity_rps=capacity,
        inflight_at_rate=None if rate is None else rate * service_time,
        utilisation=None if rate is None else rate / capacity,
        queue_allowed=queue_allowed,
        recommended_limit=workers,
        recommended_queue=queue_allowed,
        recommended_max_queue_wait_s=slack,
        overloaded=None if rate is None else rate > capacity,
        shed_rps=None if rate is None else max(0.0, rate - capacity),
        expected_queue_wait_s=None if rate is None else erlang_c_wait(workers, service_time, rate),
    )


@dataclass(frozen=True)
class Measurement:
    """Timed calls of a function at one input size."""

    size: int
    runs: int
    mean_s: float
    ci95_s: float
    """Half width of the 95 % confidence interval of the mean."""
    min_s: float
    max_s: float


def load_callable(spec: str) -> Callable[[int], Any]:
    """Import ``package.module:function``; raise :class:`ConfigError` (field ``profile``)."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError("profile", f"got {spec!r}, use package.module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigError("profile", f"cannot import {module_name!r}: {error}") from None
    target: Any = module
    for part in attribute.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise ConfigError("profile", f"{module_name!r} has no attribute {attribute!r}")
    if not callable(target):
        raise ConfigError("profile", f"{spec!r} is not callable")
    return target  # type: ignore[no-any-return]


def profile(
    function: Callable[[int], Any],
    sizes: Sequence[int],
    *,
    warmup: int = 3,
    runs: int = 10,
    timer: Callable[[], float] = time.perf_counter,
) -> list[Measurement]:
    """Time ``function(size)`` for each size: ``warmup`` untimed calls, then ``runs``
    timed ones; mean and 95 % interval (Student's t) of the timed calls."""
    if warmup < 0:
        raise ConfigError("warmup", f"must be >= 0, got {warmup}")
    if runs < 2:
        raise ConfigError("runs", f"must be >= 2 (a confidence interval needs two), got {runs}")
    results = []
    for size in sizes:
        for _ in range(warmup):
            function(size)
        samples = []
        for _ in range(runs):
            started = timer()
            function(size)
            samples.append(timer() - started)
        mean = statistics.fmean(samples)
        half_width = t95(runs - 1) * statistics.stdev(samples) / math.sqrt(runs)
        results.append(Measurement(size, runs, mean, half_width, min(samples), max(samples)))
    return results


def _parse_sizes(text: str) -> list[int]:
    parts = text.split(":")
    if len(parts) in (2, 3):
        try:
            start, stop = int(parts[0]), int(parts[1])
        except ValueError:
            start, stop = 0, 0
        if start > stop:
            raise ConfigError(
                "sizes", f"start ({start}) must be <= stop ({stop}); use start:stop[:step] or 1,10"
            )
    sizes = parse_int_list(text, "sizes")
    if min(sizes) < 0:
        raise ConfigError("sizes", f"must be >= 0, got {min(sizes)}")
    return sizes


def _fmt_seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1e-3:
        return f"{value * 1e6:.1f} us"
    if value < 1:
        return f"{value * 1e3:.2f} ms"
    return f"{value:.3f} s"


def _plan_table(result: Plan) -> Table:
    table = Table(title="Little's law plan", show_header=False)
    table.add_column("quantity")
    table.add_column("value", justify="right")
    rows = [
        ("workers", str(result.workers)),
        ("service time", _fmt_seconds(result.service_time_s)),
        ("client timeout", _fmt_seconds(result.timeout_s)),
        ("capacity", f"{result.capacity_rps:.3f} req/s"),
    ]
    if result.rate is not None:
        rows += [
            ("rate", f"{result.rate:g} req/s"),
            ("in flight at the rate", f"{result.inflight_at_rate:.2f}"),
            ("utilisation", f"{100 * (result.utilisation or 0):.1f} %"),
            ("expected queue wait (M/M/c)", _fmt_seconds(result.expected_queue_wait_s)),
        ]
    rows += [
        ("queue the timeout allows", str(result.queue_allowed)),
        ("recommended fixed limit", str(result.recommended_limit)),
        ("recommended queue", str(result.recommended_queue)),
        ("recommended max queue wait", _fmt_seconds(result.recommended_max_queue_wait_s)),
    ]
    if result.overloaded is not None:
        verdict = (
            f"OVERLOADED: shed {result.shed_rps:.3f} req/s "
            f"({100 * (result.shed_rps or 0) / (result.rate or 1):.1f} %)"
            if result.overloaded
            else "fits"
        )
        rows.append(("verdict", verdict))
    for name, value in rows:
        table.add_row(name, value)
    return table


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


@click.command()
@click.option("--workers", type=int, required=True, help="Parallel model slots (workers).")
@click.option("--service-time", type=DURATION, default=None, help="Mean time of one request.")
@click.option("--timeout", type=DURATION, required=True, help="How long clients wait.")
@click.option("--rate", type=float, default=None, help="Expected requests per second.")
@click.option(
    "--profile",
    "profile_spec",
    default=None,
    help="Measure the service time of package.module:function, called as function(size).",
)
@click.option(
    "--sizes", default=None, help="Input sizes for --profile: start:stop[:step] or 1,10,100."
)
@click.option("--warmup", type=int, default=3, show_default=True, help="Untimed calls per size.")
@click.option("--runs", type=int, default=10, show_default=True, help="Timed calls per size.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan(
    workers: int,
    service_time: float | None,
    timeout: float,
    rate: float | None,
    profile_spec: str | None,
    sizes: str | None,
    warmup: int,
    runs: int,
    as_json: bool,
) -> None:
    """Plan a limit and a queue with Little's law, from a known or a measured service time.

    \b
    loadshed plan --workers 7 --service-time 1s --timeout 2.5s --rate 5
    loadshed plan --workers 4 --timeout 1s --profile mypkg.model:predict --sizes 1000:10000:1000
    """
    try:
        if profile_spec is None:
            if sizes is not None:
                raise ConfigError("sizes", "only with --profile package.module:function")
            if service_time is None:
                raise ConfigError(
                    "service_time", "required (e.g. 200ms), or measure it with --profile"
                )
            result = make_plan(workers, service_time, timeout, rate)
            if as_json:
                click.echo(json.dumps(asdict(result), indent=2))
            else:
                Console().print(_plan_table(result))
            return
        if service_time is not None:
            raise ConfigError("service_time", "give either --service-time or --profile, not both")
        if sizes is None:
            raise ConfigError("sizes", "required with --profile (e.g. 1000:10000:1000)")
        size_list = _parse_sizes(sizes)
        make_plan(workers, 1.0, 2.0, rate)  # validate the rest before measuring
        function = load_callable(profile_spec)
        if not timeout > 0:
            raise ConfigError("timeout", f"must be > 0 seconds, got {timeout:g}")
        measured = profile(function, size_list, warmup=warmup, runs=runs)
        rows = []
        for measurement in measured:
            planned: Plan | None = None
            if measurement.mean_s > 0 and timeout > measurement.mean_s:
                planned = make_plan(workers, measurement.mean_s, timeout, rate)
            rows.append((measurement, planned))
    except ConfigError as error:
        message = str(error).split(": ", 1)[-1]
        raise click.BadParameter(message, param_hint=f"'{_flag(error.field)}'") from None
    points = [(float(m.size), m.mean_s) for m, _ in rows if m.size > 0]
    line = fit_cost_line(points) if len({c for c, _ in points}) >= 2 else None
    if as_json:
        click.echo(
            json.dumps(
                {
                    "profile": profile_spec,
                    "cost_model": (
                        None
                        if line is None
                        else {"intercept_s": line[0], "slope_s_per_unit": line[1]}
                    ),
                    "workers": workers,
                    "timeout_s": timeout,
                    "rate": rate,
                    "warmup": warmup,
                    "runs": runs,
                    "sizes": [
                        {**asdict(m), "plan": asdict(p) if p is not None else None} for m, p in rows
                    ],
                },
                indent=2,
            )
        )
        return
    table = Table(
        title=f"{profile_spec}: {warmup} warm-up + {runs} timed calls per size, "
        f"{workers} workers, timeout {_fmt_seconds(timeout)}"
    )
    for column in ("size", "mean", "95 % CI", "capacity/s", "limit", "queue", "verdict"):
        table.add_column(column, justify="right")
    for measurement, planned in rows:
        if planned is None:
            verdict = "exceeds the timeout"
        elif planned.overloaded is None:
            verdict = "-"
        else:
            verdict = "OVERLOADED" if planned.overloaded else "fits"
        table.add_row(
            str(measurement.size),
            _fmt_seconds(measurement.mean_s),
            f"± {_fmt_seconds(measurement.ci95_s)}",
            f"{planned.capacity_rps:.1f}" if planned else "-",
            str(planned.recommended_limit) if planned else "-",
            str(planned.recommended_queue) if planned else "-",
            verdict,
        )
    console = Console()
    console.print(table)
    if line is not None:
        console.print(
            f"service time ~= {_fmt_seconds(line[0])} + {_fmt_seconds(line[1])} x size: "
            f"AdmissionConfig(initial_cost_model=({line[0]:.6g}, {line[1]:.6g})) starts "
            "admission by predicted service time from it (the cost sent: the size)"
        )
