"""What importing loadshed costs: ``python -m loadshed`` works, and the core and the
middleware load no optional integration (Prometheus, aiohttp, rich, click) until used."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)

HEAVY = ("prometheus_client", "aiohttp", "rich", "click")


def run_python(*args: str) -> subprocess.CompletedProcess[str]:
    """Run a fresh interpreter (nothing imported yet) with ``args``."""
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=50, check=False
    )


def test_python_dash_m_loadshed_lists_the_commands() -> None:
    result = run_python("-m", "loadshed", "--help")
    assert result.returncode == 0, result.stderr
    commands = result.stdout.split("Commands:", 1)[1].split()
    assert "demo" in commands and "proxy" in commands and "bench" in commands


def test_import_and_middleware_load_no_optional_integration() -> None:
    code = (
        "import sys, loadshed\n"
        "from loadshed import LoadShedMiddleware, Limiter\n"
        "LoadShedMiddleware(lambda scope, receive, send: None)\n"
        "Limiter()\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))\n"
    )
    result = run_python("-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_metrics_load_prometheus_when_asked_for() -> None:
    """The lazy import still works: ``metrics_path`` builds a Prometheus exporter."""
    code = (
        "import sys\n"
        "from loadshed import LoadShedMiddleware, LoadshedMetrics\n"
        "m = LoadShedMiddleware(lambda scope, receive, send: None, metrics_path='/metrics')\n"
        "assert isinstance(m.metrics, LoadshedMetrics)\n"
        "print('prometheus_client' in sys.modules)\n"
    )
    result = run_python("-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"
