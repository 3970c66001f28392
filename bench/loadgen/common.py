"""Shared helpers of the load generator comparisons: the loopback target, the reference tools
(installed or built on demand), their output parsers, and CPU accounting of a process tree.

Every tool is run on the same target with the same connections/rate and duration, and each
result is reduced to the same figures: throughput (responses/s) and p50/p99 latency (s).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
LOADSHED = [str(REPO / ".venv" / "bin" / "loadshed")]
BUILD_DIR = Path(tempfile.gettempdir()) / "loadshed-bench-tools"
VEGETA_VERSION = "v12.13.0"


@dataclass
class Measured:
    """One tool's figures on one scenario (latencies in seconds)."""

    tool: str
    throughput_rps: float
    p50_s: float
    p99_s: float
    p90_s: float | None = None
    max_s: float | None = None
    requests: int | None = None
    note: str = ""


# -- tools ------------------------------------------------------------------------------------


def ensure_apt(tool: str) -> str:
    """Path of ``tool`` (wrk, hey), installed with apt-get when missing."""
    found = shutil.which(tool)
    if found:
        return found
    print(f"installing {tool} with apt-get", file=sys.stderr)
    subprocess.run(["apt-get", "install", "-y", tool], check=True, stdout=subprocess.DEVNULL)
    found = shutil.which(tool)
    if not found:
        raise SystemExit(f"{tool}: not installed")
    return found


def ensure_vegeta() -> str | None:
    """Build vegeta in a scratch module (``go install`` is refused for it); None without Go."""
    found = shutil.which("vegeta")
    if found:
        return found
    binary = BUILD_DIR / "vegeta" / "vegeta"
    if binary.exists():
        return str(binary)
    go = shutil.which("go")
    if go is None:
        print("vegeta: skipped (Go is not installed)", file=sys.stderr)
        return None
    module = binary.parent
    module.mkdir(parents=True, exist_ok=True)
    print("building vegeta with go (once)", file=sys.stderr)
    if not (module / "go.mod").exists():
        subprocess.run([go, "mod", "init", "scratch"], cwd=module, check=True)
    subprocess.run([go, "get", f"github.com/tsenart/vegeta/v12@{VEGETA_VERSION}"], cwd=module,
                   check=True)  # fmt: skip
    subprocess.run([go, "build", "-o", str(binary), "github.com/tsenart/vegeta/v12"],
                   cwd=module, check=True)  # fmt: skip
    return str(binary)


def ensure_oha() -> str:
    """oha (open loop with latency correction): ``cargo install --locked oha`` (~8 min)."""
    found = shutil.which("oha") or shutil.which(str(Path.home() / ".cargo" / "bin" / "oha"))
    if found:
        return found
    cargo = shutil.which("cargo") or shutil.which(str(Path.home() / ".cargo" / "bin" / "cargo"))
    if cargo is None:
        raise SystemExit("oha: needs cargo (Rust) to build")
    print("building oha with cargo install --locked oha (several minutes)", file=sys.stderr)
    subprocess.run([cargo, "install", "--locked", "oha"], check=True)
    return str(Path.home() / ".cargo" / "bin" / "oha")


def _target_binary() -> list[str]:
    """The Go target if Go is present, else the Python (aiohttp) one."""
    go = shutil.which("go")
    if go is None:
        return [sys.executable, str(HERE / "target.py")]
    binary = BUILD_DIR / "target" / "target"
    source = HERE / "target.go"
    if not binary.exists() or binary.stat().st_mtime < source.stat().st_mtime:
        binary.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, binary.parent / "target.go")
        if not (binary.parent / "go.mod").exists():
            subprocess.run([go, "mod", "init", "target"], cwd=binary.parent, check=True,
                           stderr=subprocess.DEVNULL)  # fmt: skip
        subprocess.run([go, "build", "-o", str(binary), "target.go"], cwd=binary.parent,
                       check=True)  # fmt: skip
    return [str(binary)]


@contextmanager
def target(mode: str, port: int, *extra: str) -> Iterator[str]:
    """Run the target in ``mode`` on 127.0.0.1:``port``; yields its base URL."""
    command = [*_target_binary(), "-addr", f"127.0.0.1:{port}", "-mode", mode, *extra]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    try:
        for _ in range(100):
            try:
                served(url)
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise SystemExit(f"target did not start: {command}")
        yield url
    finally:
        process.terminate()
        process.wait(5)


def served(url: str) -> int:
    """Requests the target has served so far (its /count)."""
    with urllib.request.urlopen(url.rstrip("/") + "/count", timeout=2) as response:
        return int(response.read())


