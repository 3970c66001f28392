"""Arrival schedules, HDR results (merge, JSON) and SLO parsing: pure, no network."""

from __future__ import annotations

import itertools
import random
import statistics

import pytest
from hdrh.histogram import HdrHistogram
from hypothesis import given, settings
from hypothesis import strategies as st

from loadshed.errors import ConfigError
from loadshed.loadgen.options import BenchOptions
from loadshed.loadgen.results import LatencyHistogram, RunResult, merge_results
from loadshed.loadgen.schedule import arrival_offsets, inter_arrival_gaps
from loadshed.loadgen.slo import parse_slo

# -- schedules --------------------------------------------------------------------------------


def test_poisson_inter_arrival_mean_within_5_percent_over_10000_draws() -> None:
    gaps = list(itertools.islice(inter_arrival_gaps(250.0, "poisson", random.Random(7)), 10_000))
    assert statistics.fmean(gaps) == pytest.approx(1 / 250.0, rel=0.05)
    # Exponential: the standard deviation equals the mean (a constant schedule would give 0).
    assert statistics.pstdev(gaps) == pytest.approx(1 / 250.0, rel=0.05)


def test_poisson_schedule_is_reproducible_with_a_seed() -> None:
    first = list(arrival_offsets(100, "poisson", 1.0, random.Random(3)))
    second = list(arrival_offsets(100, "poisson", 1.0, random.Random(3)))
    assert first == second
    assert first != list(arrival_offsets(100, "poisson", 1.0, random.Random(4)))


def test_constant_schedule_is_exact_and_phases_interleave() -> None:
    offsets = list(arrival_offsets(100, "constant", 1.0))
    assert len(offsets) == 100
    assert offsets[0] == 0.0
    assert offsets[-1] == pytest.approx(0.99)
    halves = [list(arrival_offsets(50, "constant", 1.0, phase=p)) for p in (0.0, 0.5)]
    assert sorted(halves[0] + halves[1]) == pytest.approx(offsets)


def test_schedule_rejects_bad_rate() -> None:
    with pytest.raises(ConfigError, match="--rate"):
        next(inter_arrival_gaps(-1.0, "constant"))


# -- histograms and merge ---------------------------------------------------------------------


def _result(latencies: list[float], statuses: list[int]) -> RunResult:
    result = RunResult(mode="open", url="http://h/", duration_s=10.0, rate=10.0)
    for latency, status in zip(latencies, statuses, strict=True):
        if status == 0:
            result.record_error("timeout", latency)
        else:
            result.record_response(status, latency)
            result.record_completion(status)
    return result


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(1e-5, 30.0), st.sampled_from([200, 201, 503, 429, 500, 0])),
        min_size=1,
        max_size=300,
    ),
    st.integers(0, 300),
)
def test_merge_of_two_runs_equals_one_run_over_both(
    samples: list[tuple[float, int]], cut: int
) -> None:
    latencies = [s[0] for s in samples]
    statuses = [s[1] for s in samples]
    cut = min(cut, len(samples))
    whole = _result(latencies, statuses)
    left = _result(latencies[:cut], statuses[:cut])
    right = _result(latencies[cut:], statuses[cut:])
    # Through JSON, as results travel between processes and hosts.
    merged = merge_results(
        [RunResult.from_json(left.to_json()), RunResult.from_json(right.to_json())]
    )
    assert merged.status_counts == whole.status_counts
    assert merged.errors == whole.errors
    for scope in ("all", "success", "rejected"):
        assert merged.latency(scope) == whole.latency(scope)
    assert merged.rate == 20.0  # concurrent runs: rates add
    assert merged.duration_s == 10.0


