"""The robustness matrix: every limit algorithm against the best hand-set limit found
in hindsight, on the traffic model endpoints really see. The regression gate for
every change to a limit algorithm.

    .venv/bin/python bench/robustness.py --out bench/results/robustness.md   # 40 cells, 2 seeds
    .venv/bin/python bench/robustness.py --quick                             # 8 core cells, <1 min
    .venv/bin/python bench/robustness.py --cells 24 --seeds 8 --algorithms little \
        --oracle bench/results/robustness_seeds8.json   # the oracle of a saved run: ~20 s

(The default's wall time on 2 cores is not measured yet: its biggest cells, 64 workers
at 4x load, dominate; lower ``--cells`` to fit a budget.)

Each *cell* is one server and one traffic pattern, in the simulator (virtual time,
seeded: the same arguments print the same numbers):

- workers 1, 2, 4, 8, 16, 32, 64; mean service time 20 ms to 1 s;
- service constant, exponential, log-normal sigma 0.5 and 1.0;
- arrivals Poisson or bursts (open loop), or closed-loop clients that retry at once;
- offered load 1.2x, 2x or 4x capacity (closed loop: clients = load x workers);
- client timeout 2 to 10 mean service times, sent as a deadline or not;
- steady, work time doubling or halving mid-run, half the workers gone or twice
  the workers (open loop only).

The origin queues without bound behind the limiter (a process pool, a model server):
every request a limit admits past the workers waits there, out of the limiter's reach.

Score: goodput (successes within the client's timeout) over the whole run, as a share
of capacity (per phase: min(capacity, offered rate)), mean over ``--seeds`` seeds.
The **oracle** of a cell is the best ``fixed:N`` for the whole run, N swept over 1 ..
2 x workers (every N up to 8 workers, a grid around the worker count beyond); each
algorithm is reported as its score over the oracle's. The cells are drawn from the
full product with a seeded generator (``--cells``, ``--sample-seed``), always
including a fixed core of hard cases; ``--quick`` runs a small subset.

``--grid`` runs a full product instead of a draw: the ordinary steady server under
random arrivals, every combination of 2 to 32 workers, the variable service shapes
(``--services`` to change them), 2x and 4x load, deadlines sent or not; Poisson
arrivals, 100 ms mean service, clients that wait 3 mean service times. A draw mixes
hard cases with easy ones; the grid shows how a limit does on the plain case, cell by
neighbouring cell (the draw has few such neighbours).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from loadshed.sim.scenarios import (
    LimiterConfig,
    ServiceConfig,
    run_capacity_change,
    run_paradox,
)

ALGORITHMS = ("none", "aimd", "vegas", "gradient2", "gradient", "little")
# Also accepted by --algorithms, not run by default: variants of the above.
VARIANTS = ("little+headroom",)
WORKERS = (1, 2, 4, 8, 16, 32, 64)
SERVICES = (("constant", 0.0), ("exponential", 0.0), ("lognormal", 0.5), ("lognormal", 1.0))
ARRIVALS = ("poisson", "bursts", "closed")
LOADS = (1.2, 2.0, 4.0)
TIMEOUTS = (2.0, 3.0, 5.0, 10.0)  # mean service times
CHANGES = ("steady", "slower", "faster", "fewer", "more")
MEAN_SERVICE = (0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
# --grid: the plain steady server, every combination (see the module docstring).
GRID_WORKERS = (2, 4, 8, 16, 32)
GRID_SERVICES = (("exponential", 0.0), ("lognormal", 0.5), ("lognormal", 1.0))
GRID_LOADS = (2.0, 4.0)


@dataclass(frozen=True)
class Cell:
    """One server and one traffic pattern."""

    workers: int
    service: str
    sigma: float
    service_time: float
    arrivals: str  # poisson | bursts | closed
    load: float
    timeout: float  # in mean service times
    change: str
    deadlines: bool

    @property
    def label(self) -> str:
        shape = self.service if self.service != "lognormal" else f"lognormal{self.sigma:g}"
        return (
            f"w{self.workers} {shape} {self.service_time * 1000:g}ms {self.arrivals} "
            f"{self.load:g}x t{self.timeout:g} {self.change} "
            f"{'deadline' if self.deadlines else 'no-deadline'}"
        )

    @classmethod
    def from_label(cls, label: str) -> Cell | None:
        """The cell a ``label`` names (any combination, drawn or not), or None if it
        does not parse."""
        match = re.fullmatch(
            r"w(\d+) (constant|exponential|lognormal)([\d.]*) ([\d.]+)ms"
            r" (poisson|bursts|closed) ([\d.]+)x t([\d.]+) (\w+) (deadline|no-deadline)",
            label.strip(),
        )
        if match is None or match[8] not in CHANGES:
            return None
        workers, service, sigma, ms, arrivals, load, timeout, change, deadline = match.groups()
        if (service == "lognormal") != bool(sigma):
            return None
        return cls(
            workers=int(workers),
            service=service,
            sigma=float(sigma) if sigma else 0.0,
            service_time=float(ms) / 1000,
            arrivals=arrivals,
            load=float(load),
            timeout=float(timeout),
            change=change,
            deadlines=deadline == "deadline",
        )

    @property
    def requests(self) -> float:
        """About how many requests a run sends (workers x load x run / service time):
        the order in which a pool should start cells so it does not end on a long one."""
        return self.workers * self.load * self.duration / self.service_time

    @property
    def duration(self) -> float:
        """300 mean service times, cut to 30,000 arrivals (at least 100 service times)."""
        rate = self.load * self.workers / self.service_time
        return max(100 * self.service_time, min(300 * self.service_time, 30_000 / rate))

    def fixed_grid(self) -> list[int]:
        """The hand-set limits to sweep for the oracle: 1 .. 2 x workers."""
        top = 2 * max(self.workers, 1)
        if self.change == "more":
            top = 2 * top  # the workers double mid-run
        if top <= 16:
            return list(range(1, top + 1))
        w = self.workers
        points = {1, w // 2, w - 2, w - 1, w, w + 1, w + 2, top}
        points |= {round(w * f) for f in (0.625, 0.75, 0.875, 1.125, 1.25, 1.5, 1.75)}
        if self.change == "more":
            points |= {2 * w - 1, 2 * w, 2 * w + 2, round(2.5 * w), 3 * w}
        if self.change == "fewer":
            points |= {w // 2 + 1, round(0.625 * w)}
        return sorted(p for p in points if 1 <= p <= top)


def _core_cells() -> list[Cell]:
    """The hard cases every run includes (from issues 12 and 18)."""
    return [
        Cell(32, "exponential", 0.0, 0.2, "poisson", 1.5, 3.0, "steady", True),
        Cell(32, "lognormal", 1.0, 0.2, "poisson", 1.5, 3.0, "slower", True),
        Cell(16, "exponential", 0.0, 0.05, "poisson", 1.5, 3.0, "steady", True),
        Cell(1, "exponential", 0.0, 0.2, "poisson", 1.5, 3.0, "steady", True),
        Cell(16, "constant", 0.0, 0.05, "poisson", 1.5, 3.0, "steady", True),
        Cell(1, "lognormal", 0.1, 0.05, "closed", 16.0, 4.0, "steady", False),
        Cell(8, "exponential", 0.0, 0.1, "poisson", 2.0, 3.0, "fewer", True),
        Cell(8, "exponential", 0.0, 0.1, "poisson", 2.0, 3.0, "more", False),
    ]


def draw_cells(
    count: int,
    seed: int,
    services: tuple[tuple[str, float], ...] = SERVICES,
    changes: tuple[str, ...] | None = None,
) -> list[Cell]:
    """``count`` cells drawn from the full product (plus the core), seeded; the service
    shapes from ``services`` (the same draw as before for the default); with
    ``changes``, only cells (core ones too) whose capacity change is among them."""
    rng = random.Random(seed)
    cells = _core_cells()
    arrival_choices = ARRIVALS
    if changes is not None:
        cells = [cell for cell in cells if cell.change in changes]
        if "steady" not in changes:
            arrival_choices = tuple(a for a in ARRIVALS if a != "closed")  # closed: steady
    seen = set(cells)
    while len(cells) < count:
        service, sigma = rng.choice(services)
        arrivals = rng.choice(arrival_choices)
        cell = Cell(
            workers=rng.choice(WORKERS),
            service=service,
            sigma=sigma,
            service_time=rng.choice(MEAN_SERVICE),
            arrivals=arrivals,
            load=rng.choice(LOADS),
            timeout=rng.choice(TIMEOUTS),
            change="steady"
            if arrivals == "closed"
            else rng.choice(CHANGES if changes is None else changes),
            deadlines=rng.random() < 0.5,
        )
        if cell not in seen:
            seen.add(cell)
            cells.append(cell)
    return cells


def grid_cells(services: tuple[tuple[str, float], ...] = GRID_SERVICES) -> list[Cell]:
    """Every combination of ``GRID_WORKERS``, ``services``, ``GRID_LOADS`` and deadlines
    sent or not: Poisson arrivals, 100 ms, clients that wait 3 services, steady."""
    return [
        Cell(workers, service, sigma, 0.1, "poisson", load, 3.0, "steady", deadlines)
        for workers in GRID_WORKERS
        for service, sigma in services
        for load in GRID_LOADS
        for deadlines in (True, False)
    ]


# Settings every limiter of the run gets (``--wait-ceiling``); the pool's processes
# read them from the environment, which they inherit.
_WAIT_CEILING_ENV = "LOADSHED_ROBUSTNESS_WAIT_CEILING"
_LIMITER_EXTRA: dict[str, Any] = (
    {"adaptive_wait_ceiling": float(os.environ[_WAIT_CEILING_ENV])}
    if os.environ.get(_WAIT_CEILING_ENV)
    else {}
)


def score(cell: Cell, limit: str, seed: int) -> float:
    """Goodput over the whole run as a share of what could be served, one seed."""
    name, _, value = limit.partition(":")
    limiter = LimiterConfig(name, limit_value=int(value) if value else None, **_LIMITER_EXTRA)
    s = cell.service_time
    if cell.arrivals == "closed":
        clients = max(1, round(cell.load * cell.workers))
        result = run_paradox(
            limiter=limiter,
            clients=(clients,),
            workers=cell.workers,
            service=ServiceConfig(s, cell.service, cell.sigma or 0.5),
            timeout=cell.timeout * s,
            send_deadline=cell.deadlines,
            duration=cell.duration,
            origin_queue=None,
            seed=seed,
        )
        return float(result["steps"][0]["goodput_ratio"])
    change_to, workers_to = s, None
    if cell.change == "slower":
        change_to = 2 * s
    elif cell.change == "faster":
        change_to = s / 2
    elif cell.change == "fewer":
        workers_to = max(1, cell.workers // 2)
    elif cell.change == "more":
        workers_to = 2 * cell.workers
    rate = cell.load * cell.workers / s
    result = run_capacity_change(
        limiter=limiter,
        workers=cell.workers,
        service_time=s,
        change_to=change_to,
        workers_to=workers_to,
        dist=cell.service,
        sigma=cell.sigma or 0.5,
        rate=rate,
        arrivals=cell.arrivals,
        burst_size=max(2, cell.workers),
        client_workers=0,
        timeout=cell.timeout * s,
        send_deadline=cell.deadlines,
        origin_queue=None,
        duration=cell.duration,
        seed=seed,
    )
    served = achievable = 0.0
    half = cell.duration / 2
    for step in result["steps"]:
        served += step["goodput_rps"] * half
        achievable += min(step["capacity_rps"], rate) * half
    return served / achievable


def parse_services(text: str) -> tuple[tuple[str, float], ...]:
    """``constant,exponential,lognormal:0.5`` -> ((name, sigma), ...); ValueError with
    the allowed forms on anything else."""
    services: list[tuple[str, float]] = []
    for item in (part.strip() for part in text.split(",")):
        name, _, sigma_text = item.partition(":")
        if name in ("constant", "exponential") and not sigma_text:
            services.append((name, 0.0))
            continue
        if name == "lognormal":
            try:
                sigma = float(sigma_text)
            except ValueError:
                sigma = math.nan
            if math.isfinite(sigma) and sigma > 0:
                services.append((name, sigma))
                continue
        raise ValueError(f"{item!r}; allowed: constant, exponential, lognormal:SIGMA (SIGMA > 0)")
    if not services:
        raise ValueError("empty; allowed: constant, exponential, lognormal:SIGMA")
    return tuple(services)


def _job(job: tuple[int, Cell, str, int]) -> tuple[int, str, int, float]:
    index, cell, limit, seed = job
    return index, limit, seed, score(cell, limit, seed)


def run(
    cells: list[Cell],
    algorithms: tuple[str, ...],
    seeds: int,
    jobs: int,
    oracles: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Every algorithm and the fixed grid on every cell; one dict per cell.

    ``oracles``: rows of an earlier run over the same cells and seeds, whose oracle
    (and ``fixed_workers``) are taken as they are instead of sweeping the grid again.
    """
    work = []
    for index, cell in enumerate(cells):
        limits = list(algorithms)
        if oracles is None:
            limits += [f"fixed:{n}" for n in cell.fixed_grid()]
        work += [(index, cell, limit, seed) for limit in limits for seed in range(1, seeds + 1)]
    # The biggest cells first, so that the pool does not end on one long job.
    work.sort(key=lambda j: -j[1].requests)
    scores: dict[tuple[int, str], list[float]] = {}
    done = 0
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for index, limit, _seed, value in pool.map(_job, work, chunksize=1):
            scores.setdefault((index, limit), []).append(value)
            done += 1
            if done % 200 == 0:
                print(
                    f"  {done}/{len(work)} runs, {time.perf_counter() - started:.0f} s",
                    file=sys.stderr,
                )
    rows = []
    for index, cell in enumerate(cells):
        if oracles is None:
            fixed = {n: statistics.fmean(scores[(index, f"fixed:{n}")]) for n in cell.fixed_grid()}
            best_n = max(fixed, key=lambda n: (fixed[n], -abs(n - cell.workers)))
            oracle = fixed[best_n]
            fixed_workers = fixed.get(cell.workers, float("nan"))
        else:
            best_n = oracles[index]["oracle_n"]
            oracle = oracles[index]["oracle"]
            fixed_workers = oracles[index]["fixed_workers"]
        algos = {a: statistics.fmean(scores[(index, a)]) for a in algorithms}
        rows.append(
            {
                "cell": asdict(cell),
                "label": cell.label,
                "oracle_n": best_n,
                "oracle": round(oracle, 4),
                "fixed_workers": round(fixed_workers, 4),
                "goodput": {a: round(v, 4) for a, v in algos.items()},
                "vs_oracle": {
                    a: round(v / oracle, 4) if oracle > 0 else None for a, v in algos.items()
                },
            }
        )
    return rows


