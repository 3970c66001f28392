"""``loadshed sweep`` and ``loadshed capacity`` against real local servers."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from loadgen_targets import serve_target
from loadshed.cli import main
from loadshed.loadgen.capacity import find_capacity
from loadshed.loadgen.options import BenchOptions
from loadshed.loadgen.slo import parse_slo


def _invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def test_sweep_writes_step_json_combined_json_tsv_and_charts(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    with serve_target() as target:
        code, stdout, _ = _invoke(
            "sweep", f"{target.url}/sleep/10", "--clients", "1,4", "-d", "0.5s", "-w", "0.2s",
            "-o", str(out),
        )  # fmt: skip
    assert code == 0, stdout
    steps = sorted(out.glob("step-*.json"))
    assert [p.name for p in steps] == ["step-00-1c.json", "step-01-4c.json"]
    first, second = (json.loads(p.read_text()) for p in steps)
    assert first["clients"] == 1 and second["clients"] == 4
    # Four clients push about four times the throughput of one against a 10 ms server.
    assert second["throughput_rps"] > 2.5 * first["throughput_rps"]
    combined = json.loads((out / "sweep.json").read_text())
    assert [s["load"] for s in combined["steps"]] == [1.0, 4.0]
    tsv = (out / "sweep.tsv").read_text().splitlines()
    assert tsv[0].startswith("load\trequests\tthroughput_rps\tgoodput_rps")
    assert len(tsv) == 3
    assert (out / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "sweep.html").read_text()
    assert "<svg" in page and "<table>" in page and "src=" not in page  # self-contained


def test_sweep_stops_early_on_stop_when(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    chart = tmp_path / "chart.png"
    with serve_target() as target:
        code, stdout, _ = _invoke(
            "sweep", f"{target.url}/status/503", "--rates", "20:60:20", "-d", "0.5s", "-w", "0s",
            "-o", str(out), "--chart", str(chart), "--stop-when", "errors>50%", "--max-lag", "1s",
        )  # fmt: skip
    assert code == 0, stdout
    assert [p.name for p in out.glob("step-*.json")] == ["step-00-20rps.json"]
    assert "stopped: errors>50%" in (out / "sweep.tsv").read_text()
    assert chart.exists() and chart.with_suffix(".html").exists()


def test_capacity_finds_the_knee_of_a_two_worker_server() -> None:
    # Two workers of 20 ms: capacity 100 req/s. Past it the queue, and p99, grow fast.
    with serve_target() as target:
        base = BenchOptions(url=f"{target.url}/slots/2/20", rate=1.0, duration_s=0.6, max_lag_s=1.0)
        search = find_capacity(
            base, parse_slo("p99<150ms,errors<1%"), start_rate=30, max_rate=1000,
            precision=0.15, max_steps=8,
        )  # fmt: skip
    assert search.inconclusive == ""
    assert search.last_pass is not None and search.first_fail is not None
    assert [s.rate for s in search.steps[:3]] == [30, 60, 120]  # bracket by doubling
    assert 60 <= search.last_pass.rate < search.first_fail.rate <= 120
    assert search.first_fail.rate - search.last_pass.rate <= 0.15 * search.last_pass.rate
    assert search.first_fail.verdicts[0].passed is False  # the p99 clause failed


def test_capacity_cli_prints_evidence_and_exits_0(tmp_path: Path) -> None:
    path = tmp_path / "capacity.json"
    with serve_target() as target:
        code, stdout, _ = _invoke(
            "capacity", f"{target.url}/slots/2/20", "--slo", "p99<150ms", "--start-rate", "40",
            "--precision", "0.3", "-d", "0.6s", "-w", "0s", "--json", str(path),
            "--max-lag", "1s",
        )  # fmt: skip
    assert code == 0, stdout
    assert "last passing step" in stdout and "first failing step" in stdout
    assert "PASS p99<150ms" in stdout and "FAIL p99<150ms" in stdout
    data = json.loads(path.read_text())
    assert 40 <= data["capacity_rps"] < data["first_fail_rate"] <= 160


def test_capacity_exits_1_when_even_the_start_rate_fails() -> None:
    with serve_target() as target:
        code, stdout, _ = _invoke(
            "capacity", f"{target.url}/status/500", "--slo", "errors<1%", "--start-rate", "20",
            "-d", "0.3s", "-w", "0s", "--max-lag", "1s",
        )  # fmt: skip
    assert code == 1
    assert "no rate met" in stdout


def test_sweep_step_the_generator_cannot_drive_ends_it_with_exit_3(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    with serve_target() as target:
        code, _, err = _invoke(
            "sweep", f"{target.url}/ok", "--rates", "50,100", "-d", "0.4s", "-w", "0s",
            "-o", str(out), "--max-lag", "1us",
        )  # fmt: skip
    assert code == 3
    assert "generator saturated" in err
    rows = (out / "sweep.tsv").read_text().splitlines()
    assert len(rows) == 2  # header and the one refused step: the sweep stopped there
    assert "generator saturated" in rows[1]
    assert not list(out.glob("step-*.json"))  # no result reported for it


def test_capacity_is_inconclusive_when_the_generator_cannot_drive_a_step() -> None:
    with serve_target() as target:
        code, stdout, _ = _invoke(
            "capacity", f"{target.url}/ok", "--slo", "p99<1s", "--start-rate", "20",
            "-d", "0.3s", "-w", "0s", "--max-lag", "1us",
        )  # fmt: skip
    # Not even the first step could be driven: no rate is claimed, and no failure either.
    assert code == 3
    assert "capacity: unknown, the generator could not drive 20 req/s" in stdout
