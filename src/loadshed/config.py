"""The admission configuration: one typed, frozen object, validated once.

:class:`AdmissionConfig` holds every setting of the admission core (queue bound,
queue wait, discipline, CoDel, reserved shares, service-time guess, patience); the
:class:`~loadshed.admission.Admission` core, :class:`~loadshed.limiter.Limiter`,
:class:`~loadshed.asgi.LoadShedMiddleware`, the proxy and the simulator accept it
whole. Which limit algorithm sets the limit is not part of it: that is the ``limit``
spec (:func:`loadshed.limits.make_limit`).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

from loadshed.checks import check_int, check_number, check_optional_number
from loadshed.costmodel import CostModel
from loadshed.errors import ConfigError, Priority
from loadshed.waitbound import DEFAULT_WAIT_CEILING

__all__ = ["AdmissionConfig", "Discipline", "LimitUnit", "resolve_config"]


_Choice = TypeVar("_Choice", bound=enum.Enum)


def _member(choices: type[_Choice], value: object, field: str) -> _Choice:
    """The member of ``choices`` that ``value`` is or names; :class:`ConfigError`
    naming ``field`` and the allowed values otherwise."""
    if isinstance(value, choices):
        return value
    if isinstance(value, str):
        for member in choices:
            if member.value == value:
                return member
    allowed = "|".join(str(member.value) for member in choices)
    raise ConfigError(field, f"got {value!r}, allowed: {allowed}")


class Discipline(str, enum.Enum):
    """The order in which queued requests are granted."""

    FIFO = "fifo"
    """Oldest first (the default)."""
    LIFO = "lifo"
    """Newest first: under overload the requests most likely still wanted go first."""
    CODEL = "codel"
    """FIFO, switching to LIFO with a short queue timeout while the minimum queue wait
    over ``codel_interval`` exceeds ``codel_target`` (Facebook's adaptive LIFO + CoDel)."""
    SHORTEST = "shortest"
    """The request with the shortest predicted service time first (from its cost, by
    the fitted cost model; oldest first among equals, and FIFO until the model is
    fitted, when its slope is 0 or when no request carries a cost): under overload more
    requests meet their deadlines; a big one waits while smaller ones come, and leaves
    by its deadline or the wait bound."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: Discipline | str, field: str = "discipline") -> Discipline:
        """A member from itself or its name; :class:`ConfigError` naming ``field`` (a
        setting or a flag) and the allowed values."""
        return _member(cls, value, field)


class LimitUnit(str, enum.Enum):
    """What the concurrency limit counts."""

    REQUESTS = "requests"
    """Requests in flight (the default): every request takes one slot."""
    COST = "cost"
    """Cost units in flight (rows, tokens): a request takes its cost (one unit when it
    carries none), for servers whose capacity is memory rather than slots (a GPU's KV
    cache in tokens). Needs a fixed limit (``fixed:N``, N in cost units)."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: LimitUnit | str) -> LimitUnit:
        """A member from itself or its name; :class:`ConfigError` naming the allowed values."""
        return _member(cls, value, "limit_unit")


def _frozen_reserved(reserved: object) -> Mapping[Priority, float]:
    """Validate ``reserved`` (priority -> share of the limit) into a read-only mapping."""
    if reserved is None:
        return MappingProxyType({})
    if not isinstance(reserved, Mapping):
        raise ConfigError(
            "reserved", f"must be a mapping priority -> share, got {type(reserved).__name__}"
        )
    shares: dict[Priority, float] = {}
    for key, share in reserved.items():
        priority = Priority.parse(key)
        try:
            share = check_number("share", share, minimum=0, maximum=1, max_open=True)
        except ConfigError as error:
            reason = str(error).partition(": ")[2]
            raise ConfigError("reserved", f"share for {priority} {reason}") from None
        shares[priority] = share
    if sum(shares.values()) >= 1:
        raise ConfigError("reserved", "shares must add up to less than 1")
    return MappingProxyType(shares)


@dataclass(frozen=True)
class AdmissionConfig:
    """Every setting of the admission core; invalid values raise :class:`ConfigError`
    naming the field when the object is built.

    Attributes:
        max_queue: most requests waiting at once (0: no queue, refuse when full).
        max_queue_wait: longest wait in the queue in seconds; None (default) means
            the adaptive bound (:class:`~loadshed.waitbound.AdaptiveWaitBound`);
            ``math.inf``: no bound, the deadline alone ends a wait.
        discipline: :class:`Discipline` or its name (``fifo``, ``lifo``, ``codel``,
            ``shortest``).
        reserved: share of the limit (0..1) kept for a class and those more critical,
            e.g. ``{Priority.CRITICAL: 0.2}``.
        initial_service_time: guess used for estimates until the first sample.
        learn_patience: use the learned client patience as the deadline of requests
            that carry none.
        adaptive_wait_ceiling: seconds of response time (queue wait plus a service
            time) the adaptive bound may grow to while clients are patient; 0 keeps
            the bound at one service time. Unused when ``max_queue_wait`` is set.
        codel_target / codel_interval: CoDel's target queue wait and interval, in
            seconds (``discipline="codel"`` only).
        initial_cost_model: ``(intercept, slope)`` in seconds and seconds per unit of
            cost: the cost model (:class:`~loadshed.costmodel.CostModel`) to start
            from, e.g. fitted by ``loadshed plan --profile``; None (default) learns it
            from the first successes that carry a cost.
        limit_unit: what the limit counts: :class:`LimitUnit` or its name,
            ``requests`` (default) or ``cost`` (in-flight cost <= the limit; a request
            without a cost counts one unit, and one costing more than the whole limit
            runs alone). ``cost`` needs a fixed limit: an adaptive one counts requests.
    """

    max_queue: int = 1000
    max_queue_wait: float | None = None
    discipline: Discipline = Discipline.FIFO
    # (left out of the hash, a read-only mapping is not hashable; equality compares it)
    reserved: Mapping[Priority, float] = field(
        default_factory=lambda: MappingProxyType({}), hash=False
    )
    initial_service_time: float | None = None
    learn_patience: bool = True
    adaptive_wait_ceiling: float = DEFAULT_WAIT_CEILING
    codel_target: float = 0.005
    codel_interval: float = 0.1
    initial_cost_model: tuple[float, float] | None = None
    limit_unit: LimitUnit = LimitUnit.REQUESTS

    def __post_init__(self) -> None:
        def settle(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)  # normalised once, frozen after

        settle("max_queue", check_int("max_queue", self.max_queue, minimum=0))
        settle(
            "max_queue_wait",
            check_optional_number(
                "max_queue_wait", self.max_queue_wait, minimum=0, allow_inf=True, unit="seconds"
            ),
        )
        settle("discipline", Discipline.parse(self.discipline))
        settle("limit_unit", LimitUnit.parse(self.limit_unit))
        settle("reserved", _frozen_reserved(self.reserved))
        settle(
            "initial_service_time",
            check_optional_number(
                "initial_service_time", self.initial_service_time, minimum=0, unit="seconds"
            ),
        )
        if not isinstance(self.learn_patience, bool):
            raise ConfigError(
                "learn_patience", f"must be true or false, got {self.learn_patience!r}"
            )
        settle(
            "adaptive_wait_ceiling",
            check_number(
                "adaptive_wait_ceiling", self.adaptive_wait_ceiling, minimum=0, unit="seconds"
            ),
        )
        for name in ("codel_target", "codel_interval"):
            settle(
                name,
                check_number(name, getattr(self, name), minimum=0, min_open=True, unit="seconds"),
            )
        model = self.initial_cost_model
        if model is not None:
            if not isinstance(model, (tuple, list)) or len(model) != 2:
                raise ConfigError(
                    "initial_cost_model", f"must be (intercept, slope) in seconds, got {model!r}"
                )
            try:
                CostModel(intercept=model[0], slope=model[1])  # validates both
            except ConfigError as error:  # name this setting, not the model's arguments
                raise ConfigError("initial_cost_model", str(error)) from None
            settle("initial_cost_model", (float(model[0]), float(model[1])))

    def replace(self, **changes: Any) -> AdmissionConfig:
        """A copy with ``changes`` applied (and validated)."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            allowed = "|".join(f.name for f in dataclasses.fields(self))
            raise ConfigError(unknown[0], f"unknown admission setting; allowed: {allowed}")
        return dataclasses.replace(self, **changes)


_DEFAULTS = AdmissionConfig()


def resolve_config(config: AdmissionConfig | None, **keywords: Any) -> AdmissionConfig:
    """The settings of a constructor that takes both ``config=`` and the keyword
    arguments of :class:`AdmissionConfig` (the keywords at their defaults when
    ``config`` is given: mixing the two is a :class:`ConfigError`)."""
    if config is None:
        return AdmissionConfig(**keywords)
    if not isinstance(config, AdmissionConfig):
        raise ConfigError("config", f"expected an AdmissionConfig, got {type(config).__name__}")
    for name, value in keywords.items():
        default = getattr(_DEFAULTS, name)
        if value is default or value == default or (name == "reserved" and not value):
            continue
        raise ConfigError(
            "config",
            f"give the admission settings in config= or as keywords, not both "
            f"(got {name}={value!r})",
        )
    return config