def summary(rows: list[dict[str, Any]], algorithms: tuple[str, ...]) -> list[str]:
    """One line per algorithm: min, median, cells below 0.95 of the oracle, beaten by."""
    lines = []
    for a in algorithms:
        ratios = [r["vs_oracle"][a] for r in rows if r["vs_oracle"][a] is not None]
        below = sum(1 for x in ratios if x < 0.95)
        lines.append(
            f"{a:>10}: min {min(ratios):.3f}, median {statistics.median(ratios):.3f}, "
            f"below 0.95 in {below}/{len(ratios)} cells"
        )
    return lines


def markdown(rows: list[dict[str, Any]], algorithms: tuple[str, ...], command: str) -> str:
    """The table (score over the oracle's) and the summary lines."""
    out = [
        "# Robustness matrix",
        "",
        f"`{command}`",
        "",
        "Goodput as a share of the oracle's (the best `fixed:N` in hindsight) per cell;",
        "`oracle` is that best goodput as a share of capacity.",
        "",
        "```",
        *summary(rows, algorithms),
        "```",
        "",
        "| cell | oracle N | oracle | " + " | ".join(algorithms) + " |",
        "| --- | ---: | ---: | " + " | ".join("---:" for _ in algorithms) + " |",
    ]
    for r in rows:
        cells = []
        for a in algorithms:
            v = r["vs_oracle"][a]
            text = "" if v is None else f"{v:.2f}"
            cells.append(f"**{text}**" if v is not None and v < 0.95 else text)
        out.append(
            f"| {r['label']} | {r['oracle_n']} | {r['oracle']:.2f} | " + " | ".join(cells) + " |"
        )
    return "\n".join(out) + "\n"


