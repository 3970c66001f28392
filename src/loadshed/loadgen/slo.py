"""Service-level objectives as users write them (``"p99<200ms,errors<0.1%,goodput>=390"``)
and their verdict against a :class:`RunResult`."""

from __future__ import annotations

import dataclasses
import operator
import re
from collections.abc import Callable

from loadshed.errors import ConfigError
from loadshed.loadgen.results import PERCENTILES, RunResult
from loadshed.units import parse_duration

__all__ = ["SLO", "Clause", "ClauseVerdict", "parse_slo"]

_OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "<": operator.lt,
    ">": operator.gt,
}
_LATENCY_STATS = (*(name for name, _ in PERCENTILES), "max", "mean")
_LATENCY_SCOPES = ("all", "success", "rejected")
_RATE_METRICS = {
    "errors": "share of requests that were not 2xx",
    "timeouts": "share of requests that timed out",
    "rejections": "share of requests rejected with 429/503",
}
_RPS_METRICS = {
    "goodput": "2xx responses per second",
    "throughput": "responses per second",
}
_CLAUSE_RE = re.compile(r"^\s*([A-Za-z][A-Za-z0-9_.]*)\s*(<=|>=|<|>)\s*(\S+)\s*$")
_HELP = (
    "use METRIC OP VALUE with OP one of < <= > >=; METRIC: [all.|success.|rejected.]"
    "p50|p75|p90|p99|p999|max|mean (a duration, e.g. 200ms), errors|timeouts|rejections "
    "(e.g. 0.1%), goodput|throughput (requests/s)"
)


@dataclasses.dataclass(frozen=True)
class Clause:
    """One objective: ``metric op threshold`` (latencies in seconds, shares as fractions)."""

    text: str
    metric: str
    op: str
    threshold: float

    def observe(self, result: RunResult) -> float:
        """The metric's value in ``result``."""
        if self.metric in _RPS_METRICS:
            return result.goodput_rps if self.metric == "goodput" else result.throughput_rps
        if self.metric in _RATE_METRICS:
            if not result.requests:
                return 0.0
            if self.metric == "errors":
                return result.error_rate
            count = (
                result.errors.get("timeout", 0)
                if self.metric == "timeouts"
                else (result.rejections)
            )
            return count / result.requests
        scope, stat = self.metric.split(".")
        return float(result.latency(scope)[stat])

    def holds(self, value: float) -> bool:
        """Whether ``value`` meets the objective."""
        return _OPERATORS[self.op](value, self.threshold)

    def fails_despite_lag(self, result: RunResult, lag_s: float) -> bool:
        """Whether this clause fails on ``result`` even if the generator's lag is discounted.

        For a run the generator could not drive. Only what the target did counts: latencies
        of responses actually received (2xx, or 429/503 for ``rejected.``), less the longest
        lag, since a stalled generator delays by about that much; and failures with a
        status or a broken connection. Timeouts do not count: a generator that stalls past
        a client timeout fires the timer before it reads a response already waiting. Bounds
        on rates (goodput, throughput) can never fail conclusively: the generator may simply
        not have sent enough.
        """
        if self.op not in ("<", "<=") or self.metric in _RPS_METRICS:
            return False
        if self.metric in _RATE_METRICS:
            if self.metric == "timeouts" or not result.requests:
                return False
            if self.metric == "rejections":
                observed = result.rejections / result.requests
            else:
                non_timeouts = result.requests - result.successes - result.errors.get("timeout", 0)
                observed = non_timeouts / result.requests
            return not self.holds(observed)
        scope, stat = self.metric.split(".")
        received = "success" if scope == "all" else scope
        observed = float(result.latency(received)[stat])
        return not self.holds(max(0.0, observed - lag_s))

    def format_value(self, value: float) -> str:
        """``value`` in the clause's own units (ms, %, req/s)."""
        if self.metric in _RPS_METRICS:
            return f"{value:.1f}/s"
        if self.metric in _RATE_METRICS:
            return f"{value * 100:.3g}%"
        return f"{value * 1e3:.3f}ms"


@dataclasses.dataclass(frozen=True)
class ClauseVerdict:
    """A clause, the value observed, and whether it passed."""

    clause: Clause
    observed: float
    passed: bool

    def line(self) -> str:
        """``PASS p99<200ms (observed 12.300ms)``."""
        word = "PASS" if self.passed else "FAIL"
        return f"{word} {self.clause.text} (observed {self.clause.format_value(self.observed)})"


@dataclasses.dataclass(frozen=True)
class SLO:
    """A conjunction of clauses."""

    text: str
    clauses: tuple[Clause, ...]

    def evaluate(self, result: RunResult) -> list[ClauseVerdict]:
        """One verdict per clause, in the order written."""
        verdicts = []
        for clause in self.clauses:
            value = clause.observe(result)
            verdicts.append(ClauseVerdict(clause, value, clause.holds(value)))
        return verdicts

    def passed(self, result: RunResult) -> bool:
        """Whether every clause holds."""
        return all(v.passed for v in self.evaluate(result))

    def any_holds(self, result: RunResult) -> bool:
        """Whether at least one clause holds (used by ``sweep --stop-when``)."""
        return any(v.passed for v in self.evaluate(result))


def _parse_clause(text: str, flag: str) -> Clause:
    match = _CLAUSE_RE.match(text)
    if match is None:
        raise ConfigError(flag, f"malformed clause {text.strip()!r}: {_HELP}")
    name, op, raw = match.group(1).lower().replace("p99.9", "p999"), match.group(2), match.group(3)
    if name in _RPS_METRICS:
        try:
            value = float(raw.removesuffix("/s"))
        except ValueError:
            raise ConfigError(
                flag, f"clause {text.strip()!r}: {raw!r} is not a number of requests/s"
            ) from None
        return Clause(text.strip(), name, op, value)
    if name in _RATE_METRICS:
        try:
            value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
        except ValueError:
            raise ConfigError(
                flag, f"clause {text.strip()!r}: {raw!r} is not a share (e.g. 0.1% or 0.001)"
            ) from None
        if not 0 <= value <= 1:
            raise ConfigError(flag, f"clause {text.strip()!r}: share must be within 0..100%")
        return Clause(text.strip(), name, op, value)
    scope, _, stat = name.rpartition(".")
    scope = scope or "all"
    if scope not in _LATENCY_SCOPES or stat not in _LATENCY_STATS:
        raise ConfigError(flag, f"clause {text.strip()!r}: unknown metric {name!r}; {_HELP}")
    try:
        seconds = parse_duration(raw, field=flag)
    except ConfigError:
        raise ConfigError(
            flag, f"clause {text.strip()!r}: {raw!r} is not a duration (e.g. 200ms, 1.5s)"
        ) from None
    return Clause(text.strip(), f"{scope}.{stat}", op, seconds)


def parse_slo(text: str, flag: str = "--slo") -> SLO:
    """Parse comma-separated clauses; raises :class:`ConfigError` naming the bad clause."""
    parts = text.split(",")
    if not text.strip() or any(not part.strip() for part in parts):
        raise ConfigError(flag, f"empty clause in {text!r}: {_HELP}")
    return SLO(text.strip(), tuple(_parse_clause(part, flag) for part in parts))
