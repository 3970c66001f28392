"""Headroom: a slot over the estimate kept only while it measurably adds throughput
(a job handed ahead to a worker). The trial alone on crafted completions, then
``Little`` on a saturated origin with and without a dispatch overhead, and the
simulator's closed loop that retries at once (issue 13's case), all in virtual time."""

from __future__ import annotations

import random

import pytest

from limit_feeds import feed_fifo_origin
from loadshed.errors import ConfigError
from loadshed.limits.base import Sample
from loadshed.limits.headroom import HeadroomTrial, TrialVerdict
from loadshed.limits.little import Little
from loadshed.sim.scenarios import LimiterConfig, ParadoxScenario, ServiceConfig


def run_trial(trial: HeadroomTrial, gap_at: dict[int, float], jitter: float = 0.0) -> TrialVerdict:
    """Complete requests one gap apart, the gap set by the trial's current limit."""
    rng = random.Random(3)
    now = 0.0
    for _ in range(10_000):
        now += gap_at[trial.limit] * (1 + jitter * rng.uniform(-1, 1))
        verdict = trial.record(now, dropped=False, queued=3)
        if verdict is not TrialVerdict.RUNNING:
            return verdict
    raise AssertionError("the trial never ended")


def test_a_clear_gain_wins_the_trial() -> None:
    assert run_trial(HeadroomTrial(1, 2), {1: 0.026, 2: 0.025}) is TrialVerdict.GAIN


def test_no_gain_loses_it() -> None:
    assert run_trial(HeadroomTrial(1, 2), {1: 0.025, 2: 0.025}) is TrialVerdict.NO_GAIN


def test_a_gain_below_the_minimum_loses_however_clear() -> None:
    assert run_trial(HeadroomTrial(4, 5), {4: 0.01005, 5: 0.0100}) is TrialVerdict.NO_GAIN


def test_a_gain_lost_in_the_noise_loses() -> None:
    # 4 % on average, but gaps that vary +-60 %: the windows (at most 128) cannot tell
    trial = HeadroomTrial(1, 2)
    assert run_trial(trial, {1: 0.026, 2: 0.025}, jitter=0.6) is TrialVerdict.NO_GAIN
    assert trial.window == trial.max_window  # sized by the spread, up to the cap


def test_windows_grow_with_the_spread_the_first_one_measured() -> None:
    quiet, noisy = HeadroomTrial(1, 2), HeadroomTrial(1, 2)
    assert run_trial(quiet, {1: 0.026, 2: 0.025}) is TrialVerdict.GAIN
    assert run_trial(noisy, {1: 0.026, 2: 0.025}, jitter=0.15) is TrialVerdict.GAIN
    assert quiet.window == 16 < noisy.window


def test_a_drop_ends_the_trial_without_headroom() -> None:
    trial = HeadroomTrial(1, 2)
    assert trial.record(0.1, dropped=False, queued=1) is TrialVerdict.RUNNING
    assert trial.record(0.2, dropped=True, queued=1) is TrialVerdict.DROPPED


def test_demand_that_does_not_fill_the_limit_measures_nothing() -> None:
    trial = HeadroomTrial(1, 2)
    verdicts = [trial.record(0.01 * i, dropped=False, queued=0) for i in range(1, 10)]
    assert TrialVerdict.UNSATURATED in verdicts


def test_clients_with_no_room_for_a_job_more_get_no_headroom() -> None:
    # A clear gain, but a fifth of the requests finish within 10 ms of their deadline
    trial = HeadroomTrial(1, 2, min_slack=0.05)
    now, verdict, count = 0.0, TrialVerdict.RUNNING, 0
    while verdict is TrialVerdict.RUNNING:
        now += 0.026 if trial.limit == 1 else 0.025
        count += 1
        verdict = trial.record(now, dropped=False, queued=3, slack=0.01 if count % 5 else 1.0)
    assert verdict is TrialVerdict.TIGHT


def test_a_higher_window_needs_no_demand_beyond_it() -> None:
    # Two clients at two slots: nobody waits for admission at the higher limit, and
    # its throughput is still measured (it can only read lower for it).
    trial = HeadroomTrial(1, 2)
    now, verdict = 0.0, TrialVerdict.RUNNING
    while verdict is TrialVerdict.RUNNING:
        high = trial.limit == 2
        now += 0.025 if high else 0.026
        verdict = trial.record(now, dropped=False, queued=0 if high else 1)
    assert verdict is TrialVerdict.GAIN


def test_the_limits_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="low < high"):
        HeadroomTrial(2, 2)


@pytest.mark.parametrize(
    ("workers", "service", "dispatch", "headroom"),
    [
        (1, 0.025, 0.001, 1),  # a 25 ms model, 1 ms to hand it the next job: 4 % idle
        (1, 0.025, 0.0, 0),  # nothing to gain
        (1, 0.5, 0.001, 0),  # 0.2 % to gain: not worth a queued job of latency
        (4, 0.1, 0.0, 0),
    ],
)
def test_little_keeps_a_slot_ahead_only_where_it_adds_throughput(
    workers: int, service: float, dispatch: float, headroom: int
) -> None:
    little = Little(headroom=True)
    feed_fifo_origin(little, workers=workers, service=service, seconds=120, dispatch=dispatch)
    assert little.headroom == headroom, little.describe()
    assert little.limit in (workers + headroom, workers + headroom + 1), little.describe()


