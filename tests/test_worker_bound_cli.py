"""``loadshed serve-demo --workers N`` refuses a worker count the machine cannot hold
(issue 14 item 1: ``--workers 100000`` used to fork until memory ran out)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from loadshed.runner import MAX_WORKERS_ENV, machine_worker_bound

pytestmark = pytest.mark.timeout(60)


def run_serve_demo(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loadshed.cli", "serve-demo", "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize("model", ["hashburn", "digits"])
def test_absurd_workers_exit_2_with_one_line_before_starting_anything(model: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != MAX_WORKERS_ENV}
    bound, _ = machine_worker_bound()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadshed.cli",
            "serve-demo",
            "--port",
            "0",
            "--model",
            model,
            "--workers",
            "100000",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1
    assert errors[0].startswith(f"Error: --workers: must be at most {bound} on this machine")
    assert MAX_WORKERS_ENV in errors[0]
    assert "Traceback" not in result.stderr
    assert "serving" not in result.stdout


def test_the_environment_variable_sets_another_bound() -> None:
    result = run_serve_demo("--model", "hashburn", "--workers", "3", env={MAX_WORKERS_ENV: "2"})
    assert result.returncode == 2, result.stderr
    assert f"at most 2 on this machine ({MAX_WORKERS_ENV}=2)" in result.stderr
    result = run_serve_demo("--model", "hashburn", "--workers", "1", env={MAX_WORKERS_ENV: "x"})
    assert result.returncode == 2, result.stderr
    assert f"{MAX_WORKERS_ENV}: must be an integer >= 1, got 'x'" in result.stderr
