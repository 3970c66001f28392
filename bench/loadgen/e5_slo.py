"""E5 (SLO benchmark), scaled down: a target with a known capacity (9 workers x 20 ms =
450 req/s, queueing beyond), then the three things the write-up did by hand:

1. ``loadshed sweep --rates 100:500:100``: throughput/goodput/p50/p99 against rate, as JSON,
   TSV, PNG and HTML;
2. ``loadshed capacity --slo "p99<200ms,errors<0.1%"``: the knee, found automatically;
3. ``loadshed bench -r 400 --slo "p99<200ms,errors<0.1%,goodput>=390"``: the requirement's
   PASS/FAIL verdict and exit code.

    .venv/bin/python bench/loadgen/e5_slo.py [--out /tmp/loadshed-e5] [--step 5]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import LOADSHED, environment, target

PORT = 18093
SLO = "p99<200ms,errors<0.1%"


def run(args: list[str]) -> int:
    """Run a loadshed command, echoing it and its output; return its exit code."""
    print(f"$ loadshed {' '.join(args)}", flush=True)
    proc = subprocess.run([*LOADSHED, *args, "-q"], capture_output=True, text=True)
    print(proc.stdout.rstrip())
    if proc.stderr.strip():
        print(proc.stderr.rstrip())
    print(f"(exit {proc.returncode})\n", flush=True)
    return proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "loadshed-e5")
    parser.add_argument("--step", type=float, default=5.0, help="seconds per step")
    args = parser.parse_args()
    print(f"<!-- {environment()} -->")
    step = f"{args.step:g}s"
    workers = ("-workers", "9", "-sleep", "20ms")
    # A fresh target for each command, so no queue left by one overloaded step lingers.
    with target("workers", PORT, *workers) as url:
        run(["sweep", url, "--rates", "100:500:100", "-d", step, "-w", "1s",
             "-o", str(args.out), "--stop-when", "errors>50%"])  # fmt: skip
    with target("workers", PORT, *workers) as url:
        run(["capacity", url, "--slo", SLO, "--start-rate", "100", "--precision", "0.05",
             "-d", step, "-w", "1s", "--json", str(args.out / "capacity.json")])  # fmt: skip
    with target("workers", PORT, *workers) as url:
        run(["bench", url, "-r", "400", "-d", step, "-w", "1s",
             "--slo", f"{SLO},goodput>=390"])  # fmt: skip


if __name__ == "__main__":
    main()
