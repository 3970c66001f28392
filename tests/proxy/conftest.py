"""Fixtures shared by the proxy's tests (servers and helpers: ``tests/proxy_servers.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from proxy_servers import Recorder, echo_app, serve_asgi


@pytest.fixture
def echo_upstream() -> Iterator[tuple[str, Recorder]]:
    """An upstream on 127.0.0.1 that answers every request with what it got (as JSON),
    and the recorder of those requests: ``(url, recorder)``."""
    recorder = Recorder()
    with serve_asgi(echo_app(recorder)) as url:
        yield url, recorder
