"""Where ``little`` spends a robustness cell: its limit over time, against hand-set limits.

    .venv/bin/python bench/little_trace.py "w16 exponential 50ms poisson 1.5x t3 steady deadline"
    .venv/bin/python bench/little_trace.py 2 --seeds 1,2 --rounds 5   # core cell 2, every 5th round
    .venv/bin/python bench/little_trace.py 19 --sample-seed 7   # cell 19 of that draw
    .venv/bin/python bench/little_trace.py e2 --e2-sigma 0.02 --no-deadline --seeds 2 --rounds 1
    .venv/bin/python bench/little_trace.py "cost:w4 exponential 100ms 3x t3" --discipline shortest

``e2`` traces E2 in the simulator instead (7 workers, 1 s -> 2 s at 60 s, 5 req/s, 2.5 s
timeout, as ``bench/sim_compare.py --only e2``; ``--e2-sigma`` gives its service times a
machine's jitter, log-normal): the score is the goodput after the change over the new
capacity, the column ``bench/sim_compare.py`` prints.

``cost:LABEL`` traces a cell of ``bench/cost_aware.py`` instead (requests that cost
different amounts, costs log-uniform over 1..100, cost-aware admission, the queue in
``--discipline`` order): the score is its goodput over the whole run, counted as
``--count`` (requests that met their deadline, or cost units), as that bench counts it.

The cell is given by its label (as ``bench/robustness.py`` prints it; any combination
parses, drawn or not) or by its index
in the draw of ``--cells`` cells from ``--sample-seed`` (indexes 0-7 are the core
cells). For each seed: the cell's score (goodput over what could be served) for
``little`` and for each ``--fixed`` limit (by default the workers and one slot
either side), the share of the run ``little`` spent at each limit (weighted by
time), the share in each state, and when start-up last ended. ``--rounds K``
also prints every K-th round's end: time, state, limit, estimate, and with variable
service the fitted knee and unqueued mean latency. ``--window S`` prints the
successes in each S seconds of the run for ``little`` and each ``--fixed`` limit, per
seed and as a mean over the seeds: which part of the run (start-up, the steady state,
after the change) the loss comes from. Deterministic per seed, like the matrix.

A diagnostic for changes to ``little``: the matrix says which cell loses; this says
whether it loses in start-up, in cruise above or below the workers, or after the
cell's change (reported time: seconds of virtual time; the change is at half the run).
"""

from __future__ import annotations

import argparse
import collections
import math
from collections.abc import Callable
from dataclasses import dataclass

import cost_aware
from loadshed.errors import ConfigError
from loadshed.limits.base import Sample
from loadshed.limits.little import Little
from loadshed.sim import metrics
from loadshed.sim.costs import CostDistribution
from loadshed.sim.request import Status
from loadshed.sim.scenarios import LimiterConfig, run_capacity_change
from robustness import Cell, draw_cells, score


@dataclass(frozen=True)
class E2:
    """E2 as ``bench/sim_compare.py`` runs it, optionally with log-normal jitter."""

    sigma: float | None  # None: the published constant service time
    deadlines: bool
    workers: int = 7

    @property
    def label(self) -> str:
        shape = f"lognormal {self.sigma:g}" if self.sigma is not None else "constant"
        sent = "deadline" if self.deadlines else "no-deadline"
        return f"E2 ({shape} service, {sent}): 120 s, 7 -> 3.5 req/s capacity at 60 s"


def score_e2(e2: E2, limit: str, seed: int) -> float:
    """Goodput after E2's change as a share of the new capacity, one seed."""
    name, _, value = limit.partition(":")
    result = run_capacity_change(
        limiter=LimiterConfig(name, limit_value=int(value) if value else None),
        send_deadline=e2.deadlines,
        duration=120.0,
        seed=seed,
        dist="lognormal" if e2.sigma is not None else "constant",
        sigma=e2.sigma if e2.sigma is not None else 0.5,
        arrivals="constant",
    )
    return float(result["steps"][1]["goodput_ratio"])


@dataclass(frozen=True)
class CostTarget:
    """A cell of ``bench/cost_aware.py``, cost-aware, its queue in ``discipline`` order,
    scored on ``count`` (``requests`` or ``cost``)."""

    cell: cost_aware.Cell
    discipline: str
    count: str
    cost_dist: str = "loguniform:1:100"
    cost_fixed: float = 0.1
    aware: bool = True

    @property
    def workers(self) -> int:
        return self.cell.workers

    @property
    def service_time(self) -> float:
        return self.cell.service_time

    @property
    def duration(self) -> float:
        return self.cell.duration

    @property
    def label(self) -> str:
        told = "" if self.aware else ", cost-blind"
        return (
            f"{self.cell.label} ({self.discipline}, {self.count}, {self.cost_dist}, "
            f"fixed share {self.cost_fixed:g}{told})"
        )


