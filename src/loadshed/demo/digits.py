"""A real scikit-learn model: a random forest trained at start-up on the 8x8 digits data set
that scikit-learn ships (1797 images, nothing downloaded), served through
:class:`~loadshed.runner.ModelRunner`.

``POST /predict`` with ``{"features": [64 numbers]}`` (pixel intensities 0..16, row by row)
returns ``{"class": 3, "probabilities": [10 numbers]}``; with ``{"batch": [[64 numbers],
...]}`` (1 to 256 images) it returns ``{"classes": [...], "probabilities": [[10 numbers],
...]}``, one prediction call for the batch: the time grows with the rows (the body to
parse and validate, and the forest), so a client that sends ``X-Request-Cost: <rows>``
lets a protected server admit each batch by its own predicted time (docs/cost.md).
Malformed input gets 422 with ``{"error": "invalid_request", "field": "features[5]",
"reason": "..."}`` (``batch[3][5]`` in a batch).

The model is loaded by the runner's initializer, never pickled per call; a prediction costs a
few milliseconds of CPU in a worker, and the event loop stays free to accept, queue and shed
requests. With the default ``fork`` start method the parent trains the forest once at start-up
and every worker inherits it (and scikit-learn, already imported): a worker, and a replacement
after a crash, is ready in milliseconds. With ``forkserver`` or ``spawn`` each worker imports
scikit-learn and trains its own identical copy (same seed), which takes one to several seconds.
"""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing.context
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from loadshed.demo import invalid_request, positive_int, positive_number
from loadshed.errors import ConfigError
from loadshed.runner import JobTimeout, ModelRunner, RunnerClosed, WorkerCrashed

__all__ = [
    "DEFAULT_N_ESTIMATORS",
    "MAX_BATCH",
    "N_CLASSES",
    "N_FEATURES",
    "create_app",
    "load_model",
    "predict",
    "predict_batch",
    "predict_job",
]

N_FEATURES = 64
"""Inputs per prediction: 8x8 pixel intensities."""
N_CLASSES = 10
DEFAULT_N_ESTIMATORS = 100
"""Trees in the forest: about 0.4 s to train and 5 ms per prediction on a laptop core."""
MAX_BATCH = 256
"""Most images in one ``batch`` request."""
MAX_BODY_BYTES = 512 * 1024  # a full batch of 256 x 64 numbers written out long

_model: Any = None  # the worker's forest, set by load_model


def load_model(n_estimators: int = DEFAULT_N_ESTIMATORS, seed: int = 0) -> None:
    """Runner initializer: train the forest on scikit-learn's bundled digits data set, unless
    this process already holds one with these settings (inherited through ``fork``)."""
    global _model
    if _model is not None and (_model.n_estimators, _model.random_state) == (n_estimators, seed):
        return
    from sklearn.datasets import load_digits
    from sklearn.ensemble import RandomForestClassifier

    features, labels = load_digits(return_X_y=True)
    model = RandomForestClassifier(n_estimators=n_estimators, random_state=seed, n_jobs=1)
    model.fit(features, labels)
    _model = model


def predict(features: list[float]) -> dict[str, Any]:
    """Runner job: classify one image (64 validated numbers)."""
    import numpy as np

    if _model is None:  # used outside a runner started with load_model
        load_model()
    probabilities = _model.predict_proba(np.asarray([features], dtype=np.float64))[0]
    best = int(np.argmax(probabilities))
    return {
        "class": int(_model.classes_[best]),
        "probabilities": [round(float(p), 6) for p in probabilities],
    }


def predict_batch(rows: list[list[float]]) -> dict[str, Any]:
    """Runner job: classify a batch of images in one call."""
    import numpy as np

    if _model is None:
        load_model()
    probabilities = _model.predict_proba(np.asarray(rows, dtype=np.float64))
    best = np.argmax(probabilities, axis=1)
    return {
        "classes": [int(_model.classes_[i]) for i in best],
        "probabilities": [[round(float(p), 6) for p in row] for row in probabilities],
    }


def predict_job(job: list[float] | list[list[float]]) -> dict[str, Any]:
    """The runner's job: one image (64 numbers) or a batch (a list of such lists)."""
    if job and isinstance(job[0], list):
        return predict_batch(job)
    return predict(job)  # type: ignore[arg-type]


def _validate_row(features: object, field: str) -> tuple[list[float] | None, JSONResponse | None]:
    if not isinstance(features, list):
        return None, invalid_request(
            field, f"must be a list of {N_FEATURES} numbers, got {type(features).__name__}"
        )
    if len(features) != N_FEATURES:
        return None, invalid_request(field, f"must hold {N_FEATURES} numbers, got {len(features)}")
    for index, value in enumerate(features):
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            return None, invalid_request(
                f"{field}[{index}]", f"must be a finite number, got {value!r}"
            )
    return [float(v) for v in features], None