def _load_oracles(path: str, cells: list[Cell], seeds: int) -> list[dict[str, Any]] | str:
    """The rows of ``path`` in the order of ``cells``, or why they cannot be used."""
    try:
        with open(path) as f:
            saved = json.load(f)
        by_cell = {Cell(**row["cell"]): row for row in saved["rows"]}
        saved_seeds = saved["seeds"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        return f"cannot read {path}: {error}"
    if saved_seeds != seeds:
        return f"{path} was run with --seeds {saved_seeds}, this run has {seeds}"
    missing = [cell.label for cell in cells if cell not in by_cell]
    if missing:
        return f"{path} has no oracle for {len(missing)} cell(s), e.g. {missing[0]}"
    return [by_cell[cell] for cell in cells]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, help="cells to draw (core included; default 40)")
    parser.add_argument("--sample-seed", type=int, help="the draw's seed (default 12)")
    parser.add_argument("--seeds", type=int, default=2, help="seeds per cell and limit")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    parser.add_argument("--quick", action="store_true", help="the core cells only, one seed")
    parser.add_argument(
        "--grid",
        action="store_true",
        help="the full product of plain steady cells (see above) instead of a draw",
    )
    parser.add_argument(
        "--services",
        help="service shapes the drawn cells take (the core cells are kept) or the grid's, e.g. "
        "lognormal:0.02,lognormal:0.05 for a nearly constant service with jitter "
        "(default: constant,exponential,lognormal:0.5,lognormal:1; with --grid "
        "exponential,lognormal:0.5,lognormal:1)",
    )
    parser.add_argument(
        "--changes",
        help="only cells with these capacity changes (core cells too), e.g. more,fewer; "
        f"allowed: {','.join(CHANGES)}",
    )
    parser.add_argument(
        "--select",
        help="only these cells of the drawn list (or the grid), by position from 0 (e.g. 0,3,9)",
    )
    parser.add_argument(
        "--wait-ceiling",
        type=float,
        help="adaptive_wait_ceiling for every limiter, oracle included (0: one service time)",
    )
    parser.add_argument(
        "--oracle",
        metavar="JSON",
        help="take each cell's oracle from this earlier run's JSON (same cells, same "
        "--seeds) instead of sweeping fixed:N again: a limit change checked in seconds",
    )
    parser.add_argument("--out", help="markdown file (a .json beside it)")
    args = parser.parse_args()
    if args.grid and (
        args.quick
        or args.changes is not None
        or args.cells is not None
        or args.sample_seed is not None
    ):
        parser.error(
            "--grid is its own set of cells: not with --quick, --changes, --cells or --sample-seed"
        )
    if args.cells is None:
        args.cells = 40
    if args.sample_seed is None:
        args.sample_seed = 12
    if args.wait_ceiling is not None:
        if not args.wait_ceiling >= 0:
            parser.error(f"--wait-ceiling: seconds >= 0, got {args.wait_ceiling}")
        os.environ[_WAIT_CEILING_ENV] = str(args.wait_ceiling)
        _LIMITER_EXTRA["adaptive_wait_ceiling"] = args.wait_ceiling
    algorithms = tuple(a for a in args.algorithms.split(",") if a)
    unknown = [a for a in algorithms if a not in ALGORITHMS + VARIANTS]
    if unknown:
        allowed = ",".join(ALGORITHMS + VARIANTS)
        parser.error(f"--algorithms: unknown {unknown}, allowed: {allowed}")
    if args.cells < 1 or args.seeds < 1 or args.jobs < 1:
        parser.error("--cells, --seeds and --jobs must be >= 1")
    services = GRID_SERVICES if args.grid else SERVICES
    if args.services is not None:
        try:
            services = parse_services(args.services)
        except ValueError as error:
            parser.error(f"--services: {error}")
    changes: tuple[str, ...] | None = None
    if args.changes is not None:
        changes = tuple(c.strip() for c in args.changes.split(",") if c.strip())
        wrong = [c for c in changes if c not in CHANGES]
        if wrong or not changes:
            allowed = ",".join(CHANGES)
            parser.error(f"--changes: unknown {wrong or args.changes!r}, allowed: {allowed}")
    if args.grid:
        cells = grid_cells(services)
    elif args.quick:
        cells = [c for c in _core_cells() if changes is None or c.change in changes]
    else:
        cells = draw_cells(args.cells, args.sample_seed, services, changes)
    if args.select:
        try:
            cells = [cells[int(i)] for i in args.select.split(",")]
        except (ValueError, IndexError):
            parser.error(f"--select: positions 0..{len(cells) - 1}, got {args.select!r}")
    seeds = 1 if args.quick else args.seeds
    oracles: list[dict[str, Any]] | None = None
    if args.oracle:
        loaded = _load_oracles(args.oracle, cells, seeds)
        if isinstance(loaded, str):
            parser.error(f"--oracle: {loaded}")
        oracles = loaded
    started = time.perf_counter()
    rows = run(cells, algorithms, seeds, args.jobs, oracles)
    command = "python bench/robustness.py " + " ".join(sys.argv[1:])
    text = markdown(rows, algorithms, command.strip())
    print(text)
    print(f"wall {time.perf_counter() - started:.0f} s", file=sys.stderr)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        json_path = args.out.rsplit(".", 1)[0] + ".json"
        with open(json_path, "w") as f:
            json.dump({"command": command, "seeds": seeds, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
