"""The reference experiments in virtual time (docs/design.md): the throughput paradox
(``paradox``), a capacity change (``capacity-change``), and a fleet of replicas some of
which slow down (``fleet``).

Each ``run_*`` function builds the simulation from plain settings, runs it and
returns a JSON-ready dict; the same seed gives the same dict. The fleet's settings are
a typed, frozen :class:`FleetScenario` (``run_fleet`` takes one, or its fields).
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from loadshed.admission import Admission
from loadshed.config import AdmissionConfig, Discipline
from loadshed.errors import ConfigError
from loadshed.limits import LIMIT_NAMES, make_limit
from loadshed.sim.arrivals import make_arrivals
from loadshed.sim.clients import ClientConfig, ClosedLoop, OpenLoop, SemiOpen
from loadshed.sim.costs import CostDistribution
from loadshed.sim.engine import Engine
from loadshed.sim.fleet import make_balancer
from loadshed.sim.metrics import LimitTrace, Phase, Recorder
from loadshed.sim.server import Replica
from loadshed.sim.service import ServiceModel, make_service_time
from loadshed.waitbound import DEFAULT_WAIT_CEILING

__all__ = [
    "SIM_LIMITS",
    "CapacityChangeScenario",
    "FleetScenario",
    "LimiterConfig",
    "ParadoxScenario",
    "ServiceConfig",
    "run_capacity_change",
    "run_fleet",
    "run_paradox",
]

SIM_LIMITS = ("none", *LIMIT_NAMES)
"""Values of ``--limit``: ``none`` is a replica with no limiter at all."""


@dataclass(frozen=True)
class LimiterConfig:
    """How each replica's admission core is built (``limit="none"``: no limiter)."""

    limit: str = "little"
    limit_value: int | None = None
    max_queue: int = 1000
    max_queue_wait: float | None = None
    discipline: str = "fifo"
    adaptive_wait_ceiling: float = DEFAULT_WAIT_CEILING

    def __post_init__(self) -> None:
        name, _, value = self.limit.partition(":")
        if name not in SIM_LIMITS:
            raise ConfigError(
                "limit", f"got {self.limit!r}, allowed: {'|'.join(SIM_LIMITS)}:N (or fixed)"
            )
        if name == "fixed" and not value and self.limit_value is None:
            raise ConfigError("limit_value", "required with --limit fixed (an integer >= 1)")
        if value and self.limit_value is not None:
            raise ConfigError(
                "limit_value", f"give the value in --limit {self.limit} or here, not both"
            )
        if value and name != "fixed":
            raise ConfigError("limit", f"only fixed takes a value, got {self.limit!r}")
        if self.limit_value is not None and self.limit_value < 1:
            raise ConfigError("limit_value", f"must be >= 1, got {self.limit_value}")
        # fail now, not inside the run (make_limit and AdmissionConfig validate)
        self.build(Engine())

    @property
    def admission(self) -> AdmissionConfig:
        """The admission settings of each replica's limiter."""
        return AdmissionConfig(
            max_queue=self.max_queue,
            max_queue_wait=self.max_queue_wait,
            discipline=Discipline.parse(self.discipline),
            adaptive_wait_ceiling=self.adaptive_wait_ceiling,
        )

    @property
    def name(self) -> str:
        """The limit as reported (``fixed:N`` with its value)."""
        if self.limit == "fixed":
            return f"fixed:{self.limit_value}"
        return self.limit  # a name, or fixed:N as given

    def build(self, engine: Engine) -> Admission | None:
        """A fresh admission core on the engine's clock, or None for ``none``."""
        if self.limit == "none":
            return None
        return Admission(make_limit(self.name), engine.clock, config=self.admission)


@dataclass(frozen=True)
class ServiceConfig:
    """The origin's service time: distribution, mean, and an optional change."""

    mean: float
    dist: str = "constant"
    sigma: float = 0.5
    change_to: float | None = None
    change_at: float | None = None

    def __post_init__(self) -> None:
        self.build(random.Random(0))
        if self.change_to is not None:
            make_service_time(self.dist, self.change_to, self.sigma)

    def build(self, rng: random.Random) -> ServiceModel:
        """The service model drawing from ``rng``."""
        before = make_service_time(self.dist, self.mean, self.sigma)
        after = None
        if self.change_to is not None:
            after = make_service_time(self.dist, self.change_to, self.sigma)
        return ServiceModel(before, rng, after=after, change_at=self.change_at)