def test_json_has_the_contract_fields() -> None:
    result = _result([0.010, 0.020, 0.030, 2.0], [200, 200, 503, 0])
    data = result.to_json()
    for key in ("requests", "duration_s", "throughput_rps", "goodput_rps", "error_rate"):
        assert key in data
    assert data["requests"] == 4
    assert data["status_counts"] == {"200": 2, "503": 1}
    assert data["errors"] == {"timeout": 1, "connect": 0, "reset": 0, "other": 0}
    for scope in ("all", "success", "rejected"):
        assert set(data["latency_s"][scope]) >= {"p50", "p75", "p90", "p99", "p999", "max", "mean"}
    assert data["latency_s"]["success"]["max"] == pytest.approx(0.020, rel=1e-3)
    assert data["latency_s"]["rejected"]["p50"] == pytest.approx(0.030, rel=1e-3)
    assert data["latency_s"]["all"]["max"] == pytest.approx(2.0, rel=1e-3)
    assert data["error_rate"] == pytest.approx(0.5)
    assert set(data["histograms"]) == {"all", "success", "rejected", "send_lag"}


def test_histogram_records_microseconds_with_3_significant_digits() -> None:
    hist = LatencyHistogram()
    for value in (0.000123, 0.0456, 1.234):
        hist.record(value)
    assert hist.percentile(0) == pytest.approx(0.000123, rel=1e-3)
    assert hist.percentile(100) == pytest.approx(1.234, rel=1e-3)
    assert LatencyHistogram.decode(hist.encode()).summary() == hist.summary()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(1e-6, 100.0), min_size=1, max_size=200), st.sampled_from([2, 3]))
def test_summary_matches_hdrh_statistics(values: list[float], figures: int) -> None:
    hist = LatencyHistogram(significant_figures=figures)
    for value in values:
        hist.record(value)
    summary = hist.summary()
    raw = hist._hist
    # Rounding to the bucket before hdrh sees a value changes nothing hdrh reports.
    direct = HdrHistogram(1, 3_600_000_000, figures)
    for value in values:
        direct.record_value(max(1, int(value * 1e6 + 0.5)))
    assert raw.equals(direct)
    assert raw.get_max_value() == direct.get_max_value()
    for name, percent in (("p50", 50.0), ("p90", 90.0), ("p999", 99.9)):
        assert summary[name] == raw.get_value_at_percentile(percent) / 1e6
    assert summary["mean"] == pytest.approx(raw.get_mean_value() / 1e6, rel=1e-9)
    assert summary["stdev"] == pytest.approx(raw.get_stddev() / 1e6, rel=1e-6, abs=1e-9)
    # The cheaper read of a few percentiles agrees with the summary.
    assert hist.percentiles([50.0, 90.0, 99.9]) == {
        50.0: summary["p50"],
        90.0: summary["p90"],
        99.9: summary["p999"],
    }


def test_histogram_clamps_to_its_range_and_resets() -> None:
    hist = LatencyHistogram(significant_figures=2)
    hist.record(-1.0)  # a clock step: counted as the shortest duration
    hist.record(5_000.0)  # longer than an hour: counted as one hour
    assert hist.count == 2
    assert hist.percentile(0) == 1e-6
    assert hist.percentile(100) == pytest.approx(3_600.0, rel=1e-2)
    hist.record(0.5)
    hist.reset()
    assert hist.count == 0 and hist.summary()["max"] == 0.0
    assert hist.percentiles([50.0]) == {}
    hist.record(0.25)
    assert hist.summary()["p50"] == pytest.approx(0.25, rel=1e-2)


def test_from_json_rejects_foreign_json() -> None:
    with pytest.raises(ConfigError, match=r"a\.json: not a loadshed result"):
        RunResult.from_json({"hello": 1}, source="a.json")


# -- SLO --------------------------------------------------------------------------------------


