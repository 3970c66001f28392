"""Issue 13, measure first: the README's example under clients that retry at once after a 503.

    .venv/bin/python bench/retry_storm.py [--clients 1,4,16,64,256] [--duration 15s]
        [--warmup 3s] [--rates 1,2,5] [--drivers hey,loadshed] [--src [LABEL=]PATH ...]
        [--model-ms 25 | --trees N] [--capacity RPS] [--out FILE.md] [--json FILE]

The app (``bench/retry_storm_app.py``) is the README's example as a new user writes it: a
FastAPI app, a scikit-learn random forest through ``ModelRunner(predict, workers=1)``, and
``app.add_middleware(LoadShedMiddleware, metrics_path="/metrics")`` at its defaults
(*protected*) or no middleware (*unprotected*); no deadline header is sent. The forest is
trained here once, its size chosen so that one call takes about ``--model-ms`` in this
process (printed; each step also reports the mean time measured inside the worker). The
calibration moves with the machine's load: to compare runs, pass the same ``--trees``.

Every step starts a fresh uvicorn server (its own session, 127.0.0.1, a free port), drives
it, and stops it; protected and unprotected alternate at each step, so both see the same
machine. Drivers:

- ``hey`` (closed loop, ``-c N -t 2``, retries at once as hey does): a ``-z WARMUP`` run
  first, discarded, then the measured ``-z DURATION`` run. Rates divide hey's counts by its
  own ``Total`` (which includes waiting for the requests in flight at the end). hey's
  latency percentiles cover every response, 200s and 503s together.
- ``loadshed`` (loadshed's load generator, run in this process through ``run_bench``:
  the engine behind ``loadshed bench URL -m POST --body-file body.json -H 'Content-Type:
  application/json' --clients N --timeout 2s --duration D --warmup W``; clients retry at
  once after a 503 by default), which splits 200 and 503 latencies.
- Open loop (``--rates``, multiples of the capacity): ``loadshed bench --rate R --arrival
  poisson``, 2 s client timeout. The capacity is ``--capacity``, else the unprotected app's
  200s per second at one client (loadshed's driver if it ran, else hey's), else a one-client
  run made for it.

Where the time goes, per step, over the measured window (a thread here samples every 50
ms): *worker busy* is the share of wall time the model worker spent inside ``predict``
(measured in the worker, ``bench/retry_storm_model.py``), with the mean time per call and
the worker's CPU share of it (below 100 %: the worker waited for a CPU while predicting);
*gap* is the time from the end of one job to the start of the next inside the worker
(dispatch gap, plus any time without work: at one client, the whole round trip); *server
CPU* is the uvicorn process alone (psutil; not its worker), in cores; *CPU per 200* is the
server's CPU per success in the variant's lowest client count without refusals (marked
``ref``), and *CPU per 503* what is left of the step's server CPU after that, per refusal;
*driver CPU* is the load generator's. On 2 cores, worker + event loop + driver compete.

``--src PATH`` (repeatable; ``LABEL=PATH``) runs the same steps with ``PYTHONPATH=PATH``
(another checkout's ``src``) beside this tree's code, labelled by LABEL (default: the
checkout's directory name), so old and new code are measured in one run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import mmap
import os
import re
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import psutil

from loadshed.errors import ConfigError
from loadshed.loadgen.options import BenchOptions
from loadshed.loadgen.runner import GeneratorSaturated, run_bench
from loadshed.units import parse_duration, parse_int_list
from retry_storm_model import (
    GAP_BUCKETS,
    STATS_BYTES,
    bucket_upper_s,
    create_stats_file,
    read_stats,
)
from servers import free_port

HERE = Path(__file__).resolve().parent
THIS_SRC = HERE.parent / "src"
HEY = "/usr/bin/hey"
SAMPLE_INTERVAL_S = 0.05
STARTUP_TIMEOUT_S = 120.0
VARIANTS = ("protected", "unprotected")


# ----------------------------------------------------------------------------- model


def calibrate(target_ms: float, trees: int | None, out_dir: Path) -> dict[str, Any]:
    """Train the digits forest, sized for ``target_ms`` per call unless ``trees`` is given;
    save it (joblib) and a request body; return what was measured."""
    import joblib
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.ensemble import RandomForestClassifier

    features, labels = load_digits(return_X_y=True)
    row = np.asarray([features[0]], dtype=np.float64)

    def build(n: int) -> tuple[Any, float]:
        model = RandomForestClassifier(n_estimators=n, random_state=0, n_jobs=1)
        model.fit(features, labels)
        for _ in range(3):
            model.predict(row)
        times = []
        for _ in range(30):
            start = time.perf_counter()
            model.predict(row)
            times.append(time.perf_counter() - start)
        return model, statistics.median(times)

    fit: dict[str, float] = {}
    if trees is None:
        _, small = build(50)
        _, large = build(150)
        per_tree = max(1e-6, (large - small) / 100)
        fixed = small - 50 * per_tree
        trees = max(1, round((target_ms / 1e3 - fixed) / per_tree))
        fit = {"per_tree_ms": per_tree * 1e3, "fixed_ms": fixed * 1e3}
    model, per_call = build(trees)
    model_path = out_dir / "model.joblib"
    joblib.dump(model, model_path)
    body_path = out_dir / "body.json"
    body_path.write_text(json.dumps([float(v) for v in features[0]]))
    return {
        "trees": trees,
        "per_call_ms": per_call * 1e3,
        "target_ms": target_ms,
        **fit,
        "model_path": str(model_path),
        "body_path": str(body_path),
    }


# ----------------------------------------------------------------------------- servers


@dataclass(frozen=True)
class Tree:
    """Which loadshed the server imports: this checkout's (src None) or another's."""

    label: str
    src: Path | None

    @property
    def package(self) -> Path:
        return ((self.src or THIS_SRC) / "loadshed").resolve()


class Server:
    """``uvicorn retry_storm_app:app`` in its own session, with its stats file mapped."""

    def __init__(self, tree: Tree, protected: bool, model_path: str, work_dir: Path) -> None:
        self.tree = tree
        self.protected = protected
        handle, stats_path = tempfile.mkstemp(prefix="stats-", suffix=".bin", dir=work_dir)
        os.close(handle)
        create_stats_file(stats_path)
        self.stats_path = stats_path
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        env = dict(os.environ)
        env.update(
            RETRY_STORM_MODEL=model_path,
            RETRY_STORM_STATS=stats_path,
            RETRY_STORM_PROTECT="1" if protected else "0",
        )
        if tree.src is not None:
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(tree.src), os.environ.get("PYTHONPATH", "")) if p
            )
        command = [
            sys.executable, "-m", "uvicorn", "retry_storm_app:app", "--app-dir", str(HERE),
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
            "--no-access-log",
        ]  # fmt: skip
        self._stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            command,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
            start_new_session=True,
        )
        self._stopped = False
        self._file = open(stats_path, "rb")  # noqa: SIM115 - closed in stop()
        self.stats = mmap.mmap(self._file.fileno(), STATS_BYTES, access=mmap.ACCESS_READ)
        try:
            self.health = self._wait_ready()
        except BaseException:
            self.stop()
            raise
        if Path(self.health["loadshed"]).resolve() != tree.package:
            self.stop()
            raise RuntimeError(
                f"{tree.label}: the server imported loadshed from {self.health['loadshed']}, "
                f"expected {tree.package}"
            )

    def _wait_ready(self) -> dict[str, Any]:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2.0) as response:
                    health: dict[str, Any] = json.loads(response.read())
                    return health
            except OSError as error:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"server ({self.tree.label}, protected={self.protected}) did not "
                        f"start: {self.stderr_text() or error}"
                    ) from None
                time.sleep(0.1)

    def stderr_text(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace").strip()[-2000:]

    def metrics(self) -> dict[str, Any]:
        """The limiter's state from ``/metrics`` (protected only; {} if unreadable)."""
        if not self.protected:
            return {}
        try:
            with urllib.request.urlopen(f"{self.url}/metrics", timeout=5.0) as response:
                text = response.read().decode()
        except OSError:
            return {}
        figures: dict[str, Any] = {"rejected_by_reason": {}}
        line_re = re.compile(r"^(\w+)(?:\{([^}]*)\})? (\S+)$")
        for line in text.splitlines():
            match = line_re.match(line)
            if match is None:
                continue
            name, labels, value = match.group(1), match.group(2) or "", float(match.group(3))
            if name in (
                "loadshed_limit",
                "loadshed_patience_seconds",
                "loadshed_queue_wait_bound_seconds",
                "loadshed_service_time_estimate_seconds",
            ):
                figures[name.removeprefix("loadshed_")] = None if math.isnan(value) else value
            elif name == "loadshed_requests_total" and 'outcome="rejected"' in labels and value:
                reason = re.search(r'reason="([^"]*)"', labels)
                figures["rejected_by_reason"][reason.group(1) if reason else "?"] = int(value)
        return figures

    def stop(self) -> None:
        """SIGTERM, then SIGKILL to the whole session (the runner's workers) after 5 s."""
        if self._stopped:
            return
        self._stopped = True
        if self.process.poll() is None:
            self.process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5.0)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5.0)
        self.stats.close()
        self._file.close()
        self._stderr.close()
        with contextlib.suppress(OSError):
            os.unlink(self.stats_path)


