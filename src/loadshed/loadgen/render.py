"""Terminal output of the load generator: the live progress line and the result tables."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from rich.text import Text

from loadshed.loadgen.engine import LiveCounters
from loadshed.loadgen.results import ERROR_KINDS, PERCENTILES, RunResult
from loadshed.loadgen.slo import ClauseVerdict

__all__ = ["format_ms", "progress_line", "result_tables", "verdict_text"]


def format_ms(seconds: float) -> str:
    """A duration in milliseconds with sensible precision."""
    millis = seconds * 1e3
    if millis >= 100:
        return f"{millis:.0f}"
    if millis >= 10:
        return f"{millis:.1f}"
    return f"{millis:.2f}"


def progress_line(live: LiveCounters) -> Text:
    """``[ 3.0/10.0s] sent 2,400  done 2,398  ok 2,390  failed 8  inflight 2  lag 1.2ms``."""
    rate = live.done / live.elapsed_s if live.elapsed_s > 0 else 0.0
    line = Text()
    line.append(f"[{live.elapsed_s:5.1f}/{live.total_s:.1f}s] ", style="bold")
    line.append(f"sent {live.sent:,}  done {live.done:,}  ")
    line.append(f"ok {live.ok:,}  ", style="green")
    line.append(f"failed {live.failed:,}  ", style="red" if live.failed else "")
    line.append(f"inflight {live.inflight:,}  {rate:,.0f}/s")
    if live.not_sent:
        line.append(f"  not sent {live.not_sent:,}", style="yellow")
    if live.max_lag_s:
        line.append(f"  max lag {format_ms(live.max_lag_s)}ms")
    return line


def result_tables(result: RunResult, title: str = "") -> list[Table]:
    """A summary table (counts, rates, usage) and a latency table (percentiles in ms)."""
    summary = Table(title=title or None, show_header=False, box=None, pad_edge=False)
    summary.add_column(style="bold")
    summary.add_column(justify="right")
    load = f"{result.clients} clients" if result.mode == "closed" else f"{result.rate:g} req/s"
    if result.mode == "open":
        load += f" ({result.arrival})"
    client = f", {result.client} client" if result.client else ""
    summary.add_row("load", f"{result.mode} loop, {load}, {result.processes} process(es){client}")
    summary.add_row("window", f"{result.duration_s:g}s (warm-up {result.warmup_s:g}s excluded)")
    summary.add_row("requests", f"{result.requests:,}")
    if result.mode == "open":
        summary.add_row("scheduled / not sent", f"{result.scheduled:,} / {result.not_sent:,}")
    summary.add_row("throughput", f"{result.throughput_rps:,.1f} responses/s")
    summary.add_row("goodput", f"{result.goodput_rps:,.1f} 2xx/s")
    summary.add_row("error rate", f"{result.error_rate * 100:.3g}%")
    statuses = ", ".join(f"{code}: {n:,}" for code, n in sorted(result.status_counts.items()))
    summary.add_row("status", statuses or "-")
    errors = ", ".join(f"{k}: {result.errors.get(k, 0):,}" for k in ERROR_KINDS)
    summary.add_row("errors", errors)
    if result.mode == "open":
        lag = result.latency("send_lag")
        summary.add_row(
            "send lag",
            f"p50 {format_ms(float(lag['p50']))}ms, p99 {format_ms(float(lag['p99']))}ms, "
            f"max {format_ms(float(lag['max']))}ms",
        )
    if result.generator_cpu_s > 0:
        summary.add_row(
            "generator",
            f"{result.generator_cpu_s:.2f} CPU-s, {result.requests_per_cpu_s:,.0f} requests/CPU-s",
        )
    if result.server:
        summary.add_row(
            "server (--pid)",
            f"CPU {result.server['cpu_percent_mean']:.0f}% mean / "
            f"{result.server['cpu_percent_max']:.0f}% max, "
            f"RSS {result.server['rss_mb_max']:.0f} MB max",
        )

    latency = Table(title="latency (ms)")
    latency.add_column("requests")
    latency.add_column("count", justify="right")
    for name, _ in PERCENTILES:
        latency.add_column(name if name != "p999" else "p99.9", justify="right")
    for name in ("max", "mean", "stdev"):
        latency.add_column(name, justify="right")
    for scope in ("all", "success", "rejected"):
        stats = result.latency(scope)
        cells = [scope, f"{stats['count']:,}"]
        for name, _ in PERCENTILES:
            cells.append(format_ms(float(stats[name])))
        cells += [format_ms(float(stats[n])) for n in ("max", "mean", "stdev")]
        latency.add_row(*cells)
    return [summary, latency]


def verdict_text(verdicts: Sequence[ClauseVerdict]) -> Text:
    """One coloured PASS/FAIL line per clause."""
    text = Text()
    for index, verdict in enumerate(verdicts):
        if index:
            text.append("\n")
        text.append(verdict.line(), style="green" if verdict.passed else "bold red")
    return text
