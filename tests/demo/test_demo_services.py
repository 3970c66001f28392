"""The demo services under real uvicorn on 127.0.0.1 (ephemeral port), driven by real HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import re
import select
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, NamedTuple

import aiohttp
import pytest
import uvicorn
from sklearn.datasets import load_digits
from starlette.applications import Starlette

from loadshed.demo import DEMO_MODELS, create_demo_app, digits, hashburn, origin
from loadshed.errors import ConfigError
from loadshed.testing import base_url, serve_config

pytestmark = pytest.mark.timeout(60)


class Served(NamedTuple):
    url: str
    loop: asyncio.AbstractEventLoop
    """The server's event loop (to run code next to the app, which is not thread-safe)."""


@contextlib.contextmanager
def serve(app: Starlette) -> Iterator[Served]:
    """Run ``app`` under uvicorn in a thread on an ephemeral loopback port, lifespan on."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    with serve_config(config, startup_timeout=30, stop_timeout=15) as server:
        yield Served(base_url(server), server.servers[0].get_loop())


@contextlib.asynccontextmanager
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    timeout = aiohttp.ClientTimeout(total=20)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        yield session


async def get_json(session: aiohttp.ClientSession, url: str) -> tuple[int, Any, float]:
    started = time.monotonic()
    async with session.get(url) as response:
        body = await response.json()
        return response.status, body, time.monotonic() - started


# --------------------------------------------------------------------------- hashburn


async def test_hashburn_holds_its_service_time_and_returns_the_hash() -> None:
    with serve(hashburn.create_app(service_time=0.2)) as served:
        url = served.url
        async with client() as session:
            status, body, elapsed = await get_json(session, f"{url}/calculate?input=hello")
            assert status == 200
            assert 0.19 <= elapsed < 1.5
            assert body["rounds"] > 1
            assert body["result"] == hashburn.hash_chain(b"hello", body["rounds"])
            # One process is one worker: two concurrent requests are served one after the other.
            started = time.monotonic()
            results = await asyncio.gather(
                get_json(session, f"{url}/calculate?input=a"),
                get_json(session, f"{url}/calculate?input=b"),
            )
            assert time.monotonic() - started >= 0.38
            assert [r[0] for r in results] == [200, 200]
            assert max(r[2] for r in results) >= 0.38

            status, body, _ = await get_json(session, f"{url}/calculate")
            assert status == 422
            assert body["field"] == "input"
            status, body, _ = await get_json(session, f"{url}/calculate?input={'x' * 5000}")
            assert (status, body["field"]) == (422, "input")
            status, body, _ = await get_json(session, f"{url}/health")
            assert (status, body["status"], body["service_time"]) == (200, "ok", 0.2)


def test_hash_chain_matches_burn() -> None:
    digest, rounds = hashburn.burn(b"abc", 0.01)
    assert digest == hashburn.hash_chain(b"abc", rounds)
    assert hashburn.hash_chain(b"abc", 1) == (
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    )


# --------------------------------------------------------------------------- digits


async def test_digits_predicts_training_rows_and_rejects_bad_input() -> None:
    features, labels = load_digits(return_X_y=True)
    rows = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 500, 1000]
    app = create_demo_app("digits", workers=2, n_estimators=30)
    with serve(app) as served:
        url = served.url
        async with client() as session:

            async def classify(row: int) -> tuple[int, dict[str, Any]]:
                payload = {"features": [int(v) for v in features[row]]}
                async with session.post(f"{url}/predict", json=payload) as response:
                    return response.status, await response.json()

            answers = await asyncio.gather(*(classify(row) for row in rows))
            for row, (status, body) in zip(rows, answers, strict=True):
                assert status == 200
                assert body["class"] == labels[row]
                assert len(body["probabilities"]) == 10
                assert sum(body["probabilities"]) == pytest.approx(1.0, abs=1e-3)
                assert body["probabilities"][body["class"]] == max(body["probabilities"])

            bad_inputs: list[tuple[Any, str]] = [
                ({"features": [1.0] * 63}, "features"),
                ({"features": "0,1,2"}, "features"),
                ({"pixels": [0] * 64}, "features"),
                ({"features": [0] * 5 + ["x"] + [0] * 58}, "features[5]"),
                ({"features": [0] * 63 + [True]}, "features[63]"),
                ([0] * 64, "body"),
            ]
            for payload, field in bad_inputs:
                async with session.post(f"{url}/predict", json=payload) as response:
                    body = await response.json()
                    assert response.status == 422, payload
                    assert body["field"] == field
                    assert body["reason"].startswith(field)
            async with session.post(f"{url}/predict", data=b"{not json") as response:
                assert response.status == 422
                assert (await response.json())["field"] == "body"
            too_long = b"0" * (digits.MAX_BODY_BYTES + 1)
            async with session.post(f"{url}/predict", data=too_long) as response:
                assert response.status == 413

            # A batch: one call for many images, answers in order.
            batch = {"batch": [[int(v) for v in features[row]] for row in rows]}
            async with session.post(f"{url}/predict", json=batch) as response:
                assert response.status == 200
                answer = await response.json()
            assert answer["classes"] == [int(labels[row]) for row in rows]
            assert len(answer["probabilities"]) == len(rows)
            bad_batches: list[tuple[Any, str]] = [
                ({"batch": []}, "batch"),
                ({"batch": [[0] * 64] * (digits.MAX_BATCH + 1)}, "batch"),
                ({"batch": [[0] * 64, [0] * 63]}, "batch[1]"),
                ({"batch": [[0] * 64, [0] * 7 + [None] + [0] * 56]}, "batch[1][7]"),
            ]
            for payload, field in bad_batches:
                async with session.post(f"{url}/predict", json=payload) as response:
                    assert response.status == 422, field
                    assert (await response.json())["field"] == field

            status, stats, _ = await get_json(session, f"{url}/admin/stats")
            assert status == 200
            assert stats["completed"] == len(rows) + 1
            assert stats["workers"] == 2
            status, health, _ = await get_json(session, f"{url}/health")
            assert (status, health["model"], health["start_method"]) == (
                200,
                "digits",
                "fork",
            )


async def test_digits_worker_killed_fails_only_its_request() -> None:
    features, labels = load_digits(return_X_y=True)
    payload = {"features": [int(v) for v in features[7]]}
    # forkserver: this server runs in a thread of the test process, whose other threads
    # make fork unsafe (a replacement forked while they hold a lock can hang in its job;
    # seen about 1 run in 10). `serve-demo` forks from a server that runs no other thread.
    app = create_demo_app("digits", workers=2, n_estimators=100, mp_context="forkserver")
    with serve(app) as served:
        url = served.url
        runner = app.state.runner
        async with client() as session:

            async def classify() -> tuple[int, dict[str, Any]]:
                async with session.post(f"{url}/predict", json=payload) as response:
                    return response.status, await response.json()

            assert (await classify())[0] == 200

            async def kill_a_busy_worker() -> int:
                # Runs in the server's loop: no reply is handled between the check and the kill.
                while not (runner.stats().busy == 2 and runner.stats().waiting >= 1):
                    await asyncio.sleep(0.0005)
                pid: int = runner.pids()[0]
                os.kill(pid, signal.SIGKILL)
                return pid

            burst = [asyncio.create_task(classify()) for _ in range(24)]
            killing = asyncio.run_coroutine_threadsafe(kill_a_busy_worker(), served.loop)
            victim = await asyncio.wait_for(asyncio.wrap_future(killing), 10)
            answers = await asyncio.gather(*burst)
            killed_at = time.monotonic()
            status, body = await classify()
            assert time.monotonic() - killed_at < 2.0
            assert (status, body["class"]) == (200, labels[7])
            failures = [b for s, b in answers if s != 200]
            assert len(failures) == 1  # only the job the killed worker was running
            for failure in failures:
                assert failure["error"] == "worker_crashed"
                assert "SIGKILL" in failure["reason"]
            assert all(b["class"] == labels[7] for s, b in answers if s == 200)
            status, stats, _ = await get_json(session, f"{url}/admin/stats")
            assert stats["restarts"] == 1
            assert stats["crashed"] == len(failures)
            assert victim not in runner.pids()


# --------------------------------------------------------------------------- origin


async def test_origin_queue_bound_gives_503_and_work_time_changes_live() -> None:
    app = origin.create_app(workers=2, service_time=0.5, queue=1)
    with serve(app) as served:
        url = served.url
        async with client() as session:
            # 2 in service, 1 queued, 2 rejected at once.
            results = await asyncio.gather(*(get_json(session, f"{url}/work") for _ in range(5)))
            statuses = sorted(r[0] for r in results)
            assert statuses == [200, 200, 200, 503, 503]
            for status, body, elapsed in results:
                if status == 503:
                    assert body["error"] == "overloaded"
                    assert elapsed < 0.4  # rejected without waiting for a slot
                else:
                    assert body["worked_seconds"] == 0.5
            queued = [b["queued_seconds"] for s, b, _ in results if s == 200]
            # The queued one waited for a slot: up to 0.5 s less however late it arrived
            # (connections open one by one on a loaded machine); a request that found a
            # free slot waits about 0.
            assert sorted(queued)[-1] >= 0.2

            status, stats, _ = await get_json(session, f"{url}/admin/stats")
            assert (stats["served"], stats["rejected"], stats["busy"], stats["queued"]) == (
                3,
                2,
                0,
                0,
            )

            async with session.put(f"{url}/admin/work-time", json={"seconds": 0.1}) as response:
                assert response.status == 200
                assert await response.json() == {"seconds": 0.1, "previous": 0.5}
            status, body, elapsed = await get_json(session, f"{url}/work")
            assert status == 200
            assert body["worked_seconds"] == 0.1
            assert 0.09 <= elapsed < 0.45

            for payload in ({"seconds": 0}, {"seconds": "2"}, {"sec": 2}, {"seconds": 1e9}):
                async with session.put(f"{url}/admin/work-time", json=payload) as response:
                    assert response.status == 422, payload
                    assert (await response.json())["field"] == "seconds"
            status, stats, _ = await get_json(session, f"{url}/admin/stats")
            assert stats["work_time"] == 0.1
            assert stats["capacity_rps"] == pytest.approx(20.0)


async def test_origin_queued_request_cancelled_frees_nothing_it_did_not_hold() -> None:
    """A waiter cancelled while queued (server shutdown) leaves the slot count intact."""
    service = origin.Origin(workers=1, service_time=0.2, queue=5)
    holder = asyncio.create_task(service.work())
    await asyncio.sleep(0.01)
    waiter = asyncio.create_task(service.work())
    await asyncio.sleep(0.01)
    assert (service.busy, service.queued) == (1, 1)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await holder
    assert (service.busy, service.queued, service.served) == (0, 0, 1)


async def work_sequentially(url: str, count: int) -> list[float]:
    """``count`` requests to ``/work`` one after the other; their ``worked_seconds``."""
    worked = []
    async with client() as session:
        for _ in range(count):
            status, body, elapsed = await get_json(session, f"{url}/work")
            assert status == 200
            assert elapsed >= body["worked_seconds"] - 0.002
            worked.append(body["worked_seconds"])
    return worked


async def test_origin_variable_work_times_are_seeded_draws_with_the_set_mean() -> None:
    # A log-normal work time of mean 20 ms, sigma 1: each draw is the seed's generator's,
    # with mu = ln(mean) - sigma^2 / 2, so the mean stays the service time.
    settings: dict[str, Any] = {
        "workers": 1,
        "service_time": 0.02,
        "service_dist": "lognormal",
        "sigma": 1.0,
    }
    draws = origin.work_time_generator(5)
    mu = math.log(0.02) - 1.0**2 / 2
    expected = [round(draws.lognormvariate(mu, 1.0), 6) for _ in range(12)]
    with serve(origin.create_app(**settings, seed=5)) as served:
        assert await work_sequentially(served.url, 12) == expected
        async with client() as session:
            _, stats, _ = await get_json(session, f"{served.url}/admin/stats")
    assert (stats["service_dist"], stats["sigma"], stats["seed"]) == ("lognormal", 1.0, 5)
    assert stats["work_time"] == 0.02 and stats["capacity_rps"] == pytest.approx(50.0)
    # The same seed repeats the run; another seed does not.
    with serve(origin.create_app(**settings, seed=5)) as served:
        assert await work_sequentially(served.url, 12) == expected
    with serve(origin.create_app(**settings, seed=6)) as served:
        assert await work_sequentially(served.url, 12) != expected


@pytest.mark.parametrize(
    ("dist", "sigma"), [("exponential", 0.5), ("lognormal", 0.5), ("lognormal", 1.0)]
)
def test_origin_work_time_distributions_keep_the_mean(dist: str, sigma: float) -> None:
    service = origin.Origin(workers=1, service_time=0.2, service_dist=dist, sigma=sigma, seed=1)
    draws = [service.draw_work_time() for _ in range(40_000)]
    assert statistics.fmean(draws) == pytest.approx(0.2, rel=0.03)
    assert statistics.pstdev(draws) > 0.05  # spread, unlike the constant default
    service.work_time = 0.4  # PUT /admin/work-time changes the mean, not the shape
    later = [service.draw_work_time() for _ in range(40_000)]
    assert statistics.fmean(later) == pytest.approx(0.4, rel=0.03)
    constant = origin.Origin(workers=1, service_time=0.2)
    assert {constant.draw_work_time() for _ in range(100)} == {0.2}


def test_origin_work_times_are_independent_of_a_load_generator_with_the_same_seed() -> None:
    # ``loadshed bench --arrival poisson --seed 1`` draws its gaps from random.Random(1);
    # work times from the same numbers would follow the gaps (long jobs after long pauses).
    from loadshed.loadgen.schedule import inter_arrival_gaps

    rate, mean = 160.0, 0.2
    gaps = inter_arrival_gaps(rate, "poisson", random.Random(1))
    service = origin.Origin(workers=32, service_time=mean, service_dist="exponential", seed=1)
    pairs = [(next(gaps) * rate, service.draw_work_time() / mean) for _ in range(20_000)]
    gap_mean = statistics.fmean(g for g, _ in pairs)
    work_mean = statistics.fmean(w for _, w in pairs)
    covariance = statistics.fmean((g - gap_mean) * (w - work_mean) for g, w in pairs)
    correlation = covariance / (
        statistics.pstdev(g for g, _ in pairs) * statistics.pstdev(w for _, w in pairs)
    )
    assert abs(correlation) < 0.05  # drawn from one generator it is 1.0


async def test_origin_serves_32_workers_at_once_with_exponential_work_times() -> None:
    # The live check's origin: 32 slots of exponential 200 ms work (asyncio sleeps).
    app = origin.create_app(workers=32, service_time=0.2, service_dist="exponential", seed=2)
    with serve(app) as served:
        async with client() as session:
            started = time.monotonic()
            results = await asyncio.gather(
                *(get_json(session, f"{served.url}/work") for _ in range(32))
            )
            elapsed = time.monotonic() - started
            assert [status for status, _, _ in results] == [200] * 32
            worked = [body["worked_seconds"] for _, body, _ in results]
            assert len(set(worked)) == 32  # a draw each
            # Nobody waited for a slot: all 32 ran together, done in about the longest draw.
            assert max(body["queued_seconds"] for _, body, _ in results) < 0.05
            assert elapsed < max(worked) + 1.0
            _, stats, _ = await get_json(session, f"{served.url}/admin/stats")
            assert (stats["served"], stats["busy"], stats["queued"]) == (32, 0, 0)
            assert stats["capacity_rps"] == pytest.approx(160.0)


def serve_demo_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``loadshed serve-demo ARGS`` that is expected to exit (a bad flag)."""
    command = [sys.executable, "-m", "loadshed.cli", "serve-demo", "--port", "0", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--model", "origin", "--service-dist", "gamma"],
            "Error: --service-dist: got 'gamma', allowed: constant|exponential|lognormal",
        ),
        (
            ["--model", "origin", "--service-dist", "lognormal", "--sigma", "0"],
            "Error: --sigma: must be a number > 0, got 0.0",
        ),
        (
            ["--model", "origin", "--service-dist", "exponential", "--sigma", "1"],
            "Error: --sigma: applies to --service-dist lognormal only",
        ),
        (
            ["--model", "hashburn", "--service-dist", "exponential"],
            "Error: --service-dist: applies to origin only",
        ),
        (["--model", "digits", "--seed", "3"], "Error: --seed: applies to origin only"),
    ],
)
def test_serve_demo_bad_service_dist_flags_are_one_line(args: list[str], line: str) -> None:
    result = serve_demo_cli(*args)
    assert result.returncode == 2, result.stderr
    assert [x for x in result.stderr.splitlines() if x.startswith("Error:")] == [line]
    assert "Traceback" not in result.stderr


