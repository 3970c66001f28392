"""Server-side resource sampling (USE): CPU % and RSS of a process and its children."""

from __future__ import annotations

import threading

import psutil

from loadshed.errors import ConfigError

__all__ = ["UsageSampler", "check_pid"]


def check_pid(pid: int) -> None:
    """Raise :class:`ConfigError` naming ``--pid`` when no such process can be read."""
    try:
        psutil.Process(pid).memory_info()
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError) as exc:
        raise ConfigError("--pid", f"cannot sample process {pid}: {exc}") from None


class UsageSampler:
    """Samples a process tree (e.g. uvicorn and its workers) in a background thread.

    CPU % is per core (200 % = two cores busy), summed over the tree; RSS is summed too.
    """

    def __init__(self, pid: int, interval_s: float = 0.5) -> None:
        check_pid(pid)
        self.pid = pid
        self.interval_s = interval_s
        self.cpu_percent: list[float] = []
        self.rss_bytes: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="loadshed-usage", daemon=True)
        self._procs: dict[int, psutil.Process] = {}

    def __enter__(self) -> UsageSampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start sampling."""
        self._sample()  # primes psutil's CPU counters
        self.cpu_percent.clear()
        self.rss_bytes.clear()
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling and wait for the thread."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _tree(self) -> list[psutil.Process]:
        root = self._procs.get(self.pid) or psutil.Process(self.pid)
        found = [root, *root.children(recursive=True)]
        # Reuse Process objects: cpu_percent() measures since the previous call on the object.
        self._procs = {p.pid: self._procs.get(p.pid, p) for p in found}
        return list(self._procs.values())

    def _sample(self) -> None:
        cpu = 0.0
        rss = 0
        try:
            procs = self._tree()
        except psutil.Error:
            return
        for proc in procs:
            try:
                cpu += proc.cpu_percent(None)
                rss += proc.memory_info().rss
            except psutil.Error:
                continue
        self.cpu_percent.append(cpu)
        self.rss_bytes.append(rss)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def summary(self) -> dict[str, float]:
        """``cpu_percent_mean``, ``cpu_percent_max``, ``rss_mb_mean``, ``rss_mb_max`` (or empty)."""
        if not self.cpu_percent:
            return {}
        return {
            "pid": float(self.pid),
            "cpu_percent_mean": sum(self.cpu_percent) / len(self.cpu_percent),
            "cpu_percent_max": max(self.cpu_percent),
            "rss_mb_mean": sum(self.rss_bytes) / len(self.rss_bytes) / 2**20,
            "rss_mb_max": max(self.rss_bytes) / 2**20,
        }