class Sampler(threading.Thread):
    """Every 50 ms: (monotonic time, the server process's CPU seconds, the worker's stats)."""

    def __init__(self, server: Server) -> None:
        super().__init__(name="retry-storm-sampler", daemon=True)
        self.server = server
        self.process = psutil.Process(server.process.pid)
        self.samples: list[tuple[float, float, float, dict[str, Any]]] = []
        self._stop_event = threading.Event()

    def sample(self) -> None:
        try:
            cpu = self.process.cpu_times()
        except psutil.Error:
            return
        machine = psutil.cpu_times()
        machine_busy = sum(machine) - machine.idle - getattr(machine, "iowait", 0.0)
        self.samples.append(
            (
                time.monotonic(),
                cpu.user + cpu.system,
                machine_busy,
                read_stats(self.server.stats),
            )
        )

    def run(self) -> None:
        self.sample()
        while not self._stop_event.wait(SAMPLE_INTERVAL_S):
            self.sample()

    def stop(self) -> None:
        self._stop_event.set()
        self.join()
        self.sample()

    def window(self, start: float, end: float) -> dict[str, Any]:
        """Where the time went between the first and last samples inside [start, end]."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2:
            return {}
        (t0, cpu0, machine0, a), (t1, cpu1, machine1, b) = inside[0], inside[-1]
        wall = t1 - t0
        jobs = b["jobs"] - a["jobs"]
        busy = b["busy_s"] - a["busy_s"]
        gaps = b["gaps"] - a["gaps"]
        hist = [y - x for x, y in zip(a["gap_hist"], b["gap_hist"], strict=True)]
        return {
            "wall_s": wall,
            "server_cpu_cores": (cpu1 - cpu0) / wall,
            "machine_cpu_cores": (machine1 - machine0) / wall,
            "worker_busy": busy / wall,
            "worker_cpu_cores": (b["busy_cpu_s"] - a["busy_cpu_s"]) / wall,
            "jobs_rps": jobs / wall,
            "predict_ms": busy / jobs * 1e3 if jobs else None,
            "predict_cpu_share": (b["busy_cpu_s"] - a["busy_cpu_s"]) / busy if busy else None,
            "gap_mean_ms": (b["gap_s"] - a["gap_s"]) / gaps * 1e3 if gaps else None,
            "gap_p50_ms": hist_quantile(hist, 0.5),
            "gap_p99_ms": hist_quantile(hist, 0.99),
        }


def hist_quantile(hist: Sequence[float], q: float) -> float | None:
    """The upper edge (ms) of the gap bucket holding the q-quantile."""
    total = sum(hist)
    if total <= 0:
        return None
    seen = 0.0
    for bucket in range(GAP_BUCKETS):
        seen += hist[bucket]
        if seen >= q * total:
            return bucket_upper_s(bucket) * 1e3
    return bucket_upper_s(GAP_BUCKETS - 1) * 1e3


# ----------------------------------------------------------------------------- drivers


def go_duration(seconds: float) -> str:
    return f"{seconds:g}s"


def hey_command(url: str, body_path: str, clients: int, seconds: float, timeout: int) -> list[str]:
    return [
        HEY, "-c", str(clients), "-z", go_duration(seconds), "-t", str(timeout),
        "-m", "POST", "-T", "application/json", "-D", body_path, url,
    ]  # fmt: skip


def parse_hey(text: str) -> dict[str, Any]:
    """hey's summary: total seconds, status codes, errors, latency percentiles, histogram."""
    parsed: dict[str, Any] = {"status": {}, "errors": {}, "percentiles_s": {}, "histogram": []}
    total = re.search(r"Total:\s+([\d.]+) secs", text)
    parsed["total_s"] = float(total.group(1)) if total else None
    for key in ("Slowest", "Fastest", "Average"):
        found = re.search(rf"{key}:\s+([\d.]+) secs", text)
        parsed[key.lower() + "_s"] = float(found.group(1)) if found else None
    section = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.endswith(":") and not stripped.startswith("["):
            section = stripped[:-1]
            continue
        if section == "Status code distribution":
            found = re.match(r"\[(\d+)\]\s+(\d+) responses", stripped)
            if found:
                parsed["status"][int(found.group(1))] = int(found.group(2))
        elif section == "Error distribution":
            found = re.match(r"\[(\d+)\]\s+(.*)", stripped)
            if found:
                parsed["errors"][found.group(2)] = int(found.group(1))
        elif section == "Latency distribution":
            found = re.match(r"([\d.]+)% in ([\d.]+) secs", stripped)
            if found and float(found.group(2)) > 0:  # hey prints 0 for a missing rank
                parsed["percentiles_s"][found.group(1)] = float(found.group(2))
        elif section == "Response time histogram":
            found = re.match(r"([\d.]+) \[(\d+)\]", stripped)
            if found:
                parsed["histogram"].append([float(found.group(1)), int(found.group(2))])
    return parsed


