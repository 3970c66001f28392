"""Sweep charts: throughput and goodput against load on the left axis, p50 and p99 of
successes on the right (as in the throughput paradox's published plots,
docs/design.md). A PNG (matplotlib, Agg) and a
self-contained HTML page with the same chart inline as SVG plus the table of steps."""

from __future__ import annotations

import html
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadshed.errors import ConfigError
from loadshed.loadgen.sweep import TSV_COLUMNS, Axis, SweepStep, step_row

__all__ = ["write_charts"]


def _figure(steps: Sequence[SweepStep], axis: Axis, title: str) -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib.figure import Figure
    except ImportError:  # pragma: no cover - matplotlib is in the charts extra
        raise ConfigError(
            "--chart", "charts need matplotlib: pip install 'loadshed[charts]'"
        ) from None
    measured = [s for s in steps if s.result is not None]
    loads = [s.load for s in measured]
    figure = Figure(figsize=(8, 4.5), dpi=100)
    rates = figure.add_subplot()
    rates.plot(loads, [s.result.throughput_rps for s in measured if s.result], "o-",
               color="tab:blue", label="throughput (responses/s)")  # fmt: skip
    rates.plot(loads, [s.result.goodput_rps for s in measured if s.result], "s-",
               color="tab:green", label="goodput (2xx/s)")  # fmt: skip
    rates.set_xlabel("clients" if axis == "clients" else "offered rate (requests/s)")
    rates.set_ylabel("requests/s")
    rates.set_ylim(bottom=0)
    rates.grid(True, alpha=0.3)
    latency = rates.twinx()
    for stat, style, color in (("p50", "^--", "tab:orange"), ("p99", "v--", "tab:red")):
        values = [float(s.result.latency("success")[stat]) * 1e3 for s in measured if s.result]
        latency.plot(loads, values, style, color=color, label=f"{stat} of successes (ms)")
    latency.set_ylabel("latency (ms)")
    latency.set_ylim(bottom=0)
    handles = rates.get_legend_handles_labels()[0] + latency.get_legend_handles_labels()[0]
    labels = rates.get_legend_handles_labels()[1] + latency.get_legend_handles_labels()[1]
    rates.legend(handles, labels, loc="upper left", fontsize="small")
    figure.suptitle(title, fontsize="medium")
    figure.tight_layout()
    return figure


def write_charts(
    steps: Sequence[SweepStep], axis: Axis, png_path: Path, title: str = "loadshed sweep"
) -> tuple[Path, Path]:
    """Write the chart to ``png_path`` and a self-contained ``.html`` beside it."""
    figure = _figure(steps, axis, title)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png_path, format="png")
    svg = io.StringIO()
    figure.savefig(svg, format="svg")
    svg_text = svg.getvalue()
    svg_text = svg_text[svg_text.find("<svg") :]  # drop the XML prolog and doctype
    html_path = png_path.with_suffix(".html")
    header = "".join(f"<th>{html.escape(c)}</th>" for c in TSV_COLUMNS)
    rows = []
    for step in steps:
        row = step_row(step)
        cells = []
        for column in TSV_COLUMNS:
            value = row[column]
            if column.endswith("_s") and isinstance(value, float):
                value = f"{value * 1e3:.2f} ms"
            cells.append(f"<td>{html.escape(str(value))}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    html_path.write_text(
        "<!doctype html>\n<html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>\n{svg_text}\n"
        f"<table><thead><tr>{header}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        "</body></html>\n"
    )
    return png_path, html_path
