"""Every numeric setting is validated at construction (issue 14 item 5): NaN, infinity
(where it means nothing), the wrong type (a string, a bool for a number) and values out
of range raise a one-line :class:`ConfigError` naming the setting, never a bare
``TypeError`` and never an accepted nonsense value.

In the optional compiled build (mypyc, ``make compiled``) a compiled constructor checks
its argument types itself before any of this runs: a value of the wrong type raises
``TypeError`` there, and a bool passed for a number is converted to 0 or 1 (see
docs/architecture.md, "The compiled build"). The tests allow for that when they run
against it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

import loadshed.admission
from loadshed.admission import Admission
from loadshed.asgi import LoadShedMiddleware
from loadshed.bounded import bounded_map
from loadshed.checks import check_int, check_number, check_optional_number
from loadshed.client import AdaptiveClient
from loadshed.clock import VirtualClock
from loadshed.errors import ConfigError, Priority
from loadshed.limiter import Limiter
from loadshed.limits import AIMD, Fixed, Gradient2, Little, Vegas, Windowed
from loadshed.runner import ModelRunner

NAN = math.nan
INF = math.inf
COMPILED = str(loadshed.admission.__file__).endswith((".so", ".pyd"))


def expect_config_error(build: Callable[[], object], field: str, value: Any) -> None:
    """``build()`` raises ConfigError naming ``field`` on one line (compiled: or TypeError,
    and a bool may be taken as a number)."""
    try:
        build()
    except ConfigError as error:
        if COMPILED and isinstance(value, bool) and error.field != field:
            pytest.xfail("compiled: mypyc converts a bool argument to a number")
        assert error.field == field
        assert str(error).startswith(f"{field}: ")
        assert "\n" not in str(error)
        return
    except TypeError:
        if COMPILED:
            return  # mypyc checked the argument's type first
        raise
    if COMPILED and isinstance(value, bool):
        pytest.xfail("compiled: mypyc converts a bool argument to a number")
    raise AssertionError(f"{field}={value!r} was accepted")


async def _app(scope: Any, receive: Any, send: Any) -> None:
    """An ASGI app that is never called."""


async def _call(item: Any) -> Any:
    return item


def _job() -> None:
    """A runner job that is never run."""


def middleware(**kwargs: Any) -> object:
    return LoadShedMiddleware(_app, **kwargs)


def admission(**kwargs: Any) -> object:
    return Admission(Fixed(1), VirtualClock(), **kwargs)


def runner(**kwargs: Any) -> object:
    return ModelRunner(_job, **kwargs)


def mapped(**kwargs: Any) -> object:
    return bounded_map(_call, [1, 2], **kwargs)


CASES: list[tuple[str, Callable[..., object], str, list[Any]]] = [
    # LoadShedMiddleware
    ("middleware", middleware, "reject_status", [500, 503.0, True, "503"]),
    ("middleware", middleware, "max_body_bytes", [-1, 1.5, True, "x", INF, NAN]),
    ("middleware", middleware, "default_timeout", [NAN, INF, 0, -1, "1", True]),
    ("middleware", middleware, "disconnect_watch_after", [NAN, INF, -1, "x", True]),
    ("middleware", middleware, "deadline_header", [5, ""]),
    ("middleware", middleware, "priority_header", [None]),
    # Limiter (its admission core)
    ("limiter", Limiter, "max_queue", [-1, INF, NAN, "x", True, 1.5]),
    ("limiter", Limiter, "max_queue_wait", [NAN, -1, -INF, "x", True]),
    ("limiter", Limiter, "initial_service_time", [NAN, INF, -1, "x", True]),
    ("limiter", Limiter, "discipline", [5, "random"]),
    ("limiter", Limiter, "name", [5]),
    ("limiter", Limiter, "reserved", ["x", 5]),
    ("admission", admission, "codel_target", [NAN, INF, 0, -1, "x", True]),
    ("admission", admission, "codel_interval", [NAN, INF, 0, "x"]),
    # ModelRunner
    ("runner", runner, "workers", [0, -1, 1.5, True, "2", INF, NAN, 100_000]),
    ("runner", runner, "max_workers", [0, 1.5, True, "2", INF]),
    ("runner", runner, "job_timeout", [NAN, INF, 0, -1, "1", True]),
    # limit algorithms
    ("fixed", Fixed, "limit", [0, 1.5, True, "x", INF, NAN]),
    ("aimd", AIMD, "initial_limit", [0, 2.5, True, "x", NAN]),
    ("aimd", AIMD, "min_limit", [0, 1.5, True, "x"]),
    ("aimd", AIMD, "max_limit", [0, 200.5, True, INF]),
    ("aimd", AIMD, "backoff_ratio", [NAN, 1.0, 0.2, "x", INF]),
    ("aimd", AIMD, "timeout", [NAN, INF, 0, "x", True]),
    ("vegas", Vegas, "smoothing", [NAN, 0, 1.5, "x", True]),
    ("vegas", Vegas, "probe_multiplier", [0, 1.5, True, NAN]),
    ("vegas", Vegas, "seed", ["x", 1.5]),
    ("vegas", Vegas, "initial_limit", [NAN]),
    ("gradient2", Gradient2, "smoothing", [NAN, 0, 2, "x"]),
    ("gradient2", Gradient2, "queue_size", [NAN, INF, -1, "x", True]),
    ("gradient2", Gradient2, "long_window", [0, 1.5, True, INF]),
    ("gradient2", Gradient2, "rtt_tolerance", [NAN, INF, 0.5, "x"]),
    ("gradient2", Gradient2, "drop_backoff", [NAN, 1.0, 0.1, "x"]),
    ("gradient2", Gradient2, "max_limit", [NAN, 1e9]),
    ("little", Little, "initial_limit", [2.5, True, NAN]),
    ("little", Little, "max_limit", [INF, "x"]),
    ("little", Little, "drain_gain", [NAN, INF, 0, 1.5, "x", True]),
    ("little", Little, "cycle_rounds", [1, 2.5, True, "x"]),
    ("little", Little, "filter_rounds", [4, 10.5, True]),
    ("little", Little, "min_round", [NAN, INF, 0, -1, "x", True]),
    ("little", Little, "backoff", [NAN, 0, 1, 1.5, "x", True]),
    ("windowed", lambda **kw: Windowed(Fixed(1), **kw), "window", [NAN, INF, 0, "x"]),
    ("windowed", lambda **kw: Windowed(Fixed(1), **kw), "min_samples", [0, 1.5, True]),
    ("windowed", lambda **kw: Windowed(Fixed(1), **kw), "min_rtt", [NAN, INF, -1, "x"]),
    ("windowed", lambda **kw: Windowed(Fixed(1), **kw), "close_on_drop", ["yes", 1, None]),
    # AdaptiveClient and bounded_map
    ("client", AdaptiveClient, "timeout", [NAN, INF, 0, -1, "x", True]),
    ("client", AdaptiveClient, "max_queue", [-1, INF, "x", True]),
    ("client", AdaptiveClient, "max_attempts", [0, 1.5, True, "3"]),
    ("client", AdaptiveClient, "retry_statuses", [[600], ["503"], [True], 503]),
    ("bounded_map", mapped, "concurrency", [0, -1, 1.5, True, "x", INF, NAN]),
    ("bounded_map", mapped, "max_held", [0, 1.5, True, "x", INF]),
]


@pytest.mark.parametrize(
    ("factory", "field", "value"),
    [
        pytest.param(factory, field, value, id=f"{owner}-{field}={value!r}")
        for owner, factory, field, values in CASES
        for value in values
    ],
)
def test_bad_numeric_setting_is_a_config_error_naming_it(
    factory: Callable[..., object], field: str, value: Any
) -> None:
    expect_config_error(lambda: factory(**{field: value}), field, value)


@pytest.mark.parametrize("share", [NAN, INF, 1.0, -0.1, "x", True])
def test_a_bad_reserved_share_names_its_priority(share: Any) -> None:
    expect_config_error(lambda: Limiter(reserved={Priority.CRITICAL: share}), "reserved", share)
    if not COMPILED:
        with pytest.raises(ConfigError, match=r"^reserved: share for critical must be a finite"):
            Limiter(reserved={Priority.CRITICAL: share})


def test_good_settings_pass_and_keep_their_meaning() -> None:
    limiter = Limiter(max_queue=0, max_queue_wait=INF, initial_service_time=0.5)
    assert limiter.admission.max_queue == 0 and limiter.admission.max_queue_wait == INF
    middleware(default_timeout=2, disconnect_watch_after=0, max_body_bytes=0)
    AIMD(timeout=5, backoff_ratio=0.5)
    Gradient2(drop_backoff=None, queue_size=0)
    Vegas(seed=None, smoothing=1)
    AdaptiveClient(timeout=None, max_queue=0)
    assert isinstance(Fixed(3).limit, int)


def test_the_checks_themselves() -> None:
    assert check_int("n", 3, minimum=1) == 3
    assert check_number("x", 2, minimum=0) == 2.0 and isinstance(check_number("x", 2), float)
    assert check_number("x", INF, allow_inf=True) == INF
    assert check_optional_number("x", None) is None
    with pytest.raises(ConfigError, match=r"^n: must be an integer >= 1 and <= 5, got 6$"):
        check_int("n", 6, minimum=1, maximum=5)
    with pytest.raises(ConfigError, match=r"^x: must be a finite number of seconds > 0, got nan$"):
        check_number("x", NAN, minimum=0, min_open=True, unit="seconds")
    with pytest.raises(ConfigError, match=r"^x: must be a number >= 0 or None, got 'x'$"):
        check_optional_number("x", "x", minimum=0, allow_inf=True)
    with pytest.raises(ConfigError, match=r"^x: must be a finite number < 1, got True$"):
        check_number("x", True, maximum=1, max_open=True)