def _check_positive(field: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(field, f"must be > 0, got {value}")


def _check_dispatch(value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ConfigError("dispatch_delay", f"must be >= 0 seconds, got {value}")


def _round(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


def _step(
    recorder: Recorder,
    phase: str,
    capacity: float,
    achievable: float,
    replicas: Sequence[Replica],
    mean_cost: float | None = None,
) -> dict[str, Any]:
    stats = recorder.stats(phase)
    summary = stats.summary()
    goodput = stats.success / stats.phase.seconds
    traces = [r.limit_trace for r in replicas if r.limit_trace is not None]
    mean_limit = None
    if traces:
        mean_limit = statistics.fmean(t.mean(stats.phase.start, stats.phase.end) for t in traces)
    costs = {}
    if mean_cost is not None:
        # Cost units served within their deadline per second, over what the achievable
        # request rate carries at the mean cost.
        costs = {
            "goodput_cost_per_s": summary.pop("goodput_cost_per_s"),
            "goodput_cost_ratio": _round(
                stats.success_cost / stats.phase.seconds / (achievable * mean_cost)
            ),
        }
    else:
        summary.pop("goodput_cost_per_s")
    return {
        "capacity_rps": _round(capacity),
        "goodput_rps": summary.pop("goodput_rps"),
        "goodput_ratio": _round(goodput / achievable),
        **costs,
        "throughput_rps": summary.pop("throughput_rps"),
        "p50_success_s": summary.pop("p50_success_s"),
        "p99_success_s": summary.pop("p99_success_s"),
        "rejected": summary.pop("rejected"),
        "timed_out": summary.pop("timed_out"),
        "mean_limit": _round(mean_limit, 3),
        **summary,
    }


def _seeded(seed: int, *salt: int) -> random.Random:
    value = seed
    for part in salt:
        value = value * 1_000_003 + part
    return random.Random(value)


@dataclass(frozen=True)
class ParadoxScenario:
    """The throughput paradox: closed-loop clients against one replica; one fresh run
    per client count.

    The goodput ratio is goodput / capacity (workers / mean service time).
    """

    limiter: LimiterConfig
    clients: Sequence[int] = (1, 2, 3, 4, 5, 8, 16, 32, 64)
    workers: int = 1
    service: ServiceConfig | None = None
    timeout: float = 2.0
    think: float = 0.0
    rtt: float = 0.001
    send_deadline: bool = True
    duration: float = 30.0
    origin_queue: int | None = None
    seed: int = 1
    dispatch_delay: float = 0.0

    def __post_init__(self) -> None:
        _check_positive("duration", self.duration)
        _check_dispatch(self.dispatch_delay)
        if self.workers < 1:
            raise ConfigError("workers", f"must be >= 1, got {self.workers}")
        if not self.clients or min(self.clients) < 1:
            raise ConfigError("clients", f"every count must be >= 1, got {list(self.clients)}")

    def run(self) -> dict[str, Any]:
        """Run the scenario once; the result as a JSON-ready dict."""
        service = self.service if self.service is not None else ServiceConfig(0.5)
        config = ClientConfig(
            timeout=self.timeout, rtt=self.rtt, think=self.think, send_deadline=self.send_deadline
        )
        capacity = self.workers / service.mean
        steps = []
        converge: list[float | None] = []
        for count in self.clients:
            engine = Engine()
            rng = _seeded(self.seed, count)
            replica = Replica(
                engine,
                workers=self.workers,
                service=service.build(rng),
                admission=self.limiter.build(engine),
                one_way=config.one_way,
                origin_queue=self.origin_queue,
                dispatch=self.dispatch_delay,
            )
            recorder = Recorder([Phase("run", 0.0, self.duration)])
            ClosedLoop(engine, replica, config, recorder, clients=count, stop=self.duration)
            engine.run(self.duration)
            step = {"clients": count, **_step(recorder, "run", capacity, capacity, [replica])}
            trace = replica.limit_trace
            settled = trace.converge_time(0.0, self.duration) if trace is not None else None
            step["converge_s"] = _round(settled, 3)
            converge.append(settled)
            steps.append(step)
        return {
            "scenario": "paradox",
            "limit": self.limiter.name,
            "capacity_rps": _round(capacity),
            "deadlines": self.send_deadline,
            "seed": self.seed,
            "settings": {
                "workers": self.workers,
                "service": service.dist,
                "service_time_s": service.mean,
                "timeout_s": self.timeout,
                "think_s": self.think,
                "rtt_s": self.rtt,
                "dispatch_delay_s": self.dispatch_delay,
                "duration_s": self.duration,
                "origin_queue": self.origin_queue,
                "max_queue": self.limiter.max_queue,
                "discipline": self.limiter.discipline,
            },
            "steps": steps,
            "converge_s": _worst(converge) if self.limiter.limit != "none" else None,
        }


class _Scenario(Protocol):
    def run(self) -> dict[str, Any]: ...


_S = TypeVar("_S", bound=_Scenario)


def _run(kind: type[_S], scenario: _S | None, settings: dict[str, Any]) -> dict[str, Any]:
    """Run ``scenario``, or one of ``kind`` built from ``settings`` (with a scenario,
    ``settings`` replace its fields)."""
    if scenario is None:
        scenario = kind(**settings)
    elif settings:
        scenario = dataclasses.replace(scenario, **settings)  # type: ignore[type-var]
    return scenario.run()


def run_paradox(scenario: ParadoxScenario | None = None, /, **settings: Any) -> dict[str, Any]:
    """Run a :class:`ParadoxScenario`: the one given, or one built from ``settings`` (with a
    scenario, ``settings`` replace its fields). Returns :meth:`ParadoxScenario.run`'s dict."""
    return _run(ParadoxScenario, scenario, settings)


def _worst(values: Sequence[float | None]) -> float | None:
    if not values or any(v is None for v in values):
        return None
    return _round(max(v for v in values if v is not None), 3)


@dataclass(frozen=True)
class CapacityChangeScenario:
    """A capacity change: a steady rate against one replica whose service time changes
    mid-run.

    ``workers_to`` also changes the worker count at the same moment (workers lost or
    added: the case where a hand-set limit is wrong); ``change_to`` equal to
    ``service_time`` keeps the service time. ``client_workers`` caps outstanding
    requests like the capacity-change experiment's Go client (0: pure open loop).
    ``cost_dist`` gives requests costs (``loguniform:1:100``; see
    :mod:`loadshed.sim.costs`: service time ~= a + b x cost, ``cost_fixed`` the share
    of a) and tells the limiter each one's cost; ``cost_blind`` sends the same traffic
    without telling it, for comparison (steps then add cost goodput). Steps
    are the phase before the change and the phase after it; goodput ratio is goodput /
    min(capacity, rate);
    ``converge_s`` is the time from the change until the limit stays within ±10 %
    (at least ±1) of where it ends up.
    """

    limiter: LimiterConfig
    workers: int = 7
    service_time: float = 1.0
    change_to: float = 2.0
    change_at: float | None = None
    workers_to: int | None = None
    dist: str = "constant"
    sigma: float = 0.5
    rate: float = 5.0
    arrivals: str = "constant"
    burst_size: int = 10
    client_workers: int = 10
    timeout: float = 2.5
    rtt: float = 0.001
    send_deadline: bool = True
    origin_queue: int | None = 100
    duration: float = 120.0
    seed: int = 1
    cost_dist: str | None = None
    cost_fixed: float = 0.1
    cost_blind: bool = False
    dispatch_delay: float = 0.0

    def __post_init__(self) -> None:
        _check_positive("duration", self.duration)
        _check_dispatch(self.dispatch_delay)
        self.costs  # noqa: B018 (validates cost_dist and cost_fixed now)
        if self.workers < 1:
            raise ConfigError("workers", f"must be >= 1, got {self.workers}")
        if self.client_workers < 0:
            raise ConfigError(
                "client_workers", f"must be >= 0 (0: open loop), got {self.client_workers}"
            )
        if self.workers_to is not None and self.workers_to < 1:
            raise ConfigError("workers_to", f"must be >= 1, got {self.workers_to}")
        change, duration = self.change, self.duration
        if not 0 < change < duration:
            raise ConfigError(
                "change_at", f"must be within (0, {duration:g}) seconds, got {change:g}"
            )

    @property
    def change(self) -> float:
        """When the change happens (``change_at``, by default mid-run)."""
        return self.duration / 2 if self.change_at is None else self.change_at

    @property
    def costs(self) -> CostDistribution | None:
        """The requests' cost distribution (None: no costs)."""
        if self.cost_dist is None:
            return None
        return CostDistribution.parse(self.cost_dist, self.cost_fixed)

    def run(self) -> dict[str, Any]:
        """Run the scenario once; the result as a JSON-ready dict."""
        change = self.change
        service = ServiceConfig(
            self.service_time, self.dist, self.sigma, change_to=self.change_to, change_at=change
        )
        arrival_process = make_arrivals(self.arrivals, self.rate, self.burst_size)
        costs = self.costs
        config = ClientConfig(
            timeout=self.timeout,
            rtt=self.rtt,
            send_deadline=self.send_deadline,
            costs=costs,
            cost_seed=self.seed * 1_000_003 + 2,
        )
        engine = Engine()
        rng = _seeded(self.seed)
        replica = Replica(
            engine,
            workers=self.workers,
            service=service.build(rng),
            admission=self.limiter.build(engine),
            one_way=config.one_way,
            origin_queue=self.origin_queue,
            cost_aware=costs is not None and not self.cost_blind,
            dispatch=self.dispatch_delay,
        )
        if self.workers_to is not None:
            engine.at(change, replica.origin.set_workers, self.workers_to)
        recorder = Recorder([Phase("before", 0.0, change), Phase("after", change, self.duration)])
        client_rng = _seeded(self.seed, 1)
        if self.client_workers:
            SemiOpen(
                engine,
                replica,
                config,
                recorder,
                arrivals=arrival_process,
                workers=self.client_workers,
                rng=client_rng,
                stop=self.duration,
            )
        else:
            OpenLoop(
                engine,
                replica,
                config,
                recorder,
                arrivals=arrival_process,
                rng=client_rng,
                stop=self.duration,
            )
        engine.run(self.duration)
        capacity_before = self.workers / self.service_time
        capacity_after = (
            self.workers if self.workers_to is None else self.workers_to
        ) / self.change_to
        mean_cost = costs.mean if costs is not None else None
        steps = [
            {
                "phase": phase,
                "rate": self.rate,
                **_step(recorder, phase, capacity, min(capacity, self.rate), [replica], mean_cost),
            }
            for phase, capacity in (("before", capacity_before), ("after", capacity_after))
        ]
        trace = replica.limit_trace
        return {
            "scenario": "capacity_change",
            "limit": self.limiter.name,
            "capacity_rps": _round(capacity_after),
            "deadlines": self.send_deadline,
            "seed": self.seed,
            "settings": {
                "workers": self.workers,
                "workers_to": self.workers_to,
                "service": self.dist,
                "service_time_s": self.service_time,
                "change_to_s": self.change_to,
                "change_at_s": change,
                "rate": self.rate,
                "arrivals": self.arrivals,
                "burst_size": self.burst_size,
                "client_workers": self.client_workers,
                "timeout_s": self.timeout,
                "rtt_s": self.rtt,
                "dispatch_delay_s": self.dispatch_delay,
                "duration_s": self.duration,
                "origin_queue": self.origin_queue,
                "max_queue": self.limiter.max_queue,
                "discipline": self.limiter.discipline,
                "cost_dist": costs.describe() if costs is not None else None,
                "cost_blind": self.cost_blind,
            },
            "steps": steps,
            "converge_s": _round(trace.converge_time(change, self.duration), 3) if trace else None,
            "final_limit": trace.values[-1] if trace else None,
        }


def run_capacity_change(
    scenario: CapacityChangeScenario | None = None, /, **settings: Any
) -> dict[str, Any]:
    """Run a :class:`CapacityChangeScenario`: the one given, or one built from
    ``settings`` (with a scenario, ``settings`` replace its fields). Returns
    :meth:`CapacityChangeScenario.run`'s dict."""
    return _run(CapacityChangeScenario, scenario, settings)


@dataclass(frozen=True)
class FleetScenario:
    """Open-loop traffic over ``replicas`` behind a balancer; a fraction of them run
    ``slow_factor`` times slower from ``slow_at`` for ``slow_for`` seconds (by default
    the middle third of the run). Invalid settings raise :class:`ConfigError` naming the
    field: at construction, but for ``origin_queue`` and ``balancer``, checked when the run
    builds the fleet.

    ``rate`` defaults to ``load`` x the healthy fleet's capacity. A rejected request is
    retried ``retries`` times through the balancer within its timeout. Steps are the
    phases before, during and after the slowdown; goodput ratio is goodput /
    min(capacity, arrivals per second in the phase).
    """

    limiter: LimiterConfig
    replicas: int = 10
    workers: int = 2
    service_time: float = 0.2
    dist: str = "lognormal"
    sigma: float = 0.5
    rate: float | None = None
    load: float = 0.8
    arrivals: str = "poisson"
    burst_size: int = 10
    balancer: str = "round-robin"
    slow_fraction: float = 0.1
    slow_factor: float = 4.0
    slow_at: float | None = None
    slow_for: float | None = None
    timeout: float = 1.0
    retries: int = 1
    rtt: float = 0.001
    send_deadline: bool = True
    origin_queue: int | None = None
    duration: float = 60.0
    seed: int = 1
    dispatch_delay: float = 0.0

    def __post_init__(self) -> None:
        _check_positive("duration", self.duration)
        _check_dispatch(self.dispatch_delay)
        if self.replicas < 1:
            raise ConfigError("replicas", f"must be >= 1, got {self.replicas}")
        if self.workers < 1:
            raise ConfigError("workers", f"must be >= 1, got {self.workers}")
        if not 0 <= self.slow_fraction <= 1:
            raise ConfigError("slow_fraction", f"must be within [0, 1], got {self.slow_fraction}")
        _check_positive("slow_factor", self.slow_factor)
        _check_positive("load", self.load)
        start, length, duration = self.slow_start, self.slow_length, self.duration
        if not 0 < start < duration or not length > 0 or start + length > duration:
            raise ConfigError(
                "slow_at",
                f"slowdown [{start:g}, {start + length:g}] must lie within (0, {duration:g})",
            )
        # What the run's parts check, checked now (in the order the run builds them).
        ServiceConfig(self.service_time, self.dist, self.sigma)
        make_arrivals(self.arrivals, self.offered_rate, self.burst_size)
        ClientConfig(
            timeout=self.timeout,
            rtt=self.rtt,
            send_deadline=self.send_deadline,
            retries=self.retries,
        )

    @property
    def capacity(self) -> float:
        """Requests per second the healthy fleet serves."""
        return self.replicas * self.workers / self.service_time

    @property
    def offered_rate(self) -> float:
        """Requests per second sent: ``rate``, or ``load`` x :attr:`capacity`."""
        return self.capacity * self.load if self.rate is None else self.rate

    @property
    def slow_start(self) -> float:
        """When the slowdown begins (``slow_at``, by default a third in)."""
        return self.duration / 3 if self.slow_at is None else self.slow_at

    @property
    def slow_length(self) -> float:
        """How long the slowdown lasts (``slow_for``, by default a third of the run)."""
        return self.duration / 3 if self.slow_for is None else self.slow_for

    def run(self) -> dict[str, Any]:
        """Run the scenario; a JSON-ready dict (the same seed gives the same dict)."""
        limiter, replicas, workers = self.limiter, self.replicas, self.workers
        service_time, dist, sigma = self.service_time, self.dist, self.sigma
        arrivals, burst_size = self.arrivals, self.burst_size
        balancer, slow_fraction, slow_factor = self.balancer, self.slow_fraction, self.slow_factor
        timeout, retries, rtt = self.timeout, self.retries, self.rtt
        send_deadline, origin_queue = self.send_deadline, self.origin_queue
        duration, seed = self.duration, self.seed
        start, length = self.slow_start, self.slow_length
        service = ServiceConfig(service_time, dist, sigma)
        capacity = self.capacity
        offered = self.offered_rate
        arrival_process = make_arrivals(arrivals, offered, burst_size)
        config = ClientConfig(
            timeout=timeout, rtt=rtt, send_deadline=send_deadline, retries=retries
        )

        engine = Engine()
        service_rng = _seeded(seed)
        fleet = [
            Replica(
                engine,
                workers=workers,
                service=service.build(service_rng),
                admission=limiter.build(engine),
                one_way=config.one_way,
                origin_queue=origin_queue,
                index=index,
                dispatch=self.dispatch_delay,
            )
            for index in range(replicas)
        ]
        choice_rng = _seeded(seed, 2)
        slowed = sorted(choice_rng.sample(range(replicas), round(slow_fraction * replicas)))

        def slow_down(factor: float) -> None:
            for index in slowed:
                fleet[index].origin.slow_factor = factor

        engine.at(start, slow_down, slow_factor)
        engine.at(start + length, slow_down, 1.0)
        front = make_balancer(balancer, fleet, _seeded(seed, 3))
        phases = [
            Phase("before", 0.0, start),
            Phase("during", start, start + length),
            Phase("after", start + length, duration),
        ]
        recorder = Recorder([p for p in phases if p.seconds > 0])
        OpenLoop(
            engine,
            front,
            config,
            recorder,
            arrivals=arrival_process,
            rng=_seeded(seed, 1),
            stop=duration,
        )
        engine.run(duration)

        slow_capacity = (replicas - len(slowed)) * workers / service_time + len(
            slowed
        ) * workers / (service_time * slow_factor)
        steps = []
        for phase in recorder.phases:
            phase_capacity = slow_capacity if phase.name == "during" else capacity
            # Poisson arrivals: judge against the requests that actually arrived
            arrived = recorder.stats(phase.name).sent / phase.seconds
            step = {
                "phase": phase.name,
                "rate": _round(offered),
                **_step(recorder, phase.name, phase_capacity, min(phase_capacity, arrived), fleet),
            }
            if slowed and fleet[0].limit_trace is not None:
                step["mean_limit_slowed"] = _round(
                    statistics.fmean(_trace(fleet[i]).mean(phase.start, phase.end) for i in slowed),
                    3,
                )
            steps.append(step)
        converge_s = None
        if slowed and fleet[0].limit_trace is not None:
            # the median slowed replica (one that never settles counts as infinitely slow)
            times = sorted(
                math.inf if t is None else t
                for t in (_trace(fleet[i]).converge_time(start, start + length) for i in slowed)
            )
            median = times[len(times) // 2]
            converge_s = None if math.isinf(median) else _round(median, 3)
        return {
            "scenario": "fleet",
            "limit": limiter.name,
            "capacity_rps": _round(capacity),
            "deadlines": send_deadline,
            "seed": seed,
            "settings": {
                "replicas": replicas,
                "workers": workers,
                "service": dist,
                "service_time_s": service_time,
                "sigma": sigma,
                "rate": _round(offered),
                "arrivals": arrivals,
                "burst_size": burst_size,
                "balancer": balancer,
                "slowed_replicas": len(slowed),
                "slow_factor": slow_factor,
                "slow_at_s": start,
                "slow_for_s": length,
                "timeout_s": timeout,
                "retries": retries,
                "rtt_s": rtt,
                "dispatch_delay_s": self.dispatch_delay,
                "duration_s": duration,
                "origin_queue": origin_queue,
                "max_queue": limiter.max_queue,
                "discipline": limiter.discipline,
            },
            "steps": steps,
            "converge_s": converge_s,
            "events": engine.events,
        }


def run_fleet(scenario: FleetScenario | None = None, /, **settings: Any) -> dict[str, Any]:
    """Run a :class:`FleetScenario`, given whole or built from its fields as keywords
    (``run_fleet(limiter=LimiterConfig("little"), replicas=20)``); keywords given with a
    scenario replace its fields. Returns :meth:`FleetScenario.run`'s dict."""
    return _run(FleetScenario, scenario, settings)


def _trace(replica: Replica) -> LimitTrace:
    assert replica.limit_trace is not None
    return replica.limit_trace
