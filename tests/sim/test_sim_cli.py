"""``loadshed simulate ...`` and ``loadshed demo`` through click, in-process."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from loadshed.cli import main
from loadshed.sim.cli import demo

PARADOX_SHORT = ["simulate", "paradox", "--clients", "1,4", "--duration", "10s"]


def _run(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(main, args)
    return result.exit_code, result.output


def test_paradox_json_is_byte_identical_for_a_seed() -> None:
    code, first = _run([*PARADOX_SHORT, "--limit", "little", "--seed", "5", "--json"])
    assert code == 0, first
    _, second = _run([*PARADOX_SHORT, "--limit", "little", "--seed", "5", "--json"])
    assert first == second
    data = json.loads(first)
    assert data["scenario"] == "paradox"
    assert data["limit"] == "little"
    assert [s["clients"] for s in data["steps"]] == [1, 4]


def test_paradox_none_vs_fixed_from_the_command_line() -> None:
    _, none = _run([*PARADOX_SHORT, "--limit", "none", "--json"])
    _, fixed = _run([*PARADOX_SHORT, "--limit", "fixed", "--limit-value", "1", "--json"])
    _, spec = _run([*PARADOX_SHORT, "--limit", "fixed:1", "--json"])
    assert json.loads(spec) == json.loads(fixed)  # fixed:N is --limit fixed --limit-value N
    none_steps = json.loads(none)["steps"]
    fixed_steps = json.loads(fixed)["steps"]
    assert json.loads(fixed)["limit"] == "fixed:1"
    assert none_steps[1]["goodput_ratio"] < 0.5
    assert fixed_steps[1]["goodput_ratio"] > 0.9
    assert none_steps[1]["mean_limit"] is None
    assert fixed_steps[1]["mean_limit"] == 1.0


def test_no_deadline_flag_reaches_the_clients() -> None:
    args = ["simulate", "capacity-change", "--duration", "20s", "--json"]
    _, with_deadline = _run(args)
    _, without = _run([*args, "--no-deadline"])
    assert json.loads(with_deadline)["deadlines"] is True
    assert json.loads(without)["deadlines"] is False


def test_dispatch_delay_idles_a_worker_with_nothing_handed_ahead() -> None:
    args = [
        "simulate", "paradox", "--service-time", "25ms", "--clients", "4", "--duration", "10s",
        "--no-deadline", "--json",
    ]  # fmt: skip
    _, plain = _run([*args, "--limit", "fixed:1"])
    code, slowed = _run([*args, "--limit", "fixed:1", "--dispatch-delay", "5ms"])
    _, ahead = _run([*args, "--limit", "fixed:2", "--dispatch-delay", "5ms"])
    assert code == 0, slowed
    assert json.loads(slowed)["settings"]["dispatch_delay_s"] == 0.005
    ratio = json.loads(slowed)["steps"][0]["goodput_ratio"]
    # one worker idles 5 ms per 25 ms job at a limit of 1; a job held ahead hides it
    assert ratio == pytest.approx(25 / 30, abs=0.02)
    assert json.loads(plain)["steps"][0]["goodput_ratio"] > 0.98
    assert json.loads(ahead)["steps"][0]["goodput_ratio"] > 0.98


def test_workers_to_changes_the_capacity_and_keeps_the_service_time() -> None:
    code, output = _run(
        [
            "simulate", "capacity-change", "--workers", "8", "--service-time", "100ms",
            "--workers-to", "4", "--rate", "60", "--limit", "fixed", "--limit-value", "8",
            "--duration", "20s", "--json",
        ]
    )  # fmt: skip
    assert code == 0, output
    data = json.loads(output)
    assert data["settings"]["workers_to"] == 4
    assert data["settings"]["change_to_s"] == 0.1  # the service time is kept
    before, after = data["steps"]
    assert before["capacity_rps"] == 80.0 and after["capacity_rps"] == 40.0
    # 60 req/s fit 8 workers; after half are gone only 40 can be served
    assert before["goodput_rps"] > 55
    assert 30 < after["goodput_rps"] <= 41


def test_capacity_change_json_has_before_and_after() -> None:
    code, output = _run(
        ["simulate", "capacity-change", "--limit", "aimd", "--duration", "20s", "--json"]
    )
    assert code == 0, output
    data = json.loads(output)
    assert [s["phase"] for s in data["steps"]] == ["before", "after"]
    assert data["capacity_rps"] == 3.5
    assert data["steps"][0]["capacity_rps"] == 7.0
    assert "converge_s" in data


def test_fleet_runs_and_prints_a_table() -> None:
    code, output = _run(
        ["simulate", "fleet", "--replicas", "5", "--duration", "9s", "--balancer", "random"]
    )
    assert code == 0, output
    for phase in ("before", "during", "after"):
        assert phase in output


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["simulate", "paradox", "--workers", "0"], "--workers"),
        (["simulate", "paradox", "--workers", "-3"], "--workers"),
        (["simulate", "paradox", "--limit", "magic"], "--limit"),
        (["simulate", "paradox", "--duration", "5x"], "--duration"),
        (["simulate", "paradox", "--timeout", "0"], "--timeout"),
        (["simulate", "paradox", "--timeout", "0.5ms"], "--timeout"),
        (["simulate", "paradox", "--clients", "64:1"], "--clients"),
        (["simulate", "paradox", "--limit", "fixed"], "--limit-value"),
        (["simulate", "paradox", "--limit", "fixed:0"], "--limit"),
        (["simulate", "paradox", "--limit", "fixed:2", "--limit-value", "3"], "--limit-value"),
        (["simulate", "paradox", "--limit-value", "0"], "--limit-value"),
        (["simulate", "paradox", "--service-time", "0"], "--service-time"),
        (["simulate", "paradox", "--origin-queue", "-1"], "--origin-queue"),
        (["simulate", "capacity-change", "--rate", "0"], "--rate"),
        (["simulate", "capacity-change", "--change-at", "10m"], "--change-at"),
        (["simulate", "capacity-change", "--discipline", "random"], "--discipline"),
        (["simulate", "capacity-change", "--workers-to", "0"], "--workers-to"),
        (["simulate", "capacity-change", "--dispatch-delay", "-1ms"], "--dispatch-delay"),
        (["simulate", "paradox", "--dispatch-delay", "soon"], "--dispatch-delay"),
        (["simulate", "fleet", "--replicas", "0"], "--replicas"),
        (["simulate", "fleet", "--balancer", "sticky"], "--balancer"),
        (["simulate", "fleet", "--slow-fraction", "2"], "--slow-fraction"),
        (["simulate", "fleet", "--service-dist", "uniform"], "--service-dist"),
        # Cost flags without costs were silently ignored.
        (["simulate", "capacity-change", "--cost-blind"], "--cost-blind"),
        (["simulate", "capacity-change", "--cost-fixed", "0.2"], "--cost-fixed"),
    ],
)
def test_bad_input_is_one_error_line_naming_the_flag(args: list[str], flag: str) -> None:
    code, output = _run(args)
    assert code == 2, output
    errors = [line for line in output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, output
    assert flag in errors[0]
    assert "Traceback" not in output


def test_simulated_demo_shows_the_paradox_and_its_cure() -> None:
    # `loadshed demo --sim` runs this command (plain `loadshed demo` is now live)
    result = CliRunner().invoke(demo, ["--json"])
    code, output = result.exit_code, result.output
    assert code == 0, output
    data = json.loads(output)
    none = {s["clients"]: s["goodput_ratio"] for s in data["none"]["steps"]}
    little = {s["clients"]: s["goodput_ratio"] for s in data["little"]["steps"]}
    assert none[64] < 0.25
    assert little[64] > none[64]
