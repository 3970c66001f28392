"""AdmissionConfig: one frozen object with every admission setting, validated once and
accepted whole by Admission, Limiter, the middleware, the proxy and the simulator."""

from __future__ import annotations

import dataclasses

import pytest

from loadshed.admission import DISCIPLINES, Admission
from loadshed.asgi import LoadShedMiddleware
from loadshed.clock import VirtualClock
from loadshed.config import AdmissionConfig, Discipline
from loadshed.errors import ConfigError, Priority, Rejected, RejectReason
from loadshed.limiter import Limiter
from loadshed.limits import LIMIT_NAMES, LIMIT_SPECS, Fixed
from loadshed.proxy.config import ProxyConfig, parse_upstream
from loadshed.sim.scenarios import SIM_LIMITS, LimiterConfig


async def app(scope: object, receive: object, send: object) -> None:
    return None


def test_the_config_is_frozen_and_normalised() -> None:
    config = AdmissionConfig(discipline="lifo", reserved={"critical": 0.25})
    assert config.discipline is Discipline.LIFO
    assert dict(config.reserved) == {Priority.CRITICAL: 0.25}
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_queue = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.reserved[Priority.DEFAULT] = 0.1  # type: ignore[index]
    assert config.replace(max_queue=3).max_queue == 3
    assert config.max_queue == 1000
    # hashable like any frozen settings object, equal settings hash alike
    same = AdmissionConfig(discipline=Discipline.LIFO, reserved={Priority.CRITICAL: 0.25})
    assert same == config and hash(same) == hash(config)
    assert config != config.replace(reserved={})


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"max_queue": -1}, "max_queue"),
        ({"max_queue_wait": -1.0}, "max_queue_wait"),
        ({"discipline": "random"}, "discipline"),
        ({"reserved": {"critical": 1.0}}, "reserved"),
        ({"reserved": {"critical": 0.6, "default": 0.6}}, "reserved"),
        ({"initial_service_time": float("nan")}, "initial_service_time"),
        ({"learn_patience": "yes"}, "learn_patience"),
        ({"adaptive_wait_ceiling": -2.0}, "adaptive_wait_ceiling"),
        ({"codel_target": 0.0}, "codel_target"),
        ({"codel_interval": float("inf")}, "codel_interval"),
    ],
)
def test_each_bad_setting_names_its_field(settings: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as raised:
        AdmissionConfig(**settings)  # type: ignore[arg-type]
    assert raised.value.field == field
    assert "\n" not in str(raised.value)


def test_a_bad_discipline_lists_the_allowed_ones() -> None:
    with pytest.raises(ConfigError, match=r"^discipline: got 'random', allowed: fifo\|lifo\|codel"):
        AdmissionConfig(discipline="random")  # type: ignore[arg-type]
    assert DISCIPLINES == ("fifo", "lifo", "codel", "shortest")
    assert str(Discipline.CODEL) == "codel"


def test_replace_refuses_an_unknown_setting() -> None:
    with pytest.raises(ConfigError, match=r"^max_qeue: unknown admission setting"):
        AdmissionConfig().replace(max_qeue=3)


async def test_limiter_and_admission_take_the_config_whole() -> None:
    config = AdmissionConfig(
        max_queue=0, discipline=Discipline.CODEL, codel_target=0.02, codel_interval=0.5
    )
    limiter = Limiter(Fixed(1), config=config, clock=VirtualClock())
    assert limiter.admission.config is config
    assert limiter.admission.discipline is Discipline.CODEL
    assert limiter.admission.max_queue == 0
    # max_queue=0: the second request is refused at once
    first = limiter.enter()
    with pytest.raises(Rejected) as refused:
        limiter.enter()
    assert refused.value.reason is RejectReason.LIMIT
    assert not isinstance(first, Rejected)
    admission = Admission(Fixed(2), VirtualClock(), config=config)
    assert admission.config is config


def test_keywords_keep_working_and_do_not_mix_with_a_config() -> None:
    limiter = Limiter(max_queue=5, discipline="lifo")
    assert limiter.admission.config == AdmissionConfig(max_queue=5, discipline=Discipline.LIFO)
    # keywords left at their defaults are fine beside a config
    Limiter(config=AdmissionConfig(max_queue=5), max_queue=1000)
    with pytest.raises(ConfigError, match=r"^config: give the admission settings"):
        Limiter(config=AdmissionConfig(max_queue=5), max_queue=7)
    with pytest.raises(ConfigError, match=r"^config: expected an AdmissionConfig"):
        Limiter(config={"max_queue": 5})  # type: ignore[arg-type]


def test_the_middleware_builds_its_limiters_from_the_config() -> None:
    config = AdmissionConfig(max_queue=3, discipline="lifo")
    middleware = LoadShedMiddleware(app, config=config, routes={"/big": "fixed:2"})
    assert middleware.limiter.admission.config is config
    assert middleware.routes[0][1].admission.config is config


def test_the_proxy_and_the_simulator_use_the_same_config() -> None:
    proxy = ProxyConfig(
        upstreams=(parse_upstream("http://127.0.0.1:9"),), max_queue=7, wait_ceiling=3.0
    )
    assert proxy.admission == AdmissionConfig(max_queue=7, adaptive_wait_ceiling=3.0)
    sim = LimiterConfig("little", max_queue=9, discipline="codel")
    assert sim.admission == AdmissionConfig(max_queue=9, discipline=Discipline.CODEL)
    with pytest.raises(ConfigError, match=r"^discipline: got 'x', allowed: fifo\|lifo\|codel"):
        LimiterConfig("little", discipline="x")
    with pytest.raises(ConfigError, match=r"^limit: fixed:N needs an integer"):
        LimiterConfig("fixed:x")


def test_one_registry_of_limit_names() -> None:
    assert ("none", *LIMIT_NAMES) == SIM_LIMITS
    assert LIMIT_SPECS == "little|little+headroom|aimd|vegas|gradient2|gradient|fixed:N"
