"""Shared click plumbing: usage errors as one line naming the flag, exit code 2.

Click prints a usage block before a usage error; loadshed prints only
``Error: <what is wrong, naming the flag and the allowed values>``. A
:class:`~loadshed.errors.ConfigError` raised while a command runs (configuration
checked at start-up) becomes the same kind of error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from loadshed.config import Discipline
from loadshed.errors import ConfigError
from loadshed.pacing import DEFAULT_REFUSAL_PACING

__all__ = ["OneLineCommand", "OneLineGroup", "discipline_option", "refusal_rate_option"]


class _OneLineErrors:
    """Mixin for click commands and groups (see the module docstring)."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)  # type: ignore[misc, no-any-return]
        except click.UsageError as error:
            error.ctx = None  # no usage block: the message alone says what is wrong
            raise

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)  # type: ignore[misc]
        except ConfigError as error:
            raise click.UsageError(str(error)) from None
        except click.UsageError as error:
            error.ctx = None
            raise


class OneLineCommand(_OneLineErrors, click.Command):
    """A click command whose usage and configuration errors print as one line."""


class OneLineGroup(_OneLineErrors, click.Group):
    """A click group whose (and whose subcommands') usage errors print as one line."""


refusal_rate_option = click.option(
    "--refusal-rate",
    type=float,
    default=DEFAULT_REFUSAL_PACING.rate,
    show_default=True,
    help="Refusals per second answered at once; beyond it each 503 is held for a "
    "bounded time (at most the expected wait and 1 s by default), so clients that "
    "retry at once cost bounded CPU (0: never hold).",
)
"""``--refusal-rate`` (:mod:`loadshed.pacing`), shared by ``serve-demo`` and ``proxy``."""


def discipline_option(help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--discipline`` (the queue's order, :class:`~loadshed.config.Discipline`), shared
    by ``serve-demo`` and ``proxy``, with the command's own ``help``."""
    return click.option(
        "--discipline",
        type=click.Choice([discipline.value for discipline in Discipline]),
        default=Discipline.FIFO.value,
        show_default=True,
        help=help,
    )
