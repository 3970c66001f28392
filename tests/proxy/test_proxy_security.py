"""``loadshed.proxy.security``: request targets, path resolution and the connection bound,
tested directly (``test_proxy.py`` and ``test_proxy_limits.py`` test them through a server)."""

from __future__ import annotations

import resource
from typing import Any

import pytest

from loadshed.proxy import security
from loadshed.proxy.security import (
    ClientConnections,
    bounded_protocol,
    client_connections,
    default_max_connections,
    is_origin_form,
    safe_path,
)

# -- the request target -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scope", "origin_form"),
    [
        ({"method": "GET", "raw_path": b"/predict"}, True),
        ({"method": "GET", "raw_path": b"/"}, True),
        ({"method": "GET", "raw_path": b"http://evil.example/x"}, False),  # absolute-form
        ({"method": "OPTIONS", "raw_path": b"*"}, False),
        ({"method": "CONNECT", "raw_path": b"evil.example:443"}, False),  # authority-form
        ({"method": "CONNECT", "raw_path": b"/x"}, False),  # never tunnels, whatever the target
        ({"method": "GET", "raw_path": b""}, False),
        ({"method": "GET", "path": "/from-path"}, True),  # no raw_path: the path decides
        ({"method": "GET", "raw_path": None, "path": "x"}, False),
        ({"method": "GET"}, False),
    ],
)
def test_only_origin_form_targets_are_served(scope: dict[str, Any], origin_form: bool) -> None:
    assert is_origin_form(scope) is origin_form


# -- safe_path --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "resolved"),
    [
        (b"/a/b?x=1", b"/a/b?x=1"),  # nothing to resolve: returned as is
        (b"/a/./b/../c", b"/a/c"),
        (b"/a/b/..", b"/a/"),  # a trailing dot segment leaves a directory
        (b"/a/b/.", b"/a/b/"),
        (b"/a/%2e%2E/c", b"/c"),  # encoded dots are dots
        (b"/a/%2e/c", b"/a/c"),
        (b"/a/..%2e/c", b"/a/..%2e/c"),  # three dots: an ordinary segment
        (b"/a/%41%20b", b"/a/%41%20b"),  # other segments stay encoded, exactly as sent
        (b"/a//b/../c", b"/a//c"),  # an empty segment is a segment
        (b"/..a/b", b"/..a/b"),
        (b"/", b"/"),
    ],
)
def test_safe_path_resolves_dot_segments(raw: bytes, resolved: bytes) -> None:
    assert safe_path(raw) == resolved


@pytest.mark.parametrize(
    "raw",
    [
        b"/../secret",
        b"/a/../../secret",
        b"/%2e%2e/secret",
        b"/%2E%2e/secret",
        b"/a/..%2fsecret",  # an encoded slash hides a ".." from the resolution
        b"/a/%2e%2e%2Fsecret",
        b"/a/..\\secret",  # as would a backslash, for an upstream that treats it as a slash
        b"/a/%2e%2e%5csecret",
        b"/a/x%2f..%2fy",
    ],
)
def test_safe_path_refuses_what_climbs_out_or_hides_a_dot_segment(raw: bytes) -> None:
    assert safe_path(raw) is None


def test_safe_path_keeps_an_encoded_slash_that_hides_no_dot_segment() -> None:
    assert safe_path(b"/files/a%2Fb") == b"/files/a%2Fb"