def score_cost(target: CostTarget, limit: str, seed: int) -> float:
    """A cost cell's goodput ratio over the whole run, one seed, as cost_aware.py scores
    it."""
    requests, cost = cost_aware.score(
        target.cell,
        limit,
        target.aware,
        seed,
        target.cost_dist,
        target.cost_fixed,
        target.discipline,
    )
    return requests if target.count == "requests" else cost


Target = Cell | E2 | CostTarget


def score_any(target: Target, limit: str, seed: int) -> float:
    """A robustness cell's score, E2's after the change, or a cost cell's."""
    if isinstance(target, E2):
        return score_e2(target, limit, seed)
    if isinstance(target, CostTarget):
        return score_cost(target, limit, seed)
    return score(target, limit, seed)


def find_cost_cell(label: str) -> cost_aware.Cell:
    """The cell of ``bench/cost_aware.py`` labelled ``label``."""
    cells = cost_aware.cells()
    for cell in cells:
        if cell.label == label:
            return cell
    labels = "\n  ".join(c.label for c in cells)
    raise SystemExit(f"cell: no cost cell labelled {label!r}; bench/cost_aware.py has:\n  {labels}")


def find_cell(spec: str, cells: int, sample_seed: int) -> Cell:
    """The cell labelled ``spec``, or at index ``spec`` of the draw."""
    drawn = draw_cells(cells, sample_seed)
    if spec.isdecimal() and spec.isascii():
        index = int(spec)
        if index >= len(drawn):
            raise SystemExit(f"cell: index {index} out of range 0..{len(drawn) - 1}")
        return drawn[index]
    for cell in drawn:
        if cell.label == spec:
            return cell
    parsed = Cell.from_label(spec)
    if parsed is not None:
        return parsed  # a cell outside the draw, written as a label
    labels = "\n  ".join(c.label for c in drawn)
    raise SystemExit(f"cell: no cell labelled {spec!r}; the draw has:\n  {labels}")


class _Recorder:
    """Time-weighted limits and states of every ``Little`` updated while active."""

    def __init__(self, every: int) -> None:
        self.every = every
        # Seconds spent at each limit and in each state.
        self.limits: collections.defaultdict[int, float] = collections.defaultdict(float)
        self.states: collections.defaultdict[str, float] = collections.defaultdict(float)
        self.rounds: list[str] = []
        self.left_startup: float | None = None  # the last move out of start-up
        self._last: tuple[float, int, str] | None = None  # (time, limit, state) last seen
        self._state = ""  # the last state seen, with " variable" while means are used
        self._round = 0

    def sample(self, algorithm: Little, now: float) -> None:
        if self._last is not None:
            then, limit, _ = self._last
            self.limits[limit] += now - then
            self.states[self._state] += now - then
        self._state = algorithm.state + (" variable" if algorithm.variable else "")
        if self._last is not None and self._last[2] == "startup" and algorithm.state != "startup":
            self.left_startup = now
        self._last = (now, algorithm.limit, algorithm.state)

    def round_ended(self, algorithm: Little, now: float) -> None:
        self._round += 1
        if not self.every or self._round % self.every:
            return
        knee = algorithm.knee
        line = (
            f"  {now:9.3f}s {algorithm.state:<7} limit {algorithm.limit:4d}"
            f"  estimate {algorithm.estimate():7.2f}"
        )
        if algorithm.variable:
            line += f"  knee {knee if knee is not None else '-':>4}"
            line += f"  mean {algorithm.service_mean * 1000:8.2f} ms"
            edge = algorithm.overtake_edge
            line += f"  edge {edge if edge is not None else '-':>4}"
        self.rounds.append(line)


