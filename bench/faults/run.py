"""The fault suite: one table ``probe | expected | observed | verdict``, exit 1 on any
``breaks``.

    .venv/bin/python bench/faults/run.py                    # fast probes + soak (3 min) + slowloris
    .venv/bin/python bench/faults/run.py --minutes 10       # the full soak
    .venv/bin/python bench/faults/run.py --minutes 0.5 --slowloris-seconds 15   # a short run
    .venv/bin/python bench/faults/run.py --fast             # the fast probes only (as make test)
    .venv/bin/python bench/faults/run.py --only smuggling,bad_input

Probes are in probes.py (the fast ones also run as tests/test_faults.py), the soak in
soak.py and the slowloris at the descriptor limit in slowloris.py. ``--markdown FILE``
also writes the table with the command that made it.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import probes
import slowloris
import soak


def main(argv: list[str] | None = None) -> int:
    """Run the probes asked for, print the table; 1 if any row breaks."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0, help="soak length (default 3)")
    parser.add_argument("--slowloris-seconds", type=float, default=30.0)
    parser.add_argument("--fast", action="store_true", help="fast probes only")
    parser.add_argument("--only", default="", help="comma-separated probe names")
    parser.add_argument("--markdown", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    if not 0 < args.minutes <= 60 or not 0 < args.slowloris_seconds <= 600:
        parser.error("--minutes must be in (0, 60], --slowloris-seconds in (0, 600]")
    names = list(probes.FAST) + ([] if args.fast else ["soak", "slowloris"])
    if args.only:
        wanted = [name.strip() for name in args.only.split(",") if name.strip()]
        unknown = sorted(set(wanted) - set(probes.FAST) - {"soak", "slowloris"})
        if unknown:
            parser.error(f"--only: unknown probe(s) {', '.join(unknown)}")
        names = wanted
    rows: list[probes.Row] = []
    started = time.monotonic()
    for name in names:
        print(f"... {name}", file=sys.stderr, flush=True)
        if name == "soak":
            rows.extend(soak.run(args.minutes))
        elif name == "slowloris":
            rows.extend(slowloris.run(args.slowloris_seconds))
        else:
            rows.extend(probes.FAST[name]())
    table = probes.render(rows)
    broken = sum(not row.holds for row in rows)
    summary = (
        f"{len(rows)} rows, {len(rows) - broken} hold, {broken} break "
        f"({time.monotonic() - started:.0f} s)"
    )
    print(table)
    print(summary)
    if args.markdown is not None:
        command = shlex.join([".venv/bin/python", "bench/faults/run.py", *(argv or sys.argv[1:])])
        args.markdown.write_text(f"`{command}`\n\n{table}\n\n{summary}\n")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