def _validate_features(body: object) -> tuple[list[float] | None, JSONResponse | None]:
    if not isinstance(body, dict):
        return None, invalid_request("body", f"must be a JSON object, got {type(body).__name__}")
    if "features" not in body:
        return None, invalid_request(
            "features", f"required: a list of {N_FEATURES} numbers (or batch: a list of such lists)"
        )
    return _validate_row(body["features"], "features")


def _validate_batch(batch: object) -> tuple[list[list[float]] | None, JSONResponse | None]:
    if not isinstance(batch, list) or not 1 <= len(batch) <= MAX_BATCH:
        got = f"{len(batch)} rows" if isinstance(batch, list) else type(batch).__name__
        return None, invalid_request(
            "batch", f"must be a list of 1 to {MAX_BATCH} lists of {N_FEATURES} numbers, got {got}"
        )
    rows = []
    for index, features in enumerate(batch):
        row, error = _validate_row(features, f"batch[{index}]")
        if error is not None:
            return None, error
        assert row is not None
        rows.append(row)
    return rows, None


def _default_start_method() -> str:
    return "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


def create_app(
    workers: int = 1,
    *,
    mp_context: str | multiprocessing.context.BaseContext | None = None,
    job_timeout: float | None = 10.0,
    n_estimators: int = DEFAULT_N_ESTIMATORS,
    seed: int = 0,
) -> Starlette:
    """Build the digits service with a :class:`ModelRunner` of ``workers`` processes.

    The runner starts in the app's lifespan (so uvicorn reports a failed model load at start-up)
    and stops with it. ``mp_context`` and ``job_timeout`` go to the runner; the default start
    method is ``fork`` where available (the parent trains once, workers inherit the model; the
    fork happens from the event loop thread of a server that runs no other threads), else
    ``spawn``. Raises :class:`~loadshed.errors.ConfigError` naming a bad setting.
    """
    workers = positive_int(workers, "workers")
    n_estimators = positive_int(n_estimators, "n_estimators")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError("seed", f"must be an integer, got {seed!r}")
    if job_timeout is not None:
        job_timeout = positive_number(job_timeout, "job_timeout")
    runner: ModelRunner[dict[str, Any]] = ModelRunner(
        predict_job,
        workers=workers,
        initializer=load_model,
        initargs=(n_estimators, seed),
        mp_context=mp_context if mp_context is not None else _default_start_method(),
        job_timeout=job_timeout,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if runner.start_method == "fork":
            # Train once here (start-up: nothing to serve yet); the workers inherit it.
            load_model(n_estimators, seed)
        async with runner:
            yield

    async def predict_endpoint(request: Request) -> JSONResponse:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            return JSONResponse(
                {"error": "too_large", "reason": f"body: at most {MAX_BODY_BYTES} bytes"},
                status_code=413,
            )
        try:
            raw = await request.body()
        except ClientDisconnect:
            # The client left mid-upload: nobody reads the answer (nginx's 499).
            return JSONResponse({"error": "client_closed_request"}, status_code=499)
        if len(raw) > MAX_BODY_BYTES:
            return JSONResponse(
                {"error": "too_large", "reason": f"body: at most {MAX_BODY_BYTES} bytes"},
                status_code=413,
            )
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return invalid_request("body", f"not valid JSON ({exc})")
        job: Any
        if isinstance(body, dict) and "batch" in body:
            rows, error = _validate_batch(body["batch"])
            if error is not None:
                return error
            job = rows
        else:
            features, error = _validate_features(body)
            if error is not None:
                return error
            job = features
        try:
            result = await runner.run(job)
        except WorkerCrashed as exc:
            return JSONResponse({"error": "worker_crashed", "reason": str(exc)}, status_code=500)
        except JobTimeout as exc:
            return JSONResponse({"error": "timeout", "reason": str(exc)}, status_code=504)
        except RunnerClosed as exc:
            return JSONResponse({"error": "shutting_down", "reason": str(exc)}, status_code=503)
        return JSONResponse(result)

    async def stats(request: Request) -> JSONResponse:
        return JSONResponse(runner.stats().as_dict())

    async def health(request: Request) -> JSONResponse:
        s = runner.stats()
        return JSONResponse(
            {
                "status": "ok",
                "model": "digits",
                "workers": s.workers,
                "busy": s.busy,
                "idle": s.idle,
                "waiting": s.waiting,
                "start_method": runner.start_method,
            }
        )

    app = Starlette(
        routes=[
            Route("/predict", predict_endpoint, methods=["POST"]),
            Route("/admin/stats", stats, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
    app.state.model = "digits"
    app.state.runner = runner
    app.state.workers = workers
    return app
