"""Client models: closed loop, open loop, and semi-open (open loop with a cap on
outstanding requests, like a pool of client workers fed by a ticker).

Every request has a client timeout. When it passes, the client gives up: the request
counts as timed out, the server is told (it sees the disconnect) and the client moves
on, while the origin keeps working on whatever it already started. By default the
client also sends its timeout as the request's deadline (like an
``X-Request-Timeout`` header, read by the server on arrival); ``send_deadline=False``
sends none and leaves the limiter to learn the clients' patience.

To keep the event count low, a request is scheduled directly at its arrival time at
the server; its send time is that minus the one-way network delay.
"""

from __future__ import annotations

import random
from typing import Protocol

from loadshed.errors import ConfigError
from loadshed.sim.arrivals import Arrivals
from loadshed.sim.costs import CostDistribution
from loadshed.sim.engine import Engine
from loadshed.sim.metrics import Recorder
from loadshed.sim.request import Request, Status

__all__ = ["ClientConfig", "ClosedLoop", "OpenLoop", "SemiOpen", "Target"]


class Target(Protocol):
    """Where requests go: a replica or a balancer in front of many."""

    def arrive(self, request: Request) -> None:
        """The request reaches the server side now."""


class ClientConfig:
    """What every client model shares: timeout, network, deadlines, think time."""

    __slots__ = ("cost_rng", "costs", "one_way", "retries", "send_deadline", "think", "timeout")

    def __init__(
        self,
        *,
        timeout: float,
        rtt: float = 0.001,
        think: float = 0.0,
        send_deadline: bool = True,
        retries: int = 0,
        costs: CostDistribution | None = None,
        cost_seed: int = 0,
    ) -> None:
        if not timeout > 0:
            raise ConfigError("timeout", f"must be > 0 seconds, got {timeout}")
        if rtt < 0:
            raise ConfigError("rtt", f"must be >= 0 seconds, got {rtt}")
        if think < 0:
            raise ConfigError("think", f"must be >= 0 seconds, got {think}")
        if timeout <= rtt:
            raise ConfigError(
                "timeout", f"must exceed the network round trip ({rtt:g}s), got {timeout:g}s"
            )
        if retries < 0:
            raise ConfigError("retries", f"must be >= 0, got {retries}")
        self.timeout = timeout
        self.one_way = rtt / 2
        self.think = think
        self.send_deadline = send_deadline
        self.retries = retries
        self.costs = costs
        """Each request's cost is drawn from this (None: every request alike)."""
        # Costs come from their own generator, drawn in send order: runs whose
        # admission differs still send the same costs at the same times (open loop).
        self.cost_rng = random.Random(cost_seed)


class _Client:
    """Shared send / timeout / response handling."""

    __slots__ = ("_now", "config", "engine", "recorder", "target")

    def __init__(
        self, engine: Engine, target: Target, config: ClientConfig, recorder: Recorder
    ) -> None:
        self.engine = engine
        self._now = engine.clock.now
        self.target = target
        self.config = config
        self.recorder = recorder

    def _send(self, tag: int) -> None:
        """Create a request arriving at the server now, and arm its timeout."""
        config = self.config
        now = self._now()
        sent_at = now - config.one_way
        request = Request(sent_at, sent_at + config.timeout, self, tag)
        if config.send_deadline:
            # the server reads the relative timeout on arrival, as from a header
            request.deadline = now + config.timeout
        costs = config.costs
        if costs is not None:
            cost = request.cost = costs.sample(config.cost_rng)
            request.size = costs.size(cost)
        self.recorder.sent(sent_at)
        self.target.arrive(request)
        if not request.done:
            # armed only now: a request refused on arrival needs no timeout event
            self.engine.at(request.timeout_at, self._timeout, request)

    def _timeout(self, request: Request) -> None:
        if request.done:
            return
        request.done = True
        request.client_gone = True
        now = self.engine.clock.now()
        self.recorder.timed_out(now)
        replica = request.replica
        if replica is not None and not request.served:
            replica.client_left(request)
        self.on_timeout(request, now)

    def on_response(self, request: Request, status: int, when: float) -> None:
        """The server answered; the answer reaches the client at ``when``."""
        if request.done or when >= request.timeout_at:
            return  # the client gives up first: its timeout event handles it
        config = self.config
        if (
            status != Status.SUCCESS
            and request.attempt < config.retries
            and when + 2 * config.one_way < request.timeout_at
        ):
            # retry through the balancer; the overall timeout keeps running
            request.attempt += 1
            request.avoid = request.replica
            request.replica = None
            self.engine.at(when + config.one_way, self.target.arrive, request)
            return
        request.done = True
        self.recorder.response(status, when - request.sent_at, when, request.cost)
        self.on_done(request, when)

    def on_timeout(self, request: Request, now: float) -> None:
        """Hook: the client gave up at ``now``."""
        self.on_done(request, now)

    def on_done(self, request: Request, when: float) -> None:
        """Hook: the client is free again at ``when``."""


