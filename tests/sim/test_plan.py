"""``loadshed plan``: Little's law, Erlang C, the profiler and the command line."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from loadshed.errors import ConfigError
from loadshed.sim.plan import erlang_c_wait, load_callable, make_plan, plan, profile, t95


def test_e2_before_and_after_the_change() -> None:
    before = make_plan(7, 1.0, 2.5, rate=5)
    assert before.capacity_rps == 7.0
    assert before.inflight_at_rate == 5.0
    assert before.queue_allowed == 10  # 1.5 s of slack drains 10 requests at 7/s
    assert before.recommended_limit == 7
    assert before.recommended_max_queue_wait_s == 1.5
    assert before.overloaded is False
    after = make_plan(7, 2.0, 2.5, rate=5)
    assert after.capacity_rps == 3.5
    assert after.queue_allowed == 1
    assert after.overloaded is True
    assert after.shed_rps == pytest.approx(1.5)
    assert after.expected_queue_wait_s is None


def test_erlang_c_matches_textbook_values() -> None:
    # M/M/1 at rho 0.5: Wq = rho / (mu - lambda) = 1 s
    assert erlang_c_wait(1, 1.0, 0.5) == pytest.approx(1.0)
    # M/M/2 with a = 1 erlang: C = 1/3, Wq = C / (c mu - lambda) = 1/3 s
    assert erlang_c_wait(2, 1.0, 1.0) == pytest.approx(1 / 3)
    assert erlang_c_wait(2, 1.0, 2.0) is None
    # many workers do not overflow
    assert erlang_c_wait(500, 1.0, 400.0) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((0, 1.0, 2.0), "workers"),
        ((1, 0.0, 2.0), "service_time"),
        ((1, 1.0, 0.0), "timeout"),
        ((1, 2.0, 1.0), "timeout"),
    ],
)
def test_nonsense_is_refused(args: tuple[int, float, float], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        make_plan(*args)
    assert caught.value.field == field
    with pytest.raises(ConfigError, match="rate"):
        make_plan(1, 1.0, 2.0, rate=-1.0)


def test_t_quantiles() -> None:
    assert t95(1) == 12.706
    assert t95(9) == 2.262
    assert 1.96 <= t95(200) <= t95(40) <= t95(30)


def test_profile_warms_up_repeats_and_reports_an_interval() -> None:
    calls: list[int] = []
    ticks = itertools.count()

    def timer() -> float:
        # a fake clock in ms: every reading advances it by 1, the call by size/1000
        return next(ticks) / 1000

    def function(size: int) -> None:
        calls.append(size)
        for _ in range(size // 1000):
            next(ticks)

    measured = profile(function, [1000, 3000], warmup=2, runs=4, timer=timer)
    assert calls == [1000] * 6 + [3000] * 6
    assert [m.size for m in measured] == [1000, 3000]
    assert measured[0].mean_s == pytest.approx(0.002)
    assert measured[1].mean_s == pytest.approx(0.004)
    assert measured[0].ci95_s == pytest.approx(0.0)
    assert measured[0].runs == 4
    with pytest.raises(ConfigError, match="runs"):
        profile(function, [1], runs=1)


def test_load_callable_errors_name_the_flag() -> None:
    assert load_callable("math:factorial")(5) == 120
    for spec in ("math", "nope_module_x:f", "math:nope"):
        with pytest.raises(ConfigError) as caught:
            load_callable(spec)
        assert caught.value.field == "profile"


def test_cli_plan_json() -> None:
    result = CliRunner().invoke(
        plan,
        ["--workers", "7", "--service-time", "1s", "--timeout", "2.5s", "--rate", "5", "--json"],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["capacity_rps"] == 7.0
    assert data["queue_allowed"] == 10
    assert data["overloaded"] is False


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--workers", "-1", "--service-time", "1s", "--timeout", "2s"], "--workers"),
        (["--workers", "1", "--service-time", "5x", "--timeout", "2s"], "--service-time"),
        (["--workers", "1", "--service-time", "2s", "--timeout", "1s"], "--timeout"),
        (["--workers", "1", "--timeout", "2s"], "--service-time"),
        (["--workers", "1", "--timeout", "2s", "--profile", "math:factorial"], "--sizes"),
        (
            ["--workers", "1", "--timeout", "2s", "--profile", "math:factorial", "--sizes", "9:1"],
            "--sizes",
        ),
        (["--workers", "1", "--timeout", "2s", "--profile", "x", "--sizes", "1"], "--profile"),
    ],
)
def test_cli_bad_input_exits_2_naming_the_flag(args: list[str], flag: str) -> None:
    result = CliRunner().invoke(plan, args)
    assert result.exit_code == 2
    error_lines = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(error_lines) == 1
    assert flag in error_lines[0]
    assert "Traceback" not in result.output


def test_cli_profile_plans_from_measurements(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "plan_target_mod.py").write_text("def work(size):\n    return sum(range(size))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    result = CliRunner().invoke(
        plan,
        [
            "--workers", "2", "--timeout", "1s", "--rate", "10",
            "--profile", "plan_target_mod:work", "--sizes", "1000:21000:10000",
            "--runs", "5", "--warmup", "1", "--json",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    sizes = data["sizes"]
    assert [s["size"] for s in sizes] == [1000, 11000, 21000]
    assert all(s["runs"] == 5 and s["mean_s"] > 0 and s["ci95_s"] >= 0 for s in sizes)
    assert sizes[-1]["plan"]["capacity_rps"] == pytest.approx(2 / sizes[-1]["mean_s"])
    assert sizes[0]["plan"]["overloaded"] is False
    sys.modules.pop("plan_target_mod", None)


def test_cli_profile_fits_the_starting_cost_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A function whose time is 2 ms + 0.1 ms per unit: the fitted line is the cost
    model admission can start from."""
    (tmp_path / "plan_cost_mod.py").write_text(
        "import time\ndef work(size):\n    time.sleep(0.002 + 0.0001 * size)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    result = CliRunner().invoke(
        plan,
        [
            "--workers", "2", "--timeout", "1s",
            "--profile", "plan_cost_mod:work", "--sizes", "10,100,200",
            "--runs", "3", "--warmup", "1", "--json",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    model = json.loads(result.output)["cost_model"]
    assert model["slope_s_per_unit"] == pytest.approx(0.0001, rel=0.3)
    assert 0.0 <= model["intercept_s"] < 0.01
    from loadshed.config import AdmissionConfig

    AdmissionConfig(initial_cost_model=(model["intercept_s"], model["slope_s_per_unit"]))
    sys.modules.pop("plan_cost_mod", None)
