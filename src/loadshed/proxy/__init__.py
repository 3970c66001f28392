"""``loadshed proxy``: admission control in front of any HTTP model server.

    from loadshed.proxy import ProxyConfig, create_proxy, parse_upstream
    config = ProxyConfig(upstreams=(parse_upstream("http://127.0.0.1:8000"),), limit="little")
    app, proxy = create_proxy(config)   # app: an ASGI app to serve (uvicorn)

Modules: :mod:`.config` (settings and their validation), :mod:`.pool` (upstreams,
one limiter each, least-outstanding choice, down marking and probes),
:mod:`.headers` (hop-by-hop stripping, X-Forwarded-For/Forwarded), :mod:`.errors`
(upstream faults -> 502/504 with a JSON reason), :mod:`.security` (origin-form
targets, safe paths, bounded request heads, header timeout, connection bound),
:mod:`.listen` (listeners bound up front), :mod:`.app` (forwarding), :mod:`.cli`.

The names below are imported on first use, so that ``loadshed.proxy.security`` and
``loadshed.proxy.listen`` (which ``serve-demo`` uses) do not pull in aiohttp.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loadshed.proxy.app import ProxyApp, ProxyMetrics, create_proxy
    from loadshed.proxy.config import ProxyConfig, UpstreamURL, parse_listen, parse_upstream
    from loadshed.proxy.pool import Upstream, UpstreamPool

__all__ = [
    "ProxyApp",
    "ProxyConfig",
    "ProxyMetrics",
    "Upstream",
    "UpstreamPool",
    "UpstreamURL",
    "create_proxy",
    "parse_listen",
    "parse_upstream",
]

_HOMES = {
    "ProxyApp": "app",
    "ProxyMetrics": "app",
    "create_proxy": "app",
    "ProxyConfig": "config",
    "UpstreamURL": "config",
    "parse_listen": "config",
    "parse_upstream": "config",
    "Upstream": "pool",
    "UpstreamPool": "pool",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'loadshed.proxy' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"loadshed.proxy.{home}"), name)
    globals()[name] = value
    return value
