"""Entry point of `cos`. Each service contributes its own sub-commands, through a registry.

The registry is the `commonos.commands` entry-point group (pyproject.toml): each entry names a top-level
command and the module whose `register(subparsers)` adds it. `cos` imports no service by name: a service
that is not installed simply has no commands, and a new one adds its commands in its own entry points.
`cos <command> ...` imports only the module that registers `<command>` (so `cos import` does not load NATS,
asyncpg or the loop); `cos`, `cos --help` and an unknown command load them all.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from functools import cache
from importlib.metadata import entry_points

from commonos.runtime.args import Parser, run_command
from commonos.runtime.cli_support import shown

#: The entry-point group of `cos`'s commands: `<command> = "<module with register(subparsers)>"`.
COMMANDS_GROUP = "commonos.commands"


@cache
def commands() -> dict[str, str]:
    """Every registered command and its module, in the order `cos --help` lists them."""
    return {ep.name: ep.value for ep in entry_points(group=COMMANDS_GROUP)}


def command_modules() -> list[str]:
    """The modules that register commands, each once, in the order of their first command."""
    return list(dict.fromkeys(commands().values()))


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `cos` parser with every command, or with `command`'s alone when it is a known command."""
    parser = Parser(
        prog="cos",
        description="CommonOS events: an event-sourced backend for AI agents on NATS JetStream and PostgreSQL.",
        epilog="Configuration comes from COS_* environment variables (COS_NATS_URL, COS_DATABASE_URL, "
        "COS_DATA_DIR, ...); with no URLs, commands use the embedded system that `cos up` started.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    known = commands()
    for name in (known[command],) if command in known else command_modules():
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # What an error says comes from files, servers and arguments: shown, never read as markup.
    return run_command(build_parser(argv[0] if argv else None), argv, shown)


if __name__ == "__main__":
    raise SystemExit(main())
