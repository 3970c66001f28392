"""Closed-loop sweep: a limit against ``fixed:N`` (N = the workers) on every cell of a
closed-loop grid, in virtual time.

Clients that retry at once after a 503 (hey, wrk, bombardier) against one replica with
an unbounded origin queue, as in the robustness matrix's closed-loop cells, but the
whole product of workers x load x timeout x deadline rather than a sample: a rule that
holds on a sampled draw may still fail on a cell next to it. Goodput as a share of
capacity; the ratio is the limit's goodput over ``fixed:N``'s, same seed.

    .venv/bin/python bench/closed_loop_sweep.py --service constant
    .venv/bin/python bench/closed_loop_sweep.py --service lognormal:0.02   # 2 % jitter
"""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
import sys
import time
from multiprocessing import Pool
from pathlib import Path

from loadshed.sim.scenarios import LimiterConfig, ServiceConfig, run_paradox

Job = tuple[int, float, float, bool, str, str, float, float, int]


def _floats(text: str, name: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise SystemExit(f"{name}: a comma-separated list of numbers, got {text!r}") from None
    if not values or min(values) <= 0:
        raise SystemExit(f"{name}: every value must be > 0, got {text!r}")
    return values


def _service(text: str) -> tuple[str, float]:
    shape, _, sigma = text.partition(":")
    if shape not in ("constant", "exponential", "lognormal"):
        raise SystemExit(f"--service: constant, exponential or lognormal:SIGMA, got {text!r}")
    return shape, float(sigma) if sigma else 0.5


def _run(job: Job) -> tuple[Job, float]:
    workers, load, timeout, deadlines, limit, shape, sigma, service, seed = job
    name, _, value = limit.partition(":")
    result = run_paradox(
        limiter=LimiterConfig(name, limit_value=int(value) if value else None),
        clients=(max(1, round(load * workers)),),
        workers=workers,
        service=ServiceConfig(service, shape, sigma),
        timeout=timeout * service,
        send_deadline=deadlines,
        duration=200 * service,
        origin_queue=None,
        seed=seed,
    )
    return job, float(result["steps"][0]["goodput_ratio"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", default="little", help="the limit to judge")
    parser.add_argument("--service", default="constant", help="constant|exponential|lognormal:S")
    parser.add_argument("--service-time", type=float, default=0.1, help="mean, seconds")
    parser.add_argument("--workers", default="1,2,4,8,16,32,64")
    parser.add_argument("--loads", default="1.2,2,4", help="clients = load x workers")
    parser.add_argument("--timeouts", default="2,3,5,10", help="in mean service times")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="markdown (a .json beside it)")
    args = parser.parse_args()
    shape, sigma = _service(args.service)
    workers = tuple(int(w) for w in _floats(args.workers, "--workers"))
    loads = _floats(args.loads, "--loads")
    timeouts = _floats(args.timeouts, "--timeouts")
    if args.service_time <= 0:
        raise SystemExit(f"--service-time: must be > 0, got {args.service_time}")
    jobs: list[Job] = []
    for w, load, timeout, deadlines in itertools.product(workers, loads, timeouts, (True, False)):
        for limit in (args.limit, f"fixed:{w}"):
            jobs.append(
                (w, load, timeout, deadlines, limit, shape, sigma, args.service_time, args.seed)
            )
    started = time.perf_counter()
    with Pool(max(1, args.jobs)) as pool:
        results = pool.map(_run, jobs)
    cells: dict[tuple[int, float, float, bool], dict[str, float]] = {}
    for job, goodput in results:
        key = (job[0], job[1], job[2], job[3])
        cells.setdefault(key, {})["fixed" if job[4].startswith("fixed:") else "limit"] = goodput
    rows = []
    for (w, load, timeout, deadlines), got in sorted(cells.items()):
        ratio = got["limit"] / got["fixed"] if got["fixed"] > 0 else float("nan")
        rows.append(
            {
                "workers": w,
                "load": load,
                "timeout": timeout,
                "deadlines": deadlines,
                "limit": got["limit"],
                "fixed": got["fixed"],
                "ratio": ratio,
            }
        )
    ratios = sorted(r["ratio"] for r in rows)
    below = [r for r in rows if r["ratio"] < 0.95]
    summary = (
        f"{args.limit} / fixed:workers over {len(rows)} cells: min {ratios[0]:.3f}, "
        f"median {ratios[len(ratios) // 2]:.3f}, below 0.95 in {len(below)}"
    )
    command = "python bench/closed_loop_sweep.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    lines = [
        "# Closed-loop sweep",
        "",
        f"`{command.strip()}`",
        "",
        f"{args.service} service, mean {args.service_time:g} s, seed {args.seed}, "
        f"200 mean service times per cell; wall {time.perf_counter() - started:.0f} s.",
        "",
        f"    {summary}",
        "",
        "Cells below 0.95:",
        "",
        f"| workers | load | timeout | deadline | {args.limit} | fixed:workers | ratio |",
        "| ---: | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for r in below:
        lines.append(
            f"| {r['workers']} | {r['load']:g}x | t{r['timeout']:g} | "
            f"{'yes' if r['deadlines'] else 'no'} | {r['limit']:.3f} | {r['fixed']:.3f} | "
            f"{r['ratio']:.3f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(
            json.dumps({"command": command, "summary": summary, "rows": rows}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
