"""The load generator's commands: ``bench``, ``sweep``, ``capacity`` and ``report``.

Exit codes: 0 ok; 1 an SLO failed (or no rate met it); 2 bad input (one line naming the flag);
3 the generator could not drive the load or failed itself (no result is reported as valid).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.live import Live

from loadshed.clickutil import OneLineCommand
from loadshed.errors import ConfigError
from loadshed.loadgen.engine import LiveCounters
from loadshed.loadgen.options import (
    ARRIVALS,
    CLIENTS,
    DEFAULT_MAX_LAG_S,
    BenchOptions,
    default_client,
)
from loadshed.loadgen.render import progress_line, result_tables, verdict_text
from loadshed.loadgen.results import RunResult, merge_results
from loadshed.loadgen.runner import GeneratorError, GeneratorSaturated, run_bench
from loadshed.loadgen.slo import SLO, parse_slo
from loadshed.units import DURATION

__all__ = ["bench", "capacity", "report", "sweep"]

EXIT_SLO_FAILED = 1
EXIT_USAGE = 2
EXIT_GENERATOR = 3

F = TypeVar("F", bound=Callable[..., Any])


def _request_options(func: F) -> F:
    """Options shared by every command that sends load."""
    decorators = [
        click.option("--method", "-m", default="GET", show_default=True, help="HTTP method."),
        click.option(
            "--header",
            "-H",
            "headers",
            multiple=True,
            metavar="'NAME: VALUE'",
            help="Request header (repeatable).",
        ),
        click.option("--body", default=None, help="Request body (a string)."),
        click.option(
            "--body-file",
            type=click.Path(exists=True, dir_okay=False, path_type=Path),
            default=None,
            help="Request body read from a file.",
        ),
        click.option(
            "--timeout",
            type=DURATION,
            default="2s",
            show_default=True,
            help="Client timeout: the request is abandoned, its connection closed, and it "
            "counts as a timeout with latency = timeout.",
        ),
        click.option(
            "--send-deadline",
            is_flag=True,
            help="Send X-Request-Timeout (seconds) equal to --timeout.",
        ),
        click.option(
            "--arrival",
            type=click.Choice(ARRIVALS),
            default="constant",
            show_default=True,
            help="Open loop arrivals: evenly spaced or Poisson.",
        ),
        click.option(
            "--max-inflight",
            type=int,
            default=None,
            help="Open loop: at most this many outstanding requests; arrivals beyond it are "
            "counted as not sent.",
        ),
        click.option(
            "--processes",
            "-p",
            type=int,
            default=1,
            show_default=True,
            help="Worker processes sharing the load (histograms merge exactly).",
        ),
        click.option("--pid", type=int, default=None, help="Server PID: sample its CPU % and RSS."),
        click.option("--seed", type=int, default=None, help="Seed for Poisson arrivals."),
        click.option(
            "--max-lag",
            type=DURATION,
            default=f"{DEFAULT_MAX_LAG_S * 1e3:g}ms",
            show_default=True,
            help="Open loop: refuse the run when the p99 of the lag behind the schedule "
            "exceeds this.",
        ),
        click.option(
            "--client",
            type=click.Choice(CLIENTS),
            default=default_client(),
            show_default=True,
            help="HTTP client: raw (lean keep-alive HTTP/1.1 on httptools, the default when "
            "installed) or aiohttp.",
        ),
        click.option(
            "--honor-retry-after",
            is_flag=True,
            help="Closed loop: after a 429/503 with Retry-After, a client waits that long "
            "before its next request (well-behaved clients; by default they retry at once, "
            "as wrk and bombardier do).",
        ),
        click.option(
            "--retry-jitter",
            type=float,
            default=0.0,
            show_default=True,
            help="With --honor-retry-after: wait Retry-After times a uniform factor in "
            "[1 - J, 1 + J], so that clients refused together do not return together.",
        ),
        click.option("--quiet", "-q", is_flag=True, help="No live progress line."),
    ]
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


def _parse_headers(headers: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    parsed = []
    for header in headers:
        name, sep, value = header.partition(":")
        if not sep or not name.strip() or any(c.isspace() for c in name.strip()):
            raise ConfigError("--header", f"{header!r} is not 'Name: value'")
        parsed.append((name.strip(), value.strip()))
    return tuple(parsed)


def _body(body: str | None, body_file: Path | None) -> bytes | None:
    if body is not None and body_file is not None:
        raise ConfigError("--body/--body-file", "give one or the other")
    if body_file is not None:
        return body_file.read_bytes()
    return body.encode() if body is not None else None


def _options(
    url: str,
    *,
    clients: int | None,
    rate: float | None,
    duration: float,
    warmup: float,
    common: dict[str, Any],
) -> BenchOptions:
    return BenchOptions(
        url=url,
        clients=clients,
        rate=rate,
        arrival=common["arrival"],
        duration_s=duration,
        warmup_s=warmup,
        timeout_s=common["timeout"],
        method=common["method"].upper(),
        headers=_parse_headers(common["headers"]),
        body=_body(common["body"], common["body_file"]),
        send_deadline=common["send_deadline"],
        max_inflight=common["max_inflight"],
        processes=common["processes"],
        seed=common["seed"],
        max_lag_s=common["max_lag"],
        client=common["client"],
        honor_retry_after=common["honor_retry_after"],
        retry_jitter=common["retry_jitter"],
    )


def _consoles() -> tuple[Console, Console]:
    """stdout and stderr consoles; wide enough for the tables when output is not a terminal."""
    out, err = Console(), Console(stderr=True)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out = Console(width=120)
    if not err.is_terminal and "COLUMNS" not in os.environ:
        err = Console(stderr=True, width=120)
    return out, err


def _check_pid(pid: int | None) -> None:
    if pid is not None:
        from loadshed.loadgen.usage import check_pid

        check_pid(pid)


@contextmanager
def _live(console: Console, quiet: bool) -> Iterator[Callable[[LiveCounters], None] | None]:
    """A rich live progress line on stderr (only on a terminal, and not with --quiet)."""
    if quiet or not console.is_terminal:
        yield None
        return
    with Live(
        progress_line(LiveCounters()), console=console, refresh_per_second=4, transient=True
    ) as live:

        def update(counters: LiveCounters) -> None:
            live.update(progress_line(counters))

        yield update


def _run_one(options: BenchOptions, pid: int | None, quiet: bool, err: Console) -> RunResult:
    """Run with a progress line; exit 3 with one clear line when the generator fails."""
    with _live(err, quiet) as update:
        try:
            return run_bench(options, on_progress=update, pid=pid)
        except (GeneratorSaturated, GeneratorError) as exc:
            click.echo(f"Error: {exc}", err=True)
            sys.exit(EXIT_GENERATOR)


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def _print_verdict(console: Console, slo: SLO | None, result: RunResult) -> bool:
    if slo is None:
        return True
    verdicts = slo.evaluate(result)
    console.print(verdict_text(verdicts))
    passed = all(v.passed for v in verdicts)
    console.print(
        "SLO: PASS" if passed else "SLO: FAIL", style="bold green" if passed else "bold red"
    )
    return passed


# -- bench -------------------------------------------------------------------------------------


@click.command(cls=OneLineCommand)
@click.argument("url")
@click.option("--clients", "-c", type=int, default=None, help="Closed loop: concurrent clients.")
@click.option("--rate", "-r", type=float, default=None, help="Open loop: requests per second.")
@click.option(
    "--duration", "-d", type=DURATION, default="10s", show_default=True, help="Measured window."
)
@click.option(
    "--warmup",
    "-w",
    type=DURATION,
    default="1s",
    show_default=True,
    help="Run this long first and exclude it from the results.",
)
@_request_options
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write every figure and the encoded histograms here.",
)
@click.option(
    "--slo",
    default=None,
    help="Objectives, e.g. 'p99<200ms,errors<0.1%,goodput>=390': PASS/FAIL per clause, "
    "exit 1 on failure.",
)
def bench(
    url: str,
    clients: int | None,
    rate: float | None,
    duration: float,
    warmup: float,
    json_path: Path | None,
    slo: str | None,
    **common: Any,
) -> None:
    """Send load to URL: closed loop (--clients) or open loop (--rate), and report.

    Open-loop latency is measured from each request's intended send time, so a stalled server
    cannot hide its stall; the run is refused if the generator falls behind its schedule.
    """
    objectives = parse_slo(slo) if slo is not None else None
    options = _options(
        url, clients=clients, rate=rate, duration=duration, warmup=warmup, common=common
    )
    _check_pid(common["pid"])
    out, err = _consoles()
    result = _run_one(options, common["pid"], common["quiet"], err)
    for table in result_tables(result, title=f"loadshed bench {url}"):
        out.print(table)
    if json_path is not None:
        _write_json(json_path, result.to_json())
    if not _print_verdict(out, objectives, result):
        sys.exit(EXIT_SLO_FAILED)


# -- report ------------------------------------------------------------------------------------


@click.command(cls=OneLineCommand)
@click.argument(
    "files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the merged result here.",
)
@click.option("--slo", default=None, help="Objectives to check against the merged result.")
def report(files: tuple[Path, ...], json_path: Path | None, slo: str | None) -> None:
    """Merge result JSON files from concurrent runs (processes, hosts) into one report.

    Counts add, HDR histograms merge exactly, rates add (the runs overlap in time).
    """
    objectives = parse_slo(slo) if slo is not None else None
    results = []
    for path in files:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(str(path), f"cannot read JSON ({exc})") from None
        results.append(RunResult.from_json(data, source=str(path)))
    merged = merge_results(results)
    out, _ = _consoles()
    for table in result_tables(merged, title=f"loadshed report ({len(files)} file(s))"):
        out.print(table)
    if json_path is not None:
        _write_json(json_path, merged.to_json())
    if not _print_verdict(out, objectives, merged):
        sys.exit(EXIT_SLO_FAILED)


# -- sweep -------------------------------------------------------------------------------------


@click.command(cls=OneLineCommand)
@click.argument("url")
@click.option(
    "--clients",
    "-c",
    "clients_list",
    default=None,
    help="Closed-loop steps: 1,2,4,8 or start:stop[:step].",
)
@click.option(
    "--rates",
    "-r",
    "rates_list",
    default=None,
    help="Open-loop steps (req/s): 100,200 or start:stop:step.",
)
@click.option(
    "--duration",
    "-d",
    type=DURATION,
    default="10s",
    show_default=True,
    help="Measured window per step.",
)
@click.option(
    "--warmup",
    "-w",
    type=DURATION,
    default="2s",
    show_default=True,
    help="Warm-up per step, excluded.",
)
@_request_options
@click.option(
    "--out-dir",
    "-o",
    type=click.Path(file_okay=False, path_type=Path),
    default="sweep-out",
    show_default=True,
    help="Per-step JSON, sweep.json, sweep.tsv and the chart go here.",
)
@click.option(
    "--chart",
    "chart_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Chart PNG (a .html is written beside it) [default: OUT_DIR/sweep.png].",
)
@click.option(
    "--stop-when",
    default=None,
    help="Stop after a step where any clause holds, e.g. 'p99>1s,errors>10%'.",
)
def sweep(
    url: str,
    clients_list: str | None,
    rates_list: str | None,
    duration: float,
    warmup: float,
    out_dir: Path,
    chart_path: Path | None,
    stop_when: str | None,
    **common: Any,
) -> None:
    """Run bench at each load step and chart throughput, goodput, p50 and p99 against load."""
    from loadshed.loadgen.chart import write_charts
    from loadshed.loadgen.sweep import Axis, SweepStep, run_sweep, step_row, write_combined
    from loadshed.units import parse_float_range, parse_int_list

    stop = parse_slo(stop_when, flag="--stop-when") if stop_when is not None else None
    if (clients_list is None) == (rates_list is None):
        raise ConfigError(
            "--clients/--rates", "give exactly one: --clients 1,2,4 or --rates 100:500:100"
        )
    axis: Axis
    if clients_list is not None:
        axis, loads = "clients", [float(c) for c in parse_int_list(clients_list, "--clients")]
        first_clients, first_rate = int(loads[0]), None
    else:
        assert rates_list is not None
        axis, loads = "rate", parse_float_range(rates_list, "--rates")
        first_clients, first_rate = None, loads[0]
    # Validate every step's options before sending anything.
    for load in loads:
        _options(url, clients=int(load) if axis == "clients" else None,
                 rate=load if axis == "rate" else None, duration=duration, warmup=warmup,
                 common=common)  # fmt: skip
    base = _options(
        url,
        clients=first_clients,
        rate=first_rate,
        duration=duration,
        warmup=warmup,
        common=common,
    )
    _check_pid(common["pid"])
    out, err = _consoles()

    def run(options: BenchOptions) -> RunResult:
        load = options.clients if axis == "clients" else options.rate
        err.print(f"step: {axis} {load:g}", style="bold")
        with _live(err, common["quiet"]) as update:
            return run_bench(options, on_progress=update, pid=common["pid"])

    def report_step(step: SweepStep) -> None:
        row = step_row(step)
        if step.result is None:
            err.print(f"  {step.note}", style="red")
            return
        err.print(
            f"  throughput {row['throughput_rps']:.1f}/s  goodput {row['goodput_rps']:.1f}/s  "
            f"errors {row['error_rate'] * 100:.3g}%  success p50 "
            f"{row['success_p50_s'] * 1e3:.2f}ms p99 {row['success_p99_s'] * 1e3:.2f}ms"
            + (f"  ({step.note})" if step.note else "")
        )

    try:
        steps = run_sweep(base, axis, loads, out_dir, stop_when=stop, run=run, on_step=report_step)
    except GeneratorError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(EXIT_GENERATOR)
    json_path, tsv_path = write_combined(steps, axis, out_dir)
    png, html_path = write_charts(
        steps, axis, chart_path or out_dir / "sweep.png", title=f"loadshed sweep {url}"
    )
    out.print(_sweep_table(steps, axis))
    out.print(
        f"wrote {json_path}, {tsv_path}, {png}, {html_path} and {len(steps)} step JSON file(s)"
    )
    if steps and steps[-1].result is None:
        sys.exit(EXIT_GENERATOR)


def _sweep_table(steps: Any, axis: str) -> Any:
    from rich.table import Table

    from loadshed.loadgen.sweep import step_row

    table = Table(title="sweep (latencies in ms; ok = 2xx)")
    for column in (axis, "requests", "tput/s", "good/s", "errors", "p50", "p99", "ok p50",
                   "ok p99", "note"):  # fmt: skip
        table.add_column(column, justify="left" if column == "note" else "right")
    for step in steps:
        row = step_row(step)
        if step.result is None:
            table.add_row(f"{step.load:g}", *[""] * 8, step.note[:60])
            continue
        table.add_row(
            f"{step.load:g}", f"{row['requests']:,}", f"{row['throughput_rps']:.1f}",
            f"{row['goodput_rps']:.1f}", f"{row['error_rate'] * 100:.3g}%",
            f"{row['p50_s'] * 1e3:.2f}", f"{row['p99_s'] * 1e3:.2f}",
            f"{row['success_p50_s'] * 1e3:.2f}", f"{row['success_p99_s'] * 1e3:.2f}", step.note,
        )  # fmt: skip
    return table


# -- capacity ----------------------------------------------------------------------------------


@click.command(cls=OneLineCommand)
@click.argument("url")
@click.option(
    "--slo", required=True, help="Objectives each step must meet, e.g. 'p99<200ms,errors<0.1%'."
)
@click.option(
    "--start-rate",
    type=float,
    default=10.0,
    show_default=True,
    help="First rate probed (req/s); doubled until a step fails.",
)
@click.option(
    "--max-rate", type=float, default=100_000.0, show_default=True, help="Highest rate probed."
)
@click.option(
    "--precision",
    type=float,
    default=0.05,
    show_default=True,
    help="Stop bisecting when the bracket is within this fraction.",
)
@click.option("--max-steps", type=int, default=16, show_default=True)
@click.option(
    "--duration",
    "-d",
    type=DURATION,
    default="5s",
    show_default=True,
    help="Measured window per step.",
)
@click.option(
    "--warmup",
    "-w",
    type=DURATION,
    default="1s",
    show_default=True,
    help="Warm-up per step, excluded.",
)
@_request_options
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the search (every step's result) here.",
)
def capacity(
    url: str,
    slo: str,
    start_rate: float,
    max_rate: float,
    precision: float,
    max_steps: int,
    duration: float,
    warmup: float,
    json_path: Path | None,
    **common: Any,
) -> None:
    """Find the highest constant rate URL serves within the SLO (bracket, then bisect).

    Exit 0 with the rate found; 1 if even --start-rate fails; 3 if the generator could not
    drive a step before a failure was found (the rate printed is then a lower bound).
    """
    from loadshed.loadgen.capacity import CapacityStep, find_capacity

    objectives = parse_slo(slo)
    for flag, value in (("--start-rate", start_rate), ("--max-rate", max_rate)):
        if not value > 0:
            raise ConfigError(flag, f"must be > 0 requests/s, got {value:g}")
    base = _options(url, clients=None, rate=start_rate, duration=duration, warmup=warmup,
                    common=common)  # fmt: skip
    _check_pid(common["pid"])
    out, err = _consoles()

    def run(options: BenchOptions) -> RunResult:
        with _live(err, common["quiet"]) as update:
            return run_bench(options, on_progress=update, pid=common["pid"])

    def report_step(step: CapacityStep) -> None:
        if step.result is None:
            err.print(f"rate {step.rate:g}/s: generator saturated", style="red")
            return
        word = "PASS" if step.passed else "FAIL"
        if step.lagged:
            word += " (generator lagged; fails even net of the lag)"
        observed = ", ".join(
            f"{v.clause.text} -> {v.clause.format_value(v.observed)}" for v in step.verdicts
        )
        err.print(f"rate {step.rate:g}/s: {word} ({observed})",
                  style="green" if step.passed else "red")  # fmt: skip

    try:
        search = find_capacity(base, objectives, start_rate=start_rate, max_rate=max_rate,
                               precision=precision, max_steps=max_steps, run=run,
                               on_step=report_step)  # fmt: skip
    except GeneratorError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(EXIT_GENERATOR)
    if json_path is not None:
        _write_json(json_path, {
            "slo": objectives.text,
            "capacity_rps": search.capacity_rps,
            "inconclusive": search.inconclusive,
            "last_pass_rate": search.last_pass.rate if search.last_pass else None,
            "first_fail_rate": search.first_fail.rate if search.first_fail else None,
            "steps": [
                {"rate": s.rate, "passed": s.passed, "saturated": s.saturated, "lagged": s.lagged,
                 "verdicts": [{"clause": v.clause.text, "observed": v.observed,
                               "passed": v.passed} for v in s.verdicts],
                 "result": s.result.to_json() if s.result else None}
                for s in search.steps
            ],
        })  # fmt: skip
    for label, step in (("last passing step", search.last_pass),
                        ("first failing step", search.first_fail)):  # fmt: skip
        if step is not None and step.result is not None:
            out.print(f"[bold]{label}: {step.rate:g} req/s[/bold]")
            out.print(verdict_text(step.verdicts))
    if search.capacity_rps is None and search.inconclusive:
        out.print(f"capacity: unknown, the generator could not drive {start_rate:g} req/s "
                  f"({search.inconclusive})", style="bold yellow")  # fmt: skip
        sys.exit(EXIT_GENERATOR)
    if search.capacity_rps is None:
        out.print(f"capacity: no rate met {objectives.text!r} (even {start_rate:g} req/s failed)",
                  style="bold red")  # fmt: skip
        sys.exit(EXIT_SLO_FAILED)
    if search.inconclusive:
        out.print(f"capacity: at least {search.capacity_rps:g} req/s meets {objectives.text!r} "
                  f"({search.inconclusive})", style="bold yellow")  # fmt: skip
        if search.first_fail is None and "max-rate" not in search.inconclusive:
            sys.exit(EXIT_GENERATOR)
        return
    assert search.first_fail is not None
    out.print(f"capacity: {search.capacity_rps:g} req/s meets {objectives.text!r} "
              f"({search.first_fail.rate:g} req/s does not)", style="bold green")  # fmt: skip
