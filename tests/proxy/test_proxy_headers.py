"""``loadshed.proxy.headers``: what the proxy sends upstream, and back to the client."""

from __future__ import annotations

from typing import Any

import pytest

from loadshed.proxy.headers import (
    HOP_BY_HOP,
    is_proxy_header,
    request_headers,
    response_headers,
)


def scope(
    *headers: tuple[str, str],
    client: tuple[str, int] | None = ("203.0.113.7", 51000),
    scheme: str = "http",
) -> dict[str, Any]:
    """An ASGI HTTP scope with these headers (as the server hands them over: bytes)."""
    return {
        "type": "http",
        "scheme": scheme,
        "client": client,
        "headers": [(n.encode("latin-1"), v.encode("latin-1")) for n, v in headers],
    }


def names(headers: list[tuple[str, str]]) -> list[str]:
    return [name.lower() for name, _ in headers]


def value(headers: list[tuple[str, str]], name: str) -> str | None:
    found = [v for n, v in headers if n.lower() == name.lower()]
    assert len(found) <= 1, f"{name} sent {len(found)} times: {headers}"
    return found[0] if found else None


# -- request_headers -------------------------------------------------------------------------


def test_end_to_end_headers_pass_in_order_and_as_sent() -> None:
    sent = request_headers(
        scope(
            ("Host", "api.example"),
            ("Accept", "application/json"),
            ("X-Custom", "a, b"),
            ("Content-Type", "text/plain"),
        ),
        "upstream:8000",
        None,
    )
    assert sent[0] == ("Host", "upstream:8000")  # the upstream's Host, first
    kept = [(n, v) for n, v in sent if n in ("Accept", "X-Custom", "Content-Type")]
    assert kept == [
        ("Accept", "application/json"),
        ("X-Custom", "a, b"),
        ("Content-Type", "text/plain"),
    ]


def test_hop_by_hop_headers_and_those_connection_names_are_dropped() -> None:
    sent = request_headers(
        scope(
            ("Host", "api.example"),
            ("Connection", "keep-alive, X-Secret , Upgrade"),
            ("Keep-Alive", "timeout=5"),
            ("TE", "trailers"),
            ("Trailer", "X-Checksum"),
            ("Transfer-Encoding", "chunked"),
            ("Upgrade", "websocket"),
            ("X-Secret", "for this hop only"),
            ("X-Kept", "1"),
        ),
        "upstream",
        None,
    )
    sent_names = names(sent)
    for hop in (*(n.decode() for n in HOP_BY_HOP), "x-secret"):
        assert hop not in sent_names
    assert value(sent, "X-Kept") == "1"


@pytest.mark.parametrize(
    "name", ["Proxy", "Proxy-Authorization", "Proxy-Connection", "Proxy-Anything"]
)
def test_proxy_headers_and_httpoxy_are_dropped(name: str) -> None:
    sent = request_headers(scope(("Host", "h"), (name, "http://evil:3128")), "upstream", None)
    assert name.lower() not in names(sent)


def test_is_proxy_header_matches_proxy_and_proxy_dash_only() -> None:
    assert is_proxy_header(b"proxy")
    assert is_proxy_header(b"proxy-authorization")
    assert is_proxy_header(b"proxy-")
    assert not is_proxy_header(b"proxyish")
    assert not is_proxy_header(b"x-proxy")
    assert not is_proxy_header(b"prox")


def test_forwarding_headers_name_the_client_and_keep_the_chain() -> None:
    sent = request_headers(
        scope(
            ("Host", "api.example"),
            ("X-Forwarded-For", "198.51.100.1"),
            ("Forwarded", "for=198.51.100.1"),
            ("X-Forwarded-Host", "spoofed"),
            ("X-Forwarded-Proto", "spoofed"),
            scheme="https",
        ),
        "upstream",
        None,
    )
    assert value(sent, "X-Forwarded-For") == "198.51.100.1, 203.0.113.7"
    assert value(sent, "Forwarded") == (
        'for=198.51.100.1, for=203.0.113.7;proto=https;host="api.example"'
    )
    assert value(sent, "X-Forwarded-Host") == "api.example"  # the client's Host, not its claim
    assert value(sent, "X-Forwarded-Proto") == "https"


def test_an_ipv6_client_is_quoted_and_bracketed_in_forwarded() -> None:
    sent = request_headers(scope(("Host", "h"), client=("2001:db8::1", 40000)), "upstream", None)
    assert value(sent, "X-Forwarded-For") == "2001:db8::1"
    assert value(sent, "Forwarded") == 'for="[2001:db8::1]";proto=http;host="h"'


def test_a_host_with_a_quote_is_left_out_of_forwarded() -> None:
    sent = request_headers(scope(("Host", 'a"b')), "upstream", None)
    assert value(sent, "Forwarded") == "for=203.0.113.7;proto=http"


def test_without_a_peer_address_the_clients_forwarding_headers_pass_as_sent() -> None:
    sent = request_headers(
        scope(("X-Forwarded-For", "10.0.0.1"), ("Forwarded", "for=10.0.0.1"), client=None),
        "upstream",
        None,
    )
    assert value(sent, "X-Forwarded-For") == "10.0.0.1"
    assert value(sent, "Forwarded") == "for=10.0.0.1"
    assert value(sent, "X-Forwarded-Host") is None  # no Host came in
    assert value(sent, "X-Forwarded-Proto") == "http"


def test_the_deadline_sent_is_the_time_left_and_replaces_the_clients() -> None:
    client = scope(
        ("Host", "h"),
        ("X-Request-Timeout", "30"),
        ("grpc-timeout", "30S"),
        ("Expect", "100-continue"),
    )
    sent = request_headers(client, "upstream", 1.23456)
    assert value(sent, "X-Request-Timeout") == "1.235"
    assert "grpc-timeout" not in names(sent)
    assert "expect" not in names(sent)  # 100-continue is this hop's business
    # Past the deadline the upstream still gets a positive one.
    assert value(request_headers(client, "upstream", -2.0), "X-Request-Timeout") == "0.001"
    # Without a deadline none is invented, and the client's is not passed on.
    assert value(request_headers(client, "upstream", None), "X-Request-Timeout") is None


def test_header_names_are_matched_in_any_case() -> None:
    sent = request_headers(
        scope(("HOST", "h"), ("CONNECTION", "X-A"), ("x-a", "1"), ("KEEP-ALIVE", "5")),
        "upstream",
        None,
    )
    assert names(sent).count("host") == 1
    assert "x-a" not in names(sent) and "keep-alive" not in names(sent)
    assert value(sent, "X-Forwarded-Host") == "h"


# -- response_headers ------------------------------------------------------------------------


def test_response_headers_drop_hop_by_hop_and_keep_the_rest_lower_cased() -> None:
    kept = response_headers(
        [
            (b"Content-Type", b"application/json"),
            (b"Retry-After", b"2"),
            (b"Connection", b"close, X-Hop"),
            (b"X-Hop", b"1"),
            (b"Transfer-Encoding", b"chunked"),
            (b"Keep-Alive", b"timeout=5"),
            (b"Proxy-Authenticate", b"Basic"),
            (b"Proxy-Status", b"upstream"),
            (b"Set-Cookie", b"a=1"),
            (b"Set-Cookie", b"b=2"),
        ]
    )
    assert kept == [
        (b"content-type", b"application/json"),
        (b"retry-after", b"2"),
        (b"set-cookie", b"a=1"),
        (b"set-cookie", b"b=2"),
    ]
