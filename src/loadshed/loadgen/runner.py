"""Run one load test: in this process, or spread over N worker processes whose results merge
exactly; sample the server's usage; refuse a run the generator could not drive."""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import queue
import time
from collections.abc import Callable
from typing import Any

from loadshed.errors import LoadshedError
from loadshed.loadgen.engine import LiveCounters, run_engine
from loadshed.loadgen.options import BenchOptions
from loadshed.loadgen.results import RunResult, merge_results
from loadshed.loadgen.usage import UsageSampler

__all__ = ["GeneratorError", "GeneratorSaturated", "run_bench"]

ProgressCallback = Callable[[LiveCounters], None]
_START_MARGIN_S = 0.2
_READY_TIMEOUT_S = 60.0


class GeneratorError(LoadshedError):
    """The generator itself failed (a worker process died or never started)."""


class GeneratorSaturated(LoadshedError):
    """The open loop fell behind its schedule: the load sent is not the load asked for.

    ``result`` holds what was measured, for the record; it must not be reported as the
    target's performance at the requested rate.
    """

    def __init__(self, result: RunResult, lag_p99_s: float, max_lag_s: float) -> None:
        rate = result.rate or 0.0
        super().__init__(
            f"generator saturated: the p99 of its lag behind the {rate:g} req/s schedule was "
            f"{lag_p99_s * 1e3:.1f} ms (limit {max_lag_s * 1e3:.0f} ms, --max-lag); the load "
            "was not driven as asked, so no result is reported. Use --processes, a lower "
            "--rate, or a less busy machine."
        )
        self.result = result
        self.lag_p99_s = lag_p99_s


def run_bench(
    options: BenchOptions,
    *,
    on_progress: ProgressCallback | None = None,
    pid: int | None = None,
) -> RunResult:
    """Run ``options`` and return the merged result.

    Raises :class:`GeneratorSaturated` when the open loop's p99 lag exceeds ``max_lag_s``.
    """
    sampler = UsageSampler(pid) if pid is not None else None
    sampling = False

    def progress(live: LiveCounters) -> None:
        nonlocal sampling
        # Sample the server during the measured window only.
        if sampler is not None and not sampling and live.elapsed_s >= options.warmup_s:
            sampling = True
            sampler.start()
        if on_progress is not None:
            on_progress(live)

    try:
        if options.processes == 1:
            result = run_engine(options, on_progress=progress)
        else:
            result = _run_processes(options, progress)
    finally:
        if sampler is not None:
            sampler.stop()
    if sampler is not None:
        result.server = sampler.summary()
    if options.mode == "open":
        lag_p99 = result.histograms["send_lag"].percentile(99.0)
        if lag_p99 > options.max_lag_s:
            raise GeneratorSaturated(result, lag_p99, options.max_lag_s)
    return result


def _worker(
    options: BenchOptions,
    phase: float,
    conn: multiprocessing.connection.Connection,
    progress: Any,
    index: int,
) -> None:
    """Worker process: wait for the common start time, run, send the result JSON back."""
    try:
        conn.send(("ready", None))
        start_at = conn.recv()
        last = 0.0

        def report(live: LiveCounters) -> None:
            nonlocal last
            now = time.monotonic()
            if now - last >= 0.2:
                last = now
                progress.put((index, live.snapshot()))

        result = run_engine(options, start_at=start_at, phase=phase, on_progress=report)
        conn.send(("result", result.to_json()))
    except BaseException as exc:  # report anything, including KeyboardInterrupt
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def _run_processes(options: BenchOptions, on_progress: ProgressCallback | None) -> RunResult:
    context = multiprocessing.get_context("spawn")
    progress: Any = context.Queue()
    shares = options.split(options.processes)
    workers = []
    for index, share in enumerate(shares):
        parent_end, child_end = context.Pipe()
        # Phases interleave constant schedules of the shares into one even schedule.
        phase = index / len(shares)
        process = context.Process(
            target=_worker,
            args=(share, phase, child_end, progress, index),
            name=f"loadshed-gen-{index}",
            daemon=True,
        )
        process.start()
        child_end.close()
        workers.append((process, parent_end))
    try:
        for process, conn in workers:
            if not conn.poll(_READY_TIMEOUT_S):
                raise GeneratorError(f"worker {process.name} did not start")
            kind, _ = conn.recv()
            if kind != "ready":
                raise GeneratorError(f"worker {process.name} failed to start")
        start_at = time.monotonic() + _START_MARGIN_S
        for _, conn in workers:
            conn.send(start_at)
        snapshots: dict[int, dict[str, float]] = {}
        results: list[RunResult] = []
        pending = {id(conn): (process, conn) for process, conn in workers}
        while pending:
            _drain_progress(progress, snapshots, on_progress)
            ready = multiprocessing.connection.wait([c for _, c in pending.values()], 0.25)
            for ready_conn in ready:
                assert isinstance(ready_conn, multiprocessing.connection.Connection)
                process, _ = pending.pop(id(ready_conn))
                try:
                    kind, payload = ready_conn.recv()
                except EOFError:
                    raise GeneratorError(f"worker {process.name} died") from None
                if kind == "error":
                    raise GeneratorError(f"worker {process.name}: {payload}")
                results.append(RunResult.from_json(payload))
        _drain_progress(progress, snapshots, on_progress)
    finally:
        for process, conn in workers:
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()
            conn.close()
        progress.close()
    merged = merge_results(results)
    merged.rate = options.rate
    merged.clients = options.clients
    merged.sources = 1
    return merged


def _drain_progress(
    progress: Any,
    snapshots: dict[int, dict[str, float]],
    on_progress: ProgressCallback | None,
) -> None:
    updated = False
    while True:
        try:
            index, snapshot = progress.get_nowait()
        except queue.Empty:
            break
        snapshots[index] = snapshot
        updated = True
    if updated and on_progress is not None:
        total = LiveCounters()
        for snap in snapshots.values():
            for field in ("sent", "done", "ok", "failed", "inflight", "not_sent"):
                setattr(total, field, getattr(total, field) + int(snap[field]))
            total.max_lag_s = max(total.max_lag_s, snap["max_lag_s"])
            total.elapsed_s = max(total.elapsed_s, snap["elapsed_s"])
            total.total_s = max(total.total_s, snap["total_s"])
        on_progress(total)