class ClosedLoop(_Client):
    """``clients`` clients, each sending, waiting for the answer or its timeout, thinking
    ``think`` seconds, and sending again (like bombardier -c, hey -c, wrk).

    A rejected client sends again after the network round trip (plus think time),
    which is what load generators do with fast 503s.
    """

    __slots__ = ("_stop", "clients")

    def __init__(
        self,
        engine: Engine,
        target: Target,
        config: ClientConfig,
        recorder: Recorder,
        *,
        clients: int,
        start: float = 0.0,
        stop: float = float("inf"),
    ) -> None:
        super().__init__(engine, target, config, recorder)
        if clients < 1:
            raise ConfigError("clients", f"must be >= 1, got {clients}")
        self.clients = clients
        self._stop = stop
        for tag in range(clients):
            engine.at(start + config.one_way, self._send_tagged, tag)

    def _send_tagged(self, tag: int) -> None:
        if self._now() - self.config.one_way < self._stop:
            self._send(tag)

    def on_done(self, request: Request, when: float) -> None:
        config = self.config
        self.engine.at(when + config.think + config.one_way, self._send_tagged, request.tag)


class OpenLoop(_Client):
    """Requests on a timeline set by ``arrivals``, independent of responses (like wrk2,
    vegeta): a slow server cannot slow the clients down."""

    __slots__ = ("_arrivals", "_rng", "_stop", "_tag")

    def __init__(
        self,
        engine: Engine,
        target: Target,
        config: ClientConfig,
        recorder: Recorder,
        *,
        arrivals: Arrivals,
        rng: random.Random,
        start: float = 0.0,
        stop: float = float("inf"),
    ) -> None:
        super().__init__(engine, target, config, recorder)
        self._arrivals = arrivals
        self._rng = rng
        self._stop = stop
        self._tag = 0
        first = start + arrivals.next_gap(rng)
        engine.at(first + config.one_way, self._arrival, None)

    def _arrival(self, _: object) -> None:
        now = self.engine.clock.now()
        next_arrival = now + self._arrivals.next_gap(self._rng)
        if next_arrival - self.config.one_way < self._stop:
            self.engine.at(next_arrival, self._arrival, None)
        self._tag += 1
        self._send(self._tag)


class SemiOpen(_Client):
    """A ticker at ``arrivals`` feeding ``workers`` client workers (the Go client of
    the capacity-change experiment, docs/design.md).

    A tick finds an idle worker and sends at once; when every worker is busy, one
    tick waits (like a ``time.Ticker`` channel, which holds one) and later ticks are
    skipped, so at most ``workers`` requests are outstanding.
    """

    __slots__ = ("_arrivals", "_idle", "_pending_tick", "_rng", "_stop", "skipped", "workers")

    def __init__(
        self,
        engine: Engine,
        target: Target,
        config: ClientConfig,
        recorder: Recorder,
        *,
        arrivals: Arrivals,
        workers: int,
        rng: random.Random,
        start: float = 0.0,
        stop: float = float("inf"),
    ) -> None:
        super().__init__(engine, target, config, recorder)
        if workers < 1:
            raise ConfigError("client_workers", f"must be >= 1, got {workers}")
        self._arrivals = arrivals
        self._rng = rng
        self._stop = stop
        self.workers = workers
        self._idle = workers
        self._pending_tick = False
        self.skipped = 0
        """Ticks dropped because every worker was busy."""
        engine.at(start + arrivals.next_gap(rng), self._tick, None)

    def _tick(self, _: object) -> None:
        now = self.engine.clock.now()
        next_tick = now + self._arrivals.next_gap(self._rng)
        if next_tick < self._stop:
            self.engine.at(next_tick, self._tick, None)
        if self._idle > 0:
            self._idle -= 1
            self.engine.at(now + self.config.one_way, self._send, 0)
        elif not self._pending_tick:
            self._pending_tick = True
        else:
            self.skipped += 1

    def on_done(self, request: Request, when: float) -> None:
        self.engine.at(when, self._worker_free, None)

    def _worker_free(self, _: object) -> None:
        now = self.engine.clock.now()
        if self._pending_tick and now < self._stop:
            self._pending_tick = False
            self.engine.at(now + self.config.one_way, self._send, 0)
        else:
            self._idle += 1
