"""Lock-in scan: how often ``little`` ends far under a limit of the worker count, seed by
seed, on a full grid of heavy-tailed open-loop cells (the robustness matrix's setup).

A limit algorithm can lock in: a back-off to a few slots makes requests wait, more of
them drop, and the drops keep the limit down. A matrix cell's mean over seeds hides one
such seed among good ones; this scan reports every seed and counts those where
``little`` serves under ``--lockin`` x what ``fixed:workers`` serves.

    .venv/bin/python bench/lockin_scan.py --out bench/results/lockin_scan.md

Every cell: Poisson or bursty arrivals at ``--load`` x capacity, exponential or
log-normal sigma 1 service of ``--service-time``, clients that wait ``--timeouts``
mean service times with or without a deadline, steady capacity, unbounded origin
queue (``bench/robustness.py``'s ``score``: goodput over capacity, whole run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from robustness import Cell, score

_SERVICES = {"exponential": ("exponential", 0.0), "lognormal1": ("lognormal", 1.0)}


def _job(job: tuple[Cell, str, int]) -> tuple[Cell, str, int, float]:
    cell, limit, seed = job
    return cell, limit, seed, score(cell, limit, seed)


def _ints(text: str, name: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"{name}: comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise SystemExit(f"{name}: integers >= 1, got {text!r}")
    return values


def _floats(text: str, name: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"{name}: comma-separated numbers, got {text!r}") from None
    if not values or not all(v > 0 for v in values):
        raise SystemExit(f"{name}: numbers > 0, got {text!r}")
    return values


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="4,16,64")
    parser.add_argument(
        "--services", default="exponential,lognormal1", help=f"of {','.join(_SERVICES)}"
    )
    parser.add_argument("--arrivals", default="poisson,bursts")
    parser.add_argument("--load", type=float, default=2.0, help="x capacity")
    parser.add_argument("--timeouts", default="2,3", help="in mean service times")
    parser.add_argument("--service-time", type=float, default=0.2, help="mean, seconds")
    parser.add_argument("--seeds", default="1,2,3,4")
    parser.add_argument(
        "--lockin", type=float, default=0.5, help="little / fixed:workers under this"
    )
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, help="markdown (a .json beside it)")
    args = parser.parse_args()
    workers = _ints(args.workers, "--workers")
    seeds = _ints(args.seeds, "--seeds")
    timeouts = _floats(args.timeouts, "--timeouts")
    services = [s for s in args.services.split(",") if s]
    wrong = [s for s in services if s not in _SERVICES]
    if wrong or not services:
        parser.error(
            f"--services: unknown {wrong or args.services!r}, allowed: {','.join(_SERVICES)}"
        )
    arrivals = [a for a in args.arrivals.split(",") if a]
    if not arrivals or any(a not in ("poisson", "bursts") for a in arrivals):
        parser.error(f"--arrivals: poisson and/or bursts, got {args.arrivals!r}")
    if not (args.load > 0 and args.service_time > 0 and 0 < args.lockin <= 1 and args.jobs >= 1):
        parser.error("--load and --service-time > 0, 0 < --lockin <= 1, --jobs >= 1")
    cells = [
        Cell(w, _SERVICES[s][0], _SERVICES[s][1], args.service_time, a, args.load, t, "steady", d)
        for w in workers
        for s in services
        for a in arrivals
        for t in timeouts
        for d in (False, True)
    ]
    jobs = [
        (cell, limit, seed)
        for cell in cells
        for limit in ("little", f"fixed:{cell.workers}")
        for seed in seeds
    ]
    started = time.monotonic()
    with ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(_job, jobs))
    wall = time.monotonic() - started
    shares = {(cell, limit, seed): share for cell, limit, seed, share in results}
    rows = []
    for cell in cells:
        fixed = f"fixed:{cell.workers}"
        ratios = [
            shares[(cell, "little", seed)] / max(shares[(cell, fixed, seed)], 1e-9)
            for seed in seeds
        ]
        rows.append({"cell": cell.label, "ratios": ratios})
    every = [r for row in rows for r in row["ratios"]]
    locked = [
        (row["cell"], seed)
        for row in rows
        for seed, r in zip(seeds, row["ratios"], strict=True)
        if r < args.lockin
    ]
    line = (
        f"little / fixed:workers over {len(every)} cell-seeds: min {min(every):.3f}, "
        f"median {statistics.median(every):.3f}, under {args.lockin:g} in {len(locked)}"
    )
    command = "python bench/lockin_scan.py " + " ".join(sys.argv[1:])
    lines = [
        "# Lock-in scan",
        "",
        f"`{command}`",
        "",
        f"{args.service_time * 1000:g} ms mean service, {args.load:g}x load; wall {wall:.0f} s.",
        "",
        f"    {line}",
        "",
        "| cell | " + " | ".join(f"seed {s}" for s in seeds) + " |",
        "| --- | " + " | ".join("---:" for _ in seeds) + " |",
    ]
    for row in rows:
        cells_text = " | ".join(
            f"**{r:.2f}**" if r < args.lockin else f"{r:.2f}" for r in row["ratios"]
        )
        lines.append(f"| {row['cell']} | {cells_text} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)
        payload = {"command": command, "summary": line, "seeds": seeds, "rows": rows}
        args.out.with_suffix(".json").write_text(json.dumps(payload, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
