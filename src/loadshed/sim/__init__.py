"""A discrete-event simulator in virtual time for loadshed's limiters.

It drives the real admission core (:class:`loadshed.admission.Admission`) and the
real limit algorithms through a :class:`~loadshed.clock.VirtualClock`: clients with
timeouts, an origin with workers and a service-time distribution, replicas behind a
load balancer. Nothing sleeps, so a minute of traffic through 1000 replicas runs in
seconds of wall time and every run with the same seed gives the same result.

Modules: ``engine`` (event heap), ``arrivals``, ``service``, ``origin``, ``clients``,
``server`` (a replica), ``fleet`` (balancers), ``metrics``, ``scenarios``
(``paradox``, ``capacity-change``, ``fleet``), ``cli`` and ``plan``.
"""

from __future__ import annotations

from loadshed.sim.engine import Engine
from loadshed.sim.scenarios import (
    SIM_LIMITS,
    CapacityChangeScenario,
    FleetScenario,
    LimiterConfig,
    ParadoxScenario,
    ServiceConfig,
    run_capacity_change,
    run_fleet,
    run_paradox,
)

__all__ = [
    "SIM_LIMITS",
    "CapacityChangeScenario",
    "Engine",
    "FleetScenario",
    "LimiterConfig",
    "ParadoxScenario",
    "ServiceConfig",
    "run_capacity_change",
    "run_fleet",
    "run_paradox",
]
