"""The issue's "must show" targets for the default ``little`` limit, in the simulator.

E1 (throughput paradox): goodput >= 97 % of capacity at every client count with no
hand-set limit, where no limiter falls below 25 % from 4 clients on. E2 (capacity
change): after the model slows from 1 s to 2 s, goodput >= 94 % of the new capacity
with client deadlines and >= 90 % without (learned patience), and the limit settles
within 10 s. Client counts 32 and 64 are in ``bench/sim_compare.py`` (their fast-503
retry storms take longer than a unit test should).
"""

from __future__ import annotations

import pytest

from loadshed.sim.scenarios import LimiterConfig, run_capacity_change, run_paradox

E1_CLIENTS = [1, 2, 3, 4, 5, 8, 16]


@pytest.fixture(scope="module")
def e1_little() -> dict[int, dict[str, float]]:
    result = run_paradox(limiter=LimiterConfig("little"), clients=E1_CLIENTS, duration=30)
    return {step["clients"]: step for step in result["steps"]}


@pytest.mark.parametrize("clients", E1_CLIENTS)
def test_e1_little_holds_goodput_at_every_client_count(
    e1_little: dict[int, dict[str, float]], clients: int
) -> None:
    step = e1_little[clients]
    # 30 s at 2 req/s counts whole requests: 59 of 60 is 0.983
    assert step["goodput_ratio"] >= 0.97, step
    assert step["p99_success_s"] < 2.0  # under the client timeout
    assert step["timed_out"] <= 1


def test_e1_without_a_limiter_collapses() -> None:
    result = run_paradox(limiter=LimiterConfig("none"), clients=[4, 5, 8, 16, 64], duration=30)
    assert all(step["goodput_ratio"] < 0.25 for step in result["steps"])


@pytest.mark.parametrize(
    ("deadlines", "target"),
    [(True, 0.94), (False, 0.90)],  # without deadlines: the learned patience
)
def test_e2_little_recovers_after_the_capacity_drop(deadlines: bool, target: float) -> None:
    result = run_capacity_change(limiter=LimiterConfig("little"), send_deadline=deadlines)
    after = result["steps"][1]
    assert after["phase"] == "after"
    assert after["goodput_ratio"] >= target, after
    assert after["p99_success_s"] <= 2.5
    assert result["converge_s"] is not None
    assert result["converge_s"] <= 10.0
