"""``loadshed.ray`` on a live local Ray cluster: two replicas of a small model behind
Serve's HTTP proxy, overloaded, then one replica killed.

Everything stays on 127.0.0.1: Ray's node binds to it, Serve's proxy listens on a free
ephemeral port there, and the clients send only to it. The cluster starts once per
module (about 10 to 30 s). Every loop is bounded in count and time, and the module as a
whole has a 300 s timeout.

The model costs no CPU. It sleeps for ``SERVICE_TIME`` while holding a one-slot
semaphore: each replica behaves like a model with one worker, so the two replicas serve
at most ``2 / SERVICE_TIME`` requests per second. Sleeping instead of computing keeps the
test from competing for the machine's cores.

Skipped when ``ray[serve]`` is not installed (the ``ray`` extra: ``make`` installs it).
"""

from __future__ import annotations

import contextlib
import json
import socket
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest

# A bare `import ray` is not a safe check here: pytest puts tests/ on sys.path, and
# this folder (tests/ray, no __init__.py) is then importable as a namespace package
# called `ray` when the real one is missing. `ray.serve` exists only in the real one.
pytest.importorskip(
    "ray.serve", reason="ray[serve] is not installed (the 'ray' extra: uv sync --all-extras)"
)
requests = pytest.importorskip("requests")

import ray  # noqa: E402
from ray import cloudpickle, serve  # noqa: E402

from loadshed.ray import deployment_options, protect  # noqa: E402

pytestmark = pytest.mark.timeout(300)

SERVICE_TIME = 0.2
"""Seconds each request holds its replica's only slot."""
REPLICAS = 2
DEADLINE = 1.0
"""Seconds, sent in loadshed's deadline header (``X-Request-Timeout``)."""
CLIENTS = 24
"""Concurrent clients in the overload test: 12 per replica. A FIFO queue would make the
last of them wait 12 x SERVICE_TIME = 2.4 s, well past DEADLINE."""
OVERLOAD_SECONDS = 12.0
QUEUED_TIME = SERVICE_TIME * CLIENTS / REPLICAS
"""How long a request would wait behind every other client in a plain queue (2.4 s)."""
CLIENT_TIMEOUT = 10.0
APP_NAME = "loadshed_ray_test"
RECOVERY_SECONDS = 90.0


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (free when asked; Serve binds it soon after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def build_deployment() -> Any:  # a serve.Deployment (Ray's typing says otherwise)
    """The protected app, defined here so that Ray pickles it by value: the replicas
    cannot import this test module."""
    import asyncio

    from fastapi import FastAPI

    app = FastAPI()

    @serve.deployment(
        num_replicas=REPLICAS,
        ray_actor_options={"num_cpus": 0.5},
        health_check_period_s=1.0,
        health_check_timeout_s=5.0,
        **deployment_options(),
    )
    @serve.ingress(protect(app))
    class SleepModel:
        def __init__(self) -> None:
            self.worker = asyncio.Semaphore(1)  # one request at a time

        @app.get("/predict")
        async def predict(self) -> dict[str, str]:
            async with self.worker:
                await asyncio.sleep(SERVICE_TIME)
            return {"replica": serve.get_replica_context().replica_tag}

        @app.get("/health")
        async def health(self) -> dict[str, str]:
            return {"status": "ok"}

    return SleepModel


@dataclass(frozen=True)
class Answer:
    status: int  # 0: no answer (connection error or client timeout)
    latency: float
    retry_after: str | None
    body: str


def get(url: str, headers: dict[str, str] | None = None) -> Answer:
    start = time.monotonic()
    try:
        response = requests.get(url, headers=headers, timeout=CLIENT_TIMEOUT)
    except requests.RequestException as error:
        return Answer(0, time.monotonic() - start, None, repr(error))
    return Answer(
        response.status_code,
        time.monotonic() - start,
        response.headers.get("Retry-After"),
        response.text,
    )


def replica_actor_names() -> list[str]:
    """The named actors of this app's replicas (namespace ``serve``)."""
    prefix = f"SERVE_REPLICA::{APP_NAME}#"
    return sorted(
        entry["name"]
        for entry in ray.util.list_named_actors(all_namespaces=True)
        if entry["namespace"] == "serve" and entry["name"].startswith(prefix)
    )


def running_replicas() -> int:
    app = serve.status().applications.get(APP_NAME)
    if app is None:
        return 0
    return sum(
        count
        for deployment in app.deployments.values()
        for state, count in deployment.replica_states.items()
        if str(getattr(state, "value", state)) == "RUNNING"
    )


METRICS_PORT = free_port()
"""The node's metrics export port (Ray's metrics agent serves Prometheus text there)."""


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    port = free_port()
    # The deployment is built in this module; let Ray pickle anything it uses from
    # here by value (the replicas cannot import the test module).
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        _node_ip_address="127.0.0.1",
        _metrics_export_port=METRICS_PORT,
    )
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_deployment().bind(), name=APP_NAME, route_prefix="/")
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60.0
        while get(f"{url}/health").status != 200:
            assert time.monotonic() < deadline, "the app did not answer /health within 60 s"
            time.sleep(0.5)
        yield url
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def test_deployment_options_are_applied(base_url: str) -> None:
    options = deployment_options()
    app = serve.status().applications[APP_NAME]
    assert str(getattr(app.status, "value", app.status)) == "RUNNING"
    assert options["max_ongoing_requests"] > 5  # Ray's default would cap each replica at 5
    assert running_replicas() == REPLICAS


