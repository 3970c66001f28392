"""Capacity search: the highest constant rate that meets an SLO. Bracket (double the rate
until a step fails), then bisect between the last pass and the first failure; each step is a
short open-loop run."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from loadshed.errors import ConfigError
from loadshed.loadgen.options import BenchOptions
from loadshed.loadgen.results import RunResult
from loadshed.loadgen.runner import GeneratorSaturated, run_bench
from loadshed.loadgen.slo import SLO, ClauseVerdict

__all__ = ["CapacitySearch", "CapacityStep", "find_capacity"]

RunFunction = Callable[[BenchOptions], RunResult]


@dataclasses.dataclass
class CapacityStep:
    """One probe: its rate, result, per-clause verdicts and whether every clause held.

    ``result`` is None (and ``saturated`` set) when the generator could not drive the rate.
    """

    rate: float
    result: RunResult | None
    verdicts: list[ClauseVerdict]
    passed: bool
    saturated: str = ""
    lagged: bool = False
    """The generator fell behind, yet the SLO failed even net of its lag."""


@dataclasses.dataclass
class CapacitySearch:
    """The outcome: every step, the best passing one and the first failing one above it."""

    steps: list[CapacityStep]
    last_pass: CapacityStep | None
    first_fail: CapacityStep | None
    inconclusive: str = ""

    @property
    def capacity_rps(self) -> float | None:
        """The highest rate that met the SLO (None if even the first step failed)."""
        return self.last_pass.rate if self.last_pass is not None else None


def find_capacity(
    base: BenchOptions,
    slo: SLO,
    *,
    start_rate: float,
    max_rate: float,
    precision: float = 0.05,
    max_steps: int = 16,
    run: RunFunction = run_bench,
    on_step: Callable[[CapacityStep], None] | None = None,
) -> CapacitySearch:
    """Search ``[start_rate, max_rate]`` until the bracket is within ``precision`` (relative).

    A step the generator could not drive ends the search as inconclusive above the last pass.
    """
    if not 0 < start_rate <= max_rate:
        raise ConfigError("--start-rate", f"must be > 0 and <= --max-rate, got {start_rate}")
    if not 0 < precision < 1:
        raise ConfigError("--precision", f"must be within (0, 1), got {precision}")
    if max_steps < 1:
        raise ConfigError("--max-steps", f"must be >= 1, got {max_steps}")
    steps: list[CapacityStep] = []
    last_pass: CapacityStep | None = None
    first_fail: CapacityStep | None = None

    def probe(rate: float) -> CapacityStep:
        options = dataclasses.replace(base, rate=rate, clients=None)
        try:
            result = run(options)
        except GeneratorSaturated as exc:
            # Far past the knee a queueing target makes the generator open connection after
            # connection and fall behind. Such a step still fails if a clause fails even net
            # of the lag; otherwise nothing can be concluded from it.
            lag = float(exc.result.latency("send_lag")["max"])
            verdicts = slo.evaluate(exc.result)
            if any(c.fails_despite_lag(exc.result, lag) for c in slo.clauses):
                step = CapacityStep(rate, exc.result, verdicts, False, lagged=True)
            else:
                step = CapacityStep(rate, None, [], False, saturated=str(exc))
        else:
            verdicts = slo.evaluate(result)
            step = CapacityStep(rate, result, verdicts, all(v.passed for v in verdicts))
        steps.append(step)
        if on_step is not None:
            on_step(step)
        return step

    # Bracket: double until a failure or the ceiling.
    rate = start_rate
    while len(steps) < max_steps:
        step = probe(rate)
        if step.saturated:
            return CapacitySearch(steps, last_pass, None, inconclusive=step.saturated)
        if not step.passed:
            first_fail = step
            break
        last_pass = step
        if rate >= max_rate:
            return CapacitySearch(
                steps, last_pass, None, inconclusive=f"met the SLO up to --max-rate {max_rate:g}"
            )
        rate = min(rate * 2, max_rate)
    if first_fail is None:
        return CapacitySearch(steps, last_pass, None, inconclusive="ran out of --max-steps")
    if last_pass is None:
        return CapacitySearch(steps, None, first_fail)
    # Bisect between the last pass and the first failure.
    while (
        len(steps) < max_steps and (first_fail.rate - last_pass.rate) > precision * last_pass.rate
    ):
        step = probe((last_pass.rate + first_fail.rate) / 2)
        if step.saturated:
            return CapacitySearch(steps, last_pass, first_fail, inconclusive=step.saturated)
        if step.passed:
            last_pass = step
        else:
            first_fail = step
    return CapacitySearch(steps, last_pass, first_fail)
