"""The model side of ``bench/retry_storm_app.py``: what runs in the ``ModelRunner`` worker.

``load_model(path, stats_path)`` (the runner's initializer) loads a scikit-learn random
forest saved with joblib by ``bench/retry_storm.py``; ``predict(features)`` classifies one
8x8 digit and records, inside the worker, where its time goes in ``stats_path``: a small
memory-mapped file the bench reads without sending a request. Layout: ``STATS_FIELDS`` as
little-endian float64, then ``GAP_BUCKETS`` float64 counters: jobs, seconds inside the model
call (wall clock and the worker's CPU), and the gap from the end of one job to the start of
the next, as a sum and a log histogram. The gap is the dispatch gap (reply read, next job
sent) plus any time the worker had nothing to do (at one client: the whole client round
trip). Kept apart from the app so the worker imports neither FastAPI nor loadshed.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
import time
from typing import Any

STATS_FIELDS = ("jobs", "busy_s", "busy_cpu_s", "gap_s", "gaps", "gap_max_s", "last_end", "pid")
GAP_BUCKETS = 64
GAP_BUCKETS_PER_OCTAVE = 3  # bucket k: gaps in [2^(k/3), 2^((k+1)/3)) us; 64 buckets reach 2.6 s
STATS_BYTES = 8 * (len(STATS_FIELDS) + GAP_BUCKETS)
_PID_AT = 8 * STATS_FIELDS.index("pid")
_BUCKETS_AT = 8 * len(STATS_FIELDS)

_model: Any = None
_stats: mmap.mmap | None = None


def gap_bucket(gap_s: float) -> int:
    """The histogram bucket of a gap (seconds)."""
    micros = gap_s * 1e6
    if micros < 1.0:
        return 0
    return min(GAP_BUCKETS - 1, int(math.log2(micros) * GAP_BUCKETS_PER_OCTAVE))


def bucket_upper_s(bucket: int) -> float:
    """The upper edge of a gap bucket, seconds."""
    return float(2.0 ** ((bucket + 1) / GAP_BUCKETS_PER_OCTAVE) / 1e6)


def create_stats_file(path: str) -> None:
    """A zeroed stats file of the right size."""
    with open(path, "wb") as file:
        file.write(bytes(STATS_BYTES))


def read_stats(buffer: bytes | mmap.mmap) -> dict[str, Any]:
    """The counters in a stats file's bytes (``gap_hist``: the bucket counts)."""
    values = struct.unpack_from(f"<{len(STATS_FIELDS) + GAP_BUCKETS}d", buffer, 0)
    stats: dict[str, Any] = dict(zip(STATS_FIELDS, values[: len(STATS_FIELDS)], strict=True))
    stats["gap_hist"] = list(values[len(STATS_FIELDS) :])
    return stats


def load_model(path: str, stats_path: str | None = None) -> None:
    """Runner initializer: load the model once per worker; open the stats file."""
    global _model, _stats
    import joblib

    _model = joblib.load(path)
    if stats_path:
        with open(stats_path, "r+b") as file:
            _stats = mmap.mmap(file.fileno(), STATS_BYTES)
        struct.pack_into("<d", _stats, _PID_AT, float(os.getpid()))


def predict(features: list[float]) -> int:
    """Runner job: classify one 8x8 image (64 pixel intensities), recording its time."""
    import numpy as np

    start = time.monotonic()
    cpu = time.process_time()
    label = int(_model.predict(np.asarray([features], dtype=np.float64))[0])
    end = time.monotonic()
    if _stats is not None:
        _record(_stats, start, end, time.process_time() - cpu)
    return label


def _record(stats: mmap.mmap, start: float, end: float, cpu_s: float) -> None:
    jobs, busy, busy_cpu, gap_sum, gaps, gap_max, last_end = struct.unpack_from("<7d", stats, 0)
    values = [jobs + 1, busy + end - start, busy_cpu + cpu_s, gap_sum, gaps, gap_max, end]
    if last_end > 0:
        gap = max(0.0, start - last_end)
        values[3] += gap
        values[4] += 1
        values[5] = max(gap_max, gap)
        at = _BUCKETS_AT + 8 * gap_bucket(gap)
        struct.pack_into("<d", stats, at, struct.unpack_from("<d", stats, at)[0] + 1)
    struct.pack_into("<7d", stats, 0, *values)