def test_slo_parses_and_judges_each_clause() -> None:
    slo = parse_slo("p99<200ms, errors<0.1%,goodput>=390, success.p50<=50ms")
    assert [c.metric for c in slo.clauses] == ["all.p99", "errors", "goodput", "success.p50"]
    assert slo.clauses[0].threshold == pytest.approx(0.2)
    assert slo.clauses[1].threshold == pytest.approx(0.001)
    result = _result([0.010] * 9_000 + [0.5] * 10, [200] * 9_010)  # 10 s window: 901 req/s
    verdicts = slo.evaluate(result)
    assert [v.passed for v in verdicts] == [True, True, True, True]
    failing = _result([0.010] * 100 + [0.5] * 2, [200] * 101 + [503])
    verdicts = slo.evaluate(failing)
    assert [v.passed for v in verdicts] == [False, False, False, True]
    assert verdicts[0].line().startswith("FAIL p99<200ms (observed 500")


def test_clause_fails_despite_generator_lag_only_when_conclusive() -> None:
    # Responses took 500 ms; the generator lagged up to 100 ms: the target took >= 400 ms.
    result = _result([0.5] * 90 + [0.01] * 5 + [2.0] * 5, [200] * 90 + [500] * 5 + [0] * 5)
    lag = 0.1
    failing, passing = parse_slo("p99<200ms,errors<1%"), parse_slo("p99<450ms,errors<6%")
    assert all(c.fails_despite_lag(result, lag) for c in failing.clauses)
    assert not any(c.fails_despite_lag(result, lag) for c in passing.clauses)
    # Timeouts may be the stalled generator's own doing; so may a shortfall in goodput.
    assert not parse_slo("timeouts<1%").clauses[0].fails_despite_lag(result, lag)
    assert not parse_slo("goodput>=1000").clauses[0].fails_despite_lag(result, lag)
    only_timeouts = _result([0.01] * 90 + [2.0] * 10, [200] * 90 + [0] * 10)
    assert not any(c.fails_despite_lag(only_timeouts, lag) for c in failing.clauses)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("p99<<200ms", "'p99<<200ms'"),
        ("p99<fast", "'p99<fast'"),
        ("p98<1s", "'p98<1s'"),
        ("errors<lots", "'errors<lots'"),
        ("errors<120%", "'errors<120%'"),
        ("goodput>=many", "'goodput>=many'"),
        ("p99<1s,,errors<1%", "empty clause"),
        ("latency", "'latency'"),
    ],
)
def test_slo_parser_rejects_malformed_clauses_naming_them(text: str, named: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_slo(text)
    assert str(info.value).startswith("--slo: ")
    assert named in str(info.value)
    assert "\n" not in str(info.value)


# -- options ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"url": "not a url", "clients": 1}, "URL"),
        ({"url": "ftp://h/", "clients": 1}, "URL"),
        ({"url": "http://h/", "rate": -5.0}, "--rate"),
        ({"url": "http://h/", "clients": 0}, "--clients"),
        ({"url": "http://h/"}, "--clients/--rate"),
        ({"url": "http://h/", "clients": 1, "rate": 1.0}, "--clients/--rate"),
        ({"url": "http://h/", "clients": 1, "duration_s": 0.0}, "--duration"),
        ({"url": "http://h/", "clients": 1, "max_inflight": 3}, "--max-inflight"),
        ({"url": "http://h/", "clients": 2, "processes": 3}, "--processes"),
    ],
)
def test_options_fail_at_construction_naming_the_flag(kwargs: dict[str, object], flag: str) -> None:
    with pytest.raises(ConfigError) as info:
        BenchOptions(**kwargs)  # type: ignore[arg-type]
    assert str(info.value).startswith(f"{flag}: ")


def test_split_deals_clients_and_rate() -> None:
    options = BenchOptions(url="http://h/", clients=5, processes=2)
    assert [share.clients for share in options.split(2)] == [3, 2]
    open_loop = BenchOptions(url="http://h/", rate=300.0, max_inflight=10, seed=1)
    shares = open_loop.split(3)
    assert [share.rate for share in shares] == [100.0] * 3
    assert [share.seed for share in shares] == [1, 2, 3]
    assert all(share.max_inflight == 3 for share in shares)
