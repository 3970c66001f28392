"""What LoadShedMiddleware costs per request, in CPU instructions: a figure that does not
move with the neighbours on a shared machine, where throughput and CPU time do.

    .venv/bin/python bench/middleware_instructions.py [--seconds 12]
        [--variants bare,fixed,little,fixed+compiled,little+compiled]

Needs valgrind (Debian: ``apt-get install valgrind``). Each variant of
``bench/middleware_targets.py`` (a trivial Starlette endpoint, bare or behind the
middleware) runs under uvicorn inside ``valgrind --tool=cachegrind``, which counts the
instructions the server process executes in user space (the kernel's share, socket I/O,
is the same for every variant and not counted). The server runs twice: started and
stopped without requests, then driven by ``loadshed bench`` (closed loop, 8 connections)
for ``--seconds``; the difference over the requests answered is the figure per request.
Variants ending in ``+compiled`` serve the same app from the mypyc build of the hot
path (``make compiled``; see ``bench/compiled_build.py``).
Valgrind slows the server some 50-fold, so the generator always has requests waiting,
as in a saturated server. Reported: instructions per request and the difference to bare.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from compiled_build import DEFAULT_DIR, SUFFIX, app_name, check, environment
from servers import free_port, uvicorn_command, wait_for_port

HERE = Path(__file__).resolve().parent
PYTHON = sys.executable
_REFS = re.compile(r"I\s+refs:\s+([\d,]+)")


def instructions(variant: str, seconds: float, compiled_dir: Path) -> tuple[int, int]:
    """(instructions the server executed, requests answered) for one run."""
    port = free_port()
    command = [
        "valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
        *uvicorn_command(app_name(variant), port),
    ]  # fmt: skip
    env = environment(variant, compiled_dir)
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_for_port(port, 120, f"{variant} server under valgrind")
        requests = 0
        if seconds > 0:
            with tempfile.NamedTemporaryFile(suffix=".json") as out:
                bench = [
                    PYTHON, "-m", "loadshed.cli", "bench", f"http://127.0.0.1:{port}/",
                    "--clients", "8", "--duration", f"{seconds}s", "--warmup", "0s",
                    "--quiet", "--json", out.name,
                ]  # fmt: skip
                subprocess.run(bench, check=True, stdout=subprocess.DEVNULL)
                requests = int(json.loads(Path(out.name).read_text())["requests"])
        server.send_signal(signal.SIGINT)
        _, stderr = server.communicate(timeout=120)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    match = _REFS.search(stderr)
    if match is None:
        raise RuntimeError(f"no instruction count from valgrind for {variant}: {stderr[-500:]}")
    return int(match.group(1).replace(",", "")), requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=12.0, help="load per variant")
    parser.add_argument("--variants", default="bare,fixed,little,fixed+compiled,little+compiled")
    parser.add_argument("--compiled-dir", type=Path, default=DEFAULT_DIR)
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("error: valgrind is not installed (Debian: apt-get install valgrind)")
    variants = args.variants.split(",")
    if any(variant.endswith(SUFFIX) for variant in variants):
        check(args.compiled_dir)
    per_request: dict[str, float] = {}
    for variant in variants:
        idle, _ = instructions(variant, 0, args.compiled_dir)
        total, requests = instructions(variant, args.seconds, args.compiled_dir)
        per_request[variant] = (total - idle) / max(1, requests)
        print(f"{variant}: {requests} requests", file=sys.stderr)
    bare = per_request.get("bare")
    print("| variant | instructions per request | over bare | bare / variant |")
    print("| --- | ---: | ---: | ---: |")
    for variant, count in per_request.items():
        over = "" if bare is None else f"{count - bare:+,.0f}"
        ratio = "" if bare is None else f"{bare / count:.3f}"
        print(f"| {variant} | {count:,.0f} | {over} | {ratio} |")


if __name__ == "__main__":
    main()
