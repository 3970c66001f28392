"""The limit algorithms: factory, validation, invariants and each peer's published rules.

Every test feeds ``Sample`` sequences in virtual time (``Sample.now``); nothing sleeps.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadshed.errors import ConfigError
from loadshed.limits import (
    AIMD,
    LIMIT_NAMES,
    Fixed,
    Gradient,
    Gradient2,
    LimitAlgorithm,
    Little,
    Sample,
    Vegas,
    Windowed,
    make_limit,
)


def feed(
    algo: LimitAlgorithm,
    rtt: float,
    *,
    inflight: int | None = None,
    dropped: bool = False,
    now: float = 0.0,
) -> int:
    """One sample; ``inflight`` defaults to the current limit (a busy limiter)."""
    busy = algo.limit if inflight is None else inflight
    return algo.update(Sample(rtt=rtt, inflight=busy, dropped=dropped, now=now))


# -- make_limit ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "cls"),
    [
        ("little", Little),
        ("aimd", AIMD),
        ("vegas", Vegas),
        ("gradient2", Gradient2),
        ("gradient", Gradient),
        ("  AIMD ", AIMD),
        ("fixed:8", Fixed),
        ("8", Fixed),
        (8, Fixed),
    ],
)
def test_make_limit_builds_each_name(spec: str | int, cls: type[LimitAlgorithm]) -> None:
    algo = make_limit(spec)
    assert type(algo) is cls
    assert algo.min_limit <= algo.limit <= algo.max_limit


def test_make_limit_fixed_value_and_fresh_instances() -> None:
    assert make_limit("fixed:12").limit == 12
    assert make_limit(3).limit == 3
    assert make_limit("aimd") is not make_limit("aimd")  # algorithms hold state


def test_make_limit_returns_an_instance_unchanged() -> None:
    vegas = Vegas(initial_limit=7)
    assert make_limit(vegas) is vegas


def test_limit_names_cover_the_factory() -> None:
    assert set(LIMIT_NAMES) == {
        "little",
        "little+headroom",
        "aimd",
        "vegas",
        "gradient2",
        "gradient",
        "fixed",
    }
    for name in LIMIT_NAMES:
        make_limit("fixed:1" if name == "fixed" else name)


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "bogus",
        "fixed",
        "fixed:",
        "fixed:0",
        "fixed:-3",
        "fixed:x",
        "fixed:2.5",
        "0",
        "-1",
        0,
        -4,
        True,
        2.5,
        None,
        "aimd:3",
        "fixed:²",
    ],
)
def test_make_limit_rejects_bad_specs_naming_allowed_values(spec: object) -> None:
    with pytest.raises(ConfigError) as info:
        make_limit(spec)  # type: ignore[arg-type]
    assert info.value.field == "limit"
    assert "little|little+headroom|aimd|vegas|gradient2|gradient|fixed:N" in str(info.value)
    assert "\n" not in str(info.value)


# -- construction-time validation ------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: Fixed(0), "limit"),
        (lambda: AIMD(min_limit=0), "min_limit"),
        (lambda: AIMD(min_limit=5, max_limit=4, initial_limit=4), "max_limit"),
        (lambda: AIMD(initial_limit=500), "initial_limit"),
        (lambda: AIMD(backoff_ratio=1.0), "backoff_ratio"),
        (lambda: AIMD(backoff_ratio=0.2), "backoff_ratio"),
        (lambda: AIMD(timeout=0.0), "timeout"),
        (lambda: AIMD(timeout=math.inf), "timeout"),
        (lambda: Vegas(smoothing=0.0), "smoothing"),
        (lambda: Vegas(probe_multiplier=0), "probe_multiplier"),
        (lambda: Vegas(initial_limit=0), "initial_limit"),
        (lambda: Vegas(min_limit=0, initial_limit=0), "min_limit"),
        (lambda: Gradient2(smoothing=1.5), "smoothing"),
        (lambda: Gradient2(queue_size=-1), "queue_size"),
        (lambda: Gradient2(long_window=0), "long_window"),
        (lambda: Gradient2(rtt_tolerance=0.9), "rtt_tolerance"),
        (lambda: Gradient2(drop_backoff=1.0), "drop_backoff"),
        (lambda: Gradient(update_interval=0), "update_interval"),
        (lambda: Gradient(probe_interval=-1), "probe_interval"),
        (lambda: Gradient(probe_timeout=0), "probe_timeout"),
        (lambda: Gradient(percentile=0), "percentile"),
        (lambda: Gradient(percentile=1.5), "percentile"),
        (lambda: Gradient(buffer=-0.1), "buffer"),
        (lambda: Gradient(probe_jitter=2), "probe_jitter"),
        (lambda: Gradient(probe_requests=0), "probe_requests"),
        (lambda: Gradient(probe_limit=0), "probe_limit"),
        (lambda: Gradient(drop_backoff=0.1), "drop_backoff"),
        (lambda: Gradient(max_limit=2000, initial_limit=3000), "initial_limit"),
    ],
)
def test_invalid_parameters_fail_at_construction(
    build: Callable[[], LimitAlgorithm], field: str
) -> None:
    with pytest.raises(ConfigError) as info:
        build()
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")


def test_published_defaults_are_the_peers() -> None:
    aimd = AIMD.published()
    assert (aimd.limit, aimd.min_limit, aimd.max_limit) == (20, 20, 200)
    assert (aimd.backoff_ratio, aimd.timeout) == (0.9, 5.0)
    vegas = Vegas.published()
    assert (vegas.limit, vegas.min_limit, vegas.max_limit) == (20, 1, 1000)
    g2 = Gradient2.published()
    assert (g2.limit, g2.min_limit, g2.max_limit) == (20, 20, 200)
    assert (g2.smoothing, g2.queue_size, g2.long_window, g2.rtt_tolerance) == (0.2, 4, 600, 1.5)
    assert g2.drop_backoff is None
    envoy = Gradient.published()
    assert (envoy.limit, envoy.min_limit, envoy.max_limit) == (3, 3, 1000)
    assert (envoy.buffer, envoy.percentile, envoy.probe_requests, envoy.probe_limit) == (
        0.25,
        0.5,
        50,
        3,
    )
    assert envoy.probing  # Envoy starts by measuring the min RTT


def test_our_defaults_suit_model_endpoints() -> None:
    for algo in (AIMD(), Vegas(), Gradient2(), Gradient()):
        assert algo.min_limit == 1, algo.name  # a one-worker model can be run one at a time
        assert algo.limit <= 4, algo.name  # a fresh deploy does not queue 20 deep
        assert algo.max_limit >= 64, algo.name  # 64 workers are reachable


# -- invariant: any samples give an int within [min, max] -------------------------------

FACTORIES: list[Callable[[], LimitAlgorithm]] = [
    lambda: Fixed(5),
    AIMD,
    AIMD.published,
    Vegas,
    Vegas.published,
    lambda: Vegas(smoothing=0.3, seed=3),
    Gradient2,
    Gradient2.published,
    Gradient,
    Gradient.published,
    Little,
    lambda: Windowed(AIMD()),
    lambda: Windowed(Vegas.published(), window=0.5, min_samples=2),
    lambda: Windowed(Gradient2(), window=0.1, min_samples=1),
    lambda: Windowed(Gradient(update_interval=0.05), window=0.01, min_samples=1),
    lambda: Windowed(Little(), window=0.2, min_samples=3),
]

RTTS = st.one_of(
    st.sampled_from([0.0, 1e-9, 50e-6, 1e-3, 0.1, 1.0, 5.0, 30.0, 1e6, 1e12]),
    st.floats(min_value=0.0, max_value=1e9, allow_nan=False, allow_infinity=False),
)
STEPS = st.lists(
    st.tuples(
        RTTS,
        st.integers(min_value=0, max_value=100_000),
        st.booleans(),
        st.one_of(st.just(0.0), st.floats(min_value=0.0, max_value=120.0)),
    ),
    max_size=300,
)


@pytest.mark.parametrize("factory", FACTORIES, ids=lambda f: repr(f()))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=STEPS)
def test_limit_is_always_an_int_within_bounds(
    factory: Callable[[], LimitAlgorithm], steps: list[tuple[float, int, bool, float]]
) -> None:
    algo = factory()
    assert isinstance(algo.limit, int)
    assert 1 <= algo.min_limit <= algo.limit <= algo.max_limit
    now = 0.0
    for rtt, inflight, dropped, advance in steps:
        now += advance
        returned = algo.update(Sample(rtt=rtt, inflight=inflight, dropped=dropped, now=now))
        assert returned == algo.limit
        assert type(returned) is int
        assert 1 <= algo.min_limit <= returned <= algo.max_limit


@pytest.mark.parametrize("factory", FACTORIES[:11], ids=lambda f: repr(f()))
def test_long_runs_of_extreme_samples_stay_in_bounds(factory: Callable[[], LimitAlgorithm]) -> None:
    algo = factory()
    rng = random.Random(11)
    now = 0.0
    for i in range(20_000):
        now += rng.choice([0.0, 1e-4, 0.01, 1.0])
        rtt = rng.choice([0.0, 1e-6, 0.01, 0.1, 5.0, 1e9])
        inflight = rng.choice([0, 1, algo.limit, 10 * algo.limit])
        algo.update(Sample(rtt=rtt, inflight=inflight, dropped=i % 7 == 0, now=now))
        assert algo.min_limit <= algo.limit <= algo.max_limit


@pytest.mark.parametrize("factory", [AIMD, Vegas, Gradient2, Gradient])
@pytest.mark.parametrize("rtt", [math.nan, math.inf, -1.0])
def test_unusable_rtts_are_ignored(factory: Callable[[], LimitAlgorithm], rtt: float) -> None:
    algo = factory()
    for i in range(200):
        algo.update(Sample(rtt=rtt, inflight=algo.limit, dropped=False, now=i * 0.1))
        assert algo.min_limit <= algo.limit <= algo.max_limit


# -- AIMD --------------------------------------------------------------------------------


def test_aimd_backs_off_by_its_ratio_on_a_drop_and_on_timeout() -> None:
    aimd = AIMD(initial_limit=50, min_limit=1, max_limit=200, timeout=5.0)
    assert feed(aimd, 0.1, dropped=True) == 45  # floor(50 * 0.9)
    assert feed(aimd, 5.1) == 40  # rtt > timeout: floor(45 * 0.9)
    assert feed(aimd, 5.0) == 41  # exactly the timeout is not beyond it: +1 (busy)


def test_aimd_grows_by_one_when_busy_and_keeps_when_app_limited() -> None:
    aimd = AIMD(initial_limit=40, min_limit=1, max_limit=200)
    assert feed(aimd, 0.1, inflight=20) == 41  # 2 * 20 >= 40
    assert feed(aimd, 0.1, inflight=20) == 41  # 2 * 20 < 41: app-limited, keep
    assert feed(aimd, 1e6, inflight=41) == 42  # no timeout by default: latency alone is no drop


def test_aimd_clamps_to_its_bounds() -> None:
    published = AIMD.published()
    assert feed(published, 0.1, dropped=True) == 20  # floor(18) clamped to min 20
    top = AIMD(initial_limit=128)
    assert feed(top, 0.1) == 128
    small = AIMD(initial_limit=1)
    assert feed(small, 0.1, dropped=True) == 1  # floor(0.9) clamped to 1


# -- Vegas -------------------------------------------------------------------------------


def vegas_at(limit: int, noload: float = 0.1, **kwargs: object) -> Vegas:
    vegas = Vegas(initial_limit=limit, max_limit=1000, **kwargs)  # type: ignore[arg-type]
    feed(vegas, noload)  # first sample: sets rtt_noload, nothing else
    assert vegas.rtt_noload == noload and vegas.limit == limit
    return vegas


def rtt_for_queue(limit: int, queue_fraction: float, noload: float = 0.1) -> float:
    """The rtt at which L x (1 - noload / rtt) equals ``queue_fraction`` x L."""
    return noload / (1.0 - queue_fraction)


@pytest.mark.parametrize(
    ("queue_estimate", "expected"),
    [
        (0.5, 26),  # q = 1 <= threshold (1): L + beta (6)
        (1.5, 21),  # q = 2 < alpha (3): L + lg (1)
        (3.5, 20),  # q = 4 in [alpha, beta]: keep
        (5.5, 20),  # q = 6 = beta: keep
        (7.5, 19),  # q = 8 > beta: L - lg
    ],
)
def test_vegas_alpha_beta_threshold_branches(queue_estimate: float, expected: int) -> None:
    vegas = vegas_at(20)
    assert feed(vegas, rtt_for_queue(20, queue_estimate / 20)) == expected


def test_vegas_scales_its_thresholds_with_log10_of_the_limit() -> None:
    # L = 200: lg = 2, alpha = 6, beta = 12, threshold = 2.
    assert feed(vegas_at(200), rtt_for_queue(200, 1.5 / 200)) == 212  # q = 2: + beta
    assert feed(vegas_at(200), rtt_for_queue(200, 4.5 / 200)) == 202  # q = 5: + lg
    assert feed(vegas_at(200), rtt_for_queue(200, 9.5 / 200)) == 200  # q = 10: keep
    assert feed(vegas_at(200), rtt_for_queue(200, 12.5 / 200)) == 198  # q = 13: - lg
    assert feed(vegas_at(200), 0.1, dropped=True) == 198  # drop: - lg


def test_vegas_drop_and_app_limited() -> None:
    assert feed(vegas_at(20), 0.1, dropped=True) == 19
    # Half the limit unused: even a long queue estimate keeps the limit.
    assert feed(vegas_at(20), rtt_for_queue(20, 0.5), inflight=9) == 20
    assert feed(vegas_at(20), rtt_for_queue(20, 0.5), inflight=10) == 19


def test_vegas_smoothing_moves_part_way() -> None:
    vegas = vegas_at(20, smoothing=0.5)
    feed(vegas, 0.1)  # target 26, smoothed to 23
    assert vegas.limit == 23


def probe_after(vegas: Vegas, rtt: float, limit_before: int) -> int:
    """Feed app-limited samples (limit unchanged) until rtt_noload changes; return count."""
    before = vegas.rtt_noload
    for count in range(1, 5000):
        feed(vegas, rtt, inflight=0, now=count)
        assert vegas.limit == limit_before
        if vegas.rtt_noload != before:
            return count
    raise AssertionError("no probe")


def test_vegas_reprobes_rtt_noload_every_jittered_30_x_limit_samples() -> None:
    published = Vegas.published(seed=5)
    feed(published, 0.1)
    jitter = random.Random(5).uniform(0.5, 1.0)
    count = probe_after(published, 0.2, 20)
    # The first sample counted too: the probe fires once jitter x 30 x L are seen.
    assert count + 1 == math.ceil(jitter * 30 * 20)
    assert 0.5 * 30 * 20 <= count + 1 <= 30 * 20
    assert published.rtt_noload == 0.2  # the peer adopts the probe's own sample


def test_vegas_seeds_make_probes_repeatable() -> None:
    first = [probe_after(_fed(Vegas.published(seed=s)), 0.2, 20) for s in (1, 1, 2)]
    assert first[0] == first[1] and first[0] != first[2]


def _fed(vegas: Vegas) -> Vegas:
    feed(vegas, 0.1)
    return vegas


def test_our_vegas_probe_adopts_the_period_minimum() -> None:
    ours = Vegas(initial_limit=20, seed=5)
    feed(ours, 0.1)
    # The whole first period held the 0.1 s sample: the first probe keeps 0.1 s ...
    feed(ours, 0.3, inflight=0)
    for i in range(2000):
        feed(ours, 0.2 if i % 50 else 0.3, inflight=0, now=i)
    # ... and later probes adopt the lowest of their period (0.2), never a 0.3 outlier.
    assert ours.rtt_noload == 0.2


# -- Gradient2 ---------------------------------------------------------------------------


def test_gradient2_long_rtt_averages_the_first_ten_then_is_exponential() -> None:
    g2 = Gradient2.published()
    for i in range(1, 11):
        feed(g2, float(i), inflight=0)
    assert g2.long_rtt == pytest.approx(5.5)
    feed(g2, 5.0, inflight=0)
    assert g2.long_rtt == pytest.approx(5.5 * (1 - 2 / 601) + 5.0 * 2 / 601)


def g2_warm(limit: int, rtt: float = 0.1, **kwargs: object) -> Gradient2:
    g2 = Gradient2(initial_limit=limit, min_limit=1, max_limit=200, **kwargs)  # type: ignore[arg-type]
    for _ in range(10):
        feed(g2, rtt, inflight=0)
    return g2


@pytest.mark.parametrize("rtt", [0.12, 0.2, 0.25, 1.0, 100.0])
def test_gradient2_gradient_is_clamped_to_half_and_one(rtt: float) -> None:
    g2 = g2_warm(100)
    long_rtt = 0.1 * (1 - 2 / 601) + rtt * 2 / 601
    gradient = max(0.5, min(1.0, 1.5 * long_rtt / rtt))
    expected = 0.8 * 100 + 0.2 * (gradient * 100 + 4)
    assert feed(g2, rtt) == math.floor(expected)
    if rtt <= 0.15:
        assert feed(g2_warm(100), rtt) == 100  # within tolerance: gradient 1, + 0.8
    if rtt >= 0.5:
        assert g2.limit == 90  # floor(80 + 0.2 * (50 + 4)): gradient held at 0.5


def test_gradient2_grows_by_the_queue_term_at_stable_latency() -> None:
    g2 = g2_warm(20)
    for _ in range(5):
        feed(g2, 0.1)
    assert g2.limit == 24  # + 0.2 x 4 per sample: 20 + 5 x 0.8


def test_gradient2_drift_recovery() -> None:
    g2 = g2_warm(100, rtt=1.0)
    feed(g2, 0.1, inflight=0)
    ema = 1.0 * (1 - 2 / 601) + 0.1 * 2 / 601
    assert g2.long_rtt == pytest.approx(ema * 0.95)  # long / short > 2: shrink at once
    steady = g2_warm(100, rtt=1.0)
    feed(steady, 0.6, inflight=0)
    assert steady.long_rtt == pytest.approx(1.0 * (1 - 2 / 601) + 0.6 * 2 / 601)


def test_gradient2_keeps_the_limit_when_app_limited() -> None:
    g2 = g2_warm(100)
    assert feed(g2, 100.0, inflight=49) == 100
    assert feed(g2, 100.0, inflight=50) == 90


def test_gradient2_drops_ignored_by_the_peer_backed_off_by_ours() -> None:
    published = g2_warm(100, drop_backoff=None)
    assert feed(published, 0.1, dropped=True) == 100  # gradient 1: + 0.8, drop unseen
    ours = g2_warm(100)
    assert feed(ours, 0.1, dropped=True) == 90
    long_before = ours.long_rtt
    feed(ours, 5.0, dropped=True)
    assert ours.long_rtt == long_before  # a timed-out latency is not a latency sample


# -- Gradient (Envoy) --------------------------------------------------------------------


class Clocked:
    """Feeds a Gradient samples at a steady pace, tracking virtual time."""

    def __init__(self, algo: Gradient, step: float = 0.01) -> None:
        self.algo = algo
        self.now = 0.0
        self.step = step

    def send(self, rtt: float, *, inflight: int | None = None, dropped: bool = False) -> int:
        self.now += self.step
        return feed(self.algo, rtt, inflight=inflight, dropped=dropped, now=self.now)

    def until(self, condition: Callable[[], bool], rtt: float, limit: int = 100_000) -> int:
        for count in range(1, limit):
            self.send(rtt)
            if condition():
                return count
        raise AssertionError("condition never met")


def measured(algo: Gradient, rtt: float = 0.1) -> Clocked:
    clocked = Clocked(algo)
    clocked.until(lambda: not algo.probing, rtt)
    assert algo.min_rtt == rtt
    return clocked


def test_envoy_starts_pinned_until_probe_requests_are_gathered() -> None:
    envoy = Gradient.published()
    assert envoy.probing and envoy.limit == 3
    clocked = Clocked(envoy)
    assert clocked.until(lambda: not envoy.probing, 0.1) == 50
    assert envoy.min_rtt == 0.1 and envoy.limit == 3


def test_envoy_gradient_and_sqrt_headroom() -> None:
    envoy = Gradient.published()
    clocked = measured(envoy)
    for _ in range(10):  # one 100 ms interval of latencies at the min RTT
        clocked.send(0.1)
    clocked.send(0.1)  # first sample of the next interval closes the previous one
    x = 1.25 * 3  # gradient (1 + buffer) x min / p50
    assert envoy.limit == math.floor(x + math.sqrt(x))  # 5


@pytest.mark.parametrize(
    ("latency", "gradient"),
    [(0.001, 2.0), (0.1, 1.25), (0.125, 1.0), (0.2, 0.625), (10.0, 0.5)],
)
def test_envoy_gradient_clamped_to_half_and_two(latency: float, gradient: float) -> None:
    envoy = Gradient.published()
    clocked = measured(envoy)
    envoy._limit = 100  # white-box: a limit far from the bounds
    for _ in range(10):
        clocked.send(latency)
    clocked.send(latency)
    x = gradient * 100
    assert envoy.limit == math.floor(x + math.sqrt(x))


def test_envoy_uses_the_interval_p50() -> None:
    envoy = Gradient.published()
    clocked = measured(envoy)
    envoy._limit = 100
    for latency in (0.1, 0.1, 0.1, 5.0, 5.0):  # p50 = 0.1: the slow tail is ignored
        clocked.step = 0.02
        clocked.send(latency)
    clocked.send(0.1)
    x = 1.25 * 100
    assert envoy.limit == math.floor(x + math.sqrt(x))


def test_envoy_reprobe_is_jittered_pins_the_limit_and_re_measures() -> None:
    envoy = Gradient.published(seed=9)
    clocked = measured(envoy)
    measured_at = clocked.now
    due = measured_at + 60.0 + random.Random(9).uniform(0.0, 0.15 * 60.0)
    clocked.step = 0.05
    clocked.until(lambda: envoy.probing, 0.1)
    assert due <= clocked.now < due + clocked.step + 1e-9
    assert envoy.limit == 3  # pinned
    limit_before = envoy._deferred_limit
    assert limit_before > 3
    clocked.until(lambda: not envoy.probing, 0.08)
    assert envoy.min_rtt == 0.08
    assert envoy.limit == limit_before  # restored after the probe


def test_envoy_jitter_depends_on_the_seed_only() -> None:
    def probe_time(seed: int) -> float:
        envoy = Gradient.published(seed=seed)
        clocked = measured(envoy)
        clocked.step = 0.05
        clocked.until(lambda: envoy.probing, 0.1)
        return clocked.now

    assert probe_time(4) == probe_time(4)
    assert probe_time(4) != probe_time(5)


def test_envoy_five_intervals_at_the_minimum_trigger_a_re_measure() -> None:
    envoy = Gradient.published()
    clocked = measured(envoy)
    starts = envoy.probes_started
    for _ in range(5):  # p50 at 10 x min: gradient 0.5, limit floored at 3
        for _ in range(11):
            clocked.send(1.0)
        assert envoy.limit == 3
    clocked.until(lambda: envoy.probing, 1.0, limit=30)
    assert envoy.probes_started == starts + 1


def test_our_gradient_probe_never_raises_the_limit_and_ends_on_timeout() -> None:
    ours = Gradient(initial_limit=2, probe_requests=50, probe_timeout=1.0)
    assert ours.limit == 2  # min(initial, probe_limit)
    clocked = Clocked(ours, step=0.3)
    # The first request was admitted at 0.1 s; the probe is 1 s old at the 4th sample (1.2 s).
    assert clocked.until(lambda: not ours.probing, 0.2) == 4
    assert ours.limit == 2


@pytest.mark.parametrize(("min_rtt", "interval"), [(0.01, 0.1), (0.1, 0.2), (0.5, 1.0), (3.0, 6.0)])
def test_our_gradient_interval_is_two_min_rtts_at_least_100ms(
    min_rtt: float, interval: float
) -> None:
    ours = Gradient()
    assert ours.interval_length == 0.1  # before any measurement
    measured(ours, min_rtt)
    assert ours.interval_length == pytest.approx(interval)
    fixed = Gradient(update_interval=0.3)
    measured(fixed, min_rtt)
    assert fixed.interval_length == 0.3


def test_our_gradient_interval_spacing_in_practice() -> None:
    ours = Gradient(initial_limit=3)
    clocked = measured(ours, 0.5)  # intervals of 1 s
    limits = []
    for _ in range(250):  # 2.5 s at the min RTT: two intervals close
        clocked.send(0.5)
        limits.append(ours.limit)
    assert len(set(limits)) == 3  # 3 -> 5 -> 8 (x1.25 + sqrt per interval)
    assert limits[0] == 3 and limits[99] == 5 and limits[-1] == 8


# -- Windowed ----------------------------------------------------------------------------


def test_windowed_feeds_one_aggregate_per_window() -> None:
    windowed = Windowed(AIMD(initial_limit=10), window=1.0, min_samples=10)
    for i in range(10):
        windowed.update(Sample(rtt=0.1, inflight=10, dropped=i == 3, now=i * 0.12))
    assert windowed.limit == 9  # one aggregate with a drop: floor(10 x 0.9), not 0.9^1
    for i in range(10):
        windowed.update(Sample(rtt=0.1, inflight=10, dropped=False, now=2 + i * 0.12))
    assert windowed.limit == 10  # busy window: + 1


def test_windowed_gradient2_sees_window_averages() -> None:
    inner = Gradient2(initial_limit=10)
    windowed = Windowed(inner, window=0.5, min_samples=2)
    now = 0.0
    for _ in range(200):
        now += 0.1
        windowed.update(Sample(rtt=0.1, inflight=10, dropped=False, now=now))
    assert inner.long_rtt == pytest.approx(0.1)
    assert windowed.limit == inner.limit > 10


def test_windowed_close_on_drop_backs_off_once_per_round_trip() -> None:
    windowed = Windowed(
        AIMD(initial_limit=8, backoff_ratio=0.5), window=1.0, min_samples=10, close_on_drop=True
    )
    # the first refusal closes its window at once: no need to wait for 10 samples
    windowed.update(Sample(rtt=0.01, inflight=8, dropped=False, now=1.00))
    assert windowed.update(Sample(rtt=0.01, inflight=8, dropped=True, now=1.01)) == 4
    # refusals of calls admitted before that back-off saw the old limit: ignored
    for i in range(20):
        windowed.update(Sample(rtt=0.05, inflight=8, dropped=True, now=1.02 + i * 0.001))
    assert windowed.limit == 4
    # a call admitted after the back-off that is refused again halves once more
    assert windowed.update(Sample(rtt=0.01, inflight=4, dropped=True, now=1.2)) == 2
    # without close_on_drop the same refusals wait for a full window
    plain = Windowed(AIMD(initial_limit=8, backoff_ratio=0.5), window=1.0, min_samples=10)
    assert plain.update(Sample(rtt=0.01, inflight=8, dropped=True, now=1.01)) == 8
