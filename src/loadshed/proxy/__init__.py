"""``loadshed proxy``: admission control in front of any HTTP model server.

    from loadshed.proxy import ProxyConfig, create_proxy, parse_upstream
    config = ProxyConfig(upstreams=(parse_upstream("http://127.0.0.1:8000"),), limit="little")
    app, proxy = create_proxy(config)   # app: an ASGI app to serve (uvicorn)

Modules: :mod:`.config` (settings and their validation), :mod:`.pool` (upstreams,
one limiter each, least-outstanding choice, down marking and probes),
:mod:`.headers` (hop-by-hop stripping, X-Forwarded-For/Forwarded), :mod:`.errors`
(upstream faults -> 502/504 with a JSON reason), :mod:`.security` (origin-form
targets only, bounded request heads), :mod:`.app` (forwarding), :mod:`.cli`.
"""

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
