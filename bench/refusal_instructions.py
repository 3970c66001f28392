"""What one refusal costs inside LoadShedMiddleware, in CPU instructions (valgrind): a figure
that does not move with the neighbours, unlike the microseconds of bench/rejection_cost.py.

    .venv/bin/python bench/refusal_instructions.py [--calls 20000] [--baseline-src DIR]

The middleware is called in-process (no server, no sockets) with E1's request, and refuses it:
- ``fixed``: a ``fixed:1`` limiter with its slot held and no queue (the mechanism alone);
- ``little``: the default limit as E1 leaves it when overloaded: its 2 slots held, 2 requests
  queued, the service time (0.5 s) and the clients' patience (2 s) learned, so each refusal
  goes through the deadline and queue-time checks first.
Each case runs twice under ``valgrind --tool=cachegrind`` (0 and ``--calls`` refusals); the
difference over the calls is the figure. ``--baseline-src`` runs the same from another source
tree too (e.g. ``git worktree add /tmp/old HEAD~3`` then ``--baseline-src /tmp/old/src``), side
by side in one run.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parent / "src"
CASES = ("fixed", "little")
_REFS = re.compile(r"==(\d+)== I\s+refs:\s+([\d,]+)")

# Runs in the measured process: build the case, then refuse ``calls`` requests.
_PROGRAM = """
import asyncio, sys
sys.path.insert(0, {bench!r})
from rejection_cost import SCOPE, StatusSink, receive, trivial_app
from loadshed.asgi import LoadShedMiddleware
from loadshed.limiter import Limiter

case, calls = sys.argv[1], int(sys.argv[2])

async def main() -> None:
    if case == "fixed":
        limiter = Limiter("fixed:1", max_queue=0, learn_patience=False)
        held = [limiter.try_acquire()]
    else:
        limiter = Limiter("little")
        for _ in range(3):
            limiter.admission.client_gave_up(2.0)
        for _ in range(10):
            limiter.admission.service.add(0.5)
        held = [limiter.try_acquire(), limiter.try_acquire()]
        queued = [limiter.enter(), limiter.enter()]
        assert limiter.queue_length == 2
    app = LoadShedMiddleware(trivial_app, limiter=limiter)
    sink = StatusSink()
    for _ in range(calls):
        await app(dict(SCOPE), receive, sink)
    assert calls == 0 or sink.status == 503, sink.status

asyncio.run(main())
"""


def instructions(source: Path, case: str, calls: int) -> int:
    """Instructions the process executed (its own, not children's) for ``calls`` refusals."""
    env = dict(os.environ, PYTHONPATH=str(source))
    program = _PROGRAM.format(bench=str(HERE))
    command = [
        "valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
        sys.executable, "-c", program, case, str(calls),
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{case} from {source} failed: {done.stderr[-800:]}")
    found = _REFS.search(done.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count from valgrind: {done.stderr[-500:]}")
    return int(found.group(2).replace(",", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--baseline-src", type=Path, default=None)
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("error: valgrind is not installed (Debian: apt-get install valgrind)")
    if args.calls < 1:
        sys.exit(f"error: --calls must be >= 1, got {args.calls}")
    trees = {"this tree": SOURCE}
    if args.baseline_src is not None:
        if not (args.baseline_src / "loadshed" / "asgi.py").is_file():
            sys.exit(f"error: --baseline-src {args.baseline_src} holds no loadshed package")
        trees = {"baseline": args.baseline_src, **trees}
    figures: dict[tuple[str, str], float] = {}
    for label, source in trees.items():
        for case in CASES:
            idle = instructions(source, case, 0)
            busy = instructions(source, case, args.calls)
            figures[label, case] = (busy - idle) / args.calls
            print(f"{label} {case}: {figures[label, case]:,.0f}", file=sys.stderr)
    command = "python bench/refusal_instructions.py " + " ".join(sys.argv[1:])
    print(f"`{command.strip()}`\n")
    print("| case | " + " | ".join(trees) + (" | this / baseline |" if len(trees) > 1 else " |"))
    print("| --- |" + " ---: |" * (len(trees) + (len(trees) > 1)))
    for case in CASES:
        cells = [f"{figures[label, case]:,.0f}" for label in trees]
        if len(trees) > 1:
            cells.append(f"{figures['this tree', case] / figures['baseline', case]:.2f}")
        print(f"| {case} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