def is_timeout(message: str) -> bool:
    return "Timeout" in message or "deadline exceeded" in message


def drive_hey(
    url: str, body_path: str, clients: int, duration: float, warmup: float, timeout: int
) -> dict[str, Any]:
    """A discarded warm-up run, then the measured one; the window is the measured process's
    lifetime."""
    if warmup > 0:
        subprocess.run(
            hey_command(url, body_path, clients, warmup, timeout),
            capture_output=True,
            check=False,
        )
    command = hey_command(url, body_path, clients, duration, timeout)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    t1 = time.monotonic()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"hey failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    driver_cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    hey = parse_hey(done.stdout)
    window = hey["total_s"] or (t1 - t0)
    status: dict[int, int] = hey["status"]
    ok = sum(n for code, n in status.items() if 200 <= code < 300)
    rejected = sum(n for code, n in status.items() if code in (429, 503))
    timeouts = sum(n for message, n in hey["errors"].items() if is_timeout(message))
    percentiles = hey["percentiles_s"]
    return {
        "command": shlex.join(command),
        "ok": ok,
        "rejected": rejected,
        "other_status": sum(status.values()) - ok - rejected,
        "timeouts": timeouts,
        "other_errors": sum(hey["errors"].values()) - timeouts,
        "window_s": window,
        "ok_rps": ok / window,
        "rejected_rps": rejected / window,
        "latency_ms": {
            "all": {
                "p50": _ms(percentiles.get("50")),
                "p99": _ms(percentiles.get("99")),
            }
        },
        "driver_cpu_cores": driver_cpu / (t1 - t0),
        "t0": t0,
        "t1": t1,
        "hey": hey,
    }