# -- running and parsing ----------------------------------------------------------------------

_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


def _wrk_duration(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text.strip())
    if match is None:
        raise ValueError(f"wrk duration {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def run_wrk(url: str, connections: int, duration_s: float, threads: int = 1) -> Measured:
    """wrk (closed loop, one connection per client)."""
    out = subprocess.run(
        [ensure_apt("wrk"), f"-t{threads}", f"-c{connections}", f"-d{duration_s:g}s",
         "--latency", url],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    percentiles = dict(re.findall(r"^\s+(50|90|99)%\s+(\S+)$", out, re.M))
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    max_text = re.search(r"Latency\s+\S+\s+\S+\s+(\S+)", out).group(1)  # type: ignore[union-attr]
    return Measured("wrk", rps, _wrk_duration(percentiles["50"]),
                    _wrk_duration(percentiles["99"]), _wrk_duration(percentiles["90"]),
                    _wrk_duration(max_text), requests)  # fmt: skip


def run_hey(url: str, connections: int, duration_s: float) -> Measured:
    """hey (closed loop, -c workers)."""
    out = subprocess.run(
        [ensure_apt("hey"), "-z", f"{duration_s:g}s", "-c", str(connections), url],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    percentiles = dict(re.findall(r"^\s+(50|90|99)% in ([\d.]+) secs", out, re.M))
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    slowest = float(re.search(r"Slowest:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    requests = sum(int(n) for n in re.findall(r"\[\d+\]\s+(\d+) responses", out))
    return Measured("hey", rps, float(percentiles["50"]), float(percentiles["99"]),
                    float(percentiles["90"]), slowest, requests)  # fmt: skip


def run_vegeta(url: str, rate: float, duration_s: float) -> Measured | None:
    """vegeta attack at a constant rate (open loop)."""
    vegeta = ensure_vegeta()
    if vegeta is None:
        return None
    attack = subprocess.run(
        [vegeta, "attack", f"-rate={rate:g}/s", f"-duration={duration_s:g}s", "-timeout=10s"],
        input=f"GET {url}\n".encode(), capture_output=True, check=True,
    ).stdout  # fmt: skip
    report = json.loads(
        subprocess.run(
            [vegeta, "report", "-type=json"], input=attack, capture_output=True, check=True
        ).stdout
    )
    lat = report["latencies"]
    # vegeta's throughput divides by duration + wait (the tail); responses / duration matches
    # the other tools' definition of a constant-rate run.
    rps = report["requests"] * report["success"] / (report["duration"] / 1e9)
    return Measured("vegeta", rps, lat["50th"] / 1e9, lat["99th"] / 1e9, lat["90th"] / 1e9,
                    lat["max"] / 1e9, report["requests"])  # fmt: skip


def run_oha(url: str, rate: float, duration_s: float) -> Measured:
    """oha at a constant rate with latency correction (open loop, exact percentiles)."""
    out = subprocess.run(
        [ensure_oha(), "-z", f"{duration_s:g}s", "-q", f"{rate:g}", "--latency-correction",
         "--no-tui", "--output-format", "json", url],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    data = json.loads(out)
    pct = data["latencyPercentiles"]
    return Measured("oha", data["summary"]["requestsPerSec"], pct["p50"], pct["p99"], pct["p90"],
                    data["summary"]["slowest"])  # fmt: skip


def run_loadshed(url: str, args: Sequence[str], label: str = "loadshed") -> Measured:
    """``loadshed bench`` with ``args``; figures from its --json."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run.json"
        proc = subprocess.run([*LOADSHED, "bench", url, *args, "-q", "--json", str(path)],
                              capture_output=True, text=True)  # fmt: skip
        if proc.returncode != 0:
            return Measured(label, 0.0, 0.0, 0.0, note=proc.stderr.strip()[:120])
        data = json.loads(path.read_text())
    lat = data["latency_s"]["all"]
    return Measured(label, data["throughput_rps"], lat["p50"], lat["p99"], lat["p90"], lat["max"],
                    data["requests"])  # fmt: skip


# -- CPU of a process tree --------------------------------------------------------------------


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its live descendants."""
    total = 0.0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            continue
    return total


def table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    """A GitHub-markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def ms(seconds: float | None) -> str:
    """Seconds as milliseconds with 2 decimals."""
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def environment() -> str:
    """One line describing the machine."""
    load = os.getloadavg()[0]
    return f"{os.cpu_count()} CPUs, load average {load:.2f}, Python {sys.version.split()[0]}"