def test_headroom_never_inflates_the_estimate() -> None:
    # The jobs held ahead queue; were their latency taken for the minimum, the
    # estimate would grow with the headroom and the limit run away.
    little = Little(headroom=True)
    feed_fifo_origin(little, workers=1, service=0.025, seconds=300, dispatch=0.001)
    assert little.headroom == 1
    assert little.estimate() < 1.5
    assert little.limit <= 3


def test_jobs_held_ahead_count_a_trials_extra_slot() -> None:
    # The admission core reads a worker's service time as the time in flight x
    # (limit - held_ahead) / limit: a trial's extra slot holds a job ahead too.
    little = Little(headroom=True)
    seen: set[tuple[int, int, int]] = set()
    update = little.update

    def recording(sample: Sample) -> int:
        limit = update(sample)
        seen.add((little.headroom, little.held_ahead, limit))
        return limit

    little.update = recording  # type: ignore[method-assign]
    feed_fifo_origin(little, workers=1, service=0.025, seconds=60, dispatch=0.001)
    assert (0, 1, 2) in seen  # the first trial's higher windows, before any headroom
    assert (1, 1, 2) in seen  # the headroom it won
    assert all(ahead <= limit - 1 for _, ahead, limit in seen)
    assert Little().held_ahead == 0


def test_drops_give_the_headroom_back() -> None:
    little = Little(headroom=True)
    feed_fifo_origin(little, workers=1, service=0.025, seconds=60, dispatch=0.001)
    assert little.headroom == 1
    now = 61.0
    for _ in range(40):
        now += 0.05
        little.update(Sample(rtt=0.05, inflight=2, dropped=True, now=now, queued=3))
    assert little.headroom == 0


def paradox_goodput(
    limit: str,
    dispatch: float,
    service: float = 0.025,
    timeout: float = 2.0,
    clients: int = 4,
) -> float:
    scenario = ParadoxScenario(
        limiter=LimiterConfig(limit),
        clients=(clients,),
        workers=1,
        service=ServiceConfig(service),
        timeout=timeout,
        send_deadline=False,
        duration=30.0,
        dispatch_delay=dispatch,
    )
    ratio = scenario.run()["steps"][0]["goodput_ratio"]
    assert isinstance(ratio, float)
    return ratio


def test_clients_that_retry_at_once_keep_the_worker_fed() -> None:
    # Issue 13 in virtual time: a 25 ms model, 1 ms of dispatch, 4 clients that come
    # straight back. A limit of 1 idles the worker 1 ms per job; one job ahead does not.
    little = paradox_goodput("little+headroom", 0.001)
    assert little >= paradox_goodput("fixed:2", 0.001) - 0.01
    assert little > paradox_goodput("fixed:1", 0.001) + 0.02
    assert little >= paradox_goodput("none", 0.001) - 0.01


def test_impatient_clients_keep_the_limit_at_the_workers() -> None:
    # Issue 18's set-up with a dispatch trip: 50 ms of work, clients that leave after
    # 200 ms and send no deadline. A job held ahead would cost each request 50 ms of
    # its 200 (fixed:2: a quarter of capacity); the learned patience leaves no room.
    little = paradox_goodput("little+headroom", 0.001, service=0.05, timeout=0.2)
    assert little >= paradox_goodput("fixed:1", 0.001, service=0.05, timeout=0.2) - 0.005
    assert paradox_goodput("fixed:2", 0.001, service=0.05, timeout=0.2) < 0.5


def test_two_clients_are_enough_for_a_slot_ahead() -> None:
    # Two clients on one 25 ms worker: at two slots nobody waits for admission, so a
    # trial's high windows read unsaturated; they were judged so and the trial ended
    # (0.963 of capacity, as at fixed:1). Only the limit's own windows need demand
    # beyond them: a high window that lacks it can only read less throughput.
    little = paradox_goodput("little+headroom", 0.001, clients=2)
    assert little >= paradox_goodput("fixed:2", 0.001, clients=2) - 0.01
    assert little > paradox_goodput("fixed:1", 0.001, clients=2) + 0.02


def test_a_probe_backed_off_by_drops_does_not_step_up() -> None:
    # 64 clients that retry at once and leave after 100 ms (2 services): a probe to
    # 2 slots times clients out, most of its round drops, and the back-off takes the
    # limit back to 1. Judged as a probe at its base (no slot added), the next round
    # passed and stepped up, doubling: 1, 3, 5, 9, ..., 65 slots, 0.70 of capacity.
    little = paradox_goodput("little+headroom", 0.001, service=0.05, timeout=0.1, clients=64)
    assert little >= 0.9


def test_headroom_is_off_by_default() -> None:
    little = Little()
    feed_fifo_origin(little, workers=1, service=0.025, seconds=60, dispatch=0.001)
    assert (little.headroom, little.limit) == (0, 1)
    # without it, the worker idles the dispatch trip after each job, as at fixed:1
    assert paradox_goodput("little", 0.001) < paradox_goodput("little+headroom", 0.001) - 0.02


def test_headroom_must_be_a_bool() -> None:
    with pytest.raises(ConfigError, match="headroom"):
        Little(headroom="yes")  # type: ignore[arg-type]


def test_a_client_leaving_the_queue_gives_a_slot_back() -> None:
    little = Little(headroom=True)
    feed_fifo_origin(little, workers=1, service=0.025, seconds=60, dispatch=0.001)
    assert (little.headroom, little.limit) == (1, 2)
    little.gave_up(61.0)
    assert (little.headroom, little.limit) == (0, 1)
