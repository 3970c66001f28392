"""Where in the run an algorithm loses to the oracle: the robustness matrix's cells,
each algorithm's successes against the oracle's (the best ``fixed:N`` of a saved
matrix run), split at ``--early`` seconds into the start of the run and the rest.

    .venv/bin/python bench/loss_split.py --oracle bench/results/robustness_seeds8.json
    .venv/bin/python bench/loss_split.py --oracle bench/results/robustness_seed7_seeds8.json \
        --sample-seed 7 --early 5 --algorithms little --out bench/results/loss_split_seed7.md

The matrix scores a cell over its whole run (15 to 120 s); a start-up that takes a
second or two to reach the workers costs a few points of that score in every cell,
while a wrong limit held for the rest of the run costs more in fewer cells. This splits
each cell's shortfall (successes under the oracle's, as a share of the oracle's total
successes; negative is a loss) into ``early`` (successes the clients got in the first
``--early`` seconds) and ``late`` (after), mean over ``--seeds`` seeds, from the same
seeded runs as ``bench/robustness.py`` (the same arguments print the same numbers).
The cells and the oracle's N come from ``--oracle`` (a ``bench/robustness.py`` JSON with
the same ``--cells``, ``--sample-seed`` and ``--seeds``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from little_trace import Successes
from robustness import ALGORITHMS, VARIANTS, Cell, draw_cells, score


def _successes(job: tuple[Cell, str, int, float]) -> tuple[int, int]:
    """(early, late) successes of one run: window 0 of ``early`` seconds, and the rest."""
    cell, limit, seed, early = job
    with Successes(early) as successes:
        score(cell, limit, seed)
    first = int(successes.counts[0])
    return first, int(sum(successes.counts.values())) - first


def split(
    cells: list[tuple[Cell, int]], algorithms: list[str], seeds: int, early: float
) -> list[dict[str, Any]]:
    """Per cell: each algorithm's early and late shortfall against ``fixed:oracle_n``."""
    rows = []
    with ProcessPoolExecutor() as pool:
        for cell, oracle_n in cells:
            runs = {
                limit: list(
                    pool.map(_successes, [(cell, limit, s, early) for s in range(1, seeds + 1)])
                )
                for limit in [f"fixed:{oracle_n}", *algorithms]
            }
            oracle = runs.pop(f"fixed:{oracle_n}")
            total = sum(e + late for e, late in oracle) or 1
            row: dict[str, Any] = {"label": cell.label, "oracle_n": oracle_n, "split": {}}
            for name, got in runs.items():
                early_gap = sum(g[0] - o[0] for g, o in zip(got, oracle, strict=True)) / total
                late_gap = sum(g[1] - o[1] for g, o in zip(got, oracle, strict=True)) / total
                row["split"][name] = {"early": round(early_gap, 4), "late": round(late_gap, 4)}
            rows.append(row)
            print(
                f"  {cell.label}: "
                + "  ".join(
                    f"{n} early {v['early']:+.3f} late {v['late']:+.3f}"
                    for n, v in row["split"].items()
                ),
                file=sys.stderr,
            )
    return rows


def markdown(rows: list[dict[str, Any]], algorithms: list[str], command: str, early: float) -> str:
    """The report: a summary per algorithm, then the table."""
    lines = ["# Where the loss is: start of the run against the rest", "", f"`{command}`", ""]
    for name in algorithms:
        earlies = [r["split"][name]["early"] for r in rows]
        lates = [r["split"][name]["late"] for r in rows]
        lines.append(
            f"- `{name}`: first {early:g} s median {statistics.median(earlies):+.3f} "
            f"(mean {statistics.mean(earlies):+.3f}), rest median "
            f"{statistics.median(lates):+.3f} (mean {statistics.mean(lates):+.3f}) of the "
            "oracle's successes"
        )
    lines += [
        "",
        "| cell | oracle N | "
        + " | ".join(f"{n}: first {early:g} s | {n}: rest" for n in algorithms)
        + " |",
        "| --- | ---: | " + " | ".join("---: | ---:" for _ in algorithms) + " |",
    ]
    for r in rows:
        values = " | ".join(
            f"{r['split'][n]['early']:+.3f} | {r['split'][n]['late']:+.3f}" for n in algorithms
        )
        lines.append(f"| {r['label']} | {r['oracle_n']} | {values} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--oracle", required=True, help="a bench/robustness.py JSON")
    parser.add_argument("--cells", type=int, default=24)
    parser.add_argument("--sample-seed", type=int, default=12)
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--early", type=float, default=5.0, help="seconds (default 5)")
    parser.add_argument("--algorithms", default="little", help="comma-separated")
    parser.add_argument("--out", help="markdown file (a .json beside it)")
    args = parser.parse_args()
    algorithms = [a for a in args.algorithms.split(",") if a]
    allowed = (*ALGORITHMS, *VARIANTS)
    unknown = [a for a in algorithms if a not in allowed]
    if unknown or not algorithms:
        parser.error(f"--algorithms: unknown {unknown}; allowed: {','.join(allowed)}")
    if not args.early > 0:
        parser.error(f"--early must be > 0 seconds, got {args.early:g}")
    if args.seeds < 1:
        parser.error(f"--seeds must be >= 1, got {args.seeds}")
    try:
        with open(args.oracle) as f:
            saved = json.load(f)
        by_cell = {Cell(**row["cell"]): row["oracle_n"] for row in saved["rows"]}
        saved_seeds = saved["seeds"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        parser.error(f"--oracle: cannot read {args.oracle}: {error}")
    if saved_seeds != args.seeds:
        parser.error(f"--oracle: {args.oracle} was run with --seeds {saved_seeds}")
    drawn = draw_cells(args.cells, args.sample_seed)
    missing = [c.label for c in drawn if c not in by_cell]
    if missing:
        parser.error(f"--oracle: no oracle for {len(missing)} cell(s), e.g. {missing[0]}")
    rows = split([(c, by_cell[c]) for c in drawn], algorithms, args.seeds, args.early)
    command = "python bench/loss_split.py " + " ".join(sys.argv[1:])
    report = markdown(rows, algorithms, command, args.early)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)
        with open(args.out.rsplit(".", 1)[0] + ".json", "w") as f:
            json.dump({"command": command, "early": args.early, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
