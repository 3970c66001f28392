"""``loadshed proxy`` from the command line: bad flags, and a real run with metrics."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
import requests
from click.testing import CliRunner

from loadshed.cli import main
from proxy_servers import Recorder, free_port

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    ("args", "flag", "allowed"),
    [
        (
            ["--limit", "turbo"],
            "--limit",
            "little|little+headroom|aimd|vegas|gradient2|gradient|fixed:N",
        ),
        (["--limit", "fixed:0"], "--limit", "fixed:N"),
        (["--upstream", "not-a-url"], "--upstream", "http://"),
        (["--upstream", "ftp://host:21"], "--upstream", "http://"),
        (["--listen", "127.0.0.1"], "--listen", "HOST:PORT"),
        (["--listen", "127.0.0.1:99999"], "--listen", "HOST:PORT"),
        (["--deadline", "soon"], "--deadline", ""),
        (["--max-queue-wait", "-1s"], "--max-queue-wait", ""),
        (["--wait-ceiling", "-1s"], "--wait-ceiling", ""),
        (["--refusal-rate", "-5"], "--refusal-rate", ">= 0"),
        (["--refusal-rate", "inf"], "--refusal-rate", ">= 0"),
        (["--max-refusal-hold", "soon"], "--max-refusal-hold", ""),
        (["--fail-threshold", "0"], "--fail-threshold", ">= 1"),
        (["--max-header-bytes", "10"], "--max-header-bytes", ">= 256"),
        (["--max-headers", "0"], "--max-headers", ">= 1"),
        (["--max-connections", "0"], "--max-connections", ">= 1"),
        (["--header-timeout", "0s"], "--header-timeout", "> 0"),
        (["--header-timeout", "soon"], "--header-timeout", ""),
        (["--reject-status", "500"], "--reject-status", "503"),
    ],
)
def test_bad_flags_exit_2_with_one_line_naming_the_flag(
    args: list[str], flag: str, allowed: str
) -> None:
    base = ["proxy", "--upstream", "http://127.0.0.1:8000"]
    if args[0] == "--upstream":
        base = ["proxy"]
    result = CliRunner().invoke(main, [*base, *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert flag in lines[0]
    assert allowed in lines[0]
    assert "Traceback" not in result.output


def test_missing_upstream_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["proxy"])
    assert result.exit_code == 2
    assert "--upstream" in result.output


def test_cli_proxies_and_serves_metrics_per_upstream(echo_upstream: tuple[str, Recorder]) -> None:
    port, metrics_port = free_port(), free_port()
    upstream, _ = echo_upstream
    command = [
        sys.executable, "-m", "loadshed.cli", "proxy",
        "--upstream", upstream, "--listen", f"127.0.0.1:{port}",
        "--limit", "fixed:3", "--metrics-port", str(metrics_port), "--close-abandoned",
    ]  # fmt: skip
    process = subprocess.Popen(
        command, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    try:
        assert process.stderr is not None
        banner = process.stderr.readline()
        assert f"127.0.0.1:{port}" in banner and "fixed:3" in banner, banner
        response = requests.get(f"http://127.0.0.1:{port}/hello?q=1", timeout=5)
        assert response.status_code == 200
        assert response.json()["path"] == "/hello"
        metrics = requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
        assert f'loadshed_limit{{limiter="{upstream}"}} 3.0' in metrics
        assert (
            f'loadshed_requests_total{{limiter="{upstream}",outcome="success",reason=""}} 1.0'
            in metrics
        )
        assert (
            f'loadshed_proxy_upstream_responses_total{{code="200",upstream="{upstream}"}} 1.0'
            in metrics
        )
        assert f'loadshed_proxy_upstream_up{{upstream="{upstream}"}} 1.0' in metrics
        health = requests.get(f"http://127.0.0.1:{metrics_port}/health", timeout=5).json()
        assert health["status"] == "ok"
        assert health["upstreams"][upstream]["limit"] == 3
    finally:
        process.terminate()
        process.wait(timeout=10)
    assert time.monotonic() > 0


def _run_proxy_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loadshed.cli", "proxy", "--upstream", "http://127.0.0.1:9", *args],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )


def test_taken_port_is_one_line_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = _run_proxy_cli("--listen", f"127.0.0.1:{port}")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"Error: --listen: cannot listen on 127.0.0.1:{port}: Address already in use"
    ]


@pytest.mark.parametrize(
    ("args", "flag", "reason"),
    [
        # the metrics listener on the proxy's own port
        (["--listen", "127.0.0.1:{port}", "--metrics-port", "{port}"], "--metrics-port", "in use"),
        (["--listen", "127.0.0.1:0", "--metrics-host", "999.1.1.1", "--metrics-port", "0"],
         "--metrics-host", "not an address of this machine"),
        (["--listen", "127.0.0.1:0", "--metrics-host", "192.0.2.1", "--metrics-port", "0"],
         "--metrics-host", "Cannot assign requested address"),
        (["--listen", "999.1.1.1:0"], "--listen", "not an address of this machine"),
        (["--listen", "192.0.2.1:0"], "--listen", "Cannot assign requested address"),
    ],
)  # fmt: skip
def test_bind_errors_are_one_line_naming_the_listener_flag(
    args: list[str], flag: str, reason: str
) -> None:
    port = free_port()
    result = _run_proxy_cli(*(arg.format(port=port) for arg in args))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"Error: {flag}: cannot listen on "), lines[0]
    assert reason in lines[0]