def test_overload_refuses_fast_with_retry_after_and_successes_meet_their_deadline(
    base_url: str,
) -> None:
    url = f"{base_url}/predict"
    headers = {"X-Request-Timeout": f"{DEADLINE:g}"}
    for _ in range(10):  # a few requests first, so each limiter has seen some
        assert get(url, headers).status == 200
    answers: list[Answer] = []
    lock = threading.Lock()
    stop = time.monotonic() + OVERLOAD_SECONDS

    def client() -> None:
        for _ in range(1000):  # bounded in count as well as in time
            if time.monotonic() >= stop:
                return
            answer = get(url, headers)
            with lock:
                answers.append(answer)
            if answer.status == 503:
                # A polite client waits as told (at most 1 s here, to keep the load on).
                with contextlib.suppress(TypeError, ValueError):
                    time.sleep(min(float(answer.retry_after or 0), 1.0))

    with ThreadPoolExecutor(CLIENTS) as pool:
        for future in [pool.submit(client) for _ in range(CLIENTS)]:
            future.result(timeout=OVERLOAD_SECONDS + 2 * CLIENT_TIMEOUT)

    statuses = {answer.status for answer in answers}
    assert statuses <= {200, 503}, f"unexpected answers: {sorted(statuses)}"
    ok = [answer for answer in answers if answer.status == 200]
    refused = [answer for answer in answers if answer.status == 503]
    assert ok, "no request succeeded under overload"
    assert refused, "nothing was refused although the offered load exceeds capacity"

    # Every refusal says when to come back, as loadshed (and Ray's own, configured by
    # deployment_options) answers it.
    assert all(answer.retry_after is not None for answer in refused)
    assert all(int(answer.retry_after or "0") >= 1 for answer in refused)
    # At least some refusals are loadshed's own (its JSON body), not Ray's.
    reasons = set()
    for answer in refused:
        with contextlib.suppress(ValueError):
            reasons.add(json.loads(answer.body).get("reason"))
    assert reasons & {"limit", "deadline", "queue_timeout"}, f"refusal bodies: {reasons}"

    # Refusals are fast: far shorter than the wait behind every other client.
    refusal_latencies = [answer.latency for answer in refused]
    assert statistics.median(refusal_latencies) < QUEUED_TIME / 4, refusal_latencies
    assert max(refusal_latencies) < QUEUED_TIME, refusal_latencies

    # Successes meet their deadline. The client's latency also counts the proxy's hop,
    # which the replica's deadline does not see, hence 95 % and a bound for the rest.
    within = sum(answer.latency <= DEADLINE for answer in ok) / len(ok)
    assert within >= 0.95, f"{within:.0%} of {len(ok)} successes within {DEADLINE} s"
    assert max(answer.latency for answer in ok) < 2 * DEADLINE


def test_metrics_carry_the_replica_label(base_url: str) -> None:
    answer = get(f"{base_url}/metrics")
    assert answer.status == 200
    assert "loadshed_limit{" in answer.body
    assert 'replica="' in answer.body and f'application="{APP_NAME}"' in answer.body


def test_gauges_and_counters_reach_rays_metrics_with_the_replica_tags(base_url: str) -> None:
    # Copied every 5 s by each replica, exported by the node's metrics agent with Ray's
    # `ray_` prefix; bounded wait.
    for _ in range(5):
        assert get(f"{base_url}/predict", {"X-Request-Timeout": "5"}).status == 200
    deadline = time.monotonic() + 60.0
    while True:
        text = get(f"http://127.0.0.1:{METRICS_PORT}/metrics").body
        limits = [line for line in text.splitlines() if line.startswith("ray_loadshed_limit{")]
        counted = [
            line
            for line in text.splitlines()
            if line.startswith("ray_loadshed_requests_total{") and 'outcome="success"' in line
        ]
        if limits and counted:
            break
        assert time.monotonic() < deadline, "no loadshed metrics on the node's port in 60 s"
        time.sleep(1.0)
    assert all(f'application="{APP_NAME}"' in line and 'replica="' in line for line in limits)
    assert sum(float(line.rsplit(" ", 1)[1]) for line in counted) >= 5


def test_a_killed_replica_is_replaced_and_requests_succeed_again(base_url: str) -> None:
    before = replica_actor_names()
    assert len(before) == REPLICAS, before
    ray.kill(ray.get_actor(before[0], namespace="serve"), no_restart=True)

    deadline = time.monotonic() + RECOVERY_SECONDS
    while True:
        names = replica_actor_names()
        if before[0] not in names and len(names) == REPLICAS and running_replicas() == REPLICAS:
            break
        assert time.monotonic() < deadline, (
            f"no replacement running within {RECOVERY_SECONDS} s: {names}"
        )
        time.sleep(0.5)

    # Both replicas answer again: a run of successes in a row, bounded in time.
    url = f"{base_url}/predict"
    in_a_row = 0
    seen: set[str] = set()
    while in_a_row < 10:
        assert time.monotonic() < deadline, f"only {in_a_row} successes in a row"
        answer = get(url, {"X-Request-Timeout": "5"})
        if answer.status == 200:
            in_a_row += 1
            seen.add(json.loads(answer.body)["replica"])
        else:
            in_a_row = 0
            time.sleep(0.2)
    assert seen, "no replica named itself"