class Successes:
    """Successes per window of ``window`` seconds (by the time the client got them)
    while active: wraps the simulator's recorder, as ``_patch`` wraps ``Little``."""

    def __init__(self, window: float) -> None:
        self.window = window
        self.counts: collections.Counter[int] = collections.Counter()

    def __enter__(self) -> Successes:
        response = self._response = metrics.Recorder.response
        counts, window = self.counts, self.window

        def counted(
            self: metrics.Recorder, status: int, latency: float, when: float, cost: float = 1.0
        ) -> None:
            if status == Status.SUCCESS:
                counts[int(when // window)] += 1
            response(self, status, latency, when, cost)

        metrics.Recorder.response = counted  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        metrics.Recorder.response = self._response  # type: ignore[method-assign]

    def row(self, windows: int) -> list[float]:
        return [float(self.counts[i]) for i in range(windows)]


def _patch(recorder: _Recorder) -> Callable[[], None]:
    """Route ``Little``'s updates and round ends through ``recorder``; returns the undo.

    (The simulator builds its algorithm from a name: wrapping the class is the one way
    in without changing the simulator for a diagnostic.)
    """
    update, end_round = Little.update, Little._end_round

    def traced_update(self: Little, sample: Sample) -> int:
        limit = update(self, sample)
        recorder.sample(self, sample.now)
        return limit

    def traced_end_round(self: Little, now: float) -> None:
        end_round(self, now)
        recorder.round_ended(self, now)

    Little.update = traced_update  # type: ignore[method-assign]
    Little._end_round = traced_end_round  # type: ignore[method-assign]

    def undo() -> None:
        Little.update = update  # type: ignore[method-assign]
        Little._end_round = end_round  # type: ignore[method-assign]

    return undo


def trace(cell: Target, seed: int, every: int) -> tuple[float, _Recorder]:
    """``little``'s score on ``cell`` for ``seed`` and what it did."""
    recorder = _Recorder(every)
    undo = _patch(recorder)
    try:
        result = score_any(cell, "little", seed)
    finally:
        undo()
    return result, recorder


def duration(cell: Target) -> float:
    """The run's length in seconds."""
    return 120.0 if isinstance(cell, E2) else cell.duration


def _window_line(name: str, row: list[float]) -> str:
    return f"    {name:<10}" + "".join(f" {n:7.1f}" for n in row)


def report(
    cell: Target,
    seed: int,
    fixed: list[int],
    every: int,
    window: float = 0.0,
    rows: dict[str, list[list[float]]] | None = None,
) -> list[str]:
    """The lines printed for one seed; with ``window``, each run's successes per
    window are added to ``rows`` (by limit) as well."""
    windows = math.ceil(duration(cell) / window - 1e-9) if window else 0
    runs: dict[str, list[float]] = {}
    successes = Successes(window or 1.0)
    with successes:
        little, recorder = trace(cell, seed, every)
    runs["little"] = successes.row(windows)
    fixed_scores = []
    for n in fixed:
        successes = Successes(window or 1.0)
        with successes:
            fixed_scores.append(score_any(cell, f"fixed:{n}", seed))
        runs[f"fixed:{n}"] = successes.row(windows)
    scores = "  ".join(
        f"fixed:{n} {value:.3f}" for n, value in zip(fixed, fixed_scores, strict=True)
    )
    total = sum(recorder.limits.values()) or 1.0
    shares = sorted(recorder.limits.items())
    limits = " ".join(f"{n}:{time / total:.0%}" for n, time in shares if time / total >= 0.01)
    states = " ".join(
        f"{state} {time / total:.0%}"
        for state, time in sorted(recorder.states.items(), key=lambda item: -item[1])
    )
    left = recorder.left_startup
    lines = [
        f"seed {seed}: little {little:.3f}  {scores}",
        f"  time at each limit (>= 1 %): {limits}",
        f"  time in each state: {states}",
        f"  start-up last ended at {left:.3f}s" if left is not None else "  never left start-up",
    ]
    if windows:
        lines.append(f"  successes per {window:g} s:")
        for name, row in runs.items():
            lines.append(_window_line(name, row))
            if rows is not None:
                rows.setdefault(name, []).append(row)
    return lines + recorder.rounds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "cell", help="a cell's label, its index in the draw, e2, or cost:LABEL (cost_aware.py)"
    )
    parser.add_argument(
        "--e2-sigma", type=float, help="with e2: log-normal service, this sigma (e.g. 0.02)"
    )
    parser.add_argument(
        "--no-deadline", action="store_true", help="with e2: clients send no deadline"
    )
    parser.add_argument(
        "--discipline",
        choices=["fifo", "lifo", "codel", "shortest"],
        help="with cost:LABEL: the queue's order (default fifo)",
    )
    parser.add_argument(
        "--count",
        choices=["requests", "cost"],
        help="with cost:LABEL: goodput counted in requests (default) or cost units",
    )
    parser.add_argument(
        "--cost-dist",
        help="with cost:LABEL: the costs' distribution (default loguniform:1:100)",
    )
    parser.add_argument(
        "--cost-fixed",
        type=float,
        help="with cost:LABEL: the service time's share that no cost explains (default 0.1)",
    )
    parser.add_argument(
        "--blind",
        action="store_true",
        help="with cost:LABEL: run the same traffic with the costs not told to loadshed",
    )
    parser.add_argument("--seeds", default="1,2", help="comma-separated seeds (default 1,2)")
    parser.add_argument("--fixed", default="", help="fixed limits to compare (default W-1,W,W+1)")
    parser.add_argument("--rounds", type=int, default=0, help="print every K-th round (0: none)")
    parser.add_argument(
        "--window",
        type=float,
        default=0.0,
        help="print successes per this many seconds, per seed and mean (0: none)",
    )
    parser.add_argument("--cells", type=int, default=24, help="cells in the draw (default 24)")
    parser.add_argument("--sample-seed", type=int, default=12, help="the draw's seed (default 12)")
    args = parser.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s]
        fixed = [int(n) for n in args.fixed.split(",") if n]
    except ValueError:
        parser.error("--seeds and --fixed take comma-separated integers")
    if args.rounds < 0:
        parser.error("--rounds must be >= 0")
    if not (args.window >= 0 and math.isfinite(args.window)):
        parser.error(f"--window must be >= 0 seconds, got {args.window:g}")
    if not seeds:
        parser.error("--seeds needs at least one seed")
    if not hasattr(Little.update, "__code__"):
        # The compiled build (mypyc) neither lets the class be wrapped nor calls
        # through the wrapper: trace with the source tree.
        raise SystemExit(
            "little_trace: loadshed.limits.little is the compiled build; run with the "
            "source tree (make's .venv, or PYTHONPATH=src)"
        )
    if args.e2_sigma is not None and not args.e2_sigma > 0:
        parser.error(f"--e2-sigma must be > 0, got {args.e2_sigma:g}")
    cell: Target
    if args.cell.lower() == "e2":
        cell = E2(args.e2_sigma, deadlines=not args.no_deadline)
    elif args.e2_sigma is not None or args.no_deadline:
        parser.error("--e2-sigma and --no-deadline go with the cell e2")
    elif args.cell.startswith("cost:"):
        try:
            CostDistribution.parse(
                args.cost_dist or "loguniform:1:100",
                0.1 if args.cost_fixed is None else args.cost_fixed,
            )
        except ConfigError as error:
            parser.error("--" + str(error).replace("_", "-", 1))  # cost_fixed: ...
        cell = CostTarget(
            find_cost_cell(args.cell.removeprefix("cost:")),
            args.discipline or "fifo",
            args.count or "requests",
            args.cost_dist or "loguniform:1:100",
            0.1 if args.cost_fixed is None else args.cost_fixed,
            aware=not args.blind,
        )
    else:
        cell = find_cell(args.cell, args.cells, args.sample_seed)
    if args.cost_dist is not None and not args.cost_dist:
        parser.error("--cost-dist: empty; allowed: constant:C|uniform:LO:HI|loguniform:LO:HI")
    cost_options = (args.discipline, args.count, args.cost_dist, args.cost_fixed)
    if not isinstance(cell, CostTarget) and (
        any(option is not None for option in cost_options) or args.blind
    ):
        parser.error(
            "--discipline, --count, --cost-dist, --cost-fixed and --blind go with a cost:LABEL cell"
        )
    if not fixed:
        w = cell.workers
        fixed = [n for n in (w - 1, w, w + 1) if n >= 1]
    if any(n < 1 for n in fixed):
        parser.error("--fixed limits must be >= 1")
    if isinstance(cell, E2):
        print(cell.label)
    else:
        capacity = cell.workers / cell.service_time
        print(f"{cell.label}: {cell.duration:g} s, {capacity:g} req/s capacity")
    if args.window and duration(cell) / args.window > 240:
        parser.error(
            f"--window {args.window:g} s splits the {duration(cell):g} s run into "
            "more than 240 windows"
        )
    rows: dict[str, list[list[float]]] = {}
    for seed in seeds:
        print("\n".join(report(cell, seed, fixed, args.rounds, args.window, rows)))
    if args.window and len(seeds) > 1:
        print(f"mean successes per {args.window:g} s over seeds {args.seeds}:")
        for name, runs in rows.items():
            mean = [sum(column) / len(runs) for column in zip(*runs, strict=True)]
            print(_window_line(name, mean))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
