"""The admission token of the request being served, for code deeper in the call.

:class:`~loadshed.asgi.LoadShedMiddleware` sets :data:`current_token` around the app,
and ``async with limiter.acquire()`` around its block, while a request holds its slot;
:class:`~loadshed.runner.ModelRunner` reads it when a job is submitted and vacates the
token (:meth:`~loadshed.admission.Token.vacate`) the moment the job's worker replies, or
with steady job times shortly before the job's predicted end, so the next queued request
is admitted while this one finishes and reaches the worker without an idle gap.
"""

from __future__ import annotations

from contextvars import ContextVar

from loadshed.admission import Token

__all__ = ["current_token"]

current_token: ContextVar[Token | None] = ContextVar("loadshed_current_token", default=None)
"""The token of the request this task serves (None outside a limited request)."""