# -- the descriptor budget --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("soft", "connections"),
    [
        (1024, 480),  # (1024 - 64) // 2
        (65536, 32736),
        (80, 16),  # never fewer than 16
        (resource.RLIM_INFINITY, ((1 << 20) - 64) // 2),  # unlimited: as for 2**20
        (1 << 30, ((1 << 20) - 64) // 2),
    ],
)
def test_default_max_connections_leaves_two_descriptors_a_request(
    monkeypatch: pytest.MonkeyPatch, soft: int, connections: int
) -> None:
    monkeypatch.setattr(security.resource, "getrlimit", lambda _: (soft, resource.RLIM_INFINITY))
    assert default_max_connections() == connections


# -- ClientConnections ------------------------------------------------------------------------


class Transport:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


class Connection:
    """Stands in for a protocol instance: the bound reads only its transport."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.transport = Transport()

    def __repr__(self) -> str:
        return self.name


def _settle(bound: ClientConnections, *connections: Connection) -> None:
    for connection in connections:
        bound.read(connection)  # type: ignore[arg-type]


def test_connections_are_admitted_up_to_the_limit_then_the_oldest_idle_makes_room() -> None:
    bound = ClientConnections(2)
    a, b, c = Connection("a"), Connection("b"), Connection("c")
    assert bound.admit(a, 0.0) and bound.admit(b, 0.0)  # type: ignore[arg-type]
    assert list(bound.open) == [a, b] and list(bound.idle) == [a, b]
    _settle(bound, a, b)
    assert bound.admit(c, 0.0)  # type: ignore[arg-type]
    assert a.transport.closed and not b.transport.closed
    assert list(bound.open) == [b, c]
    assert (bound.evicted, bound.refused) == (1, 0)


def test_a_connection_at_work_is_never_evicted_and_a_full_bound_refuses() -> None:
    bound = ClientConnections(2)
    a, b, c, d = (Connection(name) for name in "abcd")
    bound.admit(a, 0.0)  # type: ignore[arg-type]
    bound.admit(b, 0.0)  # type: ignore[arg-type]
    _settle(bound, a, b)
    bound.busy(a)  # type: ignore[arg-type]
    assert bound.admit(c, 0.0)  # type: ignore[arg-type]  # b was the only idle one
    assert b.transport.closed and not a.transport.closed
    bound.busy(c)  # type: ignore[arg-type]
    assert not bound.admit(d, 0.0)  # type: ignore[arg-type]  # everyone is working
    assert (bound.evicted, bound.refused) == (1, 1)
    assert d not in bound.open and list(bound.open) == [a, c]


def test_a_connection_that_rests_becomes_the_newest_idle() -> None:
    bound = ClientConnections(3)
    a, b, c, d = (Connection(name) for name in "abcd")
    for connection in (a, b, c):
        bound.admit(connection, 0.0)  # type: ignore[arg-type]
    _settle(bound, a, b, c)
    bound.busy(a)  # type: ignore[arg-type]
    bound.resting(a)  # type: ignore[arg-type]  # answered: idle again, after b and c
    assert list(bound.idle) == [b, c, a]
    bound.admit(d, 0.0)  # type: ignore[arg-type]
    assert b.transport.closed and not a.transport.closed
    bound.closed(c)  # type: ignore[arg-type]
    assert list(bound.open) == [a, d] and list(bound.idle) == [a, d]
    bound.resting(c)  # type: ignore[arg-type]  # gone already: not counted again
    assert c not in bound.idle


def test_an_unread_connection_is_not_evicted_within_its_grace() -> None:
    """Under a flood of reconnects the oldest idle connection may be one whose request
    has not been read yet: it is kept, and the newcomer refused, until it is read or its
    grace is over."""
    bound = ClientConnections(2, unread_grace=0.25)
    a, b, c, d, e = (Connection(name) for name in "abcde")
    assert bound.admit(a, 0.0) and bound.admit(b, 0.0)  # type: ignore[arg-type]
    bound.read(a)  # type: ignore[arg-type]  # a sent part of a head, b nothing yet
    assert bound.admit(c, 0.1)  # type: ignore[arg-type]  # a makes room, not b
    assert a.transport.closed and list(bound.open) == [b, c]
    assert not bound.admit(d, 0.2)  # type: ignore[arg-type]  # b and c are unread
    assert not b.transport.closed and (bound.evicted, bound.refused) == (1, 1)
    assert bound.admit(d, 0.3)  # type: ignore[arg-type]  # b's grace is over
    assert b.transport.closed and list(bound.open) == [c, d]
    bound.read(d)  # type: ignore[arg-type]
    assert bound.admit(e, 0.31)  # type: ignore[arg-type]  # c is unread: d goes
    assert d.transport.closed and list(bound.open) == [c, e]
    assert (bound.evicted, bound.refused) == (3, 1)


# -- bounded_protocol -------------------------------------------------------------------------


def test_each_bounded_protocol_class_has_its_own_settings_and_bound() -> None:
    first = bounded_protocol(100, 200, max_headers=3, header_timeout=None, max_connections=7)
    second = bounded_protocol()
    assert first is not second
    assert (first.max_request_line, first.max_header_bytes, first.max_headers) == (100, 200, 3)
    assert first.header_timeout is None
    assert (second.max_request_line, second.max_header_bytes, second.max_headers) == (
        8192,
        65536,
        100,
    )
    assert second.header_timeout == 10.0
    first_bound, second_bound = client_connections(first), client_connections(second)
    assert first_bound is not None and second_bound is not None
    assert first_bound is not second_bound
    assert first_bound.limit == 7
    assert second_bound.limit == default_max_connections()


def test_client_connections_is_none_for_other_protocols() -> None:
    assert client_connections("httptools") is None
    assert client_connections(object) is None
