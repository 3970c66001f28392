"""Many replicas behind a load balancer, each with its own limiter and no shared
state, some of them slowed down for a while."""

from __future__ import annotations

import random

from loadshed.errors import ConfigError
from loadshed.sim.request import Request
from loadshed.sim.server import Replica

__all__ = [
    "BALANCERS",
    "Balancer",
    "LeastOutstanding",
    "RandomBalancer",
    "RoundRobin",
    "make_balancer",
]

BALANCERS = ("random", "round-robin", "least-outstanding")


class Balancer:
    """Sends each arriving request to one of ``replicas``; a retry (``request.avoid``
    set) to another than the one that answered its last attempt, when there is one."""

    __slots__ = ("replicas",)

    def __init__(self, replicas: list[Replica]) -> None:
        if not replicas:
            raise ConfigError("replicas", "must be >= 1")
        self.replicas = replicas

    def arrive(self, request: Request) -> None:
        """Route a request arriving now."""
        raise NotImplementedError


class RandomBalancer(Balancer):
    """Uniformly random choice (seeded)."""

    __slots__ = ("_rng",)

    def __init__(self, replicas: list[Replica], rng: random.Random) -> None:
        super().__init__(replicas)
        self._rng = rng

    def arrive(self, request: Request) -> None:
        if request.client_gone:
            return
        replicas = self.replicas
        avoid = request.avoid
        if avoid is None or len(replicas) < 2:
            replicas[int(self._rng.random() * len(replicas))].arrive(request)
            return
        # one of the others, uniformly
        index = int(self._rng.random() * (len(replicas) - 1))
        if replicas[index] is avoid:
            index = len(replicas) - 1
        replicas[index].arrive(request)


class RoundRobin(Balancer):
    """Each replica in turn."""

    __slots__ = ("_next",)

    def __init__(self, replicas: list[Replica]) -> None:
        super().__init__(replicas)
        self._next = 0

    def arrive(self, request: Request) -> None:
        if request.client_gone:
            return
        replicas = self.replicas
        index = self._next
        if replicas[index] is request.avoid and len(replicas) > 1:
            index = index + 1 if index + 1 < len(replicas) else 0
        self._next = index + 1 if index + 1 < len(replicas) else 0
        replicas[index].arrive(request)


class LeastOutstanding(Balancer):
    """The replica with the fewest requests outstanding; ties go to the one that has
    waited longest at that count (so equals share the load in turn).

    Exact and O(1) per change: replicas sit in buckets by outstanding count (insertion
    ordered dicts), and counts only move by one.
    """

    __slots__ = ("_buckets", "_min")

    def __init__(self, replicas: list[Replica]) -> None:
        super().__init__(replicas)
        self._buckets: list[dict[Replica, None]] = [{}]
        for replica in replicas:
            if replica.outstanding != 0:
                raise ConfigError("replicas", "must start with nothing outstanding")
            self._buckets[0][replica] = None
            replica.on_outstanding = self._moved
        self._min = 0

    def _moved(self, replica: Replica, previous: int) -> None:
        buckets = self._buckets
        del buckets[previous][replica]
        count = replica.outstanding
        if count >= len(buckets):
            buckets.append({})
        buckets[count][replica] = None
        if count < self._min:
            self._min = count

    def arrive(self, request: Request) -> None:
        if request.client_gone:
            return
        buckets = self._buckets
        while not buckets[self._min]:
            self._min += 1
        avoid = request.avoid
        if avoid is not None and len(self.replicas) > 1:
            for bucket in buckets[self._min :]:
                for replica in bucket:
                    if replica is not avoid:
                        replica.arrive(request)
                        return
        next(iter(buckets[self._min])).arrive(request)


def make_balancer(kind: str, replicas: list[Replica], rng: random.Random) -> Balancer:
    """Build ``random``, ``round-robin`` or ``least-outstanding``."""
    if kind == "random":
        return RandomBalancer(replicas, rng)
    if kind == "round-robin":
        return RoundRobin(replicas)
    if kind == "least-outstanding":
        return LeastOutstanding(replicas)
    raise ConfigError("balancer", f"got {kind!r}, allowed: {'|'.join(BALANCERS)}")
