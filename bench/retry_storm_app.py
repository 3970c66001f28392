"""The README's example as a new user writes it, for ``bench/retry_storm.py`` (issue 13).

A FastAPI app whose scikit-learn model (``retry_storm_model``: a random forest on the
digits set, sized by the bench to about 25 ms per call) runs through
``ModelRunner(predict, workers=1)``. With ``RETRY_STORM_PROTECT=1`` (the default) it is
behind ``app.add_middleware(LoadShedMiddleware, metrics_path="/metrics")`` at its
defaults; with ``0``, unprotected. Served by uvicorn:

    RETRY_STORM_MODEL=model.joblib RETRY_STORM_PROTECT=1 \\
        python -m uvicorn retry_storm_app:app --app-dir bench --port 8000

``POST /predict`` takes a JSON list of 64 numbers. Added for the bench only: ``GET
/health`` (never limited) names the ``loadshed`` imported (``--src`` comparisons) and the
worker's pid, and ``RETRY_STORM_STATS`` names the file where the worker records its time
(see ``retry_storm_model``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI

import loadshed
from loadshed import LoadShedMiddleware, ModelRunner
from retry_storm_model import load_model, predict

MODEL_PATH = os.environ.get("RETRY_STORM_MODEL", "model.joblib")
STATS_PATH = os.environ.get("RETRY_STORM_STATS") or None
PROTECT = os.environ.get("RETRY_STORM_PROTECT", "1") == "1"

runner = ModelRunner(predict, workers=1, initializer=load_model, initargs=(MODEL_PATH, STATS_PATH))


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with runner:  # the model loads at start-up, not on the first request
        yield


app = FastAPI(lifespan=lifespan)


@app.post("/predict")
async def handle(features: list[float]) -> dict[str, int]:
    return {"label": await runner.run(features)}


@app.get("/health")
async def health() -> dict[str, Any]:
    return {
        "status": "ok",
        "protected": PROTECT,
        "loadshed": os.path.dirname(loadshed.__file__ or ""),
        "worker_pids": getattr(runner, "pids", list)(),
    }


if PROTECT:
    app.add_middleware(LoadShedMiddleware, metrics_path="/metrics")