def loadshed_command(
    url: str, body_path: str, load: str, duration: float, warmup: float, timeout: float
) -> str:
    return (
        f"loadshed bench {url} -m POST -H 'Content-Type: application/json' --body-file "
        f"{body_path} {load} --timeout {timeout:g}s --duration {duration:g}s "
        f"--warmup {warmup:g}s"
    )


def drive_loadshed(
    url: str,
    body_path: str,
    *,
    clients: int | None = None,
    rate: float | None = None,
    duration: float,
    warmup: float,
    timeout: float,
    seed: int = 1,
) -> dict[str, Any]:
    """``run_bench`` in this process; the window is its own (start time from its progress)."""
    options = BenchOptions(
        url=url,
        clients=clients,
        rate=rate,
        arrival="poisson" if rate is not None else "constant",
        duration_s=duration,
        warmup_s=warmup,
        timeout_s=timeout,
        method="POST",
        headers=(("Content-Type", "application/json"),),
        body=Path(body_path).read_bytes(),
        seed=seed if rate is not None else None,
    )
    load = f"--clients {clients}" if clients is not None else f"--rate {rate:g} --arrival poisson"
    started: list[float] = []

    def progress(live: Any) -> None:
        if not started and live.elapsed_s < live.total_s:
            started.append(time.monotonic() - live.elapsed_s)

    saturated = None
    try:
        result = run_bench(options, on_progress=progress)
    except GeneratorSaturated as error:
        result, saturated = error.result, str(error)
    t0 = (started[0] if started else time.monotonic() - duration - warmup) + warmup
    data = result.to_json()
    data.pop("histograms", None)
    latency = data["latency_s"]
    return {
        "command": loadshed_command(url, body_path, load, duration, warmup, timeout),
        "ok": result.successes,
        "rejected": result.rejections,
        "other_status": result.responses - result.successes - result.rejections,
        "timeouts": result.errors.get("timeout", 0),
        "other_errors": sum(n for kind, n in result.errors.items() if kind != "timeout"),
        "window_s": duration,
        "ok_rps": result.goodput_rps,
        "rejected_rps": result.rejections / duration,
        "latency_ms": {
            name: {
                "p50": _ms(latency[name]["p50"]) if latency[name]["count"] else None,
                "p99": _ms(latency[name]["p99"]) if latency[name]["count"] else None,
            }
            for name in ("all", "success", "rejected")
        },
        "driver_cpu_cores": result.generator_cpu_s / duration,
        "saturated": saturated,
        "t0": t0,
        "t1": t0 + duration,
        "loadshed": data,
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


# ----------------------------------------------------------------------------- steps


@dataclass
class Settings:
    duration: float
    warmup: float
    timeout: float
    calibration: dict[str, Any]
    work_dir: Path


def run_step(
    settings: Settings,
    driver: str,
    tree: Tree,
    variant: str,
    *,
    clients: int | None = None,
    rate: float | None = None,
    multiple: float | None = None,
) -> dict[str, Any]:
    """A fresh server, one driven step, the server stopped; the step's record."""
    server = Server(
        tree, variant == "protected", settings.calibration["model_path"], settings.work_dir
    )
    sampler = Sampler(server)
    try:
        sampler.start()
        body_path = settings.calibration["body_path"]
        if driver == "hey":
            assert clients is not None
            run = drive_hey(
                f"{server.url}/predict",
                body_path,
                clients,
                settings.duration,
                settings.warmup,
                max(1, round(settings.timeout)),
            )
        else:
            run = drive_loadshed(
                f"{server.url}/predict",
                body_path,
                clients=clients,
                rate=rate,
                duration=settings.duration,
                warmup=settings.warmup,
                timeout=settings.timeout,
            )
        sampler.stop()
        metrics = server.metrics()
    finally:
        if sampler.is_alive():
            sampler.stop()
        server.stop()
    split = sampler.window(run["t0"], run["t1"])
    if split.get("server_cpu_cores") is not None:
        responses = run["ok_rps"] + run["rejected_rps"]
        split["server_cpu_per_response_ms"] = (
            split["server_cpu_cores"] / responses * 1e3 if responses else None
        )
    return {
        "driver": driver,
        "tree": tree.label,
        "loadshed": str(tree.package),
        "variant": variant,
        "clients": clients,
        "rate": rate,
        "multiple": multiple,
        "run": run,
        "split": split,
        "metrics": metrics,
    }


def attribute_cpu(steps: list[dict[str, Any]]) -> None:
    """Split each step's server CPU into jobs and refusals: the CPU per job (a request that
    reached the model, served or abandoned) is the reference step's, the rest is divided by
    the 503s. The reference is the lowest load without refusals for the same driver, code and
    variant, else the other variant's, else (open loop) the closed loop's."""
    usable = [
        s
        for s in steps
        if s["split"].get("server_cpu_cores") is not None and s["split"]["jobs_rps"]
    ]

    def reference(driver: str, tree: str, variant: str) -> dict[str, Any] | None:
        other = VARIANTS[1 - VARIANTS.index(variant)]
        for want in (
            (driver, variant),
            (driver, other),
            ("loadshed", variant),
            ("loadshed", other),
        ):
            clean = [
                s
                for s in usable
                if (s["driver"], s["tree"], s["variant"]) == (want[0], tree, want[1])
                and s["run"]["rejected"] == 0
            ]
            if clean:
                return min(clean, key=lambda s: (s["clients"] or 0, s["rate"] or 0))
        return None

    for step in usable:
        ref = reference(step["driver"], step["tree"], step["variant"])
        if ref is None:
            continue
        split, run = step["split"], step["run"]
        per_job = ref["split"]["server_cpu_cores"] / ref["split"]["jobs_rps"]
        split["cpu_per_job_ms"] = per_job * 1e3
        split["cpu_per_job_ref"] = (
            "this step"
            if ref is step
            else f"{ref['driver']} {ref['variant']} {load_label(ref)} ({ref['tree']})"
        )
        rest = split["server_cpu_cores"] - per_job * split["jobs_rps"]
        split["cpu_per_503_ms"] = rest / run["rejected_rps"] * 1e3 if run["rejected"] else None


def capacity_from(steps: list[dict[str, Any]], tree: str) -> float | None:
    for driver in ("loadshed", "hey"):
        for variant in ("unprotected", "protected"):
            for step in steps:
                if (step["driver"], step["tree"], step["variant"], step["clients"]) == (
                    driver,
                    tree,
                    variant,
                    1,
                ):
                    return float(step["run"]["ok_rps"])
    return None


# ----------------------------------------------------------------------------- tables


def _num(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def _pair(a: float | None, b: float | None) -> str:
    if a is None and b is None:
        return "-"
    return f"{_small(a)} / {_small(b)}"


def _small(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.1f}" if ms >= 1 else f"{ms:.2f}"


def per_503(ms: float | None) -> str:
    """CPU per refusal; below zero the refusals' share is lost in the noise."""
    if ms is None:
        return "-"
    return f"{ms:.3f}" if ms >= 0 else "< 0 (noise)"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def load_label(step: dict[str, Any]) -> str:
    if step["clients"] is not None:
        return str(step["clients"])
    return f"{step['multiple']:g}x ({step['rate']:.1f}/s)"


def main_table(
    steps: list[dict[str, Any]], driver: str, capacity: dict[str, float | None]
) -> list[str]:
    """Clients (or rate) x {protected 200/s, 503s, timeouts, unprotected 200/s, timeouts}."""
    load = "offered (x capacity)" if driver == "open" else "clients"
    lines = [
        f"| {load} | code | protected: 200s/s (of capacity) | protected: 503s | "
        "protected: timeouts | unprotected: 200s/s (of capacity) | unprotected: timeouts |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    rows: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for step in steps:
        if step["driver"] == driver:
            key = (load_label(step), step["tree"])
            rows.setdefault(key, {})[step["variant"]] = step
    for (label, tree), by_variant in rows.items():
        cap = capacity.get(tree)
        cells = []
        for variant in VARIANTS:
            step = by_variant.get(variant)
            if step is None:
                cells += ["-", "-", "-"] if variant == "protected" else ["-", "-"]
                continue
            run = step["run"]
            share = f" ({run['ok_rps'] / cap:.0%})" if cap else ""
            cells.append(f"{run['ok_rps']:.1f}{share}")
            if variant == "protected":
                cells.append(f"{run['rejected']:,}")
            errors = run["other_errors"] + run["other_status"]
            cells.append(f"{run['timeouts']:,}" + (f" (+{errors:,} other)" if errors else ""))
        lines.append(f"| {label} | {tree} | " + " | ".join(cells) + " |")
    return lines


def ratio_table(steps: list[dict[str, Any]], driver: str) -> list[str]:
    """Protected over unprotected per load: successes per second, and successes per
    second of the model's own time (200/s x mean time per call: the share of the worker's
    time that went into successes). The model's time per call moves by 10 to 30 % from
    step to step on a shared machine, and the first ratio moves with it; the second does
    not, unless the protection itself slows the model (which the CPU share shows)."""
    rows: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for step in steps:
        if step["driver"] == driver:
            rows.setdefault((load_label(step), step["tree"]), {})[step["variant"]] = step
    lines = [
        "| load | code | 200/s: protected / unprotected | ms per call: protected / unprotected "
        "| ratio | ratio per model time |",
        "| ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for (label, tree), by_variant in rows.items():
        protected, unprotected = by_variant.get("protected"), by_variant.get("unprotected")
        if protected is None or unprotected is None:
            continue
        ok_p, ok_u = protected["run"]["ok_rps"], unprotected["run"]["ok_rps"]
        ms_p, ms_u = protected["split"].get("predict_ms"), unprotected["split"].get("predict_ms")
        ratio = f"{ok_p / ok_u:.3f}" if ok_u else "-"
        per_time = f"{ok_p * ms_p / (ok_u * ms_u):.3f}" if ok_u and ms_p and ms_u else "-"
        lines.append(
            f"| {label} | {tree} | {ok_p:.1f} / {ok_u:.1f} | {_pair(ms_p, ms_u)} | {ratio} "
            f"| {per_time} |"
        )
    return lines


def split_table(steps: list[dict[str, Any]], driver: str) -> list[str]:
    """Where the time goes, one row per step."""
    hey = driver == "hey"
    latency_head = "all p50 / p99 ms" if hey else "200 p50 / p99 ms | 503 p50 / p99 ms"
    lines = [
        "| load | code | variant | 200/s | 503/s | jobs/s | worker busy | predict ms (CPU "
        "share) | gap p50 / p99 ms | CPU, cores: server / worker / driver / machine | CPU "
        f"per job, ms | CPU per 503, ms | {latency_head} | limit / patience at end |",
        "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
        + ("---: | " if hey else "---: | ---: | ")
        + "---: |",
    ]
    for step in steps:
        if step["driver"] != driver:
            continue
        run, split, metrics = step["run"], step["split"], step["metrics"]
        latency = run["latency_ms"]
        if hey:
            lat = _pair(latency["all"]["p50"], latency["all"]["p99"])
        else:
            lat = (
                _pair(latency["success"]["p50"], latency["success"]["p99"])
                + " | "
                + _pair(latency["rejected"]["p50"], latency["rejected"]["p99"])
            )
        per_job = _num(split.get("cpu_per_job_ms"), 2)
        if split.get("cpu_per_job_ref") == "this step":
            per_job += " ref"
        elif split.get("cpu_per_job_ref"):
            per_job += "*"
        predict = _num(split.get("predict_ms"))
        if split.get("predict_cpu_share") is not None:
            predict += f" ({split['predict_cpu_share']:.0%})"
        cores = " / ".join(
            _num(value, 2)
            for value in (
                split.get("server_cpu_cores"),
                split.get("worker_cpu_cores"),
                run["driver_cpu_cores"],
                split.get("machine_cpu_cores"),
            )
        )
        limit = metrics.get("limit")
        patience = metrics.get("patience_seconds")
        state = "-" if not metrics else f"{_num(limit, 0)} / {_num(patience, 2)} s"
        lines.append(
            f"| {load_label(step)} | {step['tree']} | {step['variant']} | "
            f"{run['ok_rps']:.1f} | {run['rejected_rps']:,.0f} | {_num(split.get('jobs_rps'))} | "
            f"{_pct(split.get('worker_busy'))} | {predict} | "
            f"{_pair(split.get('gap_p50_ms'), split.get('gap_p99_ms'))} | {cores} | {per_job} | "
            f"{per_503(split.get('cpu_per_503_ms'))} | {lat} | {state} |"
        )
    return lines


def render(
    command: str,
    calibration: dict[str, Any],
    settings: Settings,
    steps: list[dict[str, Any]],
    capacity: dict[str, float | None],
    notes: list[str],
    machine: str,
) -> str:
    lines = [
        "# Retry storm: the README's example under clients that retry at once (issue 13)",
        "",
        f"`{command}`",
        "",
        f"{machine}. Model: random forest on digits, {calibration['trees']} trees, "
        f"{calibration['per_call_ms']:.1f} ms per call here (median of 30; target "
        f"{calibration['target_ms']:g} ms); `ModelRunner(predict, workers=1)`; protected = "
        "`LoadShedMiddleware` at its defaults, no deadline header. "
        f"{settings.duration:g} s measured per step after {settings.warmup:g} s of warm-up, "
        f"client timeout {settings.timeout:g} s, a fresh server per step.",
        "",
    ]
    lines += [f"- {note}" for note in notes]
    if notes:
        lines.append("")
    captions = {
        "hey": "hey, closed loop (retries at once; rates over hey's Total)",
        "loadshed": "loadshed bench, closed loop (retries at once)",
        "open": "loadshed bench, open loop (Poisson), capacity = unprotected 200s/s at 1 client",
    }
    for driver, caption in captions.items():
        if not any(step["driver"] == driver for step in steps):
            continue
        lines += [f"## {caption}", ""]
        commands = [s["run"]["command"] for s in steps if s["driver"] == driver]
        lines += [f"First step: `{commands[0]}`", ""]
        lines += main_table(steps, driver, capacity)
        lines += ["", f"**Protected over unprotected ({caption.split(',')[0]})**", ""]
        lines += ratio_table(steps, driver)
        lines += ["", f"**Where the time goes ({caption.split(',')[0]})**", ""]
        lines += split_table(steps, driver)
        lines.append("")
    lines += [
        "Worker busy: share of wall time inside `predict`, measured in the worker; predict "
        "ms: mean wall time per call, with the share of it the worker was on a CPU (below 100 "
        "%: it waited for one); jobs/s: calls of the model, served or abandoned; gap: end of "
        "one job to the start of the next in the worker (upper edges of 26 % buckets; "
        "includes time with no work, at one client the whole round trip); CPU cores: the "
        "uvicorn process alone, the model worker inside `predict`, the load generator, and "
        "the whole machine (other work included); CPU per job: the server's CPU per model "
        "call in the row marked ref (`*`: borrowed from the other variant's or the closed "
        "loop's ref row, see the JSON), CPU per 503: the rest of the server's CPU per refusal; "
        "limit / patience: the limiter's at the end of the step, read from `/metrics` after "
        "the driver closed its connections (requests in flight then count as give-ups; "
        "patience - while unknown).",
    ]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- main


def render_saved(parser: argparse.ArgumentParser, path: Path, out: Path | None) -> int:
    """Write the markdown of a run saved with ``--json`` (its step settings read back
    from the command it records)."""
    try:
        saved = json.loads(path.read_text())
        recorded = parser.parse_args(shlex.split(saved["command"])[2:])
        settings = Settings(
            parse_duration(recorded.duration, "--duration"),
            parse_duration(recorded.warmup, "--warmup"),
            parse_duration(recorded.timeout, "--timeout"),
            saved["calibration"],
            path.parent,
        )
        text = render(
            saved["command"],
            saved["calibration"],
            settings,
            saved["steps"],
            saved["capacity"],
            saved["notes"],
            saved["machine"],
        )
    except (OSError, ValueError, KeyError, ConfigError) as error:
        parser.error(f"--render {path}: {error}")
    if out is None:
        print(text, end="")
    else:
        out.write_text(text)
    return 0


def add_shared_arguments(parser: argparse.ArgumentParser) -> None:
    """``--src``, ``--model-ms``, ``--trees``, ``--out`` and ``--json`` (also ``rerun.py``'s)."""
    parser.add_argument(
        "--src",
        action="append",
        default=[],
        metavar="[LABEL=]PATH",
        help="also run the servers with PYTHONPATH=PATH (another checkout's src); repeatable",
    )
    parser.add_argument("--model-ms", type=float, default=25.0, help="target time per call")
    parser.add_argument("--trees", type=int, help="forest size (skips the calibration)")
    parser.add_argument("--out", type=Path, help="write the markdown here")
    parser.add_argument("--json", type=Path, help="write every figure here")


def check_drivers(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[list[str], list[str]]:
    """``--drivers`` and ``--trees`` checked (a parser error otherwise); hey dropped, with a
    note, when it is not installed. Returns the drivers and the notes."""
    drivers = [d.strip() for d in args.drivers.split(",") if d.strip()]
    if drivers == ["both"]:
        drivers = ["hey", "loadshed"]
    if not drivers or any(d not in ("hey", "loadshed") for d in drivers):
        parser.error(f"--drivers: hey, loadshed, hey,loadshed or both, got {args.drivers!r}")
    if args.trees is not None and args.trees < 1:
        parser.error("--trees must be >= 1")
    notes: list[str] = []
    if "hey" in drivers and not (os.access(HEY, os.X_OK) or shutil.which("hey")):
        message = f"hey not found at {HEY} (apt-get install hey): the hey driver is skipped"
        print(message, file=sys.stderr)
        notes.append(message)
        drivers.remove("hey")
    return drivers, notes


def parse_src(values: Sequence[str]) -> list[Tree]:
    trees = [Tree("this tree", None)]
    for value in values:
        label, _, path_text = value.rpartition("=")
        path = Path(path_text).resolve()
        if not (path / "loadshed" / "__init__.py").is_file():
            raise ValueError(f"--src {value}: no loadshed package in {path}")
        if not label:
            label = path.parent.name if path.name == "src" else path.name
        trees.append(Tree(label, path))
    if len({tree.label for tree in trees}) != len(trees):
        raise ValueError("--src: labels must differ (use LABEL=PATH)")
    return trees


def parse_rates(text: str) -> list[float]:
    if text.strip().lower() in ("", "none"):
        return []
    rates = [float(part) for part in text.split(",") if part.strip()]
    if any(not (r > 0 and math.isfinite(r)) for r in rates):
        raise ValueError(f"--rates: multiples of capacity must be > 0, got {text!r}")
    return rates


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,4,16,64,256", help="closed-loop client counts")
    parser.add_argument("--duration", default="15s", help="measured time per step")
    parser.add_argument("--warmup", default="3s", help="unmeasured lead-in per step")
    parser.add_argument("--timeout", default="2s", help="client timeout (hey: whole seconds)")
    parser.add_argument(
        "--rates", default="1,2,5", help="open loop: multiples of capacity ('none' to skip)"
    )
    parser.add_argument("--capacity", type=float, help="req/s for --rates (default: measured)")
    parser.add_argument(
        "--drivers", default="hey,loadshed", help="hey, loadshed, or both (hey,loadshed)"
    )
    add_shared_arguments(parser)
    parser.add_argument(
        "--render",
        type=Path,
        metavar="JSON",
        help="write the markdown of a saved --json run (to --out, or stdout) and exit",
    )
    args = parser.parse_args()
    if args.render is not None:
        return render_saved(parser, args.render, args.out)
    try:
        counts = parse_int_list(args.clients, "--clients")
        duration = parse_duration(args.duration, "--duration")
        warmup = parse_duration(args.warmup, "--warmup")
        timeout = parse_duration(args.timeout, "--timeout")
        rates = parse_rates(args.rates)
        trees = parse_src(args.src)
    except (ValueError, ConfigError) as error:
        parser.error(str(error))
    drivers, notes = check_drivers(parser, args)
    if "hey" in drivers and timeout != round(timeout):
        notes.append(f"hey takes whole seconds: -t {max(1, round(timeout))}")

    command = "python bench/retry_storm.py " + shlex.join(sys.argv[1:])
    load_before = os.getloadavg()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="retry-storm-") as work:
        work_dir = Path(work)
        print("calibrating the model ...", file=sys.stderr, flush=True)
        calibration = calibrate(args.model_ms, args.trees, work_dir)
        print(
            f"model: {calibration['trees']} trees, {calibration['per_call_ms']:.1f} ms per call "
            "in this process (median of 30)",
            file=sys.stderr,
            flush=True,
        )
        settings = Settings(duration, warmup, timeout, calibration, work_dir)
        steps: list[dict[str, Any]] = []

        def record(step: dict[str, Any]) -> None:
            steps.append(step)
            run, split = step["run"], step["split"]
            load = step["clients"] if step["clients"] is not None else f"{step['rate']:.1f}/s"
            print(
                f"  {step['driver']:>8} {step['tree']} {step['variant']:>11} {load}: "
                f"200/s {run['ok_rps']:.1f}, 503s {run['rejected']:,}, timeouts "
                f"{run['timeouts']:,}, worker busy {_pct(split.get('worker_busy'))}, "
                f"predict {_num(split.get('predict_ms'))} ms, server CPU "
                f"{_num(split.get('server_cpu_cores'), 2)} cores",
                file=sys.stderr,
                flush=True,
            )

        order = 0
        for driver in drivers:
            for clients in counts:
                for tree in trees:
                    variants = VARIANTS if order % 2 == 0 else VARIANTS[::-1]
                    order += 1
                    for variant in variants:
                        record(run_step(settings, driver, tree, variant, clients=clients))

        capacity: dict[str, float | None] = {}
        for tree in trees:
            capacity[tree.label] = args.capacity or capacity_from(steps, tree.label)
        if rates:
            for tree in trees:
                if capacity[tree.label] is None:
                    print(f"measuring capacity ({tree.label}) ...", file=sys.stderr, flush=True)
                    probe = run_step(settings, "loadshed", tree, "unprotected", clients=1)
                    probe["driver"] = "capacity"
                    steps.append(probe)
                    capacity[tree.label] = probe["run"]["ok_rps"]
            for multiple in rates:
                for tree in trees:
                    cap = capacity[tree.label]
                    assert cap is not None
                    variants = VARIANTS if order % 2 == 0 else VARIANTS[::-1]
                    order += 1
                    for variant in variants:
                        step = run_step(
                            settings,
                            "loadshed",
                            tree,
                            variant,
                            rate=cap * multiple,
                            multiple=multiple,
                        )
                        step["driver"] = "open"
                        record(step)
        attribute_cpu(steps)
    load_after = os.getloadavg()
    machine = (
        f"{os.cpu_count()} CPUs, load average {load_before[0]:.1f} before and "
        f"{load_after[0]:.1f} after; wall {time.monotonic() - started:.0f} s"
    )
    for step in steps:
        if step["run"].get("saturated"):
            notes.append(f"{step['driver']} {step['rate']}: {step['run']['saturated']}")
    text = render(command, calibration, settings, steps, capacity, notes, machine)
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "command": command,
                    "machine": machine,
                    "calibration": calibration,
                    "capacity": capacity,
                    "notes": notes,
                    "steps": steps,
                },
                indent=1,
                default=str,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
