"""The ``gputrace`` command line: each command in its own module under ``gputrace.commands``,
imported only when used, so ``gputrace --help`` stays fast and never imports cupy or wgpu."""

from __future__ import annotations

import importlib
from typing import Any

import click

from gputrace._version import __version__
from gputrace.errors import GputraceError

COMMANDS = ("summarize", "diff", "merge", "convert", "calibrate", "run", "view")


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        cmd: click.Command = getattr(importlib.import_module(f"gputrace.commands.{cmd_name}"), cmd_name)
        return cmd

    def invoke(self, ctx: click.Context) -> Any:
        """A ``GputraceError`` (a problem the user can fix) ends any command in one sentence, exit 2."""
        try:
            return super().invoke(ctx)
        except GputraceError as exc:
            from gputrace.commands._common import fail

            fail(str(exc))


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gputrace")
def cli() -> None:
    """gputrace: trace GPU work from Python and read the numbers that matter."""


def main() -> None:
    cli(prog_name="gputrace")


if __name__ == "__main__":  # python3 -m gputrace.cli, as python3 -m gputrace
    main()
