"""Sweeps: bench at each load step (clients or rates), one JSON per step, a combined JSON and
TSV, and an early stop on a condition."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from loadshed.loadgen.options import BenchOptions
from loadshed.loadgen.results import RunResult
from loadshed.loadgen.runner import GeneratorSaturated, run_bench
from loadshed.loadgen.slo import SLO

__all__ = ["Axis", "SweepStep", "run_sweep", "step_row", "write_combined"]

Axis = Literal["clients", "rate"]
RunFunction = Callable[[BenchOptions], RunResult]


@dataclasses.dataclass
class SweepStep:
    """One step: its load, its result (None when the generator could not drive it), why it
    stopped the sweep if it did, and where its JSON went."""

    load: float
    result: RunResult | None
    note: str = ""
    json_path: Path | None = None


def step_options(base: BenchOptions, axis: Axis, load: float) -> BenchOptions:
    """``base`` with the swept parameter set to ``load``."""
    if axis == "clients":
        return dataclasses.replace(base, clients=int(load), rate=None, max_inflight=None)
    return dataclasses.replace(base, rate=float(load), clients=None)


def run_sweep(
    base: BenchOptions,
    axis: Axis,
    loads: Sequence[float],
    out_dir: Path,
    *,
    stop_when: SLO | None = None,
    run: RunFunction = run_bench,
    on_step: Callable[[SweepStep], None] | None = None,
) -> list[SweepStep]:
    """Run each step in order; write ``step-NN-<load>.json`` into ``out_dir``.

    Stops after a step where any ``stop_when`` clause holds, or where the generator could not
    keep up (that step is kept, marked, and its figures are not plotted).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    steps: list[SweepStep] = []
    for index, load in enumerate(loads):
        options = step_options(base, axis, load)
        label = f"{int(load)}c" if axis == "clients" else f"{load:g}rps"
        path = out_dir / f"step-{index:02d}-{label}.json"
        try:
            result = run(options)
        except GeneratorSaturated as exc:
            step = SweepStep(load, None, note=str(exc))
            steps.append(step)
            if on_step is not None:
                on_step(step)
            break
        path.write_text(json.dumps(result.to_json(), indent=2) + "\n")
        step = SweepStep(load, result, json_path=path)
        if stop_when is not None:
            holding = [v.clause.text for v in stop_when.evaluate(result) if v.passed]
            if holding:
                step.note = f"stopped: {', '.join(holding)}"
        steps.append(step)
        if on_step is not None:
            on_step(step)
        if step.note:
            break
    return steps


TSV_COLUMNS = (
    "load",
    "requests",
    "throughput_rps",
    "goodput_rps",
    "error_rate",
    "timeouts",
    "rejections",
    "p50_s",
    "p99_s",
    "success_p50_s",
    "success_p99_s",
    "rejected_p99_s",
    "note",
)


def step_row(step: SweepStep) -> dict[str, Any]:
    """The step's headline figures (latencies in seconds), keyed by :data:`TSV_COLUMNS`."""
    result = step.result
    if result is None:
        return {column: "" for column in TSV_COLUMNS} | {"load": step.load, "note": step.note}
    every, success, rejected = (result.latency(s) for s in ("all", "success", "rejected"))
    return {
        "load": step.load,
        "requests": result.requests,
        "throughput_rps": round(result.throughput_rps, 3),
        "goodput_rps": round(result.goodput_rps, 3),
        "error_rate": round(result.error_rate, 6),
        "timeouts": result.errors.get("timeout", 0),
        "rejections": result.rejections,
        "p50_s": every["p50"],
        "p99_s": every["p99"],
        "success_p50_s": success["p50"],
        "success_p99_s": success["p99"],
        "rejected_p99_s": rejected["p99"],
        "note": step.note,
    }


def write_combined(steps: Sequence[SweepStep], axis: Axis, out_dir: Path) -> tuple[Path, Path]:
    """Write ``sweep.json`` (every step's full result) and ``sweep.tsv`` (one row per step)."""
    json_path = out_dir / "sweep.json"
    tsv_path = out_dir / "sweep.tsv"
    combined = {
        "axis": axis,
        "steps": [
            {
                "load": step.load,
                "note": step.note,
                "result": step.result.to_json() if step.result is not None else None,
            }
            for step in steps
        ],
    }
    json_path.write_text(json.dumps(combined, indent=2) + "\n")
    lines = ["\t".join(TSV_COLUMNS)]
    for step in steps:
        row = step_row(step)
        lines.append("\t".join(str(row[column]) for column in TSV_COLUMNS))
    tsv_path.write_text("\n".join(lines) + "\n")
    return json_path, tsv_path
