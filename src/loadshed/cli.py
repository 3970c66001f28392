"""``loadshed`` command line: argument parsing and output only.

Commands live in the modules that own them and are imported lazily, so that
``loadshed --help`` and fast commands do not pay for matplotlib or aiohttp.
"""

from __future__ import annotations

import importlib

import click

from loadshed.clickutil import OneLineGroup

__all__ = ["main"]

# command name -> "module:attribute" of a click command
COMMANDS: dict[str, str] = {
    "proxy": "loadshed.proxy.cli:proxy",
    "simulate": "loadshed.sim.cli:simulate",
    "demo": "loadshed.demo.live:demo",
    "serve-demo": "loadshed.demo.serve:serve_demo",
    "plan": "loadshed.sim.plan:plan",
    "bench": "loadshed.loadgen.cli:bench",
    "report": "loadshed.loadgen.cli:report",
    "sweep": "loadshed.loadgen.cli:sweep",
    "capacity": "loadshed.loadgen.cli:capacity",
}


class LazyGroup(OneLineGroup):
    """A click group whose subcommands are imported on first use, and whose usage
    errors print one line (``Error: ...`` naming the flag), exit code 2."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module_name, attribute = target.split(":")
        command = getattr(importlib.import_module(module_name), attribute)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="loadshed")
def main() -> None:
    """loadshed: keep ML inference APIs fast under overload, and measure what they hold."""


if __name__ == "__main__":  # pragma: no cover
    main()
