"""``loadshed.deadline``: a request's deadline and priority read from its headers."""

from __future__ import annotations

import pytest

from loadshed.deadline import HeaderError, parse_grpc_timeout, parse_priority, parse_timeout_seconds
from loadshed.errors import LoadshedError, Priority

# -- X-Request-Timeout: seconds ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("2.5", 2.5),
        ("30", 30.0),
        (" 0.25 ", 0.25),  # whitespace around the number is ignored
        ("1e-3", 0.001),
        ("86400", 86400.0),  # one day: the longest accepted
    ],
)
def test_timeout_seconds_reads_a_positive_number(value: str, seconds: float) -> None:
    assert parse_timeout_seconds(value) == seconds


@pytest.mark.parametrize(
    "value", ["0", "-1", "86400.5", "nan", "inf", "-inf", "", "soon", "2.5s", "1,5"]
)
def test_timeout_seconds_refuses_what_is_not_a_usable_deadline(value: str) -> None:
    with pytest.raises(HeaderError) as caught:
        parse_timeout_seconds(value)
    error = caught.value
    assert error.header == "x-request-timeout"
    assert error.value == value
    assert str(error).startswith(f"x-request-timeout: malformed value {value!r}; allowed:")


def test_header_errors_name_the_header_they_were_read_from() -> None:
    with pytest.raises(HeaderError, match=r"^x-deadline: malformed value 'x'") as caught:
        parse_timeout_seconds("x", header="x-deadline")
    assert caught.value.header == "x-deadline"
    assert isinstance(caught.value, LoadshedError)


# -- grpc-timeout: digits and a unit ----------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("250m", 0.25),
        ("1H", 3600.0),
        ("2M", 120.0),
        ("5S", 5.0),
        ("1500u", 0.0015),
        ("2000000n", 0.002),
        ("12345678m", 12345.678),  # 8 digits: the most gRPC allows
        (" 3S ", 3.0),
        ("99999999H", 86400.0),  # longer than a day: capped at a day
        ("1441M", 86400.0),
    ],
)
def test_grpc_timeout_reads_digits_and_a_unit(value: str, seconds: float) -> None:
    assert parse_grpc_timeout(value) == pytest.approx(seconds, rel=1e-12)


@pytest.mark.parametrize(
    "value",
    [
        "0m",  # no time left is not a deadline
        "123456789m",  # 9 digits
        "250",  # no unit
        "m",  # no digits
        "1.5S",  # no fractions
        "-5S",
        "5s",  # units are case-sensitive: s is not S
        "5ms",
        "5 S",
        "",
    ],
)
def test_grpc_timeout_refuses_anything_else(value: str) -> None:
    with pytest.raises(HeaderError, match=r"^grpc-timeout: malformed value") as caught:
        parse_grpc_timeout(value)
    assert caught.value.header == "grpc-timeout"
    assert caught.value.value == value


# -- X-Priority --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "priority"),
    [
        ("critical", Priority.CRITICAL),
        ("default", Priority.DEFAULT),
        ("sheddable", Priority.SHEDDABLE),
        ("SHEDDABLE", Priority.SHEDDABLE),
        (" Critical ", Priority.CRITICAL),
    ],
)
def test_priority_reads_the_three_names_in_any_case(value: str, priority: Priority) -> None:
    assert parse_priority(value) is priority


@pytest.mark.parametrize("value", ["urgent", "", "0", "high", "critical,default"])
def test_priority_refuses_other_values_as_a_header_error(value: str) -> None:
    with pytest.raises(HeaderError) as caught:  # not the ConfigError Priority.parse raises
        parse_priority(value, header="x-tier")
    assert caught.value.header == "x-tier"
    assert str(caught.value).endswith("allowed: critical|default|sheddable")
