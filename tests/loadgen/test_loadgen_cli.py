"""``loadshed bench`` and ``loadshed report`` end to end: exit codes, one-line errors, JSON."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from loadgen_targets import serve_target
from loadshed.cli import main


def _invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["bench", "not-a-url", "-c", "1"], "URL"),
        (["bench", "ftp://127.0.0.1/", "-c", "1"], "URL"),
        (["bench", "http://127.0.0.1:1/", "--rate", "-5"], "--rate"),
        (["bench", "http://127.0.0.1:1/", "--clients", "0"], "--clients"),
        (["bench", "http://127.0.0.1:1/", "-c", "1", "--slo", "p99<<2ms"], "'p99<<2ms'"),
        (["bench", "http://127.0.0.1:1/", "-c", "1", "--timeout", "soon"], "--timeout"),
        (["bench", "http://127.0.0.1:1/", "-c", "1", "-H", "no colon"], "--header"),
        (["bench", "http://127.0.0.1:1/"], "--clients/--rate"),
        (["bench", "http://127.0.0.1:1/", "-c", "1", "--retry-jitter", "0.5"], "--retry-jitter"),
        (["sweep", "http://127.0.0.1:1/", "--clients", "1,x"], "--clients"),
        (["sweep", "http://127.0.0.1:1/", "--rates", "100:-5:1"], "--rates"),
        (["sweep", "http://127.0.0.1:1/", "-c", "1", "--stop-when", "p99>"], "--stop-when"),
        (["capacity", "http://127.0.0.1:1/", "--slo", "errors<"], "'errors<'"),
        (["capacity", "http://127.0.0.1:1/", "--slo", "p99<1s", "--start-rate", "-1"], "--start"),
    ],
)
def test_bad_input_exits_2_with_one_line_naming_the_flag(args: list[str], named: str) -> None:
    code, _, err = _invoke(*args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("Error:")
    assert named in lines[0]


def test_bench_writes_json_and_passes_slo(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    with serve_target() as target:
        code, out, _ = _invoke(
            "bench", f"{target.url}/ok", "--rate", "100", "-d", "1s", "-w", "0.2s",
            "--json", str(path), "--slo", "p99<500ms,errors<1%,goodput>=90", "--max-lag", "1s",
            "--pid", str(os.getpid()),
        )  # fmt: skip
    assert code == 0, out
    assert out.count("PASS ") == 3
    assert "SLO: PASS" in out
    data = json.loads(path.read_text())
    assert data["requests"] == 100
    assert data["duration_s"] == 1.0
    assert data["goodput_rps"] == pytest.approx(100.0, abs=2.0)
    assert data["status_counts"] == {"200": 100}
    assert data["latency_s"]["success"]["p50"] > 0
    assert data["server"]["cpu_percent_mean"] >= 0  # sampled this (the server's) process


def test_bench_slo_failure_exits_1() -> None:
    with serve_target() as target:
        code, out, _ = _invoke(
            "bench", f"{target.url}/status/503", "-c", "2", "-d", "0.5s", "-w", "0s",
            "--slo", "p99<1s,errors<0.1%",
        )  # fmt: skip
    assert code == 1
    assert "PASS p99<1s" in out
    assert "FAIL errors<0.1%" in out
    assert "SLO: FAIL" in out


def test_bench_refuses_a_run_it_could_not_drive() -> None:
    with serve_target() as target:
        code, out, err = _invoke(
            "bench", f"{target.url}/ok", "-r", "200", "-d", "0.5s", "-w", "0s", "--max-lag", "1us"
        )
    assert code == 3
    assert "generator saturated" in err
    assert "latency (ms)" not in out  # no result reported


def test_report_merges_runs(tmp_path: Path) -> None:
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    with serve_target() as target:
        for path in paths:
            code, _, _ = _invoke(
                "bench", f"{target.url}/ok", "-r", "50", "-d", "0.6s", "-w", "0s",
                "--json", str(path), "--max-lag", "1s",
            )  # fmt: skip
            assert code == 0
    merged_path = tmp_path / "merged.json"
    code, out, _ = _invoke(
        "report", *map(str, paths), "--json", str(merged_path), "--slo", "goodput>=95"
    )
    assert code == 0, out
    merged = json.loads(merged_path.read_text())
    assert merged["requests"] == 60
    assert merged["rate"] == 100.0
    assert merged["goodput_rps"] == pytest.approx(100.0, abs=4.0)
    assert merged["sources"] == 2


def test_report_rejects_a_foreign_file(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text('{"a": 1}')
    code, _, err = _invoke("report", str(path))
    assert code == 2
    assert "x.json: not a loadshed result JSON" in err
