"""A limit algorithm from this tree against the same from another source tree, cell by
cell, on many seeds: the A/B test for a change to ``little`` (or any algorithm).

    git worktree add /tmp/base HEAD      # the code before the change
    .venv/bin/python bench/little_ab.py --base /tmp/base/src
    .venv/bin/python bench/little_ab.py --base /tmp/base/src --seeds 32 --sample-seeds 12,7,99

The robustness matrix (``bench/robustness.py``) scores each cell over 8 seeds by default;
one cell's score then moves by 0.01 to 0.02 between seeds' draws, so a change that
moves a cell by less cannot be told from noise there. This runs the same cells (the
union of the draws of ``--cells`` cells from each ``--sample-seeds``) with both trees on
seeds 1 .. ``--seeds`` (32 by default: about 4 minutes per tree for two draws on 2
cores) and prints, per cell, the mean goodput (share of what could be served) of each
and the change relative to the base, then the mean, median, minimum and maximum of the
changes. Only the cells that moved by ``--show`` or more are listed. No oracle: both
sides run the same seeded traffic, so the difference is the change's own.

The base side runs in a child process with ``PYTHONPATH`` set to ``--base`` (one
process cannot import two versions of the package).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor

from robustness import ALGORITHMS, VARIANTS, Cell, draw_cells, score


def _cells(count: int, sample_seeds: list[int]) -> list[Cell]:
    cells: list[Cell] = []
    for sample_seed in sample_seeds:
        for cell in draw_cells(count, sample_seed):
            if cell not in cells:
                cells.append(cell)
    return cells


def _score(job: tuple[Cell, str, int]) -> tuple[str, float]:
    cell, algorithm, seed = job
    return cell.label, score(cell, algorithm, seed)


def goodputs(cells: list[Cell], algorithm: str, seeds: int) -> dict[str, float]:
    """Mean goodput per cell label over seeds 1 .. ``seeds``, with this process's code."""
    jobs = [(cell, algorithm, seed) for cell in cells for seed in range(1, seeds + 1)]
    # The biggest runs first, so that the pool does not end on one long run.
    jobs.sort(key=lambda j: -j[0].requests)
    totals: dict[str, float] = {}
    with ProcessPoolExecutor() as pool:
        for label, value in pool.map(_score, jobs, chunksize=4):
            totals[label] = totals.get(label, 0.0) + value
    return {label: total / seeds for label, total in totals.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", help="the other tree's src directory (holds loadshed/)")
    parser.add_argument("--algorithm", default="little")
    parser.add_argument("--seeds", type=int, default=32)
    parser.add_argument("--cells", type=int, default=24)
    parser.add_argument("--sample-seeds", default="12,7", help="draws, comma-separated")
    parser.add_argument("--show", type=float, default=0.005, help="list cells moved this much")
    parser.add_argument("--out", help="write the report here too (a .json beside it)")
    parser.add_argument("--worker-json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    allowed = (*ALGORITHMS, *VARIANTS)
    if args.algorithm not in allowed and not args.algorithm.startswith("fixed:"):
        parser.error(
            f"--algorithm: unknown {args.algorithm!r}; allowed: {'|'.join(allowed)}|fixed:N"
        )
    if args.seeds < 1 or args.cells < 1:
        parser.error("--seeds and --cells must be >= 1")
    try:
        sample_seeds = [int(s) for s in args.sample_seeds.split(",") if s]
    except ValueError:
        parser.error("--sample-seeds takes comma-separated integers")
    if not sample_seeds:
        parser.error("--sample-seeds needs at least one draw")
    cells = _cells(args.cells, sample_seeds)
    if args.worker_json:
        json.dump(goodputs(cells, args.algorithm, args.seeds), sys.stdout)
        return 0
    if not args.base:
        parser.error("--base is required (the other tree's src directory)")
    if not os.path.isfile(os.path.join(args.base, "loadshed", "__init__.py")):
        parser.error(f"--base: {args.base} holds no loadshed/ package")
    child = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--worker-json"]
    env = dict(os.environ, PYTHONPATH=os.path.abspath(args.base))
    done = subprocess.run(child, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"little_ab: the base run failed:\n{done.stderr}")
    base: dict[str, float] = json.loads(done.stdout)
    this = goodputs(cells, args.algorithm, args.seeds)
    command = "python bench/little_ab.py " + " ".join(sys.argv[1:])
    lines = [f"`{command}`", "", f"{args.algorithm}, mean goodput over seeds 1-{args.seeds}:"]
    changes = {}
    for cell in cells:
        label = cell.label
        before, after = base[label], this[label]
        change = (after - before) / before if before > 0 else 0.0
        changes[label] = change
        if abs(change) >= args.show:
            lines.append(f"  {label:<60} {before:.4f} -> {after:.4f} ({change:+.3f})")
    values = list(changes.values())
    lines.append(
        f"{len(values)} cells: change mean {statistics.mean(values):+.4f}, median "
        f"{statistics.median(values):+.4f}, min {min(values):+.4f}, max {max(values):+.4f}"
    )
    report = "\n".join(lines)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report + "\n")
        with open(args.out.rsplit(".", 1)[0] + ".json", "w") as f:
            json.dump({"command": command, "base": base, "this": this}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
