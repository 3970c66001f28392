"""How much of ``little``'s gap to the oracle is start-up, cell by cell of a saved
robustness run.

    .venv/bin/python bench/startup_share.py bench/results/robustness_seeds8_stop47.json \
        --seeds 2 --services 10 --out bench/results/startup_share_stop47.md

For each cell of the run (its oracle ``fixed:N`` read from the JSON), both limits
are run again for ``--seeds`` seeds, and their successes are split into the first
``--services`` mean service times of the run and the rest. ``start-up`` is what
``little`` loses to the oracle in that first part, ``whole`` what it loses over the
run, both as shares of the oracle's successes over the whole run: where the two are
close, the cell's gap is start-up. Deterministic (virtual time, seeded).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from little_trace import Successes
from robustness import Cell, score


def _split(job: tuple[Cell, str, int, float]) -> tuple[int, int]:
    """(successes in the first ``window`` seconds, successes over the run)."""
    cell, limit, seed, window = job
    with Successes(window) as successes:
        score(cell, limit, seed)
    return successes.counts[0], sum(successes.counts.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a bench/robustness.py JSON (its oracle per cell)")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--services", type=float, default=10.0, help="start-up: mean services")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, help="markdown file")
    args = parser.parse_args()
    if args.seeds < 1 or args.services <= 0 or args.jobs < 1:
        parser.error("--seeds >= 1, --services > 0, --jobs >= 1")
    try:
        rows = json.loads(args.run.read_text())["rows"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        parser.error(f"run: not a bench/robustness.py JSON ({error})")
    cells = [(Cell(**row["cell"]), f"fixed:{row['oracle_n']}", row["label"]) for row in rows]
    started = time.monotonic()
    jobs = [
        (cell, limit, seed, args.services * cell.service_time)
        for cell, oracle, _ in cells
        for limit in ("little", oracle)
        for seed in range(1, args.seeds + 1)
    ]
    with ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(_split, jobs))
    lines = [
        "# Start-up's share of `little`'s gap to the oracle",
        "",
        f"`python bench/startup_share.py {' '.join(sys.argv[1:])}`",
        "",
        f"Start-up: the first {args.services:g} mean service times of each run; seeds 1-"
        f"{args.seeds}; wall {time.monotonic() - started:.0f} s. Losses as shares of the"
        " oracle's successes over the whole run.",
        "",
        "| cell | oracle | start-up loss | whole loss |",
        "| --- | --- | ---: | ---: |",
    ]
    startup_losses, whole_losses = [], []
    per_cell = 2 * args.seeds
    for index, (_, oracle, label) in enumerate(cells):
        chunk = results[index * per_cell : (index + 1) * per_cell]
        little_early = sum(early for early, _ in chunk[: args.seeds])
        little_all = sum(total for _, total in chunk[: args.seeds])
        oracle_early = sum(early for early, _ in chunk[args.seeds :])
        oracle_all = sum(total for _, total in chunk[args.seeds :])
        if oracle_all == 0:
            continue
        startup = (oracle_early - little_early) / oracle_all
        whole = (oracle_all - little_all) / oracle_all
        startup_losses.append(startup)
        whole_losses.append(whole)
        lines.append(f"| {label} | {oracle} | {startup:+.3f} | {whole:+.3f} |")
    lines += [
        "",
        f"Summed over {len(whole_losses)} cells: start-up {sum(startup_losses):+.3f}, whole"
        f" {sum(whole_losses):+.3f}; median start-up {statistics.median(startup_losses):+.3f},"
        f" whole {statistics.median(whole_losses):+.3f}.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