@contextlib.contextmanager
def serve_demo_running(*args: str) -> Iterator[str]:
    """Run ``loadshed serve-demo --port 0 ARGS``; yield its URL once printed; stop it after."""
    process = subprocess.Popen(
        [sys.executable, "-m", "loadshed.cli", "serve-demo", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    try:
        ready, _, _ = select.select([process.stdout], [], [], 20.0)
        banner = process.stdout.readline().decode() if ready else ""
        match = re.search(r"http://127\.0\.0\.1:(\d+)", banner)
        assert match is not None, f"no URL printed: {banner!r}"
        yield f"http://127.0.0.1:{match.group(1)}"
    finally:
        process.terminate()
        process.wait(timeout=10)
        process.stdout.close()
        errors = process.stderr.read().decode()
        process.stderr.close()
    assert "Traceback" not in errors, errors


async def test_serve_demo_origin_with_service_dist_and_seed() -> None:
    args = ["--model", "origin", "--protect", "none", "--workers", "4", "--service-time", "0.01"]
    args += ["--service-dist", "LogNormal", "--sigma", "0.8", "--seed", "9"]
    draws = origin.work_time_generator(9)
    mu = math.log(0.01) - 0.8**2 / 2
    expected = [round(draws.lognormvariate(mu, 0.8), 6) for _ in range(5)]
    with serve_demo_running(*args) as url:
        assert await work_sequentially(url, 5) == expected
        async with client() as session:
            _, stats, _ = await get_json(session, f"{url}/admin/stats")
    assert (stats["workers"], stats["service_dist"], stats["sigma"]) == (4, "lognormal", 0.8)


# --------------------------------------------------------------------------- settings


@pytest.mark.parametrize(
    "model, settings, field",
    [
        ("hashburn", {"service_time": 0}, "service_time"),
        ("hashburn", {"service_time": "fast"}, "service_time"),
        ("origin", {"workers": 0}, "workers"),
        ("origin", {"queue": -1}, "queue"),
        ("origin", {"service_time": float("inf")}, "service_time"),
        ("origin", {"service_dist": "gamma"}, "service_dist"),
        ("origin", {"service_dist": "lognormal", "sigma": -1.0}, "sigma"),
        ("origin", {"seed": "x"}, "seed"),
        ("digits", {"workers": 0}, "workers"),
        ("digits", {"mp_context": "thread"}, "mp_context"),
        ("digits", {"job_timeout": -1.0}, "job_timeout"),
        ("resnet", {}, "model"),
    ],
)
def test_invalid_settings_fail_at_construction(
    model: str, settings: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigError) as info:
        create_demo_app(model, **settings)
    assert info.value.field == field


def test_every_demo_model_builds() -> None:
    for model in DEMO_MODELS:
        app = create_demo_app(model)
        assert app.state.model == model


def test_serve_demo_discipline_orders_a_limit_queue() -> None:
    from loadshed.config import Discipline
    from loadshed.demo.serve import build_app

    for discipline, member in (("shortest", Discipline.SHORTEST), ("fifo", Discipline.FIFO)):
        app = build_app("origin", "little", discipline=discipline)
        assert app.limiter.admission.discipline is member
    with pytest.raises(ConfigError, match=r"^--discipline: got 'sjf', allowed: fifo\|lifo"):
        build_app("origin", "little", discipline="sjf")
    result = serve_demo_cli("--model", "origin", "--discipline", "sjf")
    assert result.returncode == 2 and "'sjf' is not one of" in result.stderr
    assert "Traceback" not in result.stderr


async def test_protected_origin_never_sheds_its_admin_routes() -> None:
    """A capacity change ordered while the server sheds must get through at once:
    ``PUT /admin/work-time`` came back 503 in a live fleet run and crashed the bench."""
    from loadshed.demo.serve import protect_app

    app = protect_app(origin.create_app(workers=1, service_time=1.0, queue=0), "fixed:1", 1)
    with serve(app) as served:
        url = served.url
        async with client() as session:
            held = [asyncio.ensure_future(get_json(session, f"{url}/work")) for _ in range(3)]
            await asyncio.sleep(0.15)  # the one slot is taken, the others queued or refused
            started = time.monotonic()
            async with session.put(f"{url}/admin/work-time", json={"seconds": 0.1}) as response:
                assert response.status == 200
            # not queued behind the 1 s request that holds the slot
            assert time.monotonic() - started < 0.5
            status, stats, _ = await get_json(session, f"{url}/admin/stats")
            assert status == 200 and stats["work_time"] == 0.1
            await asyncio.gather(*held)
