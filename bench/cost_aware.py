"""Issue 16: admission by predicted service time, in the simulator.

    .venv/bin/python bench/cost_aware.py --out bench/results/cost_aware.md [--seeds 2]

Requests carry a cost (log-uniform over 1..100 by default: rows in a batch, tokens in a
prompt) and take a + b x cost seconds times the service spread
(:mod:`loadshed.sim.costs`; a is ``--cost-fixed`` of the mean, the mean service time
unchanged). Open-loop Poisson arrivals at 1.5x and 3x capacity, client timeout 3 mean
service times sent as a deadline, the origin's queue unbounded. In each cell, on the
same seeds (the same arrivals and costs):

- ``little`` told each request's cost (*cost-aware*) and ``little`` not told
  (*cost-blind*);
- the **oracle**: the best ``fixed:N`` in hindsight, N swept over 1 .. 2 x workers,
  cost-aware and cost-blind; the better of the two on each count.

Goodput is counted two ways over the whole run: requests that met their deadline per
second, over capacity (can exceed 1: refusing big requests that cannot make it serves
more small ones), and cost units served within the deadline per second, over capacity
x the mean cost. Each algorithm is reported as a share of the oracle, mean over seeds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from loadshed.admission import DISCIPLINES
from loadshed.sim.scenarios import LimiterConfig, run_capacity_change


@dataclass(frozen=True)
class Cell:
    workers: int
    service: str
    sigma: float
    load: float
    service_time: float = 0.1
    timeout: float = 3.0  # mean service times

    @property
    def label(self) -> str:
        shape = f"lognormal{self.sigma:g}" if self.service == "lognormal" else self.service
        ms = self.service_time * 1000
        return f"w{self.workers} {shape} {ms:g}ms {self.load:g}x t{self.timeout:g}"

    @property
    def duration(self) -> float:
        # at least ~6,000 requests offered per run
        return max(60.0, 6000 / (self.load * self.workers / self.service_time))

    def fixed_grid(self) -> list[int]:
        top = 2 * self.workers
        if self.workers <= 8:
            return list(range(1, top + 1))
        step = max(1, self.workers // 8)
        return sorted({*range(max(1, self.workers // 2), top + 1, step), self.workers})


def cells() -> list[Cell]:
    out = []
    for workers in (1, 4, 16):
        for service, sigma in (("constant", 0.0), ("exponential", 0.0), ("lognormal", 0.5)):
            for load in (1.5, 3.0):
                out.append(Cell(workers, service, sigma, load))
    return out


def score(
    cell: Cell,
    limit: str,
    aware: bool,
    seed: int,
    cost_dist: str,
    fixed: float,
    discipline: str = "fifo",
) -> tuple[float, float]:
    """(request goodput ratio, cost goodput ratio) over the whole run, one seed."""
    name, _, value = limit.partition(":")
    limiter = LimiterConfig(name, limit_value=int(value) if value else None, discipline=discipline)
    s = cell.service_time
    rate = cell.load * cell.workers / s
    result = run_capacity_change(
        limiter=limiter,
        workers=cell.workers,
        service_time=s,
        change_to=s,
        dist=cell.service,
        sigma=cell.sigma or 0.5,
        rate=rate,
        arrivals="poisson",
        client_workers=0,
        timeout=cell.timeout * s,
        send_deadline=True,
        origin_queue=None,
        duration=cell.duration,
        seed=seed,
        cost_dist=cost_dist,
        cost_fixed=fixed,
        cost_blind=not aware,
    )
    steps = result["steps"]
    return (
        statistics.fmean(step["goodput_ratio"] for step in steps),
        statistics.fmean(step["goodput_cost_ratio"] for step in steps),
    )


def _job(
    job: tuple[int, Cell, str, bool, int, str, float, str],
) -> tuple[int, str, bool, tuple[float, float]]:
    index, cell, limit, aware, seed, cost_dist, fixed, discipline = job
    return index, limit, aware, score(cell, limit, aware, seed, cost_dist, fixed, discipline)


def run(
    all_cells: list[Cell],
    seeds: int,
    cost_dist: str,
    fixed: float,
    jobs: int,
    discipline: str = "fifo",
) -> list[dict[str, Any]]:
    work = []
    for index, cell in enumerate(all_cells):
        limits = ["little"] + [f"fixed:{n}" for n in cell.fixed_grid()]
        work += [
            (index, cell, limit, aware, seed, cost_dist, fixed, discipline)
            for limit in limits
            for aware in (True, False)
            for seed in range(1, seeds + 1)
        ]
        # No protection: no limiter, so the costs change nothing (run once).
        work += [
            (index, cell, "none", False, seed, cost_dist, fixed, discipline)
            for seed in range(1, seeds + 1)
        ]
    work.sort(key=lambda j: -j[1].workers * j[1].load * j[1].duration)
    scores: dict[tuple[int, str, bool], list[tuple[float, float]]] = {}
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for index, limit, aware, value in pool.map(_job, work, chunksize=1):
            scores.setdefault((index, limit, aware), []).append(value)
    rows = []
    for index, cell in enumerate(all_cells):

        def mean(limit: str, aware: bool, which: int, index: int = index) -> float:
            return statistics.fmean(v[which] for v in scores[(index, limit, aware)])

        row: dict[str, Any] = {"cell": asdict(cell), "label": cell.label}
        for which, count in ((0, "requests"), (1, "cost")):
            best = max(
                (
                    (mean(f"fixed:{n}", aware, which), n, aware)
                    for n in cell.fixed_grid()
                    for aware in (True, False)
                ),
            )
            oracle, n, aware = best
            aware_score = mean("little", True, which)
            blind_score = mean("little", False, which)
            workers_aware = mean(f"fixed:{cell.workers}", True, which)
            row[count] = {
                "oracle": round(oracle, 4),
                "oracle_limit": f"fixed:{n} {'aware' if aware else 'blind'}",
                "little_aware": round(aware_score, 4),
                "little_blind": round(blind_score, 4),
                "aware_vs_oracle": round(aware_score / oracle, 4),
                "blind_vs_oracle": round(blind_score / oracle, 4),
                # the limit set to the worker count, told the costs: the cost mechanism
                # alone, without little's limit
                "workers_aware_vs_oracle": round(workers_aware / oracle, 4),
                "none": round(mean("none", False, which), 4),
            }
        # The best any one hand-set limit does on both counts at once (each as a share
        # of its own count's oracle): what "at least x of the oracle on both" can reach.
        both = max(
            (
                min(
                    mean(f"fixed:{n}", aware, 0) / row["requests"]["oracle"],
                    mean(f"fixed:{n}", aware, 1) / row["cost"]["oracle"],
                ),
                n,
                aware,
            )
            for n in cell.fixed_grid()
            for aware in (True, False)
        )
        little_both = min(row["requests"]["aware_vs_oracle"], row["cost"]["aware_vs_oracle"])
        row["both"] = {
            "best_fixed": round(both[0], 4),
            "best_fixed_limit": f"fixed:{both[1]} {'aware' if both[2] else 'blind'}",
            "little_aware": round(little_both, 4),
        }
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]], command: str) -> str:
    lines = [
        "# Cost-aware admission (issue 16), simulator",
        "",
        f"`{command}`",
        "",
        "Goodput as a share of the oracle (the best `fixed:N` in hindsight, cost-aware or",
        "cost-blind, whichever is better on that count); `oracle` is its goodput over capacity",
        "(requests) or over capacity x mean cost (cost units).",
        "",
    ]
    for count in ("requests", "cost"):
        aware = [r[count]["aware_vs_oracle"] for r in rows]
        blind = [r[count]["blind_vs_oracle"] for r in rows]
        ahead = sum(1 for r in rows if r[count]["little_aware"] > r[count]["little_blind"])
        below = sum(1 for v in aware if v < 0.95)
        lines.append(
            f"- {count}: cost-aware little min {min(aware):.3f}, median "
            f"{statistics.median(aware):.3f}, below 0.95 in {below}/{len(rows)}; cost-blind min "
            f"{min(blind):.3f}, median {statistics.median(blind):.3f}; aware ahead of blind in "
            f"{ahead}/{len(rows)}"
        )
    for count in ("requests", "cost"):
        over_none = [r[count]["little_aware"] - r[count]["none"] for r in rows]
        lines.append(
            f"- {count}: cost-aware little minus no protection (shares of capacity) min "
            f"{min(over_none):+.3f}, median {statistics.median(over_none):+.3f}; no protection "
            f"ahead by more than 0.005 in {sum(1 for v in over_none if v < -0.005)}/{len(rows)}"
        )
    for count in ("requests", "cost"):
        workers = [r[count]["workers_aware_vs_oracle"] for r in rows]
        lines.append(
            f"- {count}: `fixed:` the workers, cost-aware, min {min(workers):.3f}, median "
            f"{statistics.median(workers):.3f}"
        )
    best = [r["both"]["best_fixed"] for r in rows]
    little_both = [r["both"]["little_aware"] for r in rows]
    lines.append(
        f"- both counts at once (the lower of the two shares): the best single `fixed:N` "
        f"min {min(best):.3f}, median {statistics.median(best):.3f}, below 0.95 in "
        f"{sum(1 for v in best if v < 0.95)}/{len(rows)}; cost-aware little min "
        f"{min(little_both):.3f}, median {statistics.median(little_both):.3f}"
    )
    lines += [
        "",
        "`fixed:W aware` is a limit of the worker count, told the costs: the cost mechanism",
        "without `little`'s limit.",
        "",
        "| cell | requests: oracle | little aware | little blind | fixed:W aware "
        "| cost units: oracle | little aware | little blind | fixed:W aware "
        "| both: best fixed | little aware |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        cols = [r["label"]]
        for count in ("requests", "cost"):
            x = r[count]
            cols += [
                f"{x['oracle']:.2f} ({x['oracle_limit']})",
                f"{x['aware_vs_oracle']:.2f}",
                f"{x['blind_vs_oracle']:.2f}",
                f"{x['workers_aware_vs_oracle']:.2f}",
            ]
        both = r["both"]
        cols += [
            f"{both['best_fixed']:.2f} ({both['best_fixed_limit']})",
            f"{both['little_aware']:.2f}",
        ]
        lines.append("| " + " | ".join(cols) + " |")
    return "\n".join(lines) + "\n"


def against(rows: list[dict[str, Any]], before: list[dict[str, Any]], name: str) -> str:
    """Cost-aware little in this run over cost-aware little in ``before`` (same cells),
    requests and cost units met within the deadline: what a change of policy (the
    queue discipline) buys and costs, in absolute goodput rather than as oracle shares."""
    previous = {row["label"]: row for row in before}
    lines = [
        "",
        f"## Cost-aware `little` here over cost-aware `little` in `{name}`",
        "",
        "| cell | requests | cost units |",
        "| --- | ---: | ---: |",
    ]
    ratios: dict[str, list[float]] = {"requests": [], "cost": []}
    for row in rows:
        old = previous.get(row["label"])
        if old is None:
            continue
        cols = [row["label"]]
        for count in ("requests", "cost"):
            ratio = row[count]["little_aware"] / old[count]["little_aware"]
            ratios[count].append(ratio)
            cols.append(f"{ratio:.3f}")
        lines.append("| " + " | ".join(cols) + " |")
    summary = [
        f"- {count}: min {min(values):.3f}, median {statistics.median(values):.3f}, "
        f"max {max(values):.3f} over {len(values)} cells"
        for count, values in ratios.items()
        if values
    ]
    return "\n".join([*lines[:3], *summary, "", *lines[3:]]) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--cost-dist", default="loguniform:1:100")
    parser.add_argument("--cost-fixed", type=float, default=0.1)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--select", default=None, help="Cell indexes, comma-separated.")
    parser.add_argument(
        "--discipline",
        default="fifo",
        choices=DISCIPLINES,
        help="The limiter's queue discipline, for every row (default fifo).",
    )
    parser.add_argument(
        "--against",
        default=None,
        help="A saved --json run (e.g. the fifo one) to compare cost-aware little with, "
        "cell by cell: this run's goodput over that run's, on both counts.",
    )
    parser.add_argument("--out", default=None, help="Markdown file.")
    parser.add_argument("--json", default=None, help="JSON file.")
    args = parser.parse_args()
    all_cells = cells()
    if args.select:
        all_cells = [all_cells[int(i)] for i in args.select.split(",")]
    started = time.perf_counter()
    rows = run(all_cells, args.seeds, args.cost_dist, args.cost_fixed, args.jobs, args.discipline)
    command = "python bench/cost_aware.py " + " ".join(sys.argv[1:])
    text = markdown(rows, command.strip())
    if args.against:
        with open(args.against) as saved:
            text += against(rows, json.load(saved), args.against)
    print(text)
    print(f"({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    if args.out:
        with open(args.out, "w") as out:
            out.write(text)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
